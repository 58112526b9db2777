"""Erasure in place (issue 16): each projection forgets what an erasure removed, touching
only that, and bundles exported after an erasure carry erased slots that still verify.

Every check compares the live projections with a replay of the log (``verify
--projections``): an in-place forget must leave exactly what a rebuild would, while every
row the erasure did not concern stays as it was (same rowid: nothing was rewritten).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import archive_provider.format as fmt
from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.audit.replay import verify_projections
from archive_provider.domain import builders
from archive_provider.format.verifier import ReportV2, verify_bundle
from archive_provider.projections.base import TableProjection
from archive_provider.projections.registry import default_projections
from archive_provider.projections.runner import ProjectionSet
from archive_provider.storage.store import EventStore
from tests.conftest import open_v2
from tests.test_bundle_v3 import AGAIN, pack, records
from tests.test_erasure import (
    OTHER,
    SECRET,
    SECRET_TERM,
    checkpoint,
    fill,
    fts_terms,
    raw_hits,
    turn,
)
from tests.test_export import export, members, reseal

SECRET_PLATFORM = "telegram-of-zorblax"


def rows_of(conn: sqlite3.Connection, session: str) -> list[tuple[Any, ...]]:
    """The recall rows of ``session`` with their rowids (what a rewrite would renumber)."""
    return [
        tuple(r)
        for r in conn.execute(
            "SELECT rowid, text, seq FROM recall_fts WHERE session = ? ORDER BY rowid", (session,)
        )
    ]


def matches_replay(store: EventStore, scratch: Path) -> None:
    check = verify_projections(store.path.parent, scratch_dir=scratch)
    assert check.ok, (check.mismatched, check.live, check.rebuilt)


def rich(store: EventStore) -> dict[str, int]:
    """Sessions with every event a projection reads: starts, switches, memory, checkpoints."""
    seqs: dict[str, int] = {}

    def add(name: str, event: Any) -> None:
        seqs[name] = store.append([event])[0].seq

    add(
        "start",
        builders.session_started(
            "s-secret",
            at="t0",
            details={"platform": SECRET_PLATFORM, "parent_session_id": "s-parent"},
        ),
    )
    add("turn", turn(store, "s-secret", 1, [SECRET, "hello there"]))
    add("mem_add", builders.memory_write(store.hasher, "s-secret", 1, "add", "user", SECRET, {}))
    add("keep_start", builders.session_started("s-keep", at="t1", details={"platform": "cli"}))
    add("keep_turn", turn(store, "s-keep", 1, [OTHER, "a second kept sentence"]))
    add(
        "keep_mem",
        builders.memory_write(
            store.hasher, "s-keep", 1, "add", "user", "prefers tea over coffee", {}
        ),
    )
    evidence = [store.hasher.part({"role": "user", "content": SECRET, "tool_calls": []})]
    add(
        "checkpoint",
        checkpoint(store, "s-secret", evidence, parent_session="s-parent", host_api_version=1),
    )
    add(
        "failed",
        builders.checkpoint_failed(
            "s-secret",
            at="t2",
            error=f"could not store {SECRET}",
            require_checkpoint=False,
            evidence_count=1,
        ),
    )
    add(
        "switch",
        builders.session_switched(
            "s-secret", previous="s-keep", at="t3", details={"reason": "branch"}
        ),
    )
    add(
        "recall",
        builders.recall_served(
            store.hasher,
            "s-keep",
            turn=2,
            query="where does he live",
            result=f"earlier: {SECRET}",
            sources=[seqs["turn"]],
            at="t4",
        ),
    )
    add("keep_turn2", turn(store, "s-keep", 2, ["the last kept words"], start=2))
    return seqs


def test_forgetting_a_session_rewrites_no_row_of_the_others(home: Path, store: EventStore) -> None:
    """In place: the kept session's index rows keep their rowids (a rebuild renumbers them)."""
    fill(store)
    store.append([turn(store, "s-keep", 2, ["more words about the harbour"], start=1)])
    kept = rows_of(store.conn, "s-keep")
    assert kept and min(r[0] for r in kept) > 1  # s-secret's rows came first
    erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r")
    assert rows_of(store.conn, "s-keep") == kept
    assert rows_of(store.conn, "s-secret") == []
    assert SECRET_TERM not in fts_terms(store)
    matches_replay(store, home.parent)
    # the next turn after the erasure is indexed after the rest, and still equals a replay
    store.append([turn(store, "s-keep", 3, ["a fresh sentence after the erasure"], start=2)])
    assert rows_of(store.conn, "s-keep")[-1][0] > kept[-1][0]
    matches_replay(store, home.parent)


