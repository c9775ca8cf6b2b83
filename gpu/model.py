"""The causal LM in torch, built from a GGUF: Gemma 3 and the Llama / Qwen2 family.

Reads top to bottom: RMSNorm, rotary helpers, Attention, FeedForward, Block, CausalLM. Weights keep the GGUF's
names and [out, in] layout. Architecture facts follow llama.cpp (src/models/gemma3.cpp, llama.cpp, qwen2.cpp),
so both engines compute the same function of the same file:
- Gemma 3: embedding * sqrt(hidden); norms stored with Gemma's +1 already added by the converter (so
  x_normed * w); QK-norm; RoPE NEOX-style, base 10k on sliding layers and the file's base on global ones;
  post-attention and post-feed-forward norms; GeGLU with tanh-GELU; output tied to the embedding.
- Llama: RoPE on adjacent pairs (the converter permuted q/k for it), SwiGLU, optional rope_freqs factors and
  untied output. Qwen2: as Llama with q/k/v biases and NEOX RoPE.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu.attention import paged_attention
from gpu.cuda_kernels import available as kernels_available
from gpu.cuda_kernels import paged_attention_decode
from gpu.gguf_weights import LoadedWeights, cache_entry, load_weights, read_entry_json, write_entry_json
from gpu.kv_cache import PagedKvCache
from gpu.model_config import ModelConfig

CONFIG_FILE = "config.json"


def decode_kernel_usable(device: torch.device) -> bool:
    """Whether decode rows on ``device`` go to the CUDA kernel (a CUDA device with CuPy), else the torch
    reference. Asked once per process: the answer does not change while it runs."""
    global _KERNELS
    if device.type != "cuda":
        return False
    if _KERNELS is None:
        _KERNELS = kernels_available()
    return _KERNELS


_KERNELS: bool | None = None


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rope_tables(
    positions: torch.Tensor, head_dim: int, base: float, factor: float, freq_factors: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim / 2] for positions [T]; computed in float64 for long contexts."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    inv_freq = base**-exponents
    if freq_factors is not None:  # Llama 3's per-frequency scaling (rope_freqs.weight)
        inv_freq = inv_freq / freq_factors.double()
    angles = (positions.double() / factor)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotate x [T, heads, head_dim]: halves against each other (NEOX) or adjacent pairs (Llama's GGUF)."""
    x32 = x.float()
    cos, sin = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = x32.chunk(2, dim=-1)
        rotated = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    else:
        a, b = x32[..., 0::2], x32[..., 1::2]
        rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return rotated.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, w: dict[str, torch.Tensor], prefix: str, layer: int) -> None:
        super().__init__()
        self.config, self.layer = config, layer
        self.group = config.layer_groups[layer]
        self.window = config.window_of(self.group)
        for name in ("q", "k", "v"):
            self.register_buffer(f"w{name}", w[f"{prefix}attn_{name}.weight"])
            self.register_buffer(f"b{name}", w.get(f"{prefix}attn_{name}.bias"))
        self.register_buffer("wo", w[f"{prefix}attn_output.weight"])
        self.q_norm = self.k_norm = None
        if f"{prefix}attn_q_norm.weight" in w:
            self.q_norm = RMSNorm(w[f"{prefix}attn_q_norm.weight"], config.rms_eps)
            self.k_norm = RMSNorm(w[f"{prefix}attn_k_norm.weight"], config.rms_eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], inputs: Any, kv: PagedKvCache
    ) -> torch.Tensor:
        c = self.config
        t = x.shape[0]
        q = F.linear(x, self.wq, self.bq).view(t, c.num_heads, c.head_dim)
        k = F.linear(x, self.wk, self.bk).view(t, c.num_kv_heads, c.head_dim)
        v = F.linear(x, self.wv, self.bv).view(t, c.num_kv_heads, c.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope, c.rope_neox), apply_rope(k, *rope, c.rope_neox)
        kv.write(self.layer, inputs.slot_mapping[self.group], k, v)
        if inputs.max_query_len == 1 and decode_kernel_usable(q.device):
            # Every row is a decode row: the CUDA kernel reads the block tables (no host sync, so a decode
            # step can be captured as a CUDA graph).
            out = paged_attention_decode(
                q,
                kv.k[self.layer],
                kv.v[self.layer],
                inputs.block_tables[self.group],
                inputs.seq_lens,
                c.attention_scale,
                self.window,
                max_seq_len=inputs.max_seq_len,
            )
        else:
            out = paged_attention(
                q, kv.k[self.layer], kv.v[self.layer], inputs, self.group, self.window, c.attention_scale
            )
        return F.linear(out.reshape(t, c.num_heads * c.head_dim), self.wo)


