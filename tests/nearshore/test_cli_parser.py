"""The ``nearshore`` parser: a process started for one command imports that command's module alone, and
the whole parser (help, the layout test's flags) still lists every command."""

from __future__ import annotations

import subprocess
import sys

from cli import BENCHMARKS, COMMANDS, build_parser, chosen_commands, main

COMMAND_MODULES = sorted({c.module for c in COMMANDS + BENCHMARKS})


def command_modules_held_after(setup: str, *argv: str) -> set[str]:
    """The command modules a fresh interpreter holds after running setup (argv in sys.argv[1:])."""
    script = f"import sys; {setup}; print(' '.join(m for m in {COMMAND_MODULES!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_the_chosen_command_and_benchmark_are_the_first_words():
    assert chosen_commands(["-v", "edge", "--config", "edge.toml"]) == ("edge", None)
    assert chosen_commands(["bench", "edge", "--streams", "10"]) == ("bench", "edge")
    assert chosen_commands(["bench"]) == ("bench", None)
    assert chosen_commands(["--help"]) == ("", None)


def test_a_command_imports_its_own_module_alone():
    """What building the parser for a command imports is what importing its module alone imports."""
    bench_edge = next(b.module for b in BENCHMARKS if b.name == "edge")
    for argv, module in (
        (["pacer", "--port", "1"], "cli.pacer"),
        (["keys", "list"], "cli.keys"),
        (["bench", "edge"], bench_edge),
    ):
        alone = command_modules_held_after(f"import {module}")
        assert module in alone
        assert (
            command_modules_held_after("from cli import build_parser; build_parser(sys.argv[1:])", *argv)
            == alone
        )
    assert command_modules_held_after("from cli import build_parser; build_parser(['--help'])") == set()
    assert len(command_modules_held_after("from cli import build_parser; build_parser()")) == len(
        COMMAND_MODULES
    )


def test_the_chosen_parser_reads_what_the_whole_one_reads():
    argv = ["edge", "--config", "edge.toml", "--log-format", "json"]
    chosen, whole = build_parser(argv).parse_args(argv), build_parser().parse_args(argv)
    assert vars(chosen) == vars(whole)


def test_help_lists_every_command_and_a_bad_one_is_refused(capsys):
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    listing = capsys.readouterr().out
    assert all(c.name in listing for c in COMMANDS) and "bench" in listing
    try:
        main(["no-such-command"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err
