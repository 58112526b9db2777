"""The recall index holds tokens only (issue 18): text stored once, removals told the old text.

``recall_fts`` reads its content through the view ``recall_text`` (the payload's text, or
``recall_docs.text`` where the payload cannot give it). Such an index forgets a row only
when told the exact text it indexed, so every test here ends by comparing the index's
vocabulary with one rebuilt from the content: a removal told the wrong text (or none)
leaves tokens behind and the two differ.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.domain import builders
from archive_provider.format.events import NewEvent
from archive_provider.projections import recall
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore.open(tmp_path / "archive", projections=default_projections)
    yield opened
    opened.close()


def turn(
    store: EventStore, session: str, ordinal: int, messages: list[Any], start: int
) -> NewEvent:
    parts = [store.hasher.part(m) for m in messages]
    return builders.turn(store.hasher, session, ordinal, parts, start=start, legacy=False)


def said(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": text}


def vocabulary(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT term, doc, cnt FROM recall_vocab ORDER BY term").fetchall()


def assert_index_matches_content(conn: sqlite3.Connection) -> None:
    """The tokens indexed are exactly those of the content (FTS5 'rebuild' re-reads it)."""
    live = vocabulary(conn)
    conn.execute("SAVEPOINT rebuild")
    conn.execute("INSERT INTO recall_fts (recall_fts) VALUES ('rebuild')")
    rebuilt = vocabulary(conn)
    conn.execute("ROLLBACK TO rebuild")
    conn.execute("RELEASE rebuild")
    assert live == rebuilt


def test_a_message_text_is_stored_once_in_the_file(store: EventStore) -> None:
    text = "Quimby Wallaby Heronsway keeps the ledger"
    store.append([turn(store, "s1", 1, [said(text), said("noted", "assistant")], 0)])
    assert store.conn.execute(
        "SELECT rowid, text, kind, session, role FROM recall_fts ORDER BY rowid"
    ).fetchall() == [(1, text, "turn", "s1", "user"), (2, "noted", "turn", "s1", "assistant")]
    # the rows name the payload; no text of their own, no content table of the index's own
    assert (
        store.conn.execute("SELECT count(*) FROM recall_docs WHERE text IS NULL").fetchone()[0] == 2
    )
    names = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master")}
    assert "recall_fts_content" not in names
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert store.path.read_bytes().count(text.encode()) == 1


def test_text_the_payload_cannot_give_is_kept_and_served(store: EventStore) -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "parts alpha"}, {"x": 1}]}
    nul = said("nul\x00bravo")
    lone = said("lone \ud800 charlie")
    store.append([turn(store, "s1", 1, [parts, nul, lone], 0)])
    rows = store.conn.execute("SELECT text FROM recall_text ORDER BY rowid").fetchall()
    assert rows == [("parts alpha",), ("nul\x00bravo",), ("lone \ufffd charlie",)]
    assert (
        store.conn.execute("SELECT count(*) FROM recall_docs WHERE text IS NULL").fetchone()[0] == 0
    )
    hits = recall.search(store.conn, "alpha charlie")  # (substr ends a text at NUL)
    prover = recall.Prover(store.conn, store.vkey)
    store.append([builders.session_ended("s1", at="t", message_count=3)])
    if hasattr(store, "checkpoint"):
        store.checkpoint()
    assert {h.text for h in prover.proven(hits)} == {rows[0][0], rows[2][0]}, prover.withheld
    assert_index_matches_content(store.conn)


def test_a_payload_larger_than_a_query_may_prove_is_withheld_unread(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body over PROVE_PART_BYTES, or over what the query has left of PROVE_QUERY_BYTES,
    is withheld and said; the others are still proven and served."""
    long, short = "ledger " + "x" * 3000, "ledger short"
    store.append([turn(store, "s1", 1, [said(long)], 0), turn(store, "s1", 2, [said(short)], 1)])
    if hasattr(store, "checkpoint"):
        store.checkpoint()
    hits = recall.search(store.conn, "ledger")
    monkeypatch.setattr(recall, "PROVE_PART_BYTES", 2000)
    prover = recall.Prover(store.conn, store.vkey)
    assert [h.text for h in prover.proven(hits)] == [short], prover.withheld
    assert len(prover.withheld) == 1 and "larger than this query may prove" in prover.withheld[0]
    monkeypatch.setattr(recall, "PROVE_PART_BYTES", 1 << 20)
    monkeypatch.setattr(recall, "PROVE_QUERY_BYTES", 3150)  # one turn's payloads fit
    prover = recall.Prover(store.conn, store.vkey)
    assert len(prover.proven(hits)) == 1 and len(prover.withheld) == 1


def test_memory_rewind_and_erasure_leave_no_token_behind(store: EventStore) -> None:
    m = builders.memory_write
    store.append([m(store.hasher, "s1", 1, "add", "user", "likes oolong tea", {})])
    store.append([m(store.hasher, "s1", 2, "replace", "user", "likes kopi", {"old_text": "tea"})])
    store.append([m(store.hasher, "s1", 3, "add", "user", "lives in Tromso", {})])
    store.append([m(store.hasher, "s1", 4, "remove", "user", "", {"old_text": "Tromso"})])
    assert store.conn.execute("SELECT text FROM recall_fts WHERE rowid < 0").fetchall() == [
        ("likes kopi",)
    ]
    messages = [said("first zebra"), said("second yak"), said("third walrus")]
    store.append([turn(store, "s2", 1, messages[:2], 0)])
    seq = store.head().seq
    store.append([turn(store, "s2", 2, messages[2:], 2)])
    digest = store.hasher.part(messages[1]).digest
    store.append(
        [
            builders.turns_rewound(
                "s2", switch_seq=seq, start=1, rewound=[(seq, digest)], detected_by="test"
            )
        ]
    )
    assert [r[0] for r in store.conn.execute("SELECT text FROM recall_rewound")] == ["second yak"]
    assert not recall.search(store.conn, "yak")
    store.append([turn(store, "s3", 1, [said("the secret is quokka")], 0)])
    assert_index_matches_content(store.conn)
    if hasattr(store, "vkey"):  # erasure is v2's
        erasure.forget(store, Scope("session", {"session": "s3"}), reason="test")  # type: ignore[arg-type]
        terms = {t for (t, *_) in vocabulary(store.conn)}
        assert "quokka" not in terms and "walrus" in terms
        assert not recall.search(store.conn, "quokka")
        assert_index_matches_content(store.conn)
