"""``bench faults``' printed report: a row per case and kind, a column per gateway (outcome, median time to
answer, attempts the replicas received), the totals, the ratios of median times where both rescued, and
what the client got wherever an answer was not a rescue."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from bench.faults.cases import LAYOUTS, OUTCOMES, Case, Verdict


@dataclass
class VariantResult:
    """One case, streamed or not, through one gateway."""

    case: Case
    stream: bool
    verdicts: list[Verdict] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)  # completions requests each replica received
    unmet: int = 0  # answers not counted: the faulty replica was not asked (Case.met_on)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")


@dataclass
class GatewayRun:
    name: str
    results: list[VariantResult] = field(default_factory=list)
    error: str = ""  # why it did not run, when it did not


_CASE_W, _KIND_W, _CELL_W = 24, 7, 42
_LETTER = {"rescued": "R", "advisory": "A", "failed": "F"}


def _kind(result: VariantResult) -> str:
    return "stream" if result.stream else "unary"


def outcome_cell(result: VariantResult) -> str:
    """``rescued 3/3`` when every answer had one outcome, else ``2R 1F``."""
    counts = Counter(v.outcome for v in result.verdicts)
    total = len(result.verdicts)
    if not total:
        return "none met"  # Case.met_on: the faulty replica was never asked
    if len(counts) == 1:
        ((outcome, n),) = counts.items()
        return f"{outcome} {n}/{total}"
    return " ".join(f"{counts[o]}{_LETTER[o]}" for o in OUTCOMES if counts[o])


def _seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}s" if value < 10 else f"{value:.1f}s"


def _attempts(result: VariantResult) -> str:
    """Each replica of the case's layout and the attempts it received: ``a3 b3 c6``."""
    return " ".join(f"{name}{result.attempts.get(name, 0)}" for name in LAYOUTS[result.case.layout].replicas)


def _cell(result: VariantResult | None) -> str:
    if result is None:
        return f"{'(not run)':<{_CELL_W}}"
    return f"{outcome_cell(result):<14}{_seconds(result.median_s):>8}  {_attempts(result):<18}"


def progress(gateway: str, result: VariantResult) -> str:
    return f"  {gateway}: {result.case.title} ({_kind(result)}): {_cell(result).strip()}"


def _rows(runs: list[GatewayRun]) -> list[tuple[str, str, list[VariantResult | None]]]:
    """The (case, kind) rows in the order they ran, each with every gateway's result (None: not run)."""
    keys: list[tuple[str, bool]] = []
    titles: dict[str, str] = {}
    for run in runs:
        for r in run.results:
            if (r.case.name, r.stream) not in keys:
                keys.append((r.case.name, r.stream))
                titles[r.case.name] = r.case.title
    by_run = [{(r.case.name, r.stream): r for r in run.results} for run in runs]
    return [
        (titles[name], "stream" if stream else "unary", [found.get((name, stream)) for found in by_run])
        for name, stream in keys
    ]


def totals(run: GatewayRun) -> Counter:
    return Counter(v.outcome for r in run.results for v in r.verdicts)


def _all_rescued(result: VariantResult | None) -> bool:
    if result is None or not result.verdicts:
        return False
    return all(v.outcome == "rescued" for v in result.verdicts)


def tables(runs: list[GatewayRun]) -> str:
    lines = ["", f"{'':<{_CASE_W + _KIND_W}}" + "".join(f"| {run.name:<{_CELL_W}}" for run in runs)]
    head = f"{'outcome':<14}{'median':>8}  {'attempts':<18}"
    lines.append(f"{'case':<{_CASE_W}}{'kind':<{_KIND_W}}" + f"| {head:<{_CELL_W}}" * len(runs))
    rows = _rows(runs)
    for title, kind, results in rows:
        lines.append(f"{title:<{_CASE_W}}{kind:<{_KIND_W}}" + "".join(f"| {_cell(r)}" for r in results))
    lines.append("")
    lines.append(
        "outcome: R rescued (200, all tokens, [DONE], no error event), A advisory (a typed error that is the "
        "right answer), F failed; median: time to the answer's end; attempts: completions requests each "
        "replica received (all answers of the row; d and e: MODEL's 3rd and 4th replicas, where a case has "
        "four)"
    )
    for run in runs:
        if run.error:
            lines.append(f"{run.name}: did not run: {run.error}")
            continue
        count = totals(run)
        parts = " / ".join(f"{o} {count[o]}" for o in OUTCOMES)
        lines.append(f"totals, {run.name}: {parts} (of {sum(count.values())} answers)")
    if len(runs) == 2 and not any(run.error for run in runs):
        lines.append(_ratios(runs, rows))
    lines += _details(runs)
    return "\n".join(lines)


def _ratios(runs: list[GatewayRun], rows: list[tuple[str, str, list[VariantResult | None]]]) -> str:
    out = [
        f"median time, {runs[0].name} vs {runs[1].name} (x: the second over the first), where both "
        "rescued every answer:"
    ]
    for title, kind, (ours, theirs) in rows:
        if _all_rescued(ours) and _all_rescued(theirs) and ours is not None and theirs is not None:
            ratio = theirs.median_s / ours.median_s if ours.median_s > 0 else math.nan
            out.append(
                f"  {title} ({kind}): {_seconds(ours.median_s)} vs {_seconds(theirs.median_s)}, x{ratio:.2f}"
            )
    return "\n".join(out if len(out) > 1 else [*out, "  (none)"])


def _details(runs: list[GatewayRun]) -> list[str]:
    out = ["", "what the client got, where an answer was not a rescue:"]
    for run in runs:
        for r in run.results:
            missed = Counter(f"{v.outcome}: {v.detail}" for v in r.verdicts if v.outcome != "rescued")
            for text, n in missed.items():
                out.append(f"  {run.name}, {r.case.title} ({_kind(r)}): {n}x {text}")
            if r.unmet:
                out.append(
                    f"  {run.name}, {r.case.title} ({_kind(r)}): {r.unmet} answers not counted "
                    f"({r.case.met_on} not asked: the first pick was the healthy replica)"
                )
    return out if len(out) > 2 else []
