"""Reading tool calls out of the model's text as it streams (the project's tool format,
:mod:`nearshore.protocol.tool_prompt`): content before a call is content; each
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` block becomes a call, named as soon as its name
is complete and its arguments passed on in fragments as they arrive, so a client that joins the fragments
gets exactly the arguments the model wrote.

The grammar writes the name first and compactly (:mod:`regional.tool_grammar`), which is what lets the
arguments stream. A block in another order (free text that opened a call the grammar did not hold) is read
whole at its end; a block that does not parse, or names no offered tool, is content, as written.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from nearshore.protocol.tool_prompt import CALL_CLOSE, CALL_OPEN

# A block's head up to where its arguments begin: {"name": "<name>", "arguments":
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_HEAD_PREFIX_LIMIT = 256  # a head longer than this that still does not match is read whole instead


@dataclass(slots=True)
class CallStarted:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class CallArguments:
    index: int
    fragment: str


Event = str | CallStarted | CallArguments  # a str is content


@dataclass(slots=True)
class Call:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ToolCallReader:
    """Feed it the answer's text as it comes; it returns content and call events. ``names``: the offered
    functions (a block naming another is content)."""

    names: frozenset[str]
    calls: list[Call] = field(default_factory=list)
    _pending: str = ""  # text not yet passed on: a possible start of a call tag, or a block being read
    _in_call: bool = False
    _streaming: bool = False  # the current block's name is out and its arguments are streaming
    _args_scan: _JsonScan | None = None

    def feed(self, text: str) -> list[Event]:
        self._pending += text
        events: list[Event] = []
        while True:
            before = len(events), self._pending, self._in_call
            if self._in_call:
                self._read_call(events)
            else:
                self._read_content(events)
            if (len(events), self._pending, self._in_call) == before:
                return events

    def finish(self) -> list[Event]:
        """The end of the answer: what is still held back is content (a tag never completed, a block never
        closed whose name did not go out) when no call came before it, or the rest of a streaming call's
        arguments."""
        events: list[Event] = []
        if self.calls and not self._streaming:
            # After calls, what is left is the start of another call cut short (max_tokens): not content.
            self._pending, self._in_call = "", False
        if self._in_call and self._streaming:
            # Cut short (max_tokens) inside the arguments: what came is passed on, as OpenAI does.
            if self._pending:
                events.append(CallArguments(len(self.calls) - 1, self._pending))
                self.calls[-1].arguments += self._pending
        elif self._in_call:
            events.append(CALL_OPEN + self._pending)
        elif self._pending:
            events.append(self._pending)
        self._pending = ""
        self._in_call = False
        return events

    def _read_content(self, events: list[Event]) -> None:
        at = self._pending.find(CALL_OPEN)
        if at >= 0:
            content = self._pending[:at]
            if content.strip() or (content and not self.calls):
                events.append(content.rstrip("\n") if content.strip() else content)
            self._pending = self._pending[at + len(CALL_OPEN) :]
            self._in_call, self._streaming, self._args_scan = True, False, None
            return
        keep = _partial_suffix(self._pending, CALL_OPEN)
        out = self._pending[: len(self._pending) - keep]
        if out and (out.strip() or not self.calls):  # whitespace between calls is not content
            events.append(out)
        self._pending = self._pending[len(self._pending) - keep :]

    def _read_call(self, events: list[Event]) -> None:
        if not self._streaming:
            head = _HEAD.match(self._pending)
            if head is not None:
                try:
                    name = json.loads(f'"{head.group(1)}"')
                except ValueError:
                    name = None
                if name in self.names:
                    self._start(name, events)
                    self._pending = self._pending[head.end() :]
                    self._streaming, self._args_scan = True, _JsonScan()
                    return
            close = self._pending.find(CALL_CLOSE)
            if close >= 0:  # a block read whole: another order, or not a call at all
                self._read_whole(self._pending[:close], events)
                self._pending = self._pending[close + len(CALL_CLOSE) :]
                self._in_call = False
            return
        assert self._args_scan is not None
        if not self._args_scan.done:
            used = self._args_scan.feed(self._pending)
            fragment, self._pending = self._pending[:used], self._pending[used:]
            if fragment:
                events.append(CallArguments(len(self.calls) - 1, fragment))
                self.calls[-1].arguments += fragment
            if not self._args_scan.done:
                return
        close = self._pending.find(CALL_CLOSE)
        if close >= 0:  # the rest of the block (the closing brace) is not the arguments
            self._pending = self._pending[close + len(CALL_CLOSE) :]
            self._in_call = self._streaming = False

    def _start(self, name: str, events: list[Event]) -> None:
        call = Call(f"call_{secrets.token_hex(12)}", name)
        self.calls.append(call)
        events.append(CallStarted(len(self.calls) - 1, call.id, name))

    def _read_whole(self, block: str, events: list[Event]) -> None:
        try:
            parsed = json.loads(block)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("name") in self.names and "arguments" in parsed:
            self._start(parsed["name"], events)
            arguments = json.dumps(parsed["arguments"], ensure_ascii=False, separators=(",", ":"))
            events.append(CallArguments(len(self.calls) - 1, arguments))
            self.calls[-1].arguments = arguments
        else:
            events.append(f"{CALL_OPEN}{block}{CALL_CLOSE}")


class _JsonScan:
    """Where one JSON value ends, fed in pieces: depth and string state across pieces."""

    __slots__ = ("_depth", "_escaped", "_in_string", "_started", "done")

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._started = False
        self.done = False

    def feed(self, text: str) -> int:
        """How many characters of ``text`` belong to the value (all of them, until it ends)."""
        for i, ch in enumerate(text):
            if not self._started:
                if ch.isspace():
                    continue
                self._started = True
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                    if self._depth == 0:
                        return self._end(i)
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return self._end(i)
            elif self._depth == 0 and ch in ",\n":  # a bare scalar ends at what follows it
                self.done = True
                return i
        return len(text)

    def _end(self, i: int) -> int:
        self.done = True
        return i + 1


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a start of ``tag`` (held back: the tag may
    be arriving)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
