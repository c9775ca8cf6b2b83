"""``nearshore bench grammar``: what constraining decoding to a JSON schema costs per token, for each grammar
engine that is installed, on the embedded model's vocabulary (Gemma's 262k tokens).

For every schema: the compile time (schema to a matcher ready for its first mask), then, walking the tokens
of a valid document of that schema (the model's own tokenization of it), the time to compute each next
token's mask and to advance by the token. Every engine walks the same tokens. Only llguidance is a project
dependency (it is what the engines use); xgrammar and outlines-core are measured when importable
(``PYTHONPATH`` to a folder they are installed in), so the choice can be re-checked.
"""

from __future__ import annotations

import ctypes
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.stats import percentile

# (name, schema, a document of it). Varied on purpose: flat, nested, arrays, enums, bounds, optional parts.
SCHEMAS: list[tuple[str, dict[str, Any], Any]] = [
    ("any object", {"type": "object"}, {"city": "Lagos", "population": 15388000, "coastal": True}),
    (
        "flat",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "email": {"type": "string"},
            },
            "required": ["name", "age", "email"],
            "additionalProperties": False,
        },
        {"name": "Adaeze Okafor", "age": 34, "email": "adaeze@example.ng"},
    ),
    (
        "nested",
        {
            "type": "object",
            "properties": {
                "order": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "customer": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
                            "required": ["name", "city"],
                        },
                        "total": {"type": "number"},
                    },
                    "required": ["id", "customer", "total"],
                }
            },
            "required": ["order"],
        },
        {"order": {"id": "A-1043", "customer": {"name": "Tunde", "city": "Ibadan"}, "total": 12500.5}},
    ),
    (
        "array of objects",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                        "required": ["sku", "qty"],
                    },
                    "minItems": 1,
                }
            },
            "required": ["items"],
        },
        {"items": [{"sku": "rice-5kg", "qty": 2}, {"sku": "oil-1l", "qty": 3}, {"sku": "yam", "qty": 1}]},
    ),
    (
        "enums and bounds",
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "neutral", "negative"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            "required": ["sentiment", "confidence", "stars"],
        },
        {"sentiment": "positive", "confidence": 0.92, "stars": 4},
    ),
    (
        "optional fields",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "summary": {"type": ["string", "null"]},
            },
            "required": ["title"],
        },
        {"title": "Market prices this week", "tags": ["food", "lagos"], "summary": None},
    ),
    (
        "recursive $ref",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["name", "children"],
                }
            },
            "$ref": "#/$defs/node",
        },
        {"name": "root", "children": [{"name": "a", "children": []}, {"name": "b", "children": []}]},
    ),
    (
        "patterns, formats, anyOf",
        {
            "type": "object",
            "properties": {
                "phone": {"type": "string", "pattern": "^\\+234[0-9]{10}$"},
                "day": {"type": "string", "format": "date"},
                "amount": {"anyOf": [{"type": "integer"}, {"type": "string", "enum": ["unknown"]}]},
            },
            "required": ["phone", "day", "amount"],
        },
        {"phone": "+2348012345678", "day": "2024-03-14", "amount": "unknown"},
    ),
]


@dataclass(frozen=True, slots=True)
class Vocab:
    """The model's vocabulary as grammar engines take it."""

    pieces: list[bytes]  # token id -> its bytes (control tokens as their text)
    control: list[bool]  # token id -> a control token (never text)
    eos: list[int]  # end-of-generation tokens
    tokenize: Callable[[str], list[int]]  # text -> tokens, no BOS
    native: Any  # the llama.cpp model, for engines that take its vocabulary directly


@dataclass(slots=True)
class Walk:
    compile_ms: float = 0.0
    mask_us: list[float] = field(default_factory=list)
    advance_us: list[float] = field(default_factory=list)
    ok: bool = True
    error: str = ""


class Engine:
    name = ""

    def compile(self, schema: dict[str, Any]) -> Any: ...

    def fill_mask(self, matcher: Any, out: np.ndarray) -> None: ...

    def advance(self, matcher: Any, token: int) -> bool: ...


def load_vocab(model_path: str) -> Vocab:
    import llama_cpp

    from regional.llama_model import ContextSettings, LlamaModel

    model = LlamaModel(model_path, ContextSettings(0, 0, 1, 1), vocab_only=True)
    vocab = model._vocab
    pieces, control = [], []
    for token in range(model.n_vocab):
        pieces.append(model.token_piece(token))
        attr = llama_cpp.llama_vocab_get_attr(vocab, token)
        control.append(bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL))
    eos = [t for t in range(model.n_vocab) if model.is_end_of_generation(t)]
    return Vocab(pieces, control, eos, lambda text: model.tokenize(text, add_special=False), model)


class Llguidance(Engine):
    name = "llguidance"

    def __init__(self, vocab: Vocab) -> None:
        import llama_cpp
        import llguidance

        tokens = [b"\xff" + p if c else p for p, c in zip(vocab.pieces, vocab.control, strict=True)]
        fptr = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        self._tokenizer = llguidance.LLTokenizer.from_llamacpp(
            tokens=tokens, vocab_ptr=vocab.native._vocab, tokenize_fptr=fptr, eos_token=vocab.eos
        )
        self._llg = llguidance

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self._llg.LLMatcher.grammar_from_json_schema(schema)
        matcher = self._llg.LLMatcher(self._tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def fill_mask(self, matcher: Any, out: np.ndarray) -> None:
        matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))


