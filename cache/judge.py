"""The pair judge: a cross-encoder that reads two questions together and says how likely they ask the same
thing, for the semantic candidates the verifier's certain vetoes let through (cache/verify.py).

The model is all-MiniLM-L6-v2 (the cache's embedder, installed from PyPI) fine-tuned as a cross-encoder
by ``cache/judge_train.py`` on public paraphrase pairs and the project's dev sets (provenance in
``cache/data/judge/README.md``): ``[CLS] a [SEP] b [SEP]`` with token types 0 and 1, the last layer
mean-pooled, a linear head to log-odds.
Its file (``cache/data/judge/judge.safetensors``, fp16) holds everything but the word embeddings, which are
the installed model's. The layers run in ONNX Runtime (int8 matrix products by default), the graph written
from the weights by :mod:`cache.embedder_ort` as for the embedder; tokens, embeddings, pooling and the head in
numpy. A pair is judged both ways in one batch and the lower of the two probabilities counts: both questions
must say the other (mutual entailment).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cache.embedder import (
    EmbedderLoadError,
    embedded_model_dir,
    layer_norm,
    read_shape,
    read_tensors,
    weights_of,
)

JUDGE_FILE = Path(__file__).resolve().parent / "data" / "judge" / "judge.safetensors"
MAX_PAIR_TOKENS = 128  # what the judge was trained on; a longer pair is cut (the verifier reads 2,000 chars)


class PairJudge:
    """``same(pairs) -> probabilities``: each pair's chance of asking the same thing (the lower of its two
    orders)."""

    def __init__(
        self, path: Path = JUDGE_FILE, base: Path | None = None, threads: int = 1, int8: bool = True
    ) -> None:
        base = base or embedded_model_dir()
        self.shape = read_shape(base)
        tensors = read_tensors(base / "model.safetensors")
        tuned = read_tensors(path)
        tensors.update({name: t.astype(np.float32) for name, t in tuned.items()})
        for name in ("classifier.weight", "classifier.bias"):
            if name not in tensors:
                raise EmbedderLoadError(f"{path}: tensor {name} is missing (not a judge's file)")
        self.embeddings, layers = weights_of(tensors, self.shape, path)
        self.head_w = tensors["classifier.weight"].reshape(-1)  # [H]
        self.head_b = float(tensors["classifier.bias"].reshape(-1)[0])
        self.tokenizer = pair_tokenizer(base)
        from cache.embedder_ort import OrtLayers

        self._layers = OrtLayers(self.shape, layers, threads, int8=int8)

    def same(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """For each pair, the probability that the two ask the same thing (both orders must say so)."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        both = [*pairs, *((b, a) for a, b in pairs)]
        logits = self.logits(both)
        n = len(pairs)
        return _sigmoid(np.minimum(logits[:n], logits[n:]))

    def logits(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(list(pairs))
        b, n = len(encodings), max(len(e.ids) for e in encodings)
        ids = np.zeros((b, n), dtype=np.int64)
        types = np.zeros((b, n), dtype=np.int64)
        mask = np.zeros((b, n), dtype=np.float32)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)] = e.ids
            types[row, : len(e.ids)] = e.type_ids
            mask[row, : len(e.ids)] = 1.0
        e = self.embeddings
        np.clip(ids, 0, e["word"].shape[0] - 1, out=ids)
        np.clip(types, 0, e["token_type"].shape[0] - 1, out=types)
        x = e["word"][ids] + e["position"][:n] + e["token_type"][types]  # [B, S, H]
        h = self.shape.hidden
        x = layer_norm(x.reshape(-1, h), e["norm_g"], e["norm_b"], self.shape.layer_norm_eps)
        bias = ((mask - 1.0) * np.float32(1e9))[:, None, None, :]
        x = self._layers(x, bias, b, n).reshape(b, n, h)
        pooled = np.einsum("bsh,bs->bh", x, mask) / mask.sum(axis=1, keepdims=True)
        return pooled @ self.head_w + self.head_b


def pair_tokenizer(folder: Path):  # -> tokenizers.Tokenizer
    """The model's tokenizer for pairs (``[CLS] a [SEP] b [SEP]`` with token types), cut at
    MAX_PAIR_TOKENS, padding left to the caller."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=MAX_PAIR_TOKENS)
    return tokenizer


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)
