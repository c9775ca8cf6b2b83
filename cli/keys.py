"""``nearshore keys create|list|revoke|update`` (on a SQLite file, or the city's PostgreSQL table) and
``nearshore usage``: the operator's side of keys and billing.

Secrets never reach the screen except once, from ``keys create``; everything else shows the public key_id.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sqlite3
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.config import DATA_DIR, open_named_file
from edge.keys import MAX_PER_MINUTE, ApiKey, KeyChange, KeyStore, store_call
from edge.ledger import Ledger, ReportRow

if TYPE_CHECKING:
    from edge.keys_pg import PgKeyStore

DEFAULT_KEYS_DB = DATA_DIR / "keys.sqlite3"
DEFAULT_LEDGER_DB = DATA_DIR / "ledger.sqlite3"
_MAX_PER_MINUTE_TEXT = "1e15"


class _OneLineParser(argparse.ArgumentParser):
    """A parser whose errors are one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


# --- keys -------------------------------------------------------------------------------------------------


def add_keys_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(
        dest="keys_command", required=True, metavar="ACTION", parser_class=_OneLineParser
    )

    create = commands.add_parser("create", help="issue a key (its secret is shown once)")
    create.add_argument("--tenant", type=_name, required=True, help="who the key bills to")
    create.add_argument(
        "--tier", type=_name, default="default", help="rate-limit tier (default: %(default)s)"
    )
    create.add_argument("--rpm", type=_per_minute, default=60, help="requests per minute (default: 60)")
    create.add_argument(
        "--tpm", type=_per_minute, default=100_000, help="tokens per minute (default: 100000)"
    )
    create.add_argument(
        "--model",
        dest="models",
        type=_name,
        action="append",
        default=[],
        metavar="MODEL",
        help="a model the key may use; repeat for several (default: all models)",
    )
    create.add_argument("--budget", type=_non_negative_float, metavar="USD", help="spending cap in USD")
    create.add_argument(
        "--debug",
        action="store_true",
        help="the key may ask for the route explanation (x-nearshore-debug: route): regions, RTTs, policies",
    )
    create.add_argument(
        "--substitute",
        action="store_true",
        help="in a cable cut, the local stand-in may answer this key for a model only remote regions serve",
    )

    listing = commands.add_parser("list", help="list keys (never their secrets)")

    revoke = commands.add_parser("revoke", help="revoke a key; every running edge stops accepting it at once")
    revoke.add_argument("key_id", metavar="KEY_ID")

    update = commands.add_parser(
        "update", help="change a key's limits or rights (not its tenant or secret); edges apply it at once"
    )
    update.add_argument("key_id", metavar="KEY_ID")
    update.add_argument("--tier", type=_name, help="rate-limit tier")
    update.add_argument("--rpm", type=_per_minute, help="requests per minute")
    update.add_argument("--tpm", type=_per_minute, help="tokens per minute")
    models = update.add_mutually_exclusive_group()
    models.add_argument(
        "--model",
        dest="models",
        type=_name,
        action="append",
        metavar="MODEL",
        help="the models the key may use, replacing its list; repeat for several",
    )
    models.add_argument("--all-models", action="store_true", help="the key may use every model")
    budget = update.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=_non_negative_float, metavar="USD", help="spending cap in USD")
    budget.add_argument("--no-budget", action="store_true", help="remove the key's spending cap")
    update.add_argument("--debug", action=argparse.BooleanOptionalAction, help="may ask for the route")
    update.add_argument(
        "--substitute", action=argparse.BooleanOptionalAction, help="the local stand-in may answer it"
    )

    for sub in (create, listing, revoke, update):
        where = sub.add_mutually_exclusive_group()
        where.add_argument(
            "--db", type=Path, default=DEFAULT_KEYS_DB, help="key store file (default: %(default)s)"
        )
        where.add_argument(
            "--postgres",
            metavar="URL",
            help="the city's key table instead: postgresql://USER@HOST:PORT/DB (password: PGPASSWORD)",
        )


def run_keys(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_keys(args))
    except (ValueError, OSError, sqlite3.Error) as exc:  # a value the store refused, a file it cannot use
        print(f"nearshore keys {args.keys_command}: {exc}", file=sys.stderr)
        return 1


async def _keys(args: argparse.Namespace) -> int:
    if args.postgres is None and args.keys_command != "create" and not args.db.exists():
        print(f"nearshore: no key store at {args.db}", file=sys.stderr)
        return 1
    store = await _open_store(args)
    try:
        return await _act(store, args)
    finally:
        await store_call(store, "close")


async def _open_store(args: argparse.Namespace) -> KeyStore | PgKeyStore:
    if args.postgres is None:
        return open_named_file("--db", args.db, KeyStore)
    from edge.keys_pg import PgKeyStore

    try:
        return await PgKeyStore(args.postgres, setting="--postgres").open()
    except Exception as exc:  # asyncpg's errors are not all OSError; each says what went wrong
        raise ValueError(str(exc)) from None


