"""``nearshore bench cache``: the semantic lookup, the index and the sentence embedder, beside peers."""
