"""Fixtures of the region's tests: the embedded model's vocabulary alone (no weights), and that vocabulary as
the grammar engine takes it (built once: about a second for Gemma's 262k tokens)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from regional.grammar import Vocabulary
from regional.llama_model import ContextSettings, LlamaModel
from regional.model_store import resolve_model_path


@pytest.fixture(scope="session")
def model() -> Iterator[LlamaModel]:
    vocab = LlamaModel(str(resolve_model_path("")), ContextSettings(0, 0, 1, 1), vocab_only=True)
    yield vocab
    vocab.close()


@pytest.fixture(scope="session")
def vocabulary(model: LlamaModel) -> Vocabulary:
    return Vocabulary(model)
