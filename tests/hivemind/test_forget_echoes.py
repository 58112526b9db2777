"""A peer message that quotes a recall the archive served is archived with the recall cut out
and named by reference (FORMAT.md 13.4): forgetting the recall's source leaves no byte of it
in the sender's archive, while the message's own words stay. Through the real send tool and a
real Synapse on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.format.verifier import verify_database
from tests.conftest import open_v2
from tests.test_erasure import raw_hits
from tests.test_erasure_echoes import ASKED, SAID
from tests.test_provider import SYSTEM, flush

from .agents import call, logged

pytestmark = pytest.mark.synapse


def test_a_sent_peer_message_quoting_a_recall_loses_the_recall_on_forget(
    make_user: Any, make_agent: Any, make_provider: Any, tmp_path: Path
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    home = tmp_path / "alice-home"
    first = make_provider(home, session="s-old")
    first.sync_turn(
        "", "", session_id="s-old", messages=[SYSTEM, {"role": "user", "content": SAID}]
    )
    flush(first)
    first.shutdown()

    a = make_agent(alice, home=home, session="s-new", contacts=[bob.user_id])
    make_agent(bob)
    a.on_turn_start(1, ASKED)
    served = a.prefetch(ASKED)
    assert "PLUM-4417" in served
    text = "Bob, my archive says:\n" + served + "\nDoes that match your notes?"
    sent = call(a, "hivemind_send_to_peer", peer_name=bob.user_id, message=text)
    assert sent["sent"] is True and sent["logged"] is True
    a.shutdown()

    (event,) = logged(home, "peer_message_sent")
    recalls = {e.seq for e in logged(home, "recall_served")}
    assert event.body["echoes"] and {e["recall"] for e in event.body["echoes"]} <= recalls
    store = open_v2(home / "archive")
    try:
        receipt = erasure.forget(store, Scope("session", {"session": "s-old"}), reason="r")
        assert receipt.seq is not None
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert raw_hits(home / "archive", "PLUM-4417") == []
        assert raw_hits(home / "archive", "Does that match your notes?")
        assert verify_database(store.conn, store.key, vkey=store.vkey).ok
    finally:
        store.close()
