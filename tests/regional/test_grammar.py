"""The grammar layer of constrained decoding (regional/grammar.py) and the samplers' masks (issue 21): checks
that name the part at fault, a constraint that walks a document token by token, masks applied alike by
numpy and torch, and a step's rows each masked by their own grammar."""

from __future__ import annotations

import json

import numpy as np
import pytest

from regional.engine import GenerationRequest, SamplingParams
from regional.grammar import (
    MAX_GRAMMAR_BYTES,
    GrammarError,
    GrammarSpec,
    Vocabulary,
    allowed_bits,
    allows,
    check,
    masked,
)
from regional.llama_model import LlamaModel
from regional.sampler import TokenSampler


def walk(vocabulary: Vocabulary, model: LlamaModel, spec: GrammarSpec, text: str):
    constraint = vocabulary.constraint(check(spec))
    for token in model.tokenize(text, add_special=False):
        assert allows(constraint.mask(), token), model.token_piece(token)
        constraint.advance(token)
    return constraint


# --- checks ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "names"),
    [
        ({"type": "objekt"}, "objekt"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "/nowhere"),
        ({"type": "string", "pattern": "(unclosed"}, "unclosed"),
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems"),
        ({"type": "string", "format": "no-such-format"}, "no-such-format"),
    ],
)
def test_a_schema_that_cannot_be_compiled_is_refused_naming_the_part(schema: dict, names: str):
    with pytest.raises(GrammarError, match="cannot be compiled") as caught:
        check(GrammarSpec.json_schema(schema))
    assert names in str(caught.value)


class _NoCompiler:
    """Stands in for llguidance where a test proves nothing is compiled: any use of it fails the test."""

    def __getattr__(self, name: str):
        raise AssertionError(f"llguidance.{name} was used: the grammar reached the compiler")


def test_an_oversized_or_malformed_grammar_is_refused_before_compiling(monkeypatch: pytest.MonkeyPatch):
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
    with monkeypatch.context() as patched:  # refused by its size, never handed to the compiler
        patched.setattr("regional.grammar._llguidance", lambda: _NoCompiler())
        with pytest.raises(GrammarError, match=f"at most {MAX_GRAMMAR_BYTES}"):
            check(GrammarSpec.json_schema(huge))
    with pytest.raises(GrammarError, match="not JSON"):
        check(GrammarSpec("json_schema", "{not json"))
    with pytest.raises(GrammarError, match="must be an object"):
        check(GrammarSpec("json_schema", "[1, 2]"))
    with pytest.raises(GrammarError):
        check(GrammarSpec("regex", "(a|"))


# --- a constraint, token by token -----------------------------------------------------------------------


def test_a_document_of_the_schema_walks_to_the_end_and_the_grammar_finishes(vocabulary, model):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "people": {"type": "integer"}},
        "required": ["city", "people"],
        "additionalProperties": False,
    }
    constraint = walk(
        vocabulary, model, GrammarSpec.json_schema(schema), '{"city":"Lagos","people":15388000}'
    )
    assert constraint.finished and constraint.tokens > 5


