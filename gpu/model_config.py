"""A model's shape, read from a GGUF's metadata: everything the torch model needs besides the weights.

Facts follow llama.cpp's reading of the same keys (src/llama-model.cpp), so both engines build the same model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FORMAT = 1  # of to_dict(): bump when a field changes meaning
SUPPORTED_ARCHS = ("gemma3", "llama", "qwen2")
GLOBAL = "global"
SLIDING = "sliding"

# Gemma 3: five sliding-window layers, then one global (llama.cpp: set_swa_pattern(6)); local RoPE base 10k
# unless the file says otherwise.
GEMMA3_SWA_PERIOD = 6
GEMMA3_LOCAL_ROPE_BASE = 10_000.0
# End-of-generation tokens that llama.cpp also recognises by their text.
EOG_TEXTS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>", "<|eom_id|>")


class UnsupportedModelError(ValueError):
    """The GGUF holds an architecture the torch engine does not implement."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    rms_eps: float
    rope_base: float  # global (full-attention) layers
    rope_base_local: float  # sliding-window layers
    rope_linear_factor: float  # positions divided by it on global layers (1.0: no scaling)
    rope_neox: bool  # rotate halves (NEOX) rather than adjacent pairs (llama's GGUF layout)
    sliding_window: int  # 0: no sliding layers
    layer_groups: tuple[str, ...]  # GLOBAL or SLIDING, per layer
    attention_scale: float
    embedding_scale: float  # the embedding is multiplied by it (Gemma: sqrt(hidden))
    tied_embeddings: bool
    final_logit_softcap: float  # 0: none
    eos_ids: tuple[int, ...]
    bos_id: int | None

    @property
    def groups(self) -> tuple[str, ...]:
        """The KV groups this model uses, in a fixed order."""
        return tuple(g for g in (GLOBAL, SLIDING) if g in self.layer_groups)

    @property
    def is_gemma(self) -> bool:
        return self.arch == "gemma3"

    def layers_of(self, group: str) -> tuple[int, ...]:
        return tuple(i for i, g in enumerate(self.layer_groups) if g == group)

    def window_of(self, group: str) -> int:
        """The attention window of a group in tokens (0: full causal)."""
        return self.sliding_window if group == SLIDING else 0

    def rope_of(self, layer: int) -> tuple[float, float]:
        """(base, linear factor) of a layer's RoPE: Gemma's scaling applies to its global layers only."""
        if self.layer_groups[layer] == SLIDING:
            return self.rope_base_local, 1.0
        return self.rope_base, self.rope_linear_factor

    def to_dict(self) -> dict[str, Any]:
        return {"format": CONFIG_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig | None:
        """The config saved by to_dict, or None when `data` is not one (another format, damaged)."""
        if data.get("format") != CONFIG_FORMAT:
            return None
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "format"}
        if set(values) != fields:
            return None
        try:
            return cls(**values)
        except TypeError:
            return None

    @classmethod
    def from_gguf(cls, path: str | Path) -> ModelConfig:
        import gguf

        return cls.from_reader(gguf.GGUFReader(str(path)))

    @classmethod
    def from_reader(cls, reader: Any) -> ModelConfig:
        meta = _Metadata(reader)
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"unsupported model architecture {arch!r} for the torch engine "
                f'(supported: {", ".join(SUPPORTED_ARCHS)}); use engine = "llama.cpp"'
            )
        a = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
        hidden = int(a("embedding_length"))
        layers = int(a("block_count"))
        heads = int(a("attention.head_count"))
        kv_heads = int(a("attention.head_count_kv", heads))
        head_dim = int(a("attention.key_length", hidden // heads))
        tensors = {t.name: t for t in reader.tensors}
        vocab = int(tensors["token_embd.weight"].shape[-1])
        rope_base = float(a("rope.freq_base", 10_000.0))
        scaling = a("rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise UnsupportedModelError(f"unsupported RoPE scaling {scaling!r} (supported: none, linear)")
        factor = float(a("rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        window = int(a("attention.sliding_window", 0)) if arch == "gemma3" else 0
        if arch == "gemma3":
            groups = tuple(SLIDING if (i + 1) % GEMMA3_SWA_PERIOD else GLOBAL for i in range(layers))
            # Gemma 3 27B scales by hidden / heads; the others by the head size (llama.cpp, gemma_pytorch).
            pre_attn = float(a("attention.query_pre_attn_scalar", 0) or head_dim)
            local_base = float(a("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE))
            embed_scale = math.sqrt(hidden)
        else:
            groups = (GLOBAL,) * layers
            pre_attn = float(head_dim)
            local_base = rope_base
            embed_scale = 1.0
        return cls(
            arch=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            ffn_size=int(a("feed_forward_length")),
            rms_eps=float(a("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_base=rope_base,
            rope_base_local=local_base,
            rope_linear_factor=factor,
            rope_neox=arch != "llama",
            sliding_window=window,
            layer_groups=groups,
            attention_scale=1.0 / math.sqrt(pre_attn),
            embedding_scale=embed_scale,
            tied_embeddings="output.weight" not in tensors,
            final_logit_softcap=float(a("final_logit_softcapping", 0.0) or 0.0),
            eos_ids=_eos_ids(meta),
            bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        )


class _Metadata:
    """Scalar and small-array values of a GGUFReader's fields."""

    def __init__(self, reader: Any) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def tokens(self) -> list[bytes]:
        field = self._fields.get("tokenizer.ggml.tokens")
        return [] if field is None else [bytes(field.parts[i]) for i in field.data]


def _eos_ids(meta: _Metadata) -> tuple[int, ...]:
    ids = {meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
    wanted = {t.encode() for t in EOG_TEXTS}
    ids.update(i for i, tok in enumerate(meta.tokens()) if tok in wanted)
    return tuple(sorted(int(i) for i in ids if i is not None))
