"""Stored responses (edge/response_store.py): kept per tenant, never seen or deleted by another, continued
as their conversation, gone after their days, and kept across a restart of the edge (the file)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from edge.response_store import ResponseStore
from nearshore.protocol.responses import FunctionCallItem, InputText, Message, OutputText


def response(response_id: str, text: str = "Hi.") -> dict:
    output = [
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        },
        {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "f",
            "arguments": "{}",
        },
    ]
    return {"id": response_id, "object": "response", "output": output}


ASKED = [Message(role="user", content=[InputText("Hello?")])]


def test_a_tenant_sees_and_deletes_only_its_own(tmp_path: Path):
    store = ResponseStore(tmp_path / "responses.sqlite3")
    store.put("acme", response("resp_a"), ASKED)
    assert store.get("acme", "resp_a").response["id"] == "resp_a"
    assert store.get("globex", "resp_a") is None
    assert store.delete("globex", "resp_a") is False and store.get("acme", "resp_a") is not None
    assert store.delete("acme", "resp_a") is True
    assert store.get("acme", "resp_a") is None and store.delete("acme", "resp_a") is False


def test_the_conversation_is_the_inputs_then_the_output(tmp_path: Path):
    store = ResponseStore(tmp_path / "responses.sqlite3")
    store.put("acme", response("resp_a", "Hi there."), ASKED)
    conversation = store.get("acme", "resp_a").conversation()
    assert conversation[0] == ASKED[0]
    assert conversation[1] == Message(role="assistant", content=[OutputText("Hi there.")], id="msg_1")
    assert conversation[2] == FunctionCallItem(call_id="call_1", name="f", arguments="{}", id="fc_1")


def test_old_responses_are_gone_and_the_file_outlives_the_process(tmp_path: Path):
    path, now = tmp_path / "responses.sqlite3", [1000.0]
    store = ResponseStore(path, keep_days=1, clock=lambda: now[0])
    store.put("acme", response("resp_old"), ASKED)
    now[0] += 86_400 + 1
    assert store.get("acme", "resp_old") is None  # past its days: not found, even before it is purged
    store.put("acme", response("resp_new"), ASKED)  # a new one purges the old
    store.close()
    again = ResponseStore(path, keep_days=1, clock=lambda: now[0])
    assert again.get("acme", "resp_new") is not None
    again.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT id FROM responses").fetchall() == [("resp_new",)]
