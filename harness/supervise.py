"""Watch a running topology's children: report each one that dies, restart it if asked, and say when the
run cannot go on.

A region that dies is news, not the end: the edge fails over to the others, which is what a run is for.
So a death is reported once (who, how it ended, the tail of its log) and the rest keeps running. Only the
essential children (the link emulator, the edge: every user path crosses both) end the run, when they are
down for good.

With a ``RestartPolicy`` a dead child is started again (``ManagedProcess.restart``: same argv, config and
log, so the same ports) after a backoff that doubles with each recent restart, and given up on when it
has been restarted ``max_restarts`` times within ``window_s``: a crash loop is reported, not spun.

``Supervisor.poll`` does one round and returns; the caller owns the loop (and stays on the main thread,
where a restarted child can still be armed to die with its supervisor).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from harness.procs import ManagedProcess, exit_reason

LOG_LINES = 10  # of a dead child's log, in its report


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_restarts: int = 5  # within window_s; one more death and the child is given up on
    window_s: float = 300.0

    def delay_s(self, num_recent: int) -> float:
        """The wait before the next restart, after ``num_recent`` restarts within the window."""
        return min(self.max_delay_s, self.first_delay_s * 2**num_recent)


@dataclass
class _Watch:
    """One child's bookkeeping across its lives."""

    reported: bool = False  # this life's death has been reported
    restart_at: float | None = None  # when the pending restart is due
    gave_up: bool = False
    restarts: deque[float] = field(default_factory=deque)  # when each recent restart happened

    def num_recent(self, now: float, window_s: float) -> int:
        # Restarts older than the window are forgiven: a child that crashes once a day is not a loop.
        while self.restarts and now - self.restarts[0] > window_s:
            self.restarts.popleft()
        return len(self.restarts)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Supervisor:
    def __init__(
        self,
        processes: Sequence[ManagedProcess],
        *,
        essential: Collection[str] = (),
        policy: RestartPolicy | None = None,
        restart: Callable[[ManagedProcess], object] = ManagedProcess.restart,
        report: Callable[[str], None] = _stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.processes = processes  # read live: the launcher restarts children in place
        self.essential = frozenset(essential)
        self.policy = policy
        self._restart = restart
        self.report = report
        self.clock = clock
        self._watches: dict[str, _Watch] = {}

    def poll(self) -> str | None:
        """One round over the children: report new deaths, run the restarts that are due. Returns why the
        run must end (an essential child down for good), or None while it can go on."""
        now = self.clock()
        for process in self.processes:
            if process.proc is None or process.proc.poll() is None:
                continue
            watch = self._watches.setdefault(process.name, _Watch())
            if not watch.reported:
                self._on_death(process, watch, now)
            elif watch.restart_at is not None and now >= watch.restart_at:
                self._do_restart(process, watch, now)
            if watch.gave_up and process.name in self.essential:
                return f"{process.name} is down and nothing can be served without it"
        return None

    def _on_death(self, process: ManagedProcess, watch: _Watch, now: float) -> None:
        watch.reported = True
        assert process.proc is not None
        how = exit_reason(process.proc.returncode)
        if process.name in self.essential:
            rest = "nothing can be served without it"
        else:
            rest = "the rest keeps running"
        lines = [f"nearshore up: {process.name} (pid {process.proc.pid}) {how}; {rest}"]
        tail = process.log_tail(LOG_LINES)
        if tail:
            lines.append(f"  last lines of {process.log_path}:")
            lines += [f"    {line}" for line in tail.splitlines()]
        self.report("\n".join(lines))
        self._plan_restart(process, watch, now)

    def _plan_restart(self, process: ManagedProcess, watch: _Watch, now: float) -> None:
        if self.policy is None:
            watch.gave_up = True
            return
        num_recent = watch.num_recent(now, self.policy.window_s)
        if num_recent >= self.policy.max_restarts:
            watch.gave_up = True
            self.report(
                f"nearshore up: giving up on {process.name}: it died {num_recent + 1} times within "
                f"{self.policy.window_s:g}s (restarted {num_recent} times)"
            )
            return
        delay_s = self.policy.delay_s(num_recent)
        watch.restart_at = now + delay_s
        self.report(f"nearshore up: restarting {process.name} in {delay_s:g}s")

    def _do_restart(self, process: ManagedProcess, watch: _Watch, now: float) -> None:
        assert process.proc is not None
        how = exit_reason(process.proc.returncode)
        watch.restart_at = None
        watch.restarts.append(now)
        try:
            self._restart(process)
        except OSError as e:  # the executable or its log went away: as good as one more death
            self.report(f"nearshore up: could not restart {process.name}: {e}")
            self._plan_restart(process, watch, now)
            return
        watch.reported = False  # a new life, whose death will be news again
        assert process.proc is not None
        self.report(f"nearshore up: restarted {process.name} (pid {process.proc.pid}) after it {how}")
