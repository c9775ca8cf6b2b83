"""``nearshore bench load``: open- or closed-loop load on any OpenAI-compatible endpoint, and its tails."""
