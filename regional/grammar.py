"""Constrained decoding: what a request's ``response_format`` or tool choice lets the model write next, as a
token mask each step.

llguidance compiles a JSON schema, a regex or a Lark grammar against the model's vocabulary (it is what
`nearshore bench grammar` measured beside xgrammar and outlines-core: about 20 us per mask on Gemma's 262k
tokens, a compile in about 1 ms, and no dependencies of its own). A request's grammar is checked before it
is queued (:func:`check`: a 400 naming the part of the schema at fault); each constrained sequence then
carries its own :class:`Constraint` (``Sequence.constraint``), which gives the mask for its next token and
advances by the token drawn. Its state moves only with the sequence's outputs, so a preemption (which
recomputes the KV of tokens already drawn) and prefix reuse (prompt tokens only) leave it right.

The mask is applied by the engines' samplers: in numpy for the llama.cpp engine (:func:`masked`), as a
batched bitmask tensor on the model's device for the torch engine (``gpu/sampler.py``).
"""

from __future__ import annotations

import ctypes
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

log = logging.getLogger("nearshore.grammar")
GrammarKind = Literal["json_schema", "json_object", "regex", "lark"]

# A schema or grammar above this size is refused before it is compiled: compiling is linear in it, and a
# megabyte of schema takes over a second of the node's CPU (the edge's limit is lower still).
MAX_GRAMMAR_BYTES = 256 * 1024
# JSON as OpenAI's structured outputs write it: compact, keys in the schema's order, no extra whitespace (a
# small model given free whitespace can spend its whole budget on newlines).
_JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """The request's schema or grammar cannot be compiled; the message names the part at fault."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What a request constrains its output to: a JSON schema (its JSON text), any JSON object, a regex
    or a Lark grammar."""

    kind: GrammarKind
    source: str = ""

    @classmethod
    def json_schema(cls, schema: Any) -> GrammarSpec:
        return cls("json_schema", json.dumps(schema, separators=(",", ":"), sort_keys=False))


