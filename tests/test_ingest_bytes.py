"""The ingest path writes the same archive it wrote before it was made faster (issue 18).

A fixed transcript goes through the writer's own build and append path (``turn_event``,
several jobs to one transaction as the writer group-commits them, texts repeated within
and across transactions, a secret to redact, an author, a rewind, a checkpoint, a memory
write) with the clock frozen and every random byte (salts, keys) drawn from a seeded
generator. The digest of every table's rows is the one the code before the change
(b507ca0) produced for the same input, and the projections equal a replay of the log.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from blake3 import blake3
from freezegun import freeze_time

from archive_provider.audit.replay import projection_digests, rebuild
from archive_provider.domain import builders
from archive_provider.host.spill_kinds import turn_event
from archive_provider.storage.store import EventStore
from tests.conftest import open_v2, seed_randomness, traced

#: the rows :func:`ingest` writes (every table, in the order :func:`rows_digest` reads them).
#: First computed on the code before the batched-ingest changes (b507ca0, then 579faca), to
#: show they changed no byte; recomputed when format 2's turn bodies took their frozen shape
#: (messages by position, FORMAT.md 13.4): it pins the frozen format's bytes
BEFORE = "7cad7fa8769e72951efb36d4936329aa9f5c2ea1cde8a1c7cd13f9bd9c69c03e"

TYPES = {"store_created": 1, "turn": 6, "memory_write": 1, "checkpoint": 1}
SECRET = "my key is sk-ant-api03-" + "A" * 40
AUTHOR = {"id": "u-1", "name": "Ann", "is_bot": False, "source": "cli"}


def message(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


@pytest.fixture
def seeded(home: Path) -> Iterator[EventStore]:
    """A v2 store whose every random byte comes from one seed, the clock frozen."""
    with pytest.MonkeyPatch.context() as patch, freeze_time("2026-12-01T12:00:00Z"):
        seed_randomness(patch, 18)
        store = open_v2(home / "archive")
        try:
            yield store
        finally:
            store.close()


def ingest(store: EventStore) -> None:
    """The fixed input: turns built and appended as the writer does, a few jobs a commit."""
    transcripts: dict[str, list[dict[str, str]]] = {"a": [message("system", "be brief")], "b": []}
    counts = {"a": 0, "b": 0}

    def job(session: str, *new: dict[str, str], author: dict[str, object] | None = None) -> None:
        rows = transcripts[session]
        rows.extend(new)
        events, _ = turn_event(
            store, session, counts[session], list(rows), None, False, True, author
        )
        store.append_in_transaction(events)
        counts[session] += 1

    with store.transaction():  # one commit, several jobs: texts repeated inside it
        job("a", message("user", "hello"), message("assistant", "hi there"), author=AUTHOR)
        job("b", message("user", "hello"), message("assistant", "hi there"))
        job("a", message("user", SECRET), message("assistant", "noted"))
    with store.transaction():  # texts stored by the commit before
        job("b", message("user", "hello"), message("assistant", "noted"))
        job("a", message("user", "again"), message("assistant", "again"))
    store.append(
        [builders.memory_write(store.hasher, "a", 1, "add", "user", "prefers tea", {}, redact=True)]
    )
    with store.transaction():
        evidence = [store.hasher.part(row) for row in transcripts["a"]]
        store.append_in_transaction(
            [
                builders.checkpoint(
                    store.hasher,
                    "a",
                    evidence,
                    parent_session="",
                    host_api_version=1,
                    require_checkpoint=False,
                    received=len(evidence),
                )
            ]
        )
    transcripts["b"] = transcripts["b"][:2]  # the host rewound b's last turn
    with store.transaction():
        job("b", message("user", "something else"), message("assistant", "hi there"))


def rows_digest(conn: sqlite3.Connection) -> str:
    """BLAKE3 of every row of every table (FTS5's shadow tables included), in rowid or key
    order: the archive's whole content, whatever its pages look like."""
    hasher = blake3()
    tables = [
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            " ORDER BY name"
        )
    ]
    for table in tables:
        hasher.update(f"\x00table {table}\x00".encode())
        for row in conn.execute(f'SELECT * FROM "{table}" ORDER BY 1, 2'):
            hasher.update(
                repr(tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)).encode()
            )
    return hasher.hexdigest()


def test_the_archive_is_the_one_the_code_before_wrote(seeded: EventStore) -> None:
    ingest(seeded)
    types = dict(seeded.conn.execute("SELECT type, count(*) FROM events GROUP BY type"))
    assert types == TYPES  # what the digest covers
    assert rows_digest(seeded.conn) == BEFORE


def test_the_projections_equal_a_replay(seeded: EventStore) -> None:
    ingest(seeded)
    live = projection_digests(seeded.conn)
    rebuild(seeded)
    assert projection_digests(seeded.conn) == live


def test_a_new_part_is_looked_up_once(store: EventStore) -> None:
    """Naming a new text probes ``payloads`` by its lookup; appending it does not again
    (the code before probed each new message twice: 4.1 statements of a turn's 19.6)."""
    rows = [message("user", "a new question"), message("assistant", "a new answer")]
    with traced(store.conn) as statements, store.transaction():
        events, _ = turn_event(store, "s", 0, rows, None, False, True)
        store.append_in_transaction(events)
        assert len([s for s in statements if "FROM payloads WHERE lookup" in s]) == 2
        again, _ = turn_event(store, "t", 0, rows, None, False, True)  # stored now: found
        store.append_in_transaction(again)
    stored = store.conn.execute("SELECT count(*) FROM payloads WHERE lookup IS NOT NULL")
    assert stored.fetchone()[0] == 2


def test_a_part_named_before_the_transaction_is_looked_up_again(
    home: Path, store: EventStore
) -> None:
    """A text named outside a transaction and stored by another process before it begins
    is found stored, not inserted a second time under a new salt."""
    early = store.hasher.part(message("user", "written twice"))
    assert early.salt is not None  # new when named
    other = open_v2(home / "archive")
    try:
        other.append(
            [
                builders.turn(
                    other.hasher,
                    "o",
                    1,
                    [other.hasher.part(message("user", "written twice"))],
                    start=0,
                    legacy=False,
                )
            ]
        )
    finally:
        other.close()
    store.append([builders.turn(store.hasher, "s", 1, [early], start=0, legacy=False)])
    rows = store.conn.execute("SELECT count(*) FROM payloads WHERE body = ?", (early.body,))
    assert rows.fetchone()[0] == 1


def test_a_turn_of_new_texts_is_not_looked_up_by_identity_and_a_resent_one_is(
    store: EventStore,
) -> None:
    """A turn naming a part salted in this transaction has an identity no event has: the
    append skips that probe. The same turn sent again names stored parts: it is probed and
    found (idempotent)."""
    rows = [message("user", "first words"), message("assistant", "first reply")]
    with traced(store.conn) as statements:
        with store.transaction():
            events, _ = turn_event(store, "s", 0, rows, None, False, True)
            first = store.append_in_transaction(events)
        assert [s for s in statements if "FROM events WHERE identity" in s] == []
        with store.transaction():
            again = store.append_in_transaction(turn_event(store, "s", 0, rows, 0, False, True)[0])
    assert len([s for s in statements if "FROM events WHERE identity" in s]) == 1
    assert [r.outcome for r in first] == ["appended"]
    assert [(r.outcome, r.seq) for r in again] == [("already_archived", first[0].seq)]
