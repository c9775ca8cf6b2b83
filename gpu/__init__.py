"""The torch engine's parts: the model, paged KV blocks, the batched sampler, CUDA kernels and graphs; the
engine itself is regional/torch_engine.py, its scheduler regional/scheduler.py (see ARCHITECTURE.md)."""
