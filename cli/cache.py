"""``nearshore cache-eval`` (how well the shipped cache tells paraphrases from different questions) and
``nearshore cache stats|clear|inspect`` (an operator's look into an edge's cache folder)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from cache import admin, eval_answers, eval_judge, eval_learned, eval_suite, evaluate
from cache.decision import semantic_check
from cache.embedder import embedded_model_dir, load_embedder
from cache.response_cache import threshold_for
from cache.settings import CacheSettings
from edge.config import EdgeConfig
from nearshore.config import load_config

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


# --- cache-eval --------------------------------------------------------------------------------------------


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="?",
        type=Path,
        default=None,
        help="JSON Lines of labelled pairs {a, b, same, kind, lang} (default: every shipped set, the "
        "generated hard negatives, and the worst of them)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="also print the threshold -> false-hit-rate table for CALIBRATION in cache/response_cache.py",
    )
    parser.add_argument(
        "--calibrate-judge",
        action="store_true",
        help="print the pair judge's threshold -> false-hit-rate table (JUDGE_CALIBRATION in "
        "cache/decision.py), measured on the public sets' calibration slices only",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        metavar="RATE",
        help="the cache's target_false_hit_rate for this run (default: the shipped 0.01); it sets the "
        "cosine threshold and the pair judge's",
    )
    parser.add_argument("--misses", action="store_true", help="also list the paraphrases it missed, and why")
    parser.add_argument(
        "--learned",
        action="store_true",
        help="measure whether the embedder, judging the words the verifier cannot explain, adds paraphrase "
        "hits at the same precision (fitted on the dev sets, counted on the others)",
    )
    parser.add_argument(
        "--answers",
        action="store_true",
        help="measure the live audit's judge of two answers instead, on cache/data/answer_pairs.jsonl",
    )


def run_eval(args: argparse.Namespace) -> int:
    if args.calibrate_judge:
        settings = CacheSettings()
        embedder = load_embedder(str(embedded_model_dir()), backend=settings.embedder_backend)
        check = semantic_check(True, settings.judge_path, 1.0)  # any target: the judge is loaded
        judged = eval_judge.judge_all(eval_judge.calibration_pairs(), embedder, check)
        rows = eval_judge.judge_curve(judged, threshold_for(settings.target_false_hit_rate))
        print(json.dumps(rows) if args.json else eval_judge.format_judge_curve(rows))
        return 0
    if args.answers:
        report = eval_answers.evaluate_judge()
        print(json.dumps(report) if args.json else eval_answers.format_judge(report))
        return 0
    if args.learned:
        sets, _ = eval_suite.with_generated(eval_suite.load_sets())
        settings = CacheSettings()
        embedder = load_embedder(str(embedded_model_dir()), backend=settings.embedder_backend)
        report = eval_learned.report(eval_learned.candidates(sets, embedder))
        print(json.dumps(report) if args.json else eval_learned.format_learned(report))
        return 0
    settings = CacheSettings() if args.target is None else CacheSettings(target_false_hit_rate=args.target)
    try:
        if args.file is None:  # every shipped set, apart; a calibration only ever on the dev sets
            sets, negatives = eval_suite.with_generated(eval_suite.load_sets())
            report = eval_suite.run_suite(sets, negatives, settings)
            fitted_on = eval_suite.dev_outcomes(report)
            report.pop("_outcomes")
            text = eval_suite.format_suite(report)
            misses = [(name, s) for name, s in report["sets"].items() if s["role"] == "dev"]
            scope = "on the dev sets only "
        else:
            report, fitted_on = evaluate.evaluate(args.file, settings)
            text, misses, scope = evaluate.format_report(report), [("", report)], ""
    except (OSError, ValueError) as exc:
        print(f"nearshore cache-eval: {exc}", file=sys.stderr)
        return 2
    table = evaluate.calibration(fitted_on) if args.calibrate else None
    if args.json:
        if table is not None:
            report["calibration"] = [list(row) for row in table]
        print(json.dumps(report, ensure_ascii=False))
        return 0
    print(text)
    if args.misses:
        for name, s in misses:
            print(f"\n  {name}:" if name else "")
            print(evaluate.format_misses(s))
    if table is not None:
        print(
            f"\nmeasured calibration {scope}(threshold, false-hit rate on the hard negatives with the "
            "verifier on: the upper end of its 95% interval):"
        )
        print(evaluate.format_calibration(table))
    return 0


# --- cache stats | clear | inspect -------------------------------------------------------------------------


def duration_s(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 3600, 30m, 12h, 7d)")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    stats = actions.add_parser("stats", help="entries, bytes, partitions, ages, expired")
    clear = actions.add_parser("clear", help="remove all entries, a partition's, or old ones")
    inspect = actions.add_parser("inspect", help="show entries of a partition or matching a text")
    for sub in (stats, clear, inspect):
        where = sub.add_mutually_exclusive_group()
        where.add_argument("--config", type=Path, help="an edge's config file (its [cache] folder)")
        where.add_argument("--folder", type=Path, help="the cache folder itself")
    stats.add_argument("--top", type=_positive, default=10, help="partitions listed (default 10)")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    what = clear.add_mutually_exclusive_group(required=True)
    what.add_argument("--all", action="store_true", help="every entry")
    what.add_argument("--partition", help="one partition's entries (a prefix of it as printed is enough)")
    what.add_argument(
        "--older-than", type=duration_s, metavar="AGE", help="entries stored more than AGE ago (30m, 12h, 7d)"
    )
    inspect.add_argument("--partition", help="only this partition (a prefix of it is enough)")
    inspect.add_argument("--grep", default="", help="only entries whose question or answer contains this")
    inspect.add_argument(
        "--limit", type=_positive, default=20, help="entries shown, newest first (default 20)"
    )
    for sub in (stats, inspect):
        sub.add_argument("--show-tenants", action="store_true", help="show which tenant each entry is for")


def cache_folder(args: argparse.Namespace) -> Path:
    """--folder, or the folder the edge config's [cache] names (beside its ledger when empty), as the edge
    itself resolves it (edge/cache_setup.py)."""
    if args.folder is not None:
        return args.folder.expanduser()
    config = load_config(args.config, EdgeConfig)
    if config.cache.folder:
        return Path(config.cache.folder).expanduser()
    return Path(config.ledger_db).expanduser().parent / "cache"


def _city_redis(args: argparse.Namespace) -> str:
    """The Redis the edge's config shares its cache through ("" for --folder, or an edge alone)."""
    return load_config(args.config, EdgeConfig).cache.share_redis_url if args.config is not None else ""


