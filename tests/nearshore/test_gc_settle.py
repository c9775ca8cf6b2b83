"""A server's collector once it has started (nearshore/gc_settle.py): start-up's objects leave the scans,
and a reference cycle made while serving is still freed. Run in a child process: the test process's own
collector is left as it is."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import gc, weakref
from nearshore.gc_settle import YOUNG_THRESHOLD, settle_after_start

made_at_start = [[i] for i in range(5_000)]
settle_after_start()
assert gc.get_freeze_count() >= 5_000, gc.get_freeze_count()
assert gc.get_threshold()[0] == YOUNG_THRESHOLD

class Request:
    pass

request = Request()
request.itself = request  # a cycle, as a failed request's exception and traceback make
gone = weakref.ref(request)
del request
assert gone() is not None  # not freed on the spot: only a scan finds a cycle
made_while_serving = [[] for _ in range(2 * YOUNG_THRESHOLD)]
assert gone() is None
"""


def test_start_ups_objects_leave_the_scans_and_a_cycle_made_while_serving_is_freed():
    subprocess.run([sys.executable, "-c", CHILD], check=True, timeout=60)