async def _act(store: KeyStore | PgKeyStore, args: argparse.Namespace) -> int:
    if args.keys_command == "create":
        settings = {
            "tier": args.tier,
            "rpm": args.rpm,
            "tpm": args.tpm,
            "models": args.models,
            "budget_usd": args.budget,
            "debug": args.debug,
            "substitute": args.substitute,
        }
        plaintext, key = await store_call(store, "create", args.tenant, **settings)
        print(f"key:    {plaintext}")
        print(f"key_id: {key.key_id}")
        print("This key will not be shown again: store it now.", file=sys.stderr)
        return 0
    if args.keys_command == "list":
        print(format_table(_KEY_HEADER, [_key_row(key) for key in await store_call(store, "list")]))
        return 0
    if args.keys_command == "update":
        changed = await store_call(store, "update", args.key_id, _change(args))
        if changed is None:
            print(f"nearshore: no such key: {args.key_id}", file=sys.stderr)
            return 1
        print(format_table(_KEY_HEADER, [_key_row(changed)]))
        return 0
    if await store_call(store, "revoke", args.key_id):
        print(f"revoked {args.key_id}")
        return 0
    known = await store_call(store, "get", args.key_id)
    print(f"nearshore: {'already revoked' if known else 'no such key'}: {args.key_id}", file=sys.stderr)
    return 0 if known else 1


def _change(args: argparse.Namespace) -> KeyChange:
    given: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("tier", "rpm", "tpm", "models", "debug", "substitute")
        if getattr(args, name) is not None
    }
    if args.all_models:
        given["models"] = []
    if args.budget is not None or args.no_budget:
        given["budget_usd"] = args.budget
    if not given:
        raise ValueError("nothing to change: give at least one of --tier --rpm --tpm --model --budget ...")
    return KeyChange(**given)


_KEY_HEADER = ("key_id", "tenant", "tier", "rpm", "tpm", "models", "budget", "revoked", "created")


def _key_row(key: ApiKey) -> tuple[str, ...]:
    return (
        key.key_id,
        key.tenant,
        key.tier,
        str(key.rpm),
        str(key.tpm),
        ",".join(key.models) or "*",
        "-" if key.budget_usd is None else f"{key.budget_usd:.2f}",
        "yes" if key.revoked else "no",
        datetime.fromtimestamp(key.created_at, UTC).strftime("%Y-%m-%d %H:%M"),
    )


# --- usage ------------------------------------------------------------------------------------------------


def add_usage_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--db", type=Path, default=DEFAULT_LEDGER_DB, help="ledger file (default: %(default)s)"
    )
    where.add_argument(
        "--postgres",
        metavar="URL",
        help="the city's bill instead (every edge's rows): postgresql://USER@HOST:PORT/DB (PGPASSWORD)",
    )
    parser.add_argument("--since", type=_day, metavar="YYYY-MM-DD", help="first UTC day included")
    parser.add_argument("--until", type=_day, metavar="YYYY-MM-DD", help="last UTC day included")


def run_usage(args: argparse.Namespace) -> int:
    try:
        return _usage(args)
    except (ValueError, OSError, sqlite3.Error) as exc:  # a file that is not a ledger, or cannot be read
        print(f"nearshore usage: {exc}", file=sys.stderr)
        return 1


def _usage(args: argparse.Namespace) -> int:
    if args.postgres is not None:
        from edge.ledger_pg import fleet_report

        since, until = _bounds(args)
        print(format_usage(asyncio.run(fleet_report(args.postgres, since, until, "--postgres"))))
        return 0
    if not args.db.exists():
        print(f"nearshore: no ledger at {args.db}", file=sys.stderr)
        return 1
    since, until = _bounds(args)
    ledger = open_named_file("--db", args.db, Ledger)
    try:
        rows = ledger.report(since, until)
    finally:
        asyncio.run(ledger.close())
    print(format_usage(rows))
    return 0


def _bounds(args: argparse.Namespace) -> tuple[float | None, float | None]:
    since = args.since.timestamp() if args.since else None
    # --until names a day to include: stop at the start of the next one.
    until = (args.until + timedelta(days=1)).timestamp() if args.until else None
    return since, until


_USAGE_HEADER = ("day", "key_id", "tenant", "requests", "prompt", "cached", "completion", "cost_usd")


def format_usage(rows: Sequence[ReportRow]) -> str:
    total = ReportRow(
        key_id="",
        tenant="",
        day="total",
        requests=sum(r.requests for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        cached_tokens=sum(r.cached_tokens for r in rows),
        completion_tokens=sum(r.completion_tokens for r in rows),
        cost_usd=sum(r.cost_usd for r in rows),
    )
    return format_table(_USAGE_HEADER, [_usage_row(r) for r in [*rows, total]])


def _usage_row(r: ReportRow) -> tuple[str, ...]:
    counts = (r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens)
    return (r.day, r.key_id, r.tenant, *map(str, counts), f"{r.cost_usd:.6f}")


# --- helpers ----------------------------------------------------------------------------------------------


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def _per_minute(text: str) -> int:
    """A whole number from 1 to MAX_PER_MINUTE; ``1e6`` is read as 1000000."""
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        value = math.nan
    if not (isinstance(value, int) or (math.isfinite(value) and value.is_integer())):
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}")
    if not 1 <= value <= MAX_PER_MINUTE:
        raise argparse.ArgumentTypeError(f"must be from 1 to {_MAX_PER_MINUTE_TEXT}, not {text}")
    return int(value)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not (math.isfinite(value) and value >= 0):  # nan fails both; inf (or 1e400) would be no cap
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, not {text}")
    return value


def _name(text: str) -> str:
    """A tenant, tier or model name: it shows in tables, logs and the ledger, one line each."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be printable, one line: {text!r}")
    return text


def _day(text: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, not {text!r}") from None
