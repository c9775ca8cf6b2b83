"""``bench faults``' cases and its verdict on each answer: pure, no I/O (bench/faults/run.py runs them).

Three replicas of ``nearshore hostile`` stand behind the gateway: ``a`` and ``b`` serve MODEL, ``c`` serves
FALLBACK, MODEL's fallback (for any failure and for a context-length refusal). A few cases need another
layout of regions over the replicas (:data:`LAYOUTS`: four replicas of MODEL, one server under two names,
a second model beside MODEL on the primaries); each layout is a gateway of its own, configured alike.
A case shows its fault on both primaries, per request through the body's ``user``
(``mode:a=503,b=503,c=ok``) or for a while through ``POST /_control``, so that whichever replica a
gateway asks first, it meets the fault; ``c`` answers correctly, so a rescue is always possible except
where the right answer is the error (the content filter). A fault in the middle of a stream is on ``a``
alone (``met_on``): what is measured is whether the answer survives it, so an answer counts only when
``a`` was asked.

Every correct answer is TOKENS tokens of the hostile's WORD. A verdict is one of three outcomes:

- rescued: a full, correct answer (200, every token, a stream ending in ``[DONE]``, no error event);
- advisory: a clean, bounded, typed error that is the right answer (the content filter's 400 passed on, a
  429 whose Retry-After the client can honour);
- failed: anything else: a wrong or cut answer presented as success, an error event mid-stream, a 5xx where
  the fallback could have answered, no answer within the client's timeout or after the deadline.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from dataclasses import dataclass
from typing import Literal

from harness.standins.hostile_answers import WORD
from nearshore.protocol import sse

MODEL = "gemma-3-270m"
FALLBACK = "long-context-model"
SECOND = "second-model"  # beside MODEL on the primaries (the per-model circuits case); FALLBACK its fallback
TOKENS = 60
EXPECTED_TEXT = WORD * TOKENS
PRIMARIES = ("a", "b")


@dataclass(frozen=True)
class Region:
    """One region entry of a gateway's config: its name, the replica it points at, the models it serves."""

    name: str
    replica: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    name: str
    regions: tuple[Region, ...]

    @property
    def replicas(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(region.replica for region in self.regions))


def _layout(name: str, *regions: tuple[str, str, tuple[str, ...]]) -> Layout:
    return Layout(name, tuple(Region(*region) for region in regions))


_ON_C = ("c", "c", (FALLBACK,))
LAYOUTS = {
    layout.name: layout
    for layout in (
        _layout("three", ("a", "a", (MODEL,)), ("b", "b", (MODEL,)), _ON_C),
        _layout("four", *((r, r, (MODEL,)) for r in ("a", "b", "d", "e")), _ON_C),
        _layout("one-url", ("a", "a", (MODEL,)), ("a-again", "a", (MODEL,)), _ON_C),
        _layout("two-models", ("a", "a", (MODEL, SECOND)), ("b", "b", (MODEL, SECOND)), _ON_C),
    )
}
MAX_HONOURED_RETRY_S = 60.0  # a Retry-After longer than this is no advice a client can act on
DEADLINE_GRACE_S = 2.0  # an answer this long past the request deadline was not bounded by it

