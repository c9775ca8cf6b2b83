"""A check on the suite itself, off by default: ``NEARSHORE_TEST_ORDER=reverse`` runs each module's tests in
the reverse of their written order (the modules in their usual order).

A test that holds only after the tests above it in its module (a module-scoped fixture they leave in some
state) passes in the usual serial run but fails when a pytest-xdist worker steals a module's tail and runs
it without its head; reversed, it fails every time. Reversed, a module's first test that asserts a fresh
start (nothing cached yet) fails too, though no worker ever runs it after the others: read each failure for
which kind it is. ``make test`` does not reverse; run it by hand:

    NEARSHORE_TEST_ORDER=reverse .venv/bin/python -m pytest -n 3 --dist loadfile tests/edge
"""

from __future__ import annotations

import os
from itertools import groupby

import pytest

ORDER = os.environ.get("NEARSHORE_TEST_ORDER", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ORDER != "reverse":
        return
    reordered: list[pytest.Item] = []
    for _module, tests in groupby(items, key=lambda item: item.nodeid.split("::", 1)[0]):
        reordered += list(tests)[::-1]
    items[:] = reordered
