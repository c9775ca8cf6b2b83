"""The batched GPU decode engine: model, KV blocks, scheduler, sampler (see DESIGN.md, step 6)."""