def test_every_projection_forgets_a_session_in_place(home: Path, store: EventStore) -> None:
    seqs = rich(store)
    kept = rows_of(store.conn, "s-keep")
    memory_before = store.conn.execute(
        "SELECT rowid, text FROM recall_fts WHERE kind = 'memory' AND text NOT LIKE '%Zorblax%'"
    ).fetchall()
    receipt = erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r")
    assert receipt.seq is not None
    conn = store.conn
    assert rows_of(conn, "s-keep") == kept
    assert (
        conn.execute("SELECT rowid, text FROM recall_fts WHERE kind = 'memory'").fetchall()
        == memory_before
    )
    # the erased session start: no platform, no parent link (a replay skips its body)
    assert conn.execute(
        "SELECT platform, started_at FROM sessions WHERE session = 's-secret'"
    ).fetchone() == (None, None)
    assert (
        conn.execute("SELECT count(*) FROM session_links WHERE session = 's-secret'").fetchone()[0]
        == 0
    )
    assert conn.execute("SELECT count(*) FROM checkpoint_failures").fetchone()[0] == 0
    assert conn.execute(
        "SELECT result FROM recalls_served WHERE seq = ?", (seqs["recall"],)
    ).fetchone() == ("",)  # its query, the later session's own words, stays (FORMAT.md 13.4)
    assert conn.execute("SELECT content FROM memory_entries").fetchall() == [
        ("prefers tea over coffee",)
    ]
    for text in (SECRET, SECRET_PLATFORM, "could not store"):
        assert raw_hits(home, text) == [], text
    assert SECRET_TERM not in fts_terms(store)
    matches_replay(store, home.parent)


def test_forgetting_one_memory_entry_replays_only_its_target(home: Path, store: EventStore) -> None:
    store.append([builders.memory_write(store.hasher, "s1", 1, "add", "memory", OTHER, {})])
    old, new = "passport number is X1234567", "passport number is Y7654321"
    store.append([builders.memory_write(store.hasher, "s1", 2, "add", "user", old, {})])
    store.append([turn(store, "s1", 1, ["what a lovely afternoon by the river"])])
    store.append(
        [builders.memory_write(store.hasher, "s1", 3, "replace", "user", new, {"old_text": "X12"})]
    )
    store.append([builders.memory_write(store.hasher, "s1", 4, "add", "user", "likes tea", {})])
    turns = rows_of(store.conn, "s1")
    other_target = store.conn.execute(
        "SELECT * FROM memory_history WHERE target = 'memory'"
    ).fetchall()
    erasure.forget(store, Scope("memory", {"text": "X1234567"}), reason="r")
    assert rows_of(store.conn, "s1") == turns
    assert (
        store.conn.execute("SELECT * FROM memory_history WHERE target = 'memory'").fetchall()
        == other_target
    )
    assert store.conn.execute(
        "SELECT target, content FROM memory_entries ORDER BY target"
    ).fetchall() == [("memory", OTHER), ("user", "likes tea")]
    assert raw_hits(home, "X1234567") == [] and raw_hits(home, "Y7654321") == []
    matches_replay(store, home.parent)


def test_forgetting_one_turn_by_seq_keeps_the_rest_of_its_session(
    home: Path, store: EventStore
) -> None:
    store.append([turn(store, "s1", 1, [OTHER])])
    first = store.append([turn(store, "s1", 2, [SECRET, "and then we left"], start=1)])[0].seq
    store.append([turn(store, "s1", 3, ["a third sentence of the session"], start=3)])
    before = [r for r in rows_of(store.conn, "s1") if r[2] != first]
    erasure.forget(store, Scope("event", {"seq": first}), reason="r")
    assert rows_of(store.conn, "s1") == before
    assert raw_hits(home, SECRET) == [] and SECRET_TERM not in fts_terms(store)
    matches_replay(store, home.parent)


