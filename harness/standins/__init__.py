"""Stand-in regions for tests and benchmarks: the pacer streams at a fixed pace, the hostile region
misbehaves on purpose. Both speak the regional node's OpenAI API."""
