"""The wire protocol edge and region share: OpenAI schemas, errors and SSE framing."""