def test_a_short_text_a_later_checkpoint_repeats_is_indexed_as_a_replay_would(
    home: Path, store: EventStore
) -> None:
    """A checkpoint indexes only evidence its session had not said: once the turn saying it
    is erased, a replay indexes the checkpoint's own copy (too short to be swept as a quote),
    so the in-place forget must do the same."""
    short = "ok thanks"
    seq = store.append([turn(store, "s1", 1, [short])])[0].seq
    store.append([turn(store, "s1", 2, [OTHER], start=1)])
    evidence = [
        store.hasher.part({"role": "user", "content": short, "tool_calls": []}),
        store.hasher.part({"role": "user", "content": OTHER}),
    ]
    store.append([checkpoint(store, "s1", evidence, host_api_version=1)])
    erasure.forget(store, Scope("event", {"seq": seq}), reason="r")
    assert store.conn.execute(
        "SELECT kind FROM recall_fts WHERE text = ?", (short,)
    ).fetchall() == [("checkpoint",)]
    matches_replay(store, home.parent)


@pytest.mark.parametrize("scope", ["event", "session"])
def test_a_rewound_message_is_forgotten_where_the_rewind_moved_it(
    home: Path, store: EventStore, scope: str
) -> None:
    from archive_provider.storage.store import iter_events

    store.append([turn(store, "s1", 1, ["the first words of the session"])])
    said = store.append([turn(store, "s1", 2, [SECRET], start=1)])[0].seq
    (event,) = iter_events(store.conn, said - 1, said)
    digest = event.messages[0]
    store.append(
        [
            builders.turns_rewound(
                "s1", switch_seq=said, start=1, rewound=[(said, digest)], detected_by="test"
            )
        ]
    )
    store.append([turn(store, "s2", 1, [OTHER])])
    assert store.conn.execute("SELECT count(*) FROM recall_rewound").fetchone() == (1,)
    kept = rows_of(store.conn, "s2")
    chosen = (
        Scope("event", {"seq": said}) if scope == "event" else Scope("session", {"session": "s1"})
    )
    erasure.forget(store, chosen, reason="r")
    assert store.conn.execute("SELECT count(*) FROM recall_rewound").fetchone() == (0,)
    assert rows_of(store.conn, "s2") == kept
    assert raw_hits(home, SECRET) == []
    matches_replay(store, home.parent)


class Words(TableProjection):
    """A projection another package could register: it keeps turn texts and no forget."""

    name = "words"
    ddl = ("CREATE TABLE IF NOT EXISTS words (seq INTEGER NOT NULL, text TEXT NOT NULL)",)
    tables = {"words": "seq, text"}
    handles = frozenset({"turn"})

    def reduce(self, conn: sqlite3.Connection, event: Any) -> None:
        from archive_provider.projections.base import event_part

        for digest in event.messages:
            message = event_part(conn, event, digest)
            if isinstance(message, dict):
                conn.execute(
                    "INSERT INTO words VALUES (?, ?)", (event.seq, str(message.get("content")))
                )


def with_words(conn: sqlite3.Connection) -> ProjectionSet:
    return ProjectionSet([*default_projections(conn), Words()])


def test_a_projection_without_an_in_place_forget_is_rebuilt_from_the_log(
    tmp_path: Path,
) -> None:
    words = open_v2(tmp_path / "words" / "archive", with_words)
    try:
        fill(words)
        erasure.forget(words, Scope("session", {"session": "s-secret"}), reason="r")
        texts = [t for (t,) in words.conn.execute("SELECT text FROM words")]
        assert texts == [OTHER]
        assert raw_hits(tmp_path / "words", SECRET) == []
        check = verify_projections(
            words.path.parent, projections=with_words(words.conn), scratch_dir=tmp_path
        )
        assert check.ok, check.mismatched
    finally:
        words.close()


# -- bundles with erased slots ------------------------------------------------------------


STANDALONE = ("verifier.py", "merkle.py", "signed_note.py", "tlog_proof.py")


