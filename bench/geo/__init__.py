"""``nearshore bench geo``: locating a client and choosing a route, per call."""
