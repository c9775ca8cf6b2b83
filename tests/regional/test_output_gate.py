"""Stop sequences and blocked phrases, whatever the token boundaries."""

import pytest

from regional.output_gate import OutputGate
from regional.safety import BlocklistFilter, CallableFilter, build_filter, load_hook


def run(gate: OutputGate, pieces: list[str]) -> tuple[list[str], str | None]:
    sent: list[str] = []
    for piece in pieces:
        out, finish = gate.feed(piece)
        sent.append(out)
        if finish:
            return sent, finish
    sent.append(gate.flush())
    return sent, None


@pytest.mark.parametrize(
    "pieces",
    [
        ["Hello wor", "ld. EN", "D here"],
        ["Hello world. ", "E", "N", "D", " here"],
        ["Hello world. END here"],
        ["H", "e", "l", "l", "o", " ", "w", "o", "r", "l", "d", ".", " ", "E", "N", "D"],
    ],
)
def test_stop_split_across_tokens_is_never_sent(pieces):
    sent, finish = run(OutputGate(["END"]), pieces)
    assert finish == "stop"
    assert "".join(sent) == "Hello world. "
    assert not any("E" in s or "N" in s for s in sent[-2:] if s)


def test_partial_stop_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    gate = OutputGate(["</answer>"])
    out1, _ = gate.feed("a </ans")
    assert out1 == "a "  # "</ans" could still become the stop
    out2, finish = gate.feed("wered")
    assert finish is None and out2 == "</answered"


def test_earliest_of_several_stops_wins():
    sent, finish = run(OutputGate(["zz", "b"]), ["aaa", "bzz"])
    assert "".join(sent) == "aaa" and finish == "stop"


def test_flush_releases_held_text_at_end_of_generation():
    gate = OutputGate(["STOP"])
    out, finish = gate.feed("the ST")
    assert (out, finish) == ("the ", None)
    assert gate.flush() == "ST"
    assert gate.output == "the ST"


def test_blocklist_cuts_before_phrase_case_insensitively_across_tokens():
    gate = OutputGate([], BlocklistFilter(["secret plan"]))
    sent, finish = run(gate, ["Here is the Sec", "ret Pl", "an: attack"])
    assert finish == "content_filter"
    assert "".join(sent) == "Here is the "


def test_blocked_phrase_before_stop_reports_content_filter():
    gate = OutputGate(["."], BlocklistFilter(["bad"]))
    sent, finish = run(gate, ["so bad."])
    assert finish == "content_filter" and "".join(sent) == "so "


def test_callable_hook_blocks_unreleased_text():
    gate = OutputGate([], CallableFilter(lambda text: "forbidden" in text))
    sent, finish = run(gate, ["ok ", "then forbidden"])
    assert finish == "content_filter"
    assert "".join(sent) == "ok "


def test_build_filter_and_hook_loading():
    assert build_filter([], "") is None
    f = build_filter(["x"], "tests.safety_hooks:no_digits")
    assert f is not None and f.find("abc1", 0) == 0 and f.find("axb", 0) == 1
    assert isinstance(load_hook("tests.safety_hooks:no_digits"), CallableFilter)
    with pytest.raises(ValueError, match="module:callable"):
        load_hook("nocolon")
