"""The edge proxy: TLS, API keys, rate limits, streaming relay, billing (see ARCHITECTURE.md)."""
