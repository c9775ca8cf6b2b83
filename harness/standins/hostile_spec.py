"""The hostile's mode spec: which mode, with which arguments, on which instance. Pure, no I/O.

A request picks its mode with the body's ``user`` field, ``mode:<spec>``; ``--mode`` and ``POST /_control``
take a spec too. An edge sends the same body to every replica, so one spec can name a mode per instance
(each hostile has its ``--name``)::

    spec    := choice | entry ("," entry)*
    entry   := target "=" choice       target: an instance's --name, or * for any instance not named
    choice  := mode (":" arg)*         mode: [a-z0-9-]+; arg: [A-Za-z0-9._-]+

``stall-at:20:30`` is one choice for every instance; ``london=429:1,*=ok`` sends 429 from london and a
correct answer from any other; ``london=503,paris=ok`` leaves an instance named neither to its default.
A mode's arguments are positional; each mode declares them as :class:`Param` s (a converter and a default)
and :func:`bind` turns the strings into values. Every failure is a :class:`SpecError` (the server answers
400 with it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_SPEC_CHARS = 512
ANY = "*"
_MODE = re.compile(r"[a-z0-9][a-z0-9-]*")
_ARG = re.compile(r"[A-Za-z0-9._-]+")
_TARGET = re.compile(r"[A-Za-z0-9._-]+|\*")


class SpecError(ValueError):
    """A spec or a mode argument that does not parse; the message says which part and why."""


@dataclass(frozen=True)
class Choice:
    mode: str
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ":".join((self.mode, *self.args))


@dataclass(frozen=True)
class Spec:
    by_target: Mapping[str, Choice]  # an instance's name, or ANY

    def pick(self, instance: str) -> Choice | None:
        """This instance's choice: its own entry, else the ``*`` one; None when the spec leaves it out."""
        return self.by_target.get(instance) or self.by_target.get(ANY)

    def __str__(self) -> str:
        if set(self.by_target) == {ANY}:
            return str(self.by_target[ANY])
        return ",".join(f"{target}={choice}" for target, choice in self.by_target.items())


def parse_choice(text: str) -> Choice:
    mode, *args = text.split(":")
    if not _MODE.fullmatch(mode):
        raise SpecError(f"bad mode name {mode!r} in {text!r}")
    for arg in args:
        if not _ARG.fullmatch(arg):
            raise SpecError(f"bad argument {arg!r} in {text!r}")
    return Choice(mode, tuple(args))


def parse(text: str) -> Spec:
    """A spec from its text (``mode:`` already removed)."""
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(f"a mode spec is at most {MAX_SPEC_CHARS} characters")
    if "=" not in text:
        return Spec({ANY: parse_choice(text)})
    by_target: dict[str, Choice] = {}
    for entry in text.split(","):
        target, sep, choice = entry.partition("=")
        if not sep:
            raise SpecError(f"{entry!r} names no instance (write name=mode, or *=mode)")
        if not _TARGET.fullmatch(target):
            raise SpecError(f"bad instance name {target!r}")
        if target in by_target:
            raise SpecError(f"instance {target!r} named twice")
        by_target[target] = parse_choice(choice)
    return Spec(by_target)


# ---- a mode's arguments -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    convert: Callable[[str], Any]  # raises ValueError on a bad value
    default: Any


def bind(params: Sequence[Param], choice: Choice) -> dict[str, Any]:
    """The choice's arguments as values by name, defaults filling the ones left out."""
    if len(choice.args) > len(params):
        takes = ", ".join(p.name for p in params) or "no arguments"
        raise SpecError(f"mode {choice.mode} takes {takes}; got {len(choice.args)} arguments")
    values = {p.name: p.default for p in params}
    for param, text in zip(params, choice.args, strict=False):
        try:
            values[param.name] = param.convert(text)
        except ValueError as exc:
            raise SpecError(f"mode {choice.mode}: bad {param.name} {text!r}: {exc}") from None
    return values


def seconds(max_s: float) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 <= value <= max_s):
            raise ValueError(f"want seconds from 0 to {max_s:g}")
        return value

    return convert


def count(low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        if not (text.isascii() and text.isdigit() and low <= int(text) <= high):
            raise ValueError(f"want a whole number from {low} to {high}")
        return int(text)

    return convert


def one_of(*words: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in words:
            raise ValueError("want one of " + ", ".join(words))
        return text

    return convert


def tag(text: str) -> str:
    return text  # the choice's syntax already bounds it
