"""Exact and semantic response cache at the edge (see DESIGN.md, step 2).

Nothing is imported here: `edge.config` reads `cache.settings`, and the embedder's stack (numpy,
tokenizers, ONNX Runtime) should load only in the processes that embed.
"""