class Xgrammar(Engine):
    name = "xgrammar"

    def __init__(self, vocab: Vocab) -> None:
        import xgrammar

        info = xgrammar.TokenizerInfo(
            vocab.pieces, xgrammar.VocabType.RAW, vocab_size=len(vocab.pieces), stop_token_ids=vocab.eos
        )
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self._xgr = xgrammar

    def compile(self, schema: dict[str, Any]) -> Any:
        return self._xgr.GrammarMatcher(self._compiler.compile_json_schema(json.dumps(schema)))

    def fill_mask(self, matcher: Any, out: np.ndarray) -> None:
        import torch

        matcher.fill_next_token_bitmask(torch.from_numpy(out[None, :]))

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))


class OutlinesCore(Engine):
    name = "outlines-core"

    def __init__(self, vocab: Vocab) -> None:
        import outlines_core

        by_piece: dict[bytes, list[int]] = {}
        eos = vocab.eos[0]
        for token, (piece, is_control) in enumerate(zip(vocab.pieces, vocab.control, strict=True)):
            if not is_control and piece and token not in vocab.eos:
                by_piece.setdefault(piece, []).append(token)
        self._vocabulary = outlines_core.Vocabulary(eos, by_piece)
        self._oc = outlines_core

    def compile(self, schema: dict[str, Any]) -> Any:
        regex = self._oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self._oc.Guide(self._oc.Index(regex, self._vocabulary))

    def fill_mask(self, matcher: Any, out: np.ndarray) -> None:
        matcher.write_mask_into(out.ctypes.data, out.size, out.itemsize)

    def advance(self, matcher: Any, token: int) -> bool:
        matcher.advance(token)
        return True


ENGINES: list[type[Engine]] = [Llguidance, Xgrammar, OutlinesCore]


def walk(engine: Engine, schema: dict[str, Any], tokens: list[int], vocab_size: int) -> Walk:
    result = Walk()
    mask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
    started = time.perf_counter()
    try:
        matcher = engine.compile(schema)
    except Exception as exc:  # an engine that cannot compile it is a result, not a crash
        return Walk(ok=False, error=f"{type(exc).__name__}: {exc}"[:120])
    result.compile_ms = (time.perf_counter() - started) * 1000
    for token in tokens:
        t0 = time.perf_counter()
        engine.fill_mask(matcher, mask)
        t1 = time.perf_counter()
        if not (mask[token >> 5] >> (token & 31)) & 1:
            return Walk(result.compile_ms, result.mask_us, result.advance_us, False, f"token {token} masked")
        if not engine.advance(matcher, token):
            return Walk(result.compile_ms, result.mask_us, result.advance_us, False, f"token {token} refused")
        t2 = time.perf_counter()
        result.mask_us.append((t1 - t0) * 1e6)
        result.advance_us.append((t2 - t1) * 1e6)
    return result


def run(model_path: str, repeats: int = 3) -> list[dict[str, Any]]:
    vocab = load_vocab(model_path)
    rows: list[dict[str, Any]] = []
    for kind in ENGINES:
        started = time.perf_counter()
        try:
            engine = kind(vocab)
        except ImportError as exc:
            rows.append({"engine": kind.name, "installed": False, "error": str(exc)})
            continue
        setup_s = time.perf_counter() - started
        for name, schema, document in SCHEMAS:
            tokens = vocab.tokenize(json.dumps(document))
            walks = [walk(engine, schema, tokens, len(vocab.pieces)) for _ in range(repeats)]
            masks = [us for w in walks for us in w.mask_us]
            advances = [us for w in walks for us in w.advance_us]
            rows.append(
                {
                    "engine": kind.name,
                    "installed": True,
                    "setup_s": round(setup_s, 2),
                    "schema": name,
                    "tokens": len(tokens),
                    "ok": all(w.ok for w in walks),
                    "error": next((w.error for w in walks if not w.ok), ""),
                    # The first walk's: engines may cache a compiled schema, and a new one is what matters.
                    "compile_ms": round(walks[0].compile_ms, 1) if masks else None,
                    "mask_us_p50": round(percentile(masks, 50), 1) if masks else None,
                    "mask_us_p95": round(percentile(masks, 95), 1) if masks else None,
                    "mask_us_mean": round(float(np.mean(masks)), 1) if masks else None,
                    "advance_us_p50": round(percentile(advances, 50), 1) if advances else None,
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| engine | schema | tokens | ok | compile ms | mask us p50 | p95 | mean | advance us p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["installed"]:
            lines.append(f"| {r['engine']} | not installed ({r['error']}) | | | | | | | |")
            continue
        ok = "yes" if r["ok"] else f"no: {r['error']}"
        lines.append(
            f"| {r['engine']} | {r['schema']} | {r['tokens']} | {ok} | {r['compile_ms']} "
            f"| {r['mask_us_p50']} | {r['mask_us_p95']} | {r['mask_us_mean']} | {r['advance_us_p50']} |"
        )
    setups = {r["engine"]: r["setup_s"] for r in rows if r["installed"]}
    lines.append("")
    lines.append("tokenizer setup: " + ", ".join(f"{k} {v} s" for k, v in setups.items()))
    return "\n".join(lines)
