"""The harness keeps standing (issue 18): a child of ``nearshore up`` that dies is reported once (name, how it
ended, its log's tail) and the rest keeps running; ``--restart`` starts it again with a backoff, and gives
up on a crash loop. Fast tests drive the supervisor over tiny real subprocesses; the slow one kills a
region under a running ``nearshore up`` while requests go through the edge."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.launcher import RunningTopology
from harness.procs import ManagedProcess, exit_reason
from harness.supervise import RestartPolicy, Supervisor

ROOT = Path(__file__).resolve().parents[2]
FAST = RestartPolicy(first_delay_s=0.2, max_delay_s=0.4, max_restarts=3, window_s=60)


def _child(tmp_path: Path, name: str, code: str) -> ManagedProcess:
    return ManagedProcess(name, [sys.executable, "-c", code], tmp_path / f"{name}.log").start()


def _poll_until(supervisor: Supervisor, done: Callable[[], bool], timeout_s: float = 10.0) -> str | None:
    """Poll as ``nearshore up`` does (faster), until ``done()`` or the run must end; the reason, if any."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reason = supervisor.poll()
        if reason is not None or done():
            return reason
        time.sleep(0.02)
    raise AssertionError("the supervisor did not get there in time")


def test_exit_reasons_name_the_code_or_the_signal():
    assert exit_reason(3) == "exited with code 3"
    assert exit_reason(0) == "exited with code 0"
    assert exit_reason(-signal.SIGKILL) == "was killed by SIGKILL"


def test_a_dead_child_is_reported_once_with_its_log_and_the_rest_keeps_running(tmp_path: Path):
    crash = _child(tmp_path, "region-london", "print('out of memory, says the engine'); raise SystemExit(3)")
    steady = _child(tmp_path, "region-virginia", "import time; time.sleep(30)")
    reports: list[str] = []
    supervisor = Supervisor([crash, steady], essential={"edge"}, report=reports.append)
    try:
        assert crash.proc is not None
        crash.proc.wait(10)
        for _ in range(5):
            assert supervisor.poll() is None  # a region is not essential: the run goes on
        assert len(reports) == 1, reports
        assert reports[0].startswith(f"nearshore up: region-london (pid {crash.proc.pid}) exited with code 3")
        assert "the rest keeps running" in reports[0]
        assert "out of memory, says the engine" in reports[0]  # the tail of its log
        assert steady.proc is not None and steady.proc.poll() is None
    finally:
        steady.stop()


def test_an_essential_child_killed_ends_the_run_and_says_why(tmp_path: Path):
    edge = _child(tmp_path, "edge", "import time; time.sleep(30)")
    reports: list[str] = []
    supervisor = Supervisor([edge], essential={"edge"}, report=reports.append)
    assert supervisor.poll() is None
    assert edge.proc is not None
    edge.proc.send_signal(signal.SIGKILL)
    edge.proc.wait(10)
    reason = supervisor.poll()
    assert reason == "edge is down and nothing can be served without it"
    assert "edge (pid" in reports[0] and "was killed by SIGKILL" in reports[0]


def test_restarts_back_off_then_give_up_on_a_crash_loop(tmp_path: Path):
    loop = _child(tmp_path, "region-london", "print('boom'); raise SystemExit(3)")
    reports: list[tuple[float, str]] = []
    supervisor = Supervisor([loop], policy=FAST, report=lambda line: reports.append((time.monotonic(), line)))
    pids = {loop.proc.pid} if loop.proc is not None else set()

    def gave_up() -> bool:
        if loop.proc is not None:
            pids.add(loop.proc.pid)
        return any("giving up" in line for _, line in reports)

    assert _poll_until(supervisor, gave_up) is None  # a region given up on does not end the run
    lines = [line for _, line in reports]
    deaths = [line for line in lines if "exited with code 3" in line and "restarted" not in line]
    assert len(deaths) == 4, lines  # each life's death once: the first and three restarts
    planned = [line.rsplit(" in ", 1)[1] for line in lines if line.startswith("nearshore up: restarting")]
    assert planned == ["0.2s", "0.4s", "0.4s"]  # doubling, capped at max_delay_s
    restarted = [line for line in lines if line.startswith("nearshore up: restarted region-london (pid ")]
    assert len(restarted) == 3 and all("after it exited with code 3" in line for line in restarted)
    assert len(pids) == 4  # a new process each time
    assert lines[-1].startswith("nearshore up: giving up on region-london: it died 4 times within 60s")
    # Each restart waited its delay after the death was reported.
    times = {line: at for at, line in reports}
    plans = [at for at, line in reports if line.startswith("nearshore up: restarting")]
    dones = [times[line] for line in restarted]
    for plan_at, done_at, delay in zip(plans, dones, (0.2, 0.4, 0.4), strict=True):
        assert done_at - plan_at >= delay - 0.01
    # One log across its lives, the restarts marked in it.
    log = loop.log_path.read_text()
    assert log.count("boom") == 4
    assert log.count("--- nearshore: restarting region-london (it exited with code 3) ---") == 3
    time.sleep(0.5)
    assert supervisor.poll() is None and len(reports) == len(lines)  # given up: quiet from now on


