"""``nearshore bench edge``: what the edge adds to a token stream, its request rate and throughput."""