class FeedForward(nn.Module):
    """GeGLU (tanh-GELU) for Gemma, SwiGLU for Llama / Qwen2: down(act(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, w: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        self.gelu = config.is_gemma
        self.register_buffer("gate", w[f"{prefix}ffn_gate.weight"])
        self.register_buffer("up", w[f"{prefix}ffn_up.weight"])
        self.register_buffer("down", w[f"{prefix}ffn_down.weight"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.linear(x, self.gate)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return F.linear(act * F.linear(x, self.up), self.down)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, w: dict[str, torch.Tensor], layer: int) -> None:
        super().__init__()
        prefix = f"blk.{layer}."
        norm = lambda name: RMSNorm(w[prefix + name + ".weight"], config.rms_eps)  # noqa: E731
        self.attn_norm, self.ffn_norm = norm("attn_norm"), norm("ffn_norm")
        self.attention = Attention(config, w, prefix, layer)
        self.feed_forward = FeedForward(config, w, prefix)
        self.post_attn_norm = self.post_ffn_norm = None
        if config.is_gemma:
            self.post_attn_norm, self.post_ffn_norm = norm("post_attention_norm"), norm("post_ffw_norm")

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], inputs: Any, kv: PagedKvCache
    ) -> torch.Tensor:
        h = self.attention(self.attn_norm(x), rope, inputs, kv)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        x = x + h
        h = self.feed_forward(self.ffn_norm(x))
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h)
        return x + h


def vocab_logits(x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """``x @ output.T``: the logits of x's rows over the vocabulary. On the CPU it is asked as
    ``output @ x.T`` with at least two rows: for a few rows against Gemma's [262,144 x 640] output, MKL's
    float32 kernel runs 2-4x slower the other way round, and its one-row path slower than two rows (one
    thread: 4 rows 112 -> 46 ms, 2 rows 129 -> 33 ms, 1 row 60 -> 33 ms), and the step is mostly this."""
    if x.device.type != "cpu":
        return F.linear(x, output)
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, x])  # the same row twice: two rows take the faster kernel
    return (output @ x.T).T[:rows]


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("embedding", weights["token_embd.weight"])  # [vocab, hidden]
        self.register_buffer("freq_factors", weights.get("rope_freqs.weight"))
        self.layers = nn.ModuleList(Block(config, weights, i) for i in range(config.num_layers))
        self.norm = RMSNorm(weights["output_norm.weight"], config.rms_eps)
        self.register_buffer("output", weights.get("output.weight", self.embedding))
        self.weights_info: LoadedWeights | None = None

    @classmethod
    def load(
        cls,
        gguf_path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        cache_root: str | Path | None = None,
    ) -> CausalLM:
        """The model of a GGUF on `device`; `weights_info` says how long loading took and if cached.

        The config is cached beside the weights too: reading it from the GGUF opens a GGUFReader, which takes
        seconds (the tokenizer's arrays are parsed in Python).
        """
        started = time.perf_counter()
        entry = cache_entry(gguf_path, cache_root)
        config = ModelConfig.from_dict(read_entry_json(entry, CONFIG_FILE) or {})
        reader = None
        if config is None:
            import gguf

            reader = gguf.GGUFReader(str(gguf_path))
            config = ModelConfig.from_reader(reader)
            write_entry_json(entry, CONFIG_FILE, config.to_dict())
        loaded = load_weights(gguf_path, dtype, device, cache_root, reader=reader)
        model = cls(config, loaded.tensors).eval()
        load_s = time.perf_counter() - started
        model.weights_info = replace(
            loaded, tensors={}, load_s=load_s, cache_hit=loaded.cache_hit and reader is None
        )
        return model

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    @torch.inference_mode()
    def forward(self, inputs: Any, kv: PagedKvCache) -> torch.Tensor:
        """fp32 logits [N, vocab] for inputs.logit_rows, after writing this step's keys and values to kv."""
        c = self.config
        x = F.embedding(inputs.tokens, self.embedding)
        if c.embedding_scale != 1.0:
            x = x * c.embedding_scale
        tables: dict[tuple[float, float], tuple[torch.Tensor, torch.Tensor]] = {}
        for layer, block in enumerate(self.layers):
            base, factor = c.rope_of(layer)
            if (base, factor) not in tables:
                tables[base, factor] = rope_tables(
                    inputs.positions, c.head_dim, base, factor, self.freq_factors
                )
            x = block(x, tables[base, factor], inputs, kv)
        x = self.norm(x[inputs.logit_rows])
        logits = vocab_logits(x, self.output).float()
        if c.final_logit_softcap:
            logits = torch.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
        return logits