def test_an_unfinished_document_allows_only_what_may_follow(vocabulary, model):
    spec = GrammarSpec.json_schema(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    constraint = walk(vocabulary, model, spec, '{"n":4')
    assert not constraint.finished
    allowed = np.flatnonzero(allowed_bits(constraint.mask(), vocabulary.size))
    pieces = {model.token_piece(int(t)) for t in allowed}
    assert b"}" in pieces and b"2" in pieces
    assert b'"' not in pieces and b"a" not in pieces
    assert not any(model.is_end_of_generation(int(t)) for t in allowed)  # no end inside the JSON


def test_a_regex_and_any_json_object(vocabulary, model):
    assert walk(vocabulary, model, GrammarSpec("regex", r"\+234[0-9]{10}"), "+2348012345678").finished
    constraint = walk(vocabulary, model, GrammarSpec("json_object"), '{"a":[1,2,{"b":null}]}')
    assert constraint.finished


def test_the_first_mask_of_a_ref_loop_says_it_allows_nothing(vocabulary):
    loop = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
    constraint = vocabulary.constraint(check(GrammarSpec.json_schema(loop)))
    with pytest.raises(GrammarError, match=r"allows no output at all.*NoExtensionBias"):
        constraint.mask()


# --- masks in the samplers ------------------------------------------------------------------------------


def random_mask(rng: np.random.Generator, vocab: int, share: float) -> np.ndarray:
    bits = (rng.random(vocab) < share).astype(np.uint8)
    padded = np.zeros(((vocab + 31) // 32) * 32, dtype=np.uint8)
    padded[:vocab] = bits
    return np.packbits(padded, bitorder="little").view(np.int32)


def test_masked_logits_keep_the_allowed_and_forbid_the_rest():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(1000).astype(np.float32)
    mask = random_mask(rng, 1000, 0.1)
    out = masked(logits, mask)
    allowed = allowed_bits(mask, 1000).astype(bool)
    assert np.array_equal(out[allowed], logits[allowed])
    assert np.all(np.isneginf(out[~allowed]))
    assert [allows(mask, t) for t in range(1000)] == list(allowed)


def test_torch_applies_the_same_masks_row_by_row():
    torch = pytest.importorskip("torch")
    from gpu.sampler import apply_token_bitmask

    rng = np.random.default_rng(2)
    logits = rng.standard_normal((3, 1000)).astype(np.float32)
    masks = np.stack([random_mask(rng, 1000, share) for share in (0.05, 0.5, 1.0)])
    out = apply_token_bitmask(torch.from_numpy(logits), torch.from_numpy(masks)).numpy()
    for row in range(3):
        assert np.array_equal(out[row], masked(logits[row], masks[row]))
    # The device path (shift and mask; here taken by float64 logits) masks alike; the input is left as it was.
    wide = apply_token_bitmask(torch.from_numpy(logits).double(), torch.from_numpy(masks)).float().numpy()
    assert np.array_equal(wide, out) and not np.isinf(logits).any()


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)])
def test_the_sampler_draws_only_allowed_tokens_and_greedy_takes_the_best_allowed(params):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(5000).astype(np.float32)
    mask = random_mask(rng, 5000, 0.02)
    allowed = np.flatnonzero(allowed_bits(mask, 5000))
    sampler = TokenSampler(params)
    drawn = [sampler.sample(logits, mask) for _ in range(50)]
    assert all(allows(mask, t) for t in drawn)
    if params.greedy:
        assert set(drawn) == {int(allowed[np.argmax(logits[allowed])])}
        # The likeliest token allowed: the short path gives what the full mask gives.
        best = int(np.argmax(logits))
        everything = np.full_like(mask, -1)
        assert TokenSampler(params).sample(logits, everything) == best


def test_a_steps_rows_are_each_masked_by_their_own_grammar(vocabulary, model):
    from regional.llama_engine import LlamaCppEngine
    from regional.sequence import Sequence
    from regional.step_plan import StepPlan

    greedy = SamplingParams(temperature=0.0)
    logits = np.random.default_rng(4).standard_normal((3, vocabulary.size)).astype(np.float32)

    class Rows:
        def row(self, batch_row: int) -> np.ndarray:
            return logits[batch_row]

    def sequence(name: str, spec: GrammarSpec | None) -> Sequence:
        request = GenerationRequest(name, [2], 8, greedy)
        constraint = vocabulary.constraint(check(spec)) if spec is not None else None
        return Sequence(request, 0.0, TokenSampler(greedy), constraint=constraint)

    free = sequence("free", None)
    digits = sequence("digits", GrammarSpec("regex", "[0-9]+"))
    braces = sequence("braces", GrammarSpec("json_object"))
    plan = StepPlan(samples=[(free, 0), (digits, 1), (braces, 2)])
    engine = LlamaCppEngine.__new__(LlamaCppEngine)  # _sample reads nothing of the engine's own
    tokens, _logprobs, failures = engine._sample(plan, Rows())
    assert not failures
    assert tokens[0] == int(np.argmax(logits[0]))
    assert model.token_piece(tokens[1]).isdigit()
    assert model.token_piece(tokens[2]).startswith(b"{")


def test_checked_grammars_are_plain_json_text():
    grammar = check(GrammarSpec.json_schema({"type": "object"}))
    assert isinstance(json.loads(grammar), dict)


def test_logit_bias_moves_the_same_tokens_in_numpy_and_torch():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(1000).astype(np.float32)
    bias = ((7, 100.0), (int(np.argmax(logits)), -100.0))
    greedy = SamplingParams(temperature=0.0, logit_bias=bias)
    assert TokenSampler(greedy).sample(logits) == 7
    torch = pytest.importorskip("torch")
    from gpu.sampler import sample
    from gpu.sampling_rows import SamplingRow

    rows = [SamplingRow(greedy, seed=0), SamplingRow(SamplingParams(temperature=0.0), seed=0)]
    drawn = sample(torch.from_numpy(np.stack([logits, logits])), rows).tokens
    assert drawn == [7, int(np.argmax(logits))]  # the bias is its row's alone
