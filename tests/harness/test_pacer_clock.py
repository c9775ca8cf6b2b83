"""The pacer's clocks: each stream's own from its arrival, or one step clock shared by every stream (a
batched decoder's), where a stream arriving mid-step waits for the first step at least an interval away."""

from __future__ import annotations

import argparse
import math
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from cli.pacer import add_arguments
from harness.standins import pacer
from tests.harness.test_standin_answers import CREATED, pinned


@pytest.mark.parametrize("now", [0.0, 0.001, 0.0199, 0.02, 12.3456789, 98765.4321])
def test_a_streams_own_clock_waits_one_interval(now: float):
    assert pacer.step_delay(now, 0.02, step_clock=False) == 0.02


@pytest.mark.parametrize("now", [0.0, 0.001, 0.0199, 0.02, 12.3456789, 98765.4321])
def test_the_step_clock_puts_the_first_token_on_a_step_at_least_an_interval_away(now: float):
    interval = 0.02
    delay = pacer.step_delay(now, interval, step_clock=True)
    assert interval <= delay < 2 * interval
    steps = (now + delay) / interval
    assert math.isclose(steps, round(steps), abs_tol=1e-6)  # on a step of the shared clock


def test_streams_arriving_within_one_step_get_their_first_token_on_the_same_step():
    interval = 0.02
    firsts = {round((now + pacer.step_delay(now, interval, True)) / interval) for now in (100.001, 100.019)}
    assert len(firsts) == 1


def test_an_instant_pacer_stays_instant_on_either_clock():
    assert pacer.step_delay(5.5, 0.0, step_clock=True) == 0.0


async def test_the_step_clock_changes_when_tokens_leave_not_what_they_say(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(time, "time", lambda: CREATED + 0.25)
    settings = pacer.PacerSettings(3, 0.001, 0, 0, "p", step_clock=True)
    body = {"model": "gemma-3-270m", "max_tokens": 2, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with TestClient(TestServer(pacer.create_app(settings))) as client:
        r = await client.post("/v1/chat/completions", json=body, headers={"x-request-id": "req-5"})
        assert await r.read() == pinned("pacer_chat_stream")


def test_the_command_takes_either_clock():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).clock == "stream"
    assert parser.parse_args(["--clock", "step"]).clock == "step"
    with pytest.raises(SystemExit):
        parser.parse_args(["--clock", "wall"])
