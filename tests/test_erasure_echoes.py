"""The recall the archive served comes back in the host's next messages (turns and checkpoint
evidence), delegations and peer messages; it is archived by reference (FORMAT.md 13.4), so forgetting what it showed leaves
no byte of it, and the later messages keep their own words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
from agent.memory_manager import build_memory_context_block

from archive_provider import recall_echo_cut
from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.audit.replay import verify_projections
from archive_provider.format.verifier import verify_database
from archive_provider.host.schemas import load_event_schema
from hivemind import events
from tests.conftest import open_v2
from tests.test_erasure import raw_hits
from tests.test_provider import SYSTEM, flush

SAID = "My locker code is PLUM-4417, behind the gym"
ASKED = "Which locker was mine, and what code did it have?"


def test_a_served_recall_handed_back_in_a_turn_and_a_checkpoint_goes_with_its_source(
    make_provider, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    second, served = served_in_new_session(make_provider, home)
    # the host (hermes-agent's own code) appends it to the API copy of the user message
    sent = ASKED + "\n\n" + build_memory_context_block(served)
    messages = [
        SYSTEM,
        {"role": "user", "content": ASKED, "api_content": sent},
        {"role": "assistant", "content": "Locker 12, I believe."},
    ]
    second.sync_turn("", "", session_id="s-new", messages=messages)
    flush(second)
    second.on_pre_compress(messages, require_checkpoint=True)
    second.shutdown()

    store = open_v2(home / "archive")
    try:
        kinds = {e.type: e for e in store.events() if e.session == "s-new"}
        for kind in ("turn", "checkpoint"):
            (echo,) = kinds[kind].body["echoes"]
            assert echo["recall"] == kinds["recall_served"].seq and echo["field"] == "api_content"
        assert raw_hits(home / "archive", SAID)  # the source, and nowhere else (see below)
        receipt = erasure.forget(store, Scope("session", {"session": "s-old"}), reason="r")
        assert receipt.seq is not None
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert raw_hits(home / "archive", "PLUM-4417") == []
        assert raw_hits(home / "archive", ASKED)  # the later session's own words stay
        assert verify_database(store.conn, store.key, vkey=store.vkey).ok
        assert verify_projections(store.path.parent, scratch_dir=tmp_path).ok
    finally:
        store.close()


def served_in_new_session(make_provider: Any, home: Path) -> tuple[Any, str]:
    """Session s-old says SAID; a provider in s-new is served it as recall (the result)."""
    first = make_provider(home, session="s-old")
    first.sync_turn(
        "", "", session_id="s-old", messages=[SYSTEM, {"role": "user", "content": SAID}]
    )
    flush(first)
    first.shutdown()
    second = make_provider(home, session="s-new")
    second.on_turn_start(1, ASKED)
    served = second.prefetch(ASKED)
    assert "PLUM-4417" in served
    return second, served


def forgotten_everywhere(home: Path, tmp_path: Path, kind: str, *kept: str) -> None:
    """Forget s-old: no byte of its words in any file of the archive, ``kept`` (the later
    event's own words) still there, ``show`` of the ``kind`` event renders [erased]."""
    store = open_v2(home / "archive")
    try:
        (event,) = [e for e in store.events() if e.type == kind]
        jsonschema.validate(event.body, load_event_schema(kind))
        recall = next(e for e in store.events() if e.type == "recall_served")
        assert [e["recall"] for e in event.body["echoes"]] and all(
            e["recall"] == recall.seq for e in event.body["echoes"]
        )
        receipt = erasure.forget(store, Scope("session", {"session": "s-old"}), reason="r")
        assert receipt.seq is not None
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert raw_hits(home / "archive", "PLUM-4417") == []
        for words in kept:
            assert raw_hits(home / "archive", words), words
        assert verify_database(store.conn, store.key, vkey=store.vkey).ok
        assert verify_projections(store.path.parent, scratch_dir=tmp_path).ok
        seq = event.seq
    finally:
        store.close()
    env = {k: v for k, v in os.environ.items() if k != "HERMES_HOME"}
    shown = subprocess.run(
        [sys.executable, "-m", "archive_provider.cli", "--home", str(home), "show", str(seq)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    assert "as sent, with the recall it echoes" in shown.stdout and "[erased]" in shown.stdout
    assert "PLUM-4417" not in shown.stdout


def test_a_delegation_that_quotes_a_served_recall_keeps_its_words_not_the_recall(
    make_provider: Any, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    provider, served = served_in_new_session(make_provider, home)
    task = "Look up the locker, using what the archive said:\n" + served
    result = "Checked the gym records.\n" + served + "\nThe locker is number 12."
    provider.on_delegation(task, result, child_session_id="s-child")
    flush(provider)
    provider.shutdown()
    forgotten_everywhere(
        home, tmp_path, "delegation", "Look up the locker", "The locker is number 12."
    )


def test_a_peer_message_that_quotes_a_served_recall_keeps_its_words_not_the_recall(
    make_provider: Any, tmp_path: Path
) -> None:
    """The event hivemind's send tool records once the homeserver accepted the message, built
    on the archive's writer as the tool builds it (the Matrix round trip is not the point)."""
    home = tmp_path / "home"
    provider, served = served_in_new_session(make_provider, home)
    text = "Bob, my archive says:\n" + served + "\nDoes that match your notes?"
    assert provider.core.record(
        lambda store: [
            events.message_sent(
                store.hasher,
                "s-new",
                event_id="$sent:localhost",
                room_id="!room:localhost",
                recipient="@bob:localhost",
                text=text,
                txn_id="hivemind-1",
                cut=recall_echo_cut(store, "s-new"),
            )
        ],
        "peer_message_sent",
        10,
    )
    provider.shutdown()
    forgotten_everywhere(
        home, tmp_path, "peer_message_sent", "Bob, my archive says", "Does that match"
    )
