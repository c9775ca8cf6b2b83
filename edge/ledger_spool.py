"""Where usage rows wait while the ledger file cannot take them: an append-only file per process, beside it.

Another process holding the ledger's write lock (an operator's sqlite3 shell, a VACUUM, an export) or a
full disk must neither freeze the edge nor lose a bill. A row the ledger file refuses is appended here
(one msgspec JSON line, written to the OS before the request's last bytes leave: as durable as a WAL commit
with ``synchronous=NORMAL``), and replayed into the ledger once it takes writes again.

Files are ``<ledger>.spool-<pid>``: each process appends to its own (an edge's workers share one ledger).
Replaying renames the file to ``.replay`` first, so new rows start a fresh file while the old one is read;
a ``.replay`` left by a crash, or the spool of a process that is gone, is adopted by the next ledger opened
on the same file. Rows carry their request id and the replay skips ids already in the ledger, so a crash
between the ledger's commit and the spool's removal writes nothing twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import msgspec

log = logging.getLogger("nearshore.ledger")


def spool_path(ledger: Path, pid: int) -> Path:
    return ledger.with_name(f"{ledger.name}.spool-{pid}")


class Spool:
    """This process's spool file: appends from the event loop, replays taken from the replayer."""

    def __init__(self, ledger: Path, record_type: type) -> None:
        self.path = spool_path(ledger, os.getpid())
        self._ledger = ledger
        self._decoder = msgspec.json.Decoder(record_type)
        self._encoder = msgspec.json.Encoder()
        self.rows = 0  # rows appended and not yet replayed (this process's, adopted ones included)
        self._adopted: set[str] = set()  # files of processes that are gone, taken over

    def append(self, records: list) -> None:
        """Write ``records`` to the OS; raises OSError (a full disk) with nothing half-written counted."""
        data = b"".join(self._encoder.encode(rec) + b"\n" for rec in records)
        with open(self.path, "ab") as f:
            start = f.tell()
            try:
                f.write(data)
                f.flush()
            except OSError:
                with contextlib.suppress(OSError):
                    f.truncate(start)  # no partial line for the replay to trip on
                raise
        self.rows += len(records)

    def take(self) -> list[Path]:
        """The files to replay now: this process's spool (renamed aside, so appends start a new file), its
        own ``.replay`` files, and those of processes that are gone. Call it on the event loop, where the
        appends run: a rename between an append's open and its write would put that row in a file being
        replayed and then removed."""
        taken = []
        if self.path.exists():
            aside = self.path.with_name(self.path.name + f".replay-{os.getpid()}")
            if aside.exists():  # an earlier replay of it failed: append the new rows to it
                with open(self.path, "rb") as src, open(aside, "ab") as dst:
                    dst.write(src.read())
                self.path.unlink()
            else:
                self.path.rename(aside)
        for path in sorted(self._ledger.parent.glob(f"{self._ledger.name}.spool-*")):
            if _owner_alive(path):
                continue
            if ".replay-" not in path.name:  # a dead process's live spool: take it aside as ours
                aside = path.with_name(path.name + f".replay-{os.getpid()}")
                try:
                    path.rename(aside)
                except OSError:  # another process took it first
                    continue
                path = aside
            if not path.name.startswith(self.path.name) and path.name not in self._adopted:
                self._adopted.add(path.name)
                self.rows += _lines(path)  # another process's rows: counted as ours from now on
            taken.append(path)
        return taken

    def read(self, path: Path) -> list:
        """The rows in ``path``; a line that does not parse (a torn write) is logged and skipped."""
        rows = []
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(self._decoder.decode(line))
            except msgspec.DecodeError as exc:
                log.error("ledger spool %s line %d does not parse (%s): %r", path, number, exc, line[:300])
        return rows

    def replayed(self, paths: list[Path], rows: int) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._adopted.discard(path.name)
        self.rows = max(self.rows - rows, 0)

    def pending_files(self) -> bool:
        return any(self._ledger.parent.glob(f"{self._ledger.name}.spool-*"))


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _owner_alive(path: Path) -> bool:
    """Whether the process that wrote ``path`` still runs (then it replays it itself); ours counts as gone
    for ``.replay`` files, which we took."""
    name = path.name
    pid_text = name.rsplit(".spool-", 1)[1].split(".", 1)[0]
    if ".replay-" in name:
        pid_text = name.rsplit(".replay-", 1)[1]
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return ".replay-" not in name
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
