"""Exact and semantic response cache at the edge (see DESIGN.md, step 2)."""
