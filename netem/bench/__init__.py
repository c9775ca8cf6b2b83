"""The benchmarks: ``nearshore bench edge``, ``bench region`` and ``bench hostile`` (their flags are in
nearshore/cli/bench.py).

One streaming client times every stream (client.py: TTFT, inter-token gaps, Server-Timing), also used by
``nearshore chat`` and the scenarios; every server a benchmark starts, ours and the peers', is started in
one place (peers.py); a process tree's CPU time is read from /proc (cpu.py).
"""