def run_cache(args: argparse.Namespace) -> int:
    folder = cache_folder(args)
    try:
        if args.cache_command == "stats":
            report = admin.stats(folder, top=args.top, show_tenants=args.show_tenants)
            print(json.dumps(_stats_dict(report)) if args.json else _format_stats(report))
        elif args.cache_command == "clear":
            partition = admin.resolve_partition(folder, args.partition) if args.partition else None
            removed = admin.clear(folder, partition=partition, older_than_s=args.older_than)
            print(f"removed {removed} entries from {folder}")
            if city := _city_redis(args):
                from cache.city_share import announce_clear  # redis: only where a city shares its cache

                announce_clear(city, partition, args.older_than)
                print("and asked the city's other edges to clear the same (cache.share_redis_url)")
        else:
            partition = admin.resolve_partition(folder, args.partition) if args.partition else None
            shown = admin.inspect(folder, partition=partition, grep=args.grep, limit=args.limit)
            print(_format_inspect(shown, args.show_tenants))
    except (admin.NoCache, ValueError, OSError) as exc:
        print(f"nearshore cache: {exc}", file=sys.stderr)
        return 1
    return 0


def _stats_dict(s: admin.Stats) -> dict:
    return {name: getattr(s, name) for name in s.__slots__}  # type: ignore[attr-defined]


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({_age(time.time() - ts)} ago)"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _format_stats(s: admin.Stats) -> str:
    lines = [
        f"cache folder   {s.folder}",
        f"entries        {s.entries} ({s.expired} expired, {s.undecodable} undecodable)",
        f"on disk        {_mb(s.bytes_on_disk)} (entries {_mb(s.entries_bytes)}, vector index "
        f"{_mb(s.index_bytes)})",
        f"partitions     {s.partitions}",
        f"oldest         {_when(s.oldest_created_s)}",
        f"newest         {_when(s.newest_created_s)}",
    ]
    if s.top_partitions:
        tenants = "scope" in s.top_partitions[0]
        lines.append(
            f"\n  partition                           entries   rows{'   tenant' if tenants else ''}"
        )
        for row in s.top_partitions:
            tenant = f"   {row['scope'] or '-'}" if tenants else ""
            lines.append(f"  {row['partition']:<34}{row['entries']:>8}{row['rows']:>7}{tenant}")
    return "\n".join(lines)


def _preview(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _format_inspect(shown: list[admin.Shown], show_tenants: bool) -> str:
    if not shown:
        return "no entries match"
    lines = []
    for s in shown:
        tenant = f"  tenant {s.scope or '-'}" if show_tenants else ""
        lines.append(
            f"{s.partition[:12]}  age {_age(s.age_s)}  ttl left {_age(s.ttl_left_s)}{tenant}\n"
            f"  Q: {_preview(s.query, 100)}\n  A: {_preview(s.answer, 100)}"
        )
    return "\n".join(lines)