def _llguidance():
    import llguidance

    return llguidance


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar of ``spec`` (not yet checked)."""
    llg = _llguidance()
    if len(spec.source.encode()) > MAX_GRAMMAR_BYTES:
        raise GrammarError(
            f"the {spec.kind.replace('_', ' ')} is {len(spec.source.encode())} bytes; at most "
            f"{MAX_GRAMMAR_BYTES} are accepted"
        )
    if spec.kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.source)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError("the JSON schema must be an object (or true)")
        try:
            return llg.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"the JSON schema cannot be compiled: {exc}") from None
    if spec.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec.source)
    return llg.LLMatcher.grammar_from_lark(spec.source)


def check(spec: GrammarSpec) -> str:
    """``spec``'s grammar, checked (no vocabulary needed); raises :class:`GrammarError` with the reason,
    as llguidance words it (``Unimplemented keys: ["not"]``, ``Pointer '/nowhere' does not exist``)."""
    grammar = grammar_text(spec)
    is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        what = spec.kind.replace("_", " ")
        raise GrammarError(f"the {what} cannot be compiled: {'; '.join(messages)}")
    return grammar


class Vocabulary:
    """The model's vocabulary as llguidance takes it: built once per loaded model (about 1.7 s for Gemma,
    the last second of it holding the GIL), on first use, shared by every constrained sequence."""

    def __init__(self, model: Any) -> None:
        self._model = model  # regional.llama_model.LlamaModel (the full model or its vocabulary only)
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self.size = model.n_vocab
        self.words = (model.n_vocab + 31) // 32  # int32 words of one row's bitmask

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._build()
            return self._tokenizer

    @property
    def built(self) -> bool:
        return self._tokenizer is not None

    def _build(self) -> Any:
        import llama_cpp

        llg = _llguidance()
        model = self._model
        vocab = model._vocab
        tokens: list[bytes] = []
        for token in range(model.n_vocab):
            piece = model.token_piece(token)
            attr = llama_cpp.llama_vocab_get_attr(vocab, token)
            # llguidance's convention for a control token (never text): its name behind a 0xff byte.
            if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
                piece = b"\xff" + piece
            tokens.append(piece)
        eos = [t for t in range(model.n_vocab) if model.is_end_of_generation(t)]
        tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        return llg.LLTokenizer.from_llamacpp(
            tokens=tokens, vocab_ptr=vocab, tokenize_fptr=tokenize, eos_token=eos
        )

    def constraint(self, grammar: str, trigger: str | None = None) -> Constraint | LazyConstraint:
        """A fresh matcher of a checked grammar, for one sequence (off the event loop: a large grammar
        takes milliseconds to build); with ``trigger``, applied only once the output's text has reached
        it (:class:`LazyConstraint`)."""
        matcher = _llguidance().LLMatcher(self.tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the grammar cannot be compiled: {matcher.get_error()}")
        constraint = Constraint(matcher, self.words)
        return constraint if trigger is None else LazyConstraint(constraint, trigger.encode(), self)

    def token_bytes(self, token: int) -> bytes:
        return self._model.token_bytes(token)


class Constraint:
    """One sequence's grammar state: the mask of its next token, advanced by each token drawn. The mask is
    computed once per state (:meth:`prepare`, on the grammar thread while the model runs) and read by the
    sampler (:meth:`mask`); advancing makes it stale."""

    __slots__ = ("_error", "_fresh", "_mask", "_matcher", "failure", "tokens")

    def __init__(self, matcher: Any, words: int) -> None:
        self._matcher = matcher
        self._mask = np.zeros(words, dtype=np.int32)
        self._fresh = False  # _mask (or _error) is the current state's
        self._error: GrammarError | None = None
        self.tokens = 0  # tokens accepted so far
        # Why the grammar failed its sequence (it allowed no token, or refused the one drawn): the request's
        # own error (a 400), never the engine's.
        self.failure: GrammarError | None = None

    def prepare(self) -> None:
        """Compute the current state's mask if it is not yet; a grammar that allows nothing is kept for
        :meth:`mask` to raise, on the thread that samples."""
        if self._fresh:
            return
        self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)  # drops the GIL
        self._error = None
        if self._matcher.is_error() or not self._mask.any():
            reason = (self._matcher.get_error() or "no token allowed").splitlines()[0]
            if self.tokens == 0:
                self._error = GrammarError(
                    "the grammar allows no output at all (a $ref loop, or bounds no value meets): " + reason
                )
            else:
                self._error = GrammarError(
                    f"constrained decoding failed after {self.tokens} tokens: {reason}"
                )
        self._fresh = True

    def mask(self) -> np.ndarray:
        """The next token's bitmask (bit ``t & 31`` of word ``t >> 5`` set: token ``t`` allowed), valid
        until the next :meth:`advance`; raises :class:`GrammarError` when the grammar allows nothing."""
        self.prepare()
        if self._error is not None:
            self.failure = self._error
            raise self._error
        return self._mask

    def check(self) -> None:
        """The first mask, computed once up front, and the output the grammar forces from there, followed
        on a copy: a grammar that allows nothing, or whose forced output never ends (an object or a list
        that must hold another like it: a required ``$ref`` back into itself), is refused before its
        sequence is queued, not when its first token is drawn (see also :class:`LazyConstraint`)."""
        self.mask()
        probe = self._matcher.deep_copy()
        if not probe.consume_tokens(probe.compute_ff_tokens()) or probe.is_error():
            reason = (probe.get_error() or "forced output refused").splitlines()[0]
            raise GrammarError(
                "the grammar forces an output that never ends (a required $ref back into itself): " + reason
            )

    def advance(self, token: int) -> None:
        self._fresh = False
        if not self._matcher.consume_token(token):
            reason = (self._matcher.get_error() or "token refused").splitlines()[0]
            self.failure = GrammarError(f"constrained decoding failed after {self.tokens} tokens: {reason}")
            raise self.failure
        self.tokens += 1

    @property
    def finished(self) -> bool:
        """The grammar is complete and nothing may follow (the JSON closed): the sequence stops here."""
        return bool(self._matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self._matcher.is_accepting())


class LazyConstraint:
    """A grammar that applies from a trigger on (``auto`` tool choice: free text until the model opens a
    call, then the call's grammar). Before the trigger it masks nothing; the token that completes the
    trigger must end with it, so that the grammar starts on a token boundary: a trigger that ends inside
    a token (text after it in the same token) leaves the output free, and its reader parses what came."""

    __slots__ = ("_tail", "_vocab", "inner", "state", "trigger")

    def __init__(self, inner: Constraint, trigger: bytes, vocab: Vocabulary) -> None:
        self.inner = inner
        self.trigger = trigger
        self._vocab = vocab
        self._tail = b""  # the output's last bytes, as long as the trigger
        self.state: Literal["waiting", "triggered", "free"] = "waiting"

    def prepare(self) -> None:
        if self.state == "triggered":
            self.inner.prepare()

    def mask(self) -> np.ndarray | None:
        return self.inner.mask() if self.state == "triggered" else None

    def advance(self, token: int) -> None:
        if self.state == "triggered":
            self.inner.advance(token)
            return
        if self.state == "free":
            return
        piece = self._vocab.token_bytes(token)
        seen = self._tail + piece
        if seen.endswith(self.trigger):
            self.state = "triggered"
        elif self.trigger in seen:
            self.state = "free"  # it ended inside this token: nothing to start the grammar from
        self._tail = seen[-len(self.trigger) :]

    @property
    def finished(self) -> bool:
        return self.state == "triggered" and self.inner.finished

    @property
    def tokens(self) -> int:
        return self.inner.tokens

    @property
    def failure(self) -> GrammarError | None:
        return self.inner.failure

    def check(self) -> None:
        """The grammar checked up front as :meth:`Constraint.check` does: a grammar that allows nothing, or
        forces an output that never ends, is refused before the sequence is queued, not when the model
        opens a call."""
        self.inner.check()


def allows(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def allowed_bits(mask: np.ndarray, size: int) -> np.ndarray:
    """One uint8 per token (1: allowed), from a row's bitmask."""
    return np.unpackbits(mask.view(np.uint8), bitorder="little")[:size]


def masked(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A copy of ``logits`` with every token the mask forbids at -inf. Branch-free (log of the 0/1 bits),
    so its cost does not depend on how the allowed tokens are spread: a random mask makes ``np.where``
    five times slower over Gemma's vocabulary."""
    with np.errstate(divide="ignore"):
        return logits + np.log(allowed_bits(mask, logits.shape[0]), dtype=np.float32)
