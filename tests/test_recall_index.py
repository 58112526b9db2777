"""The recall index holds tokens only (issue 18): text stored once, removals told the old text.

``recall_fts`` reads its content through the view ``recall_text`` (the payload's text, or
``recall_docs.text`` where the payload cannot give it). Such an index forgets a row only
when told the exact text it indexed, so every test here ends by comparing the index's
vocabulary with one rebuilt from the content: a removal told the wrong text (or none)
leaves tokens behind and the two differ.
"""

from __future__ import annotations

import shutil
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


# -- an archive an older release left ---------------------------------------------------------

#: what recall version 4 kept (0.1.0 and the first format-2 archives): the text in the index
#: itself, and which memory target each memory row came from
RECALL_V4_DDL = (
    "CREATE VIRTUAL TABLE recall_fts USING fts5(text, kind UNINDEXED, session UNINDEXED,"
    " seq UNINDEXED, role UNINDEXED, tokenize = 'unicode61 remove_diacritics 2')",
    "CREATE VIRTUAL TABLE recall_vocab USING fts5vocab(recall_fts, 'row')",
    "CREATE TABLE recall_memory (rowid INTEGER PRIMARY KEY, target TEXT NOT NULL)",
)
#: sessions version 3 kept the transcript's digests as 64 hex characters
TRANSCRIPT_V3_DDL = (
    "CREATE TABLE transcript (session TEXT NOT NULL, position INTEGER NOT NULL,"
    " digest TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (session, position)) WITHOUT ROWID",
    "CREATE TABLE transcript_rewound (rewound_seq INTEGER NOT NULL, position INTEGER NOT NULL,"
    " session TEXT NOT NULL, digest TEXT NOT NULL, seq INTEGER NOT NULL,"
    " PRIMARY KEY (rewound_seq, position)) WITHOUT ROWID",
    "CREATE INDEX transcript_rewound_seq ON transcript_rewound(seq)",
)


def as_an_older_release_left_it(db_path: Path) -> None:
    """Turn the recall and sessions projections of a format-2 archive back into what recall
    version 4 and sessions version 3 stored, with the same rows, caught up to the head (in
    SQL only, so an archive of any size is aged in seconds). An open with projections must
    notice the versions and rebuild both from the log."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ALTER TABLE transcript RENAME TO transcript_v4")
        conn.execute("ALTER TABLE transcript_rewound RENAME TO transcript_rewound_v4")
        conn.execute("DROP INDEX transcript_rewound_seq")
        for statement in TRANSCRIPT_V3_DDL:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO transcript SELECT session, position, lower(hex(digest)), seq"
            " FROM transcript_v4"
        )
        conn.execute(
            "INSERT INTO transcript_rewound SELECT rewound_seq, position, session,"
            " lower(hex(digest)), seq FROM transcript_rewound_v4"
        )
        conn.execute("DROP TABLE transcript_v4")
        conn.execute("DROP TABLE transcript_rewound_v4")
        # the v5 index reads its text through the view; v4 held it: copy it out, then swap
        conn.execute(
            "CREATE TEMP TABLE texts AS SELECT rowid AS id, text, kind, session, seq, role"
            " FROM recall_fts"
        )
        for name in ("recall_vocab", "recall_fts", "recall_docs"):
            conn.execute(f"DROP TABLE {name}")
        conn.execute("DROP VIEW recall_text")
        for statement in RECALL_V4_DDL:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO recall_fts (rowid, text, kind, session, seq, role)"
            " SELECT id, text, kind, session, seq, role FROM texts ORDER BY id"
        )
        conn.execute("INSERT INTO recall_memory SELECT id, 'user' FROM texts WHERE kind = 'memory'")
        conn.execute("DROP TABLE texts")
        conn.execute("UPDATE projection_state SET version = 4 WHERE name = 'recall'")
        conn.execute("UPDATE projection_state SET version = 3 WHERE name = 'sessions'")
        conn.execute("COMMIT")
    finally:
        conn.close()


def recall_and_transcript(db_path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every recall row and every transcript row (digests as hex), in order."""
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True)
    try:
        recall_rows = conn.execute(
            "SELECT rowid, text, kind, session, seq, role FROM recall_fts ORDER BY rowid"
        ).fetchall()
        transcript = conn.execute(
            "SELECT session, position, CASE typeof(digest) WHEN 'blob' THEN lower(hex(digest))"
            " ELSE digest END, seq FROM transcript ORDER BY session, position"
        ).fetchall()
        return recall_rows, transcript
    finally:
        conn.close()


def versions(db_path: Path) -> dict[str, tuple[int, int]]:
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True)
    try:
        return {
            name: (version, last_seq)
            for name, version, last_seq in conn.execute(
                "SELECT name, version, last_seq FROM projection_state"
            )
        }
    finally:
        conn.close()


@pytest.mark.parametrize("rebuilt_by", ["the host's open", "replay"])
def test_an_archive_an_older_release_left_is_rebuilt_from_the_log(
    rebuilt_by: str, cli_home_v2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recall version 4 (the text in the index) and sessions version 3 (hex digests in the
    transcript), caught up to the head: read-only commands say what to run; the host's open
    (the provider's initialize, which then serves recall) or ``replay`` rebuilds both from
    the log, to the same rows."""
    from archive_provider import ArchiveProvider
    from archive_provider.cli import main
    from archive_provider.projections.builtin import RecallProjection, SessionsProjection

    home = tmp_path / "home"
    shutil.copytree(cli_home_v2, home)
    witness = cli_home_v2.with_name("home.archive-witness")  # the profile's own, beside it
    shutil.copytree(witness, home.with_name(witness.name))
    db_path = home / "archive" / "events.db"
    rows, transcript = recall_and_transcript(db_path)
    assert any("Ziggy" in (row[1] or "") for row in rows) and transcript
    as_an_older_release_left_it(db_path)
    assert recall_and_transcript(db_path) == (rows, transcript)  # the same rows, as v4 held them
    assert main(["--home", str(home), "search", "Ziggy"]) != 0  # read-only: nothing rebuilt
    assert "hermes-archive replay" in capsys.readouterr().err

    if rebuilt_by == "replay":
        assert main(["--home", str(home), "replay"]) == 0
    else:
        provider = ArchiveProvider()
        provider.initialize("sess-3", hermes_home=str(home), platform="cli")
        try:  # served from the rebuilt index, with its proof
            assert "Ziggy" in provider.prefetch("what is my cat called", session_id="sess-3")
        finally:
            provider.shutdown()

    head = sqlite3.connect(db_path).execute("SELECT seq FROM head").fetchone()[0]
    state = versions(db_path)
    assert state["recall"] == (RecallProjection.version, head)
    assert state["sessions"] == (SessionsProjection.version, head)
    conn = sqlite3.connect(db_path)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "recall_memory" not in names and {"recall_docs", "recall_text"} <= names
        assert conn.execute(
            "SELECT DISTINCT typeof(digest), length(digest) FROM transcript"
        ).fetchall() == [("blob", 32)]
        assert_index_matches_content(conn)
    finally:
        conn.close()
    assert recall_and_transcript(db_path) == (rows, transcript)
    capsys.readouterr()
    assert main(["--home", str(home), "--json", "search", "Ziggy"]) == 0
    assert "Ziggy" in capsys.readouterr().out
    assert main(["--home", str(home), "--json", "verify", "--projections"]) == 0
