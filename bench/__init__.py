"""Every benchmark, each behind ``nearshore bench ...`` (the flags are in cli/bench.py): edge/, faults/,
load/, cache/, geo/, gpu/ (the checks and timings of ``nearshore gpu-check``), region.py, fairness.py and
hostile.py. Every server a benchmark starts, ours and the peers', is started in one place (peers.py); a
process tree's CPU time is read from /proc (cpu.py); percentiles come from harness/stats.py, the one
definition the scenarios use too. Streams are timed by the harness's client (harness/client.py)."""
