"""A thin, checked wrapper over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

Everything ctypes-shaped stays in this module: the engine above it speaks in Python lists and numpy rows.
Every return code is checked, because llama-cpp-python's log mapping can hide llama.cpp's own errors.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp
import numpy as np

from regional.model_facts import remembered

log = logging.getLogger("nearshore.llama")

_backend_lock = threading.Lock()
_backend_ready = False


class LlamaError(RuntimeError):
    pass


class KvCacheFull(LlamaError):
    """llama_decode found no room for the batch; nothing was applied, so the step can be retried."""


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            _backend_ready = True


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 cont. Only warnings and errors reach our log.
    if level in (3, 4):
        log.log(
            logging.WARNING if level == 3 else logging.ERROR, "%s", text.decode(errors="replace").rstrip()
        )


@dataclass(frozen=True, slots=True)
class ContextSettings:
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_threads: int


class LlamaModel:
    """One loaded model with one context whose KV pool all sequences share (``kv_unified``)."""

    def __init__(
        self,
        path: str,
        settings: ContextSettings,
        progress: Callable[[float], None] | None = None,
        vocab_only: bool = False,
    ) -> None:
        _init_backend()
        self.path = path
        self.settings = settings
        self._ctx = None
        self._batch = None
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.vocab_only = vocab_only
        if progress is not None:
            # Keep a reference: ctypes callbacks are freed with their Python object.
            self._progress_cb = llama_cpp.llama_progress_callback(
                lambda value, _user: progress(value) or True
            )
            mparams.progress_callback = self._progress_cb
        self._model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not self._model:
            raise LlamaError(f"llama.cpp could not load the model file {path}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self._model)
        # One buffer per thread: the engine's worker and the event loop (naming tokens) both render pieces.
        self._piece_bufs = threading.local()
        if vocab_only:
            return
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = settings.n_ctx
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = settings.n_seq_max
        cparams.n_threads = settings.n_threads
        cparams.n_threads_batch = settings.n_threads
        # One pool for all sequences, so a shared prompt prefix can be referenced by several of them;
        # the full sliding-window cache, so trimming a sequence back to a shared prefix is safe.
        cparams.kv_unified = True
        cparams.swa_full = True
        cparams.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise LlamaError(f"llama.cpp could not create a context (n_ctx={settings.n_ctx})")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        self._batch = llama_cpp.llama_batch_init(settings.n_batch, 0, 1)

    # --- vocabulary -----------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode()
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        if n < 0:
            raise LlamaError(f"tokenize failed ({n})")
        return list(buf[:n])

    def bos_prefix(self) -> list[int]:
        """What the model wants before a prompt: BOS, or nothing."""
        adds_bos = llama_cpp.llama_vocab_get_add_bos(self._vocab)
        return [llama_cpp.llama_vocab_bos(self._vocab)] if adds_bos else []

    def longest_token_bytes(self) -> int:
        """The most bytes of text one token stands for, control tokens' text included (a scan of the
        vocabulary: about 0.4 s for Gemma's 262k entries, so it is done once per model file and kept)."""
        return remembered(self.path, "longest_token_bytes", self._scan_longest_token_bytes)

    def _scan_longest_token_bytes(self) -> int:
        buf = ctypes.create_string_buffer(1024)
        longest = 1
        for token in range(self.n_vocab):
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            longest = max(longest, abs(n))  # negative: the piece needs -n bytes (longer than the buffer)
        return longest

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for; special tokens (end of turn, ...) render as nothing."""
        return self._piece(token, special=False)

    def token_piece(self, token: int) -> bytes:
        """The bytes a token stands for, control tokens spelled out (``<end_of_turn>``)."""
        return self._piece(token, special=True)

    def _piece(self, token: int, special: bool) -> bytes:
        buf = getattr(self._piece_bufs, "buf", None)
        if buf is None:
            buf = self._piece_bufs.buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode(errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        text = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return text.decode(errors="replace") if text else ""

    def special_tokens(self) -> dict[str, str]:
        return {
            "bos_token": self.token_text(llama_cpp.llama_vocab_bos(self._vocab)),
            "eos_token": self.token_text(llama_cpp.llama_vocab_eos(self._vocab)),
        }

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode() if raw else None

    # --- decoding -------------------------------------------------------------------------------------

    def decode(
        self, tokens: list[int], positions: list[int], seq_ids: list[int], want_logits: list[bool]
    ) -> None:
        """Run one llama_decode over the given tokens (at most n_batch of them)."""
        n = len(tokens)
        if n == 0 or n > self.settings.n_batch:
            raise LlamaError(f"a batch must hold 1..{self.settings.n_batch} tokens, got {n}")
        batch = self._batch
        batch.n_tokens = n
        for i in range(n):
            batch.token[i] = tokens[i]
            batch.pos[i] = positions[i]
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq_ids[i]
            batch.logits[i] = want_logits[i]
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc == 1:
            raise KvCacheFull("llama_decode: no room in the KV cache for this batch")
        if rc != 0:
            reason = {1: "no room in the KV cache", 2: "aborted", -1: "invalid batch"}.get(
                rc, "internal error"
            )
            raise LlamaError(f"llama_decode failed: {reason} (rc={rc})")

    def logits(self, batch_index: int) -> np.ndarray:
        """The logits row of the batch's ``batch_index``-th token; valid until the next decode."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        if not ptr:
            raise LlamaError(f"no logits for batch index {batch_index}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    # --- KV memory ------------------------------------------------------------------------------------

    def forget(self, seq_id: int, from_pos: int = 0) -> None:
        """Drop the sequence's cells at positions >= from_pos."""
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq_id, from_pos, -1):
            raise LlamaError(f"could not trim sequence {seq_id} to {from_pos} tokens")

    def share_prefix(self, src: int, dst: int, length: int) -> None:
        """Let sequence ``dst`` use the cells of ``src``'s first ``length`` positions (no copy)."""
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, 0, length)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None
