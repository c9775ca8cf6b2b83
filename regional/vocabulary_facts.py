"""What a loaded model's vocabulary says, as the engine answers it (llama.cpp's vocabulary, for every
engine: prompts tokenize the same way whichever engine decodes them)."""

from __future__ import annotations

from regional.llama_model import LlamaModel


class VocabularyFacts:
    """The vocabulary's answers; ``_vocab`` is None until the model is loaded (and after it is unloaded),
    when the answers that have a safe default give it."""

    _vocab: LlamaModel | None

    def detokenize(self, tokens: list[int]) -> str:
        assert self._vocab is not None
        return self._vocab.detokenize(tokens)

    @property
    def vocab_size(self) -> int:
        assert self._vocab is not None
        return self._vocab.n_vocab

    def token_piece(self, token: int) -> bytes:
        assert self._vocab is not None
        return self._vocab.token_piece(token)

    def chat_template(self) -> str | None:
        return self._vocab.chat_template() if self._vocab is not None else None

    def special_tokens(self) -> dict[str, str]:
        return self._vocab.special_tokens() if self._vocab is not None else {}

    def adds_bos(self) -> bool:
        return bool(self._vocab.bos_prefix()) if self._vocab is not None else True