def standalone(alone: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-I", "verifier.py", *args, "--json"],
        cwd=alone,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_bundle_exported_after_an_erasure_carries_erased_slots_that_verify(
    home: Path, store: EventStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from archive_provider.cli import main

    fill(store)
    keep_seq = store.conn.execute(
        "SELECT seq FROM events WHERE session = 's-keep' AND type = 'turn'"
    ).fetchone()[0]
    secret_seq = store.conn.execute(
        "SELECT seq FROM events WHERE session = 's-secret' AND type = 'turn'"
    ).fetchone()[0]
    receipt = erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r")
    erased = {
        bytes(d).hex(): int(s)
        for d, s in store.conn.execute("SELECT digest, erasure_seq FROM erased")
    }
    vkey = store.vkey
    store.close()
    alone = tmp_path / "auditor"
    alone.mkdir()
    for name in STANDALONE:
        shutil.copy(Path(fmt.__file__).parent / name, alone / name)
    whole = export(home, alone / "whole.zip")
    content = members(whole)
    manifest = json.loads(content["manifest.json"])
    tombstones = {r[1].hex(): r[2] for r in records(content["payloads.bin"]) if r[0] & 1 == 0}
    assert tombstones == erased and manifest["erased"] == len(erased)
    assert all(s == receipt.seq for s in erased.values())
    carried = [r for r in records(content["payloads.bin"]) if r[0] & 1 == 1]
    assert not [r for r in carried if r[1].hex() in erased]  # no body for a tombstone
    for name, data in content.items():
        for text in (SECRET, json.dumps(SECRET)[1:-1]):
            assert text.encode() not in data, name
    assert OTHER.encode() in b"".join(content.values())
    report = verify_bundle(whole, vkey=vkey)
    assert report.ok and report.authenticity == "verified", report.problem
    assert isinstance(report, ReportV2) and report.payloads_erased == len(erased)
    assert report.erasures == [{"seq": receipt.seq, "payloads": len(erased)}]  # as a database's
    code, alone_report = standalone(alone, "whole.zip", "--key", vkey)
    assert code == 0 and alone_report["ok"] and alone_report["authenticity"] == "verified"
    # a bundle of the erased session alone: only slots, and it still verifies
    from archive_provider.audit.export import Selection

    only = export(home, alone / "erased-session.zip", Selection(session="s-secret"))
    assert verify_bundle(only, vkey=vkey).ok
    code, _ = standalone(alone, "erased-session.zip", "--key", vkey)
    assert code == 0

    # a tombstone dated at or before the event that names it hides a body: refused there
    def backdate(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        items = records(content["payloads.bin"])
        items[0] = (items[0][0] & AGAIN, items[0][1], secret_seq, b"")
        content["payloads.bin"] = pack(items)

    reseal(only, backdate)
    report = verify_bundle(only, vkey=vkey)
    assert (report.ok, report.code) == (False, "missing_payload"), report.problem
    assert report.first_bad_seq is not None and report.first_bad_seq <= secret_seq
    # a proof of a kept event, and of the erased turn (its envelope, no body), check offline
    for seq, name in ((keep_seq, "keep.proof"), (secret_seq, "erased.proof")):
        assert (
            main(["--home", str(home), "--json", "prove", str(seq), "--out", str(alone / name)])
            == 0
        )
        capsys.readouterr()
        code, proof = standalone(alone, name, "--key", vkey)
        assert code == 0 and proof["authenticity"] == "verified", proof
        assert SECRET.encode() not in (alone / name).read_bytes()
    (event,) = standalone(alone, "keep.proof", "--key", vkey)[1]["details"]["events"]
    assert any(OTHER in body for body in event["disclosed"].values())
    (event,) = standalone(alone, "erased.proof", "--key", vkey)[1]["details"]["events"]
    assert not set(event["disclosed"]) & set(erased)


def test_an_export_asks_for_its_tombstones_in_batches(store: EventStore, tmp_path: Path) -> None:
    """The erased digests a bundle names are looked up in one query per batch of digests,
    not one query each (issue 18: the export asked the ``erased`` table per digest)."""
    from archive_provider.audit.export import Selection, export_bundle

    fill(store)
    erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r")
    erased = store.conn.execute("SELECT count(*) FROM erased").fetchone()[0]
    assert erased >= 2
    asked: list[str] = []
    store.conn.set_trace_callback(asked.append)
    try:
        result = export_bundle(store, tmp_path / "all.zip", Selection())
    finally:
        store.conn.set_trace_callback(None)
    assert result.verification.ok, result.verification.problem
    assert len([sql for sql in asked if "FROM erased WHERE digest" in sql]) == 1
    tombstones = [
        r for r in records(members(tmp_path / "all.zip")["payloads.bin"]) if r[0] & 1 == 0
    ]
    assert len(tombstones) == erased