Outcome = Literal["rescued", "advisory", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("rescued", "advisory", "failed")


@dataclass(frozen=True)
class Case:
    """One fault, sent ``repeats`` times at once (or ``requests`` times, ``spacing_s`` apart, in order)."""

    name: str  # the --cases key
    title: str
    spec: str = ""  # the body's user: mode:<spec>; "{tag}" becomes a new tag per request
    control: str = ""  # else this spec on the ``control_on`` replicas, for ``control_s`` from each batch
    control_on: tuple[str, ...] = PRIMARIES
    control_s: float = 0.0
    unary: bool = True  # also sent non-streamed
    expect: Literal["rescue", "advise"] = "rescue"
    advisory: tuple[int, ...] = ()  # statuses that are the right answer too (429: with a usable Retry-After)
    requests: int = 0  # 0: the run's repeats, all at once
    spacing_s: float = 0.0
    # One faulty replica beside a healthy one: answers go one at a time, and one counts only when this
    # replica received an attempt (the gateway met the fault; else its first pick was the healthy one)
    met_on: str = ""
    layout: str = "three"  # the regions over the replicas (LAYOUTS)
    model: str = MODEL  # what the case's requests ask for
    # A model whose healthy requests (no fault) alternate with the case's, on a time line: they must not
    # hide the case's failures from the circuits (per model), and they must be served too
    interleave: str = ""

    def body_spec(self, tag: str) -> str:
        return self.spec.replace("{tag}", tag)

    def control_spec(self, tag: str) -> str:
        return self.control.replace("{tag}", tag)


def _both(fault: str) -> str:
    return f"a={fault},b={fault},c=ok"


def _one(fault: str) -> str:
    return f"a={fault},b=ok,c=ok"


# Limits of the run (faults.py sets both gateways to them): first token 5 s, stall 5 s, deadline 30 s. The
# issue's "20 s first token" and "30 s stall" are scaled to sit past them.
CASES: tuple[Case, ...] = (
    Case("429", "429 Retry-After 1s", control="429:1", control_s=0.9, advisory=(429,)),
    Case("429-bare", "429 no Retry-After", control="429-bare", control_s=0.9, unary=False),
    Case("500-once", "500 once", spec="a=500-once:{tag}a,b=500-once:{tag}b,c=ok", unary=False),
    Case("503", "503 for good", spec=_both("503")),
    Case("reset", "connection reset", spec=_both("reset")),
    Case("silence", "silence (90s no byte)", spec=_both("slow-first-token:90")),
    Case("slow-first", "first token at 20s", spec=_both("slow-first-event:20")),
    # Mid-stream faults on one replica: the other answers, or continues the answer, correctly (on both,
    # the continuation would meet the same fault again at its own token 20 or 40)
    Case("cut", "a: cut at 40 of 60", spec=_one("cut-at:40:60"), met_on="a"),
    Case("stall", "a: stall 12s at 20", spec=_one("stall-at:20:12"), met_on="a"),
    Case("malformed", "a: malformed at 10", spec=_one("malformed-chunk:10"), met_on="a"),
    # Failover bounded in time (issue 34): both primaries stall mid-answer, each after 20 tokens: the
    # fallback continues what two replicas of the model failed; both send their head and never a token:
    # one first-byte budget, not a timeout each, before the fallback answers.
    Case("stall-chain", "a, b: stall 12s at 20", spec=_both("stall-at:20:12"), unary=False),
    Case("no-token", "a, b: head, no token", spec=_both("hang-after-headers"), unary=False),
    Case("no-done", "no [DONE]", spec="*=no-done", unary=False),
    Case("context", "context length 400", spec=_both("context-length")),
    Case("filter", "content filter 400", spec=_both("content-filter"), expect="advise", advisory=(400,)),
    # Four replicas of MODEL all failing: the attempts must leave the fallback its turn.
    Case("four", "4 replicas all 503", spec="a=503,b=503,d=503,e=503,c=ok", layout="four"),
    # One server under two region names, asking not to be asked for 2 s: not asked again under the other.
    Case(
        "one-url",
        "one URL twice: 429 2s",
        control="429:2",
        control_on=("a",),
        control_s=2.5,
        layout="one-url",
        advisory=(429,),
    ),
    # SECOND dead on both primaries while MODEL is healthy there: its failures open its own circuits.
    Case(
        "per-model",
        "2nd model dead, 1st ok",
        spec="a=503,b=503,c=ok",
        layout="two-models",
        model=SECOND,
        interleave=MODEL,
        unary=False,
        requests=12,
        spacing_s=0.25,
    ),
    Case(
        "down",
        "primary a down 20s",
        control="down:20:{tag}",
        control_on=("a",),
        control_s=25.0,
        unary=False,
        requests=15,
        spacing_s=20.0 / 15,
    ),
)
BY_NAME = {case.name: case for case in CASES}


def pick(names: str) -> list[Case]:
    """The cases a comma-separated list names ("" or "all": every one), in the table's order."""
    if names.strip() in ("", "all"):
        return list(CASES)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown cases {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [case for case in CASES if case.name in wanted]


@dataclass(frozen=True)
class Observation:
    """What one client saw: the status (None: no response at all), the body as far as it came, and why it
    stopped early ("" when it ended normally)."""

    stream: bool
    status: int | None
    body: bytes
    seconds: float
    retry_after: str | None = None
    broke: str = ""  # the client's exception, e.g. "TimeoutError" or "ClientPayloadError: ..."


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    detail: str  # what the client got, in a few words


@dataclass(frozen=True)
class StreamRead:
    text: str
    content_events: int
    done: bool  # the last event was [DONE]
    errors: list[str]  # error events' codes (or messages)
    bad_events: int  # data lines that are not JSON
    after_done: int  # events after [DONE]


def read_stream(body: bytes) -> StreamRead:
    """The answer an SSE body carries, read as a client SDK reads it (comments and blank lines skipped)."""
    text, content, errors, bad, after = [], 0, [], 0, 0
    done = False
    for data in sse.parse(body):  # an unfinished last event included
        data = data.strip()
        if not data:
            continue
        if done:
            after += 1
            continue
        if data == sse.DONE_DATA:
            done = True
            continue
        try:
            event = json.loads(data)
        except ValueError:
            bad += 1
            continue
        if not isinstance(event, dict):
            bad += 1
            continue
        if "error" in event:
            errors.append(_error_name(event["error"]))
            continue
        pieces = [_content(choice) for choice in event.get("choices") or [] if isinstance(choice, dict)]
        if any(pieces):
            content += 1
            text.extend(pieces)
    return StreamRead("".join(text), content, done, errors, bad, after)


def _content(choice: dict) -> str:
    delta = choice.get("delta")
    piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return piece if isinstance(piece, str) else ""


def _error_name(error: object) -> str:
    if not isinstance(error, dict):
        return str(error)[:60]
    return str(error.get("code") or error.get("type") or error.get("message") or "error")[:60]


def _typed_error(body: bytes) -> str | None:
    """The error's code (or type) when the body is an OpenAI-shaped error, else None."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    return _error_name(error)


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _unary_text(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
        choice = payload["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return text if isinstance(text, str) else None


def _tokens(text: str) -> int:
    return text.count(WORD.strip())


def _answer(obs: Observation) -> tuple[bool, str]:
    """Whether a 200 is the full, correct answer, and what it was."""
    if not obs.stream:
        text = _unary_text(obs.body)
        if text is None:
            return False, "200, a body that is no completion"
        if text != EXPECTED_TEXT:
            return False, f"200, {_tokens(text)}/{TOKENS} tokens"
        return (True, "200 full") if not obs.broke else (False, f"200 full, then {obs.broke}")
    read = read_stream(obs.body)
    problems = []
    if read.text != EXPECTED_TEXT:
        problems.append(f"{_tokens(read.text)}/{TOKENS} tokens")
    if read.errors:
        problems.append(f"error event {read.errors[0]}")
    if read.bad_events:
        problems.append(f"{read.bad_events} bad event(s) relayed")
    if not read.done:
        problems.append("no [DONE]")
    if obs.broke:
        problems.append(obs.broke)
    if problems:
        return False, "200, " + ", ".join(problems)
    return True, "200 full, [DONE]"


def classify(case: Case, obs: Observation, deadline_s: float) -> Verdict:
    """The outcome of one answer to ``case``; ``deadline_s`` is the gateway's request deadline."""
    if obs.status is None:
        return Verdict("failed", f"no answer ({obs.broke or 'nothing'}) after {obs.seconds:.0f}s")
    late = obs.seconds > deadline_s + DEADLINE_GRACE_S
    if obs.status == 200:
        whole, detail = _answer(obs)
        if late:
            return Verdict("failed", f"{detail} after {obs.seconds:.0f}s, past the {deadline_s:g}s deadline")
        if case.expect == "advise":
            return Verdict("failed", f"{detail}: answered what the provider refused")
        return Verdict("rescued" if whole else "failed", detail)
    code = _typed_error(obs.body)
    detail = f"{obs.status} {code or 'untyped body'}"
    if obs.status == 429 and obs.retry_after is not None:
        detail += f", Retry-After {obs.retry_after}"
    if code is None or obs.status not in case.advisory or late:
        return Verdict("failed", detail + (f" after {obs.seconds:.0f}s" if late else ""))
    if obs.status == 429:
        wait = retry_after_s(obs.retry_after)
        if wait is None or wait > MAX_HONOURED_RETRY_S:
            return Verdict("failed", detail + " (no Retry-After to honour)")
    return Verdict("advisory", detail)
