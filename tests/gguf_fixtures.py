"""Tiny random-weight GGUFs that llama.cpp loads: the Llama / Qwen2 family has no real file on this machine.

F32 tensors, an SPM ("llama") vocabulary with byte tokens so llama.cpp's tokenizer accepts it, and weights
scaled so that next-token distributions are peaked (top-1 ties would make agreement checks flaky).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
FFN = 128
LAYERS = 2
CONTEXT = 256


def _vocab() -> tuple[list[str], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # unknown, control, control
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # byte
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += letters + ["\u2581" + c for c in letters]
    types += [1] * (2 * len(letters))  # normal
    return tokens, types


def write_tiny_gguf(path: Path, arch: str = "llama", seed: int = 0, tied: bool = False) -> Path:
    """A 2-layer model of `arch` ("llama" or "qwen2"; any other name writes metadata only)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, types = _vocab()
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10_000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def matrix(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    if arch in ("llama", "qwen2"):
        writer.add_tensor("token_embd.weight", rng.standard_normal((vocab, HIDDEN)).astype(np.float32))
        writer.add_tensor("output_norm.weight", norm(HIDDEN))
        if not tied:
            writer.add_tensor("output.weight", matrix(vocab, HIDDEN, gain=4.0))
        for layer in range(LAYERS):
            p = f"blk.{layer}."
            writer.add_tensor(p + "attn_norm.weight", norm(HIDDEN))
            writer.add_tensor(p + "attn_q.weight", matrix(HEADS * HEAD_DIM, HIDDEN, gain=2.0))
            writer.add_tensor(p + "attn_k.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN, gain=2.0))
            writer.add_tensor(p + "attn_v.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN))
            if arch == "qwen2":
                for name, size in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
                    bias = (0.5 * rng.standard_normal(size * HEAD_DIM)).astype(np.float32)
                    writer.add_tensor(p + f"attn_{name}.bias", bias)
            writer.add_tensor(p + "attn_output.weight", matrix(HIDDEN, HEADS * HEAD_DIM))
            writer.add_tensor(p + "ffn_norm.weight", norm(HIDDEN))
            writer.add_tensor(p + "ffn_gate.weight", matrix(FFN, HIDDEN))
            writer.add_tensor(p + "ffn_up.weight", matrix(FFN, HIDDEN))
            writer.add_tensor(p + "ffn_down.weight", matrix(HIDDEN, FFN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