def test_a_restarted_child_that_stays_up_is_left_alone(tmp_path: Path):
    marker = tmp_path / "second-life"
    # Its first life crashes; the next one stays up.
    code = (
        f"import pathlib, time; p = pathlib.Path({str(marker)!r})\n"
        "if not p.exists():\n    p.touch(); raise SystemExit(1)\n"
        "time.sleep(30)"
    )
    child = _child(tmp_path, "links", code)
    reports: list[str] = []
    supervisor = Supervisor([child], essential={"links"}, policy=FAST, report=reports.append)
    try:
        assert _poll_until(supervisor, lambda: any("restarted" in r for r in reports)) is None
        for _ in range(10):
            assert supervisor.poll() is None
            time.sleep(0.02)
        assert child.proc is not None and child.proc.poll() is None
        assert len(reports) == 3, reports  # died, restarting in 0.2s, restarted
        assert "nothing can be served without it" in reports[0]
    finally:
        child.stop()


def test_an_essential_child_given_up_on_ends_the_run(tmp_path: Path):
    child = _child(tmp_path, "edge", "raise SystemExit(2)")
    supervisor = Supervisor([child], essential={"edge"}, policy=FAST, report=lambda _: None)
    assert _poll_until(supervisor, lambda: False) == "edge is down and nothing can be served without it"


def test_restart_refuses_a_running_child(tmp_path: Path):
    child = _child(tmp_path, "region-london", "import time; time.sleep(30)")
    try:
        with pytest.raises(RuntimeError, match="still running"):
            child.restart()
    finally:
        child.stop()


# --- the real thing: nearshore up, a region killed under traffic -------------------------------------------

TOPOLOGY = """\
name = "survive"
description = "A Lagos user and edge, two regions: London (nearest) and Johannesburg"
[user]
city = "lagos"
link = "lagos-4g"
[edge]
city = "lagos"
[[regions]]
name = "london"
city = "london"
link = "lagos-london"
[[regions]]
name = "johannesburg"
city = "johannesburg"
link = "lagos-johannesburg"
"""


@dataclass
class Answer:
    sent: float
    status: int  # 0: no HTTP answer at all
    region: str


class Traffic:
    """Streamed requests through the edge, one after another, in a thread: what a user keeps sending."""

    def __init__(self, running: RunningTopology) -> None:
        self.running = running
        self.context = ssl.create_default_context(cafile=running.edge_ca)
        self.answers: list[Answer] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            self.answers.append(self.one(f"Request {n}: name a street in Lagos."))

    def one(self, question: str) -> Answer:
        body = {
            "model": "gemma-3-270m",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 6,
            "stream": True,
        }
        request = urllib.request.Request(
            self.running.edge_url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.running.api_key}",
                "Content-Type": "application/json",
                "Cache-Control": "no-cache, no-store",  # every request must reach a region
            },
        )
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
                response.read()
                return Answer(sent, response.status, response.headers.get("x-nearshore-region", ""))
        except urllib.error.HTTPError as e:
            return Answer(sent, e.code, e.headers.get("x-nearshore-region", ""))
        except (OSError, TimeoutError, http.client.HTTPException):  # (a stream cut as the run stops)
            return Answer(sent, 0, "")

    def served_since(self, since: float, test: Callable[[str], bool]) -> list[Answer]:
        return [a for a in list(self.answers) if a.sent >= since and a.status == 200 and test(a.region)]


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, up: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        assert up.poll() is None, f"nearshore up ended (code {up.returncode}) while waiting for {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _pid_of(running: RunningTopology, config_name: str) -> int:
    """The pid whose command line names this config (state.json lists pids, not names)."""
    for pid in running.pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(config_name.encode()) for a in argv):
            return pid
    raise AssertionError(f"no process for {config_name} in {running.pids}")


def _stop(up: subprocess.Popen[bytes]) -> None:
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)


@pytest.mark.slow
def test_up_survives_a_killed_region_and_restarts_it(tmp_path: Path):
    topology, run_dir = tmp_path / "survive.toml", tmp_path / "run"
    topology.write_text(TOPOLOGY)
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    argv = [sys.executable, "-m", "nearshore", "up", str(topology), "--run-dir", str(run_dir), "--restart"]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        up = subprocess.Popen(argv, cwd=ROOT, stdout=stdout, stderr=stderr)
    traffic: Traffic | None = None
    try:
        _wait(lambda: "Ctrl-C stops everything" in out.read_text(), 240, "the topology to come up", up)
        running = RunningTopology.load(run_dir / "state.json")
        traffic = Traffic(running)
        traffic.thread.start()
        begun = time.monotonic()
        _wait(lambda: traffic.served_since(begun, lambda r: r == "london"), 60, "london to serve", up)

        victim = _pid_of(running, "region-london.toml")
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        _wait(lambda: "SIGKILL" in err.read_text(), 10, "the death to be reported", up)
        report = err.read_text()
        assert f"nearshore up: region-london (pid {victim}) was killed by SIGKILL" in report, report
        assert "the rest keeps running" in report and "last lines of" in report

        # The edge fails over: new requests are answered 200 by Johannesburg (after it ejects London).
        _wait(lambda: traffic.served_since(killed, lambda r: r == "johannesburg"), 30, "failover", up)
        assert up.poll() is None

        # --restart: London comes back on its port, and the edge routes to it again (it is nearest).
        _wait(lambda: "restarted region-london (pid " in err.read_text(), 30, "the restart", up)
        restarted = time.monotonic()
        _wait(lambda: traffic.served_since(restarted, lambda r: r == "london"), 120, "london again", up)
        report = err.read_text()
        assert report.count("region-london (pid ") == 2, report  # the death once, the restart once
        state = RunningTopology.load(run_dir / "state.json")
        assert victim not in state.pids and _pid_of(state, "region-london.toml") != victim
        assert up.poll() is None
    finally:
        if traffic is not None:
            traffic.stopping.set()
        _stop(up)
        if traffic is not None:
            traffic.thread.join(40)
    assert up.returncode == 0, err.read_text()
