"""Exact and semantic response cache at the edge (ARCHITECTURE.md, the "cache" step).

Nothing is imported here: `edge.config` reads `cache.settings`, and the embedder's stack (numpy,
tokenizers, ONNX Runtime) should load only in the processes that embed.
"""
