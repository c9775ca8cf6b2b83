"""Stored responses (edge/response_store.py): kept per tenant, never seen or deleted by another, continued
as their conversation, gone after their days, and kept across a restart of the edge (the file)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from edge.response_store import OverQuota, ResponseStore
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


def sized(response_id: str, text_bytes: int) -> dict:
    return response(response_id, "x" * text_bytes)


def test_a_tenant_past_its_quota_loses_its_own_oldest_and_no_one_elses(tmp_path: Path):
    now = [1000.0]
    store = ResponseStore(tmp_path / "r.sqlite3", clock=lambda: now[0], max_tenant_bytes=10_000)
    store.put("globex", sized("resp_g", 2_000), ASKED)
    for i in range(12):  # each about 2.3 KB: the quota holds four
        now[0] += 1
        store.put("acme", sized(f"resp_{i}", 2_000), ASKED)
    kept = [i for i in range(12) if store.get("acme", f"resp_{i}") is not None]
    assert kept == [8, 9, 10, 11]  # the newest that fit, in order
    assert 8_000 < store.tenant_bytes("acme") <= 10_000
    assert store.get("globex", "resp_g") is not None  # another tenant's are untouched
    # The tally is what is stored (a restart counts nothing twice).
    with sqlite3.connect(tmp_path / "r.sqlite3") as db:
        stored = db.execute(
            "SELECT SUM(length(response) + length(inputs)) FROM responses WHERE tenant = 'acme'"
        ).fetchone()[0]
    assert store.tenant_bytes("acme") == stored
    store.close()
    again = ResponseStore(tmp_path / "r.sqlite3", clock=lambda: now[0], max_tenant_bytes=10_000)
    assert again.tenant_bytes("acme") == stored
    again.close()


def test_the_tally_follows_deletes_expiry_and_a_store_written_before_it(tmp_path: Path):
    path, now = tmp_path / "r.sqlite3", [1000.0]
    store = ResponseStore(path, keep_days=1, clock=lambda: now[0], max_tenant_bytes=1 << 20)
    store.put("acme", sized("resp_a", 500), ASKED)
    store.put("acme", sized("resp_b", 500), ASKED)
    one = store.tenant_bytes("acme") // 2
    assert store.delete("acme", "resp_a") and store.tenant_bytes("acme") == one
    assert not store.delete("globex", "resp_b") and store.tenant_bytes("acme") == one
    now[0] += 86_400 + 1
    store.put("globex", sized("resp_g", 10), ASKED)  # purges acme's expired one
    assert store.tenant_bytes("acme") == 0
    store.close()
    # A store from before the tally: its tenants are counted when it is opened.
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE tenant_bytes")
    again = ResponseStore(path, keep_days=1, clock=lambda: now[0], max_tenant_bytes=1 << 20)
    assert again.tenant_bytes("globex") > 0 and again.tenant_bytes("acme") == 0
    again.close()


def test_one_response_larger_than_the_quota_is_not_stored_and_drops_nothing(tmp_path: Path):
    store = ResponseStore(tmp_path / "r.sqlite3", max_tenant_bytes=4_000)
    store.put("acme", sized("resp_small", 100), ASKED)
    with pytest.raises(OverQuota):
        store.put("acme", sized("resp_huge", 5_000), ASKED)
    assert store.get("acme", "resp_small") is not None and store.get("acme", "resp_huge") is None
    store.close()
