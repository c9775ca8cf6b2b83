"""The edge proxy: TLS, API keys, rate limits, streaming relay, billing (see DESIGN.md, step 1, 4 and 7)."""
