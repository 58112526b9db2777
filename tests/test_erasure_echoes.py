"""The recall the archive served comes back in the host's next messages (turns and checkpoint
evidence); it is archived by reference (FORMAT.md 13.4), so forgetting what it showed leaves
no byte of it, and the later messages keep their own words."""

from __future__ import annotations

from pathlib import Path

from agent.memory_manager import build_memory_context_block

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.audit.replay import verify_projections
from archive_provider.format.verifier import verify_database
from tests.conftest import open_v2
from tests.test_erasure import raw_hits
from tests.test_provider import SYSTEM, flush

SAID = "My locker code is PLUM-4417, behind the gym"
ASKED = "Which locker was mine, and what code did it have?"


def test_a_served_recall_handed_back_in_a_turn_and_a_checkpoint_goes_with_its_source(
    make_provider, tmp_path: Path
) -> None:
    home = tmp_path / "home"
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
