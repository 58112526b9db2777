"""The format-v2 store on real SQLite files (docs/FORMAT.md sections 10, 12.3, 14, 15, 17).

One ``EventStore`` API for both versions: ``EventStore.open`` gives an ``EventStore`` for a
v2 file and the v1 class for a v1 file, and the rest of the package reads both the same way.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from freezegun import freeze_time
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive_provider.format import digests_v2, merkle
from archive_provider.format.events import NewEvent, Part
from archive_provider.format.signed_note import (
    Checkpoint,
    Signature,
    Verifier,
    format_checkpoint,
    format_note,
    open_checkpoint,
)
from archive_provider.storage import store as store_module
from archive_provider.storage.store import EventStore, StoreError
from archive_provider.storage.store_pieces import SIGNING_KEY_ENV, KeyFileError, TamperedPart


def _turn(store: EventStore, turn: int, *texts: str, session: str = "s1") -> NewEvent:
    parts = tuple(store.hasher.part({"content": t, "role": "user"}) for t in texts)
    digests = [p.digest for p in parts]
    return NewEvent("turn", session, {"turn": turn}, {"turn": turn, "messages": digests}, parts)


def _open(folder: Path) -> EventStore:
    store = EventStore.open(folder)
    return store


def _leaves(conn: sqlite3.Connection) -> list[bytes]:
    from archive_provider.storage.store import iter_events

    return [merkle.leaf_hash(e.envelope.canonical()) for e in iter_events(conn)]


def test_a_new_v2_archive_has_its_files_meta_and_first_event(tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    store = _open(folder)
    for name in ("events.db", "store.key", "signing.key"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    assert not (folder / "payload.key").exists()
    meta = dict(store.conn.execute("SELECT name, value FROM meta"))
    assert meta["format_version"] == "2"
    assert meta["origin"] == f"hermes-archive.invalid/{store.store_id}"
    assert meta["vkey"] == store.vkey and store.vkey.startswith(meta["origin"] + "+")
    first = store.event(1)
    assert first is not None and first.type == "store_created"
    assert first.body["vkey"] == store.vkey and first.body["store_id"] == store.store_id
    # the first event was a durable commit: it is signed
    assert store.conn.execute("SELECT size FROM signed_checkpoints").fetchall() == [(1,)]
    store.close()


def test_digests_are_blobs_in_the_database_and_hex_in_the_api(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    [result] = store.append([_turn(store, 1, "hello", "world")])
    row = store.conn.execute(
        "SELECT typeof(identity), length(identity), length(payload), length(parts),"
        " length(chain), author FROM events WHERE seq = ?",
        (result.seq,),
    ).fetchone()
    assert row == ("blob", 32, 32, 64, 32, None)
    event = store.event(result.seq)
    assert event is not None and event.envelope.identity == result.identity
    assert len(event.part_digests) == 2 and all(len(d) == 64 for d in event.part_digests)
    assert event.messages == event.part_digests
    for digest in event.part_digests:
        assert store.payload(digest) is not None
    store.close()


def test_parts_are_stored_once_with_a_salt_and_a_lookup(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    store.append([_turn(store, 1, "same")])
    store.append([_turn(store, 2, "same", "new")])
    rows = store.conn.execute(
        "SELECT CAST(body AS TEXT), length(salt), length(lookup) FROM payloads"
        " WHERE lookup IS NOT NULL ORDER BY 1"
    ).fetchall()
    assert rows == [
        ('{"content":"new","role":"user"}', 32, 16),
        ('{"content":"same","role":"user"}', 32, 16),
    ]
    # event bodies get a salt but no lookup
    bodies = store.conn.execute(
        "SELECT count(*) FROM payloads p JOIN events e ON e.payload = p.digest"
        " WHERE p.lookup IS NULL AND length(p.salt) = 32"
    ).fetchone()[0]
    assert bodies == 3  # store_created and two turns
    store.close()


def test_payload_pages_stay_full_as_random_digests_arrive(tmp_path: Path) -> None:
    """Payload rows are kept in append order (a rowid table), not in digest order.

    Keyed by a random digest, every insert lands on a random page and splits it, leaving
    pages about a fifth empty (issue 18: 236 of 2,320 bytes per turn at 100k turns; 21%
    here). In append order each page is filled before the next is started (4% here).
    """
    store = _open(tmp_path / "a")
    filler = "the archive keeps every word of this message once " * 10
    for batch in range(40):
        store.append(
            [_turn(store, 25 * batch + i, f"{25 * batch + i} {filler}") for i in range(25)]
        )
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    [(pages, unused)] = store.conn.execute(
        "SELECT sum(pgsize), sum(unused) FROM dbstat WHERE name = 'payloads'"
    ).fetchall()
    store.close()
    assert unused / pages < 0.08, f"payload pages {unused / pages:.0%} empty"


def test_a_part_made_before_another_transaction_stored_it_is_renamed(tmp_path: Path) -> None:
    """Two builders drawing salts for one new text: the second is renamed to the stored digest."""
    store = _open(tmp_path / "a")
    early = _turn(store, 1, "twice")  # drawn now, not stored
    store.parts_hasher.pending.clear()  # as if built by another transaction
    store.append([_turn(store, 2, "twice")])
    [result] = store.append([early])
    event = store.event(result.seq)
    stored = store.event(result.seq - 1)
    assert event is not None and stored is not None
    assert event.part_digests == stored.part_digests
    assert event.messages == stored.part_digests
    assert (
        store.conn.execute("SELECT count(*) FROM payloads WHERE lookup IS NOT NULL").fetchone()[0]
        == 1
    )
    store.close()


def test_the_same_event_is_archived_once(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    first = store.append([_turn(store, 1, "a", "b")])
    rows = store.conn.execute("SELECT count(*) FROM payloads").fetchone()[0]
    again = store.append([_turn(store, 1, "a", "b")])
    assert again[0].outcome == "already_archived" and again[0].seq == first[0].seq
    assert store.conn.execute("SELECT count(*) FROM payloads").fetchone()[0] == rows
    # identity covers the session: the same turn in another session is another event
    other = store.append([_turn(store, 1, "a", "b", session="s2")])
    assert other[0].outcome == "appended"
    store.close()


def test_a_tampered_part_fails_the_transaction(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    store.append([_turn(store, 1, "secret")])
    store.conn.execute("DROP TRIGGER payloads_erase_only")
    store.conn.execute(
        'UPDATE payloads SET body = CAST(\'{"content":"secreT","role":"user"}\' AS BLOB)'
        " WHERE lookup IS NOT NULL"
    )
    head = store.head()
    with pytest.raises(TamperedPart, match="edited after it was written"):
        store.append([_turn(store, 2, "secret")])
    assert store.head() == head
    store.close()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET session = 'x'",
        "DELETE FROM events",
        "DELETE FROM payloads",
        "UPDATE payloads SET body = NULL, salt = NULL, lookup = NULL",  # not listed in erased
        "UPDATE tiles SET hashes = substr(hashes, 1, 32)",
        "DELETE FROM tiles",
        "DELETE FROM signed_checkpoints",
        "UPDATE signed_checkpoints SET size = 99",
    ],
)
def test_triggers_refuse_what_the_format_forbids(tmp_path: Path, statement: str) -> None:
    store = _open(tmp_path / "a")
    store.append([_turn(store, 1, "x", "y")], durable=True)
    with pytest.raises(sqlite3.IntegrityError):
        store.conn.execute(statement)
    store.close()


def test_an_erasure_may_clear_a_payload_listed_in_erased(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    store.append([_turn(store, 1, "forget me")])
    digest = store.conn.execute("SELECT digest FROM payloads WHERE lookup IS NOT NULL").fetchone()[
        0
    ]
    store.conn.execute("BEGIN")
    store.conn.execute("INSERT INTO erased VALUES (?, 2)", (digest,))
    store.conn.execute(
        "UPDATE payloads SET body = NULL, salt = NULL, lookup = NULL WHERE digest = ?", (digest,)
    )
    with pytest.raises(sqlite3.IntegrityError, match="final"):
        store.conn.execute("DELETE FROM erased")
    store.conn.execute("ROLLBACK")
    store.close()


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(st.integers(min_value=1, max_value=140), min_size=1, max_size=6))
def test_tiles_and_root_follow_the_envelopes(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int]
) -> None:
    """Tiles grown in each append transaction equal the tree of the envelopes, across tiles."""
    folder = tmp_path_factory.mktemp("tree") / "archive"
    store = _open(folder)
    turn = 0
    for size in batches:
        events = []
        for _ in range(size):
            turn += 1
            events.append(_turn(store, turn, f"m{turn}"))
        store.append(events)
    leaves = _leaves(store.conn)
    head = store.head()
    assert head.seq == len(leaves) == 1 + sum(batches)
    appender = merkle.TileAppender()
    appender.append(leaves)
    assert head.root == appender.root().hex()
    tiles = {
        (lv, ix): bytes(h)
        for lv, ix, h in store.conn.execute("SELECT level, idx, hashes FROM tiles")
    }
    assert tiles == appender.changed()
    reader = merkle.TileReader(lambda lv, ix: tiles.get((lv, ix)), head.seq)
    assert merkle.root(head.seq, reader).hex() == head.root
    store.close()


def test_a_rolled_back_transaction_leaves_the_kept_edge_as_it_was(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    store.append([_turn(store, 1, "a")])
    with pytest.raises(RuntimeError, match="boom"), store.transaction():
        store.append_in_transaction([_turn(store, 2, "b")])
        raise RuntimeError("boom")
    store.append([_turn(store, 3, "c")])
    appender = merkle.TileAppender()
    appender.append(_leaves(store.conn))
    assert store.head().root == appender.root().hex()
    store.close()


def test_a_commit_hashes_its_tree_root_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head row, the checkpoint and the committed roots (what serving trusts) take the
    one root the commit hashed; they hashed it twice before."""
    store = _open(tmp_path / "a")
    hashed: list[int] = []
    real = merkle.TileAppender.root

    def counted(appender: merkle.TileAppender) -> bytes:
        hashed.append(appender.size)
        return real(appender)

    monkeypatch.setattr(merkle.TileAppender, "root", counted)
    with store.transaction(durable=True):  # durable: the commit signs a checkpoint too
        (first,) = store.append_in_transaction([_turn(store, 1, "a")])
    with store.transaction():  # nothing new: the head stays, its root is recorded again
        store.append_in_transaction([_turn(store, 1, "a")])
    (second,) = store.append([_turn(store, 2, "b")])
    assert hashed == [first.seq, first.seq, second.seq]
    signed = store.conn.execute("SELECT root FROM signed_checkpoints WHERE size = ?", (first.seq,))
    assert store.committed_roots[first.seq] == signed.fetchone()[0]
    assert store.committed_roots[second.seq].hex() == store.head().root
    store.close()


def _checkpoints(store: EventStore) -> list[int]:
    return [r[0] for r in store.conn.execute("SELECT size FROM signed_checkpoints ORDER BY size")]


def test_checkpoints_at_durable_commits_every_5_s_and_at_close(tmp_path: Path) -> None:
    with freeze_time("2026-12-01 12:00:00") as clock:
        store = _open(tmp_path / "a")
        assert _checkpoints(store) == [1]  # store_created, durable
        store.append([_turn(store, 1, "a")])
        clock.tick(timedelta(seconds=4))
        store.append([_turn(store, 2, "b")])
        assert _checkpoints(store) == [1]  # less than 5 s since the last one
        clock.tick(timedelta(seconds=1))
        store.append([_turn(store, 3, "c")])
        assert _checkpoints(store) == [1, 4]
        store.append([_turn(store, 4, "d")], durable=True)
        assert _checkpoints(store) == [1, 4, 5]
        store.append([_turn(store, 5, "e")])
        store.close()
    again = EventStore.open(tmp_path / "a")
    assert _checkpoints(again) == [1, 4, 5, 6]  # the clean close signed the head
    again.close()


def test_every_signed_checkpoint_verifies_with_the_vkey(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    for turn in range(1, 4):
        store.append([_turn(store, turn, f"t{turn}")], durable=True)
    verifier = Verifier.from_vkey(store.vkey)
    tiles = {(lv, ix): bytes(h) for lv, ix, h in store.conn.execute("SELECT * FROM tiles")}
    rows = store.conn.execute("SELECT size, root, signature FROM signed_checkpoints").fetchall()
    assert len(rows) == 4
    for size, root, signature in rows:
        text = format_checkpoint(Checkpoint(store.origin, size, bytes(root)))
        note = format_note(text, [Signature(store.origin, verifier.key_id, bytes(signature))])
        checkpoint, _, _ = open_checkpoint(note, verifier)
        reader = merkle.TileReader(lambda lv, ix: tiles.get((lv, ix)), store.head().seq)
        assert merkle.root(size, reader) == checkpoint.root
    store.close()


def test_the_signing_key_may_live_outside_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles = tmp_path / "profile"  # each archive folder's parent is its profile
    outside = tmp_path / "keys" / "signing.key"
    outside.parent.mkdir()
    monkeypatch.setenv(SIGNING_KEY_ENV, str(outside))
    store = _open(profiles / "a")
    assert outside.exists() and not (profiles / "a" / "signing.key").exists()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600
    store.close()
    # a new archive never takes over another archive's key
    with pytest.raises(KeyFileError, match="belongs to another archive"):
        _open(profiles / "b")
    assert not (profiles / "b" / "store.key").exists()
    # nor opens with it
    other = tmp_path / "other.key"
    monkeypatch.setenv(SIGNING_KEY_ENV, str(other))
    _open(profiles / "c").close()
    with pytest.raises(KeyFileError, match="not for this archive"):
        EventStore.open(profiles / "a")
    monkeypatch.delenv(SIGNING_KEY_ENV)
    with pytest.raises(KeyFileError, match="missing"):
        EventStore.open(profiles / "a")


def test_an_uppercase_store_key_is_the_same_key(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    store.append([_turn(store, 1, "same")])
    store.close()
    key_path = tmp_path / "a" / "store.key"
    text = key_path.read_text()
    os.chmod(key_path, 0o600)
    key_path.write_text(text.upper())
    again = EventStore.open(tmp_path / "a")
    [result] = again.append([_turn(again, 1, "same")])
    assert result.outcome == "already_archived"  # the lookup found the stored part
    again.close()


def test_a_missing_store_key_beside_an_archive_is_an_error(tmp_path: Path) -> None:
    _open(tmp_path / "a").close()
    (tmp_path / "a" / "store.key").unlink()
    with pytest.raises(StoreError, match="store.key"):
        EventStore.open(tmp_path / "a")


def test_parts_carry_their_salt_only_until_stored(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    fresh = store.hasher.part({"x": 1})
    assert isinstance(fresh, Part) and fresh.salt is not None and fresh.lookup is not None
    assert digests_v2.payload_digest(fresh.salt, fresh.body).hex() == fresh.digest
    store.append([NewEvent("turn", "s", {"turn": 1}, {"m": [fresh.digest]}, (fresh,))])
    found = store.hasher.part({"x": 1})
    assert found.digest == fresh.digest and found.salt is None
    store.close()


def test_the_key_command_prints_the_verifier_key_never_the_private_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from archive_provider.cli import main

    store = _open(tmp_path / "archive")
    vkey = store.vkey
    store.close()
    assert main(["--home", str(tmp_path), "key"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == vkey
    assert "PRIVATE" not in out
    Verifier.from_vkey(out.strip())  # a well-formed signed-note verifier key
    assert main(["--home", str(tmp_path), "--json", "key"]) == 0
    assert f'"vkey": "{vkey}"' in capsys.readouterr().out


def test_one_event_naming_a_new_text_twice_stores_it_once(tmp_path: Path) -> None:
    store = _open(tmp_path / "a")
    [result] = store.append([_turn(store, 1, "again", "again")])
    event = store.event(result.seq)
    assert event is not None and event.part_digests[0] == event.part_digests[1]
    assert (
        store.conn.execute("SELECT count(*) FROM payloads WHERE lookup IS NOT NULL").fetchone()[0]
        == 1
    )
    store.close()


def _writer_turn(turn: int, text: str) -> Callable[[EventStore], list[NewEvent]]:
    def build(store: EventStore) -> list[NewEvent]:
        return [_turn(store, turn, text)]

    return build


def test_the_writer_appends_proves_and_witnesses_a_v2_archive(tmp_path: Path) -> None:
    from archive_provider.format.verifier import verify_database
    from archive_provider.storage.witness import Witness
    from archive_provider.storage.writer import Writer

    folder = tmp_path / "archive"
    _open(folder).close()
    witness = Witness(tmp_path / "witness", folder)
    writer = Writer(folder, witness=witness)
    try:
        writer.submit(_writer_turn(1, "a"))
        (result,) = writer.append_durable(_writer_turn(2, "a"), timeout=10)
        assert result.outcome == "appended"
    finally:
        assert writer.close().complete
    store = EventStore.open(folder)
    report = verify_database(store.conn, store.key, vkey=store.vkey)
    assert report.ok and report.as_dict()["authenticity"] == "verified"
    head = store.head()
    assert [r[0] for r in store.conn.execute("SELECT max(size) FROM signed_checkpoints")] == [
        head.seq
    ]
    store.close()
    # the next writer proves the v2 log on open (full verification) and builds on it
    again = Writer(folder, witness=witness)
    try:
        (more,) = again.append_durable(_writer_turn(3, "b"), timeout=10)
        assert more.outcome == "appended" and more.seq == head.seq + 1
    finally:
        assert again.close().complete


def test_the_writer_refuses_a_tampered_v2_archive(tmp_path: Path) -> None:
    from archive_provider.storage.writer import Writer, WriterUnavailable

    folder = tmp_path / "archive"
    store = _open(folder)
    store.append([_turn(store, 1, "original")])
    store.close()
    conn = sqlite3.connect(folder / "events.db")
    conn.execute("DROP TRIGGER payloads_erase_only")
    conn.execute(
        'UPDATE payloads SET body = CAST(\'{"content":"forged","role":"user"}\' AS BLOB)'
        " WHERE lookup IS NOT NULL"
    )
    conn.commit()
    conn.close()
    writer = Writer(folder)
    try:
        with pytest.raises(WriterUnavailable, match="failed verification at seq 2"):
            writer.append_durable(_writer_turn(2, "next"), timeout=10)
    finally:
        writer.close()


def test_v2_identity_keys_leave_out_what_the_identity_covers(tmp_path: Path) -> None:
    """A turn's K is {"turn": n}, a checkpoint's {}, a memory write's {"order": n}."""
    from archive_provider.domain import builders

    store = _open(tmp_path / "a")
    parts = [store.hasher.part({"role": "user", "content": "hi"})]
    events = [
        builders.turn(store.hasher, "s", 1, parts, start=0, legacy=False),
        builders.checkpoint(
            store.hasher,
            "s",
            parts,
            parent_session="",
            host_api_version=1,
            require_checkpoint=False,
            received=1,
        ),
        builders.memory_write(store.hasher, "s", 1, "add", "memory", "likes tea", {}),
    ]
    assert [e.key for e in events] == [{"turn": 1}, {}, {"order": 1}]
    results = store.append(events)
    assert [r.outcome for r in results] == ["appended"] * 3
    # the same checkpoint in another session is another event: the identity covers session
    other = builders.checkpoint(
        store.hasher, "t", parts, parent_session="", host_api_version=1,
        require_checkpoint=False, received=1,
    )  # fmt: skip
    assert store.append([other])[0].outcome == "appended"
    assert store.append(events)[1].outcome == "already_archived"
    store.close()


def test_export_writes_a_v2_bundle_and_the_readable_copy_shows_hex(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from archive_provider.cli import main
    from archive_provider.format.verifier import verify_bundle

    store = _open(tmp_path / "archive")
    store.append([_turn(store, 1, "hello")])
    head = store.head()
    store.close()
    assert main(["--home", str(tmp_path), "export", str(tmp_path / "out.zip")]) == 0
    assert f"chain {head.chain}" in capsys.readouterr().out  # the signed head, as hex
    assert verify_bundle(tmp_path / "out.zip").ok
    assert main(["--home", str(tmp_path), "readable-copy", str(tmp_path / "copy.db")]) == 0
    out = capsys.readouterr().out
    assert f"chain {head.chain}" in out and "b'" not in out


def test_a_clean_writer_close_signs_the_head_and_keeps_the_fast_path(tmp_path: Path) -> None:
    """The closing checkpoint is in the file the witness fingerprints: the next open is fast."""
    from archive_provider.storage.witness import Witness, fast_path_ok
    from archive_provider.storage.writer import Writer

    folder = tmp_path / "archive"
    _open(folder).close()
    witness = Witness(tmp_path / "witness", folder)
    writer = Writer(folder, witness=witness)
    writer.submit(_writer_turn(1, "a"))  # not durable: no checkpoint at this commit
    assert writer.close().complete
    assert fast_path_ok(folder / "events.db", witness)
    store = EventStore.open(folder)
    assert store.conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()[0] == 3
    store.close()


def test_the_api_the_witness_and_proofs_build_on(tmp_path: Path) -> None:
    """checkpoint_note, read_tile and salted_payload: a signed tree an outsider can check."""
    from archive_provider.format.signed_note import Signer, open_checkpoint
    from archive_provider.storage.store import salted_payload

    store = _open(tmp_path / "a")
    for turn in range(1, 6):
        store.append([_turn(store, turn, f"text {turn}")], durable=True)
    head = store.head()
    note = store.checkpoint_note()
    assert note is not None
    log_key = Verifier.from_vkey(store.vkey)
    checkpoint, _, cosigned = open_checkpoint(note, log_key)
    assert (checkpoint.size, checkpoint.root.hex()) == (head.seq, head.root) and not cosigned
    # a stored cosignature comes back as a verifiable line of the note
    witness = Signer("witness.example/w1", bytes(32), 0x04)
    cosignature = witness.cosign(checkpoint.text, 1_700_000_000)
    store.conn.execute(
        "INSERT INTO cosignatures VALUES (?, ?, ?, ?, ?)",
        (head.seq, witness.name, witness.key_id.to_bytes(4, "big"), 1_700_000_000,
         cosignature.data[8:]),
    )  # fmt: skip
    again = store.checkpoint_note(head.seq)
    assert again is not None
    _, _, cosigned = open_checkpoint(again, log_key, [witness.verifier])
    assert [c.name for c in cosigned] == ["witness.example/w1"]
    # inclusion of event 3 in the signed tree, read from the tiles
    event = store.event(3)
    assert event is not None
    reader = merkle.TileReader(store.read_tile, head.seq)
    proof = merkle.inclusion_proof(2, head.seq, reader)
    merkle.verify_inclusion(
        2, head.seq, merkle.leaf_hash(event.envelope.canonical()), proof, checkpoint.root
    )
    salt, body = salted_payload(store.conn, event.part_digests[0]) or (b"", b"")
    assert digests_v2.payload_digest(salt, body).hex() == event.part_digests[0]
    assert store.checkpoint_note(999) is None
    store.close()


@pytest.mark.parametrize("schema_committed", [False, True])
def test_a_v2_archive_whose_making_was_cut_short_is_taken_up_again(
    tmp_path: Path, schema_committed: bool
) -> None:
    """A crash after the keys and events.db were made (before the schema was committed, or
    before store_created): the next open finishes the v2 store with its own keys, instead
    of turning events.db into a v1 store that then wants a payload.key."""
    from archive_provider.storage.store import DB_NAME, _initialise, _make_keys, connect

    folder = tmp_path / "archive"
    folder.mkdir(mode=0o700)
    store_id, signer = _make_keys(folder)
    os.close(os.open(folder / DB_NAME, os.O_WRONLY | os.O_CREAT, 0o600))  # where the kill fell
    if schema_committed:
        conn = connect(folder / DB_NAME)
        _initialise(conn, store_id, signer)
        conn.close()
    store = EventStore.open(folder)
    try:
        assert store.store_id == store_id
        assert store.vkey == signer.vkey
        assert [e.type for e in store.events()] == ["store_created"]
        assert store.append([_turn(store, 1, "hi")])[0].outcome == "appended"
    finally:
        store.close()
    assert not (folder / "payload.key").exists()


def test_the_loser_of_a_race_to_make_a_new_archive_leaves_it_as_the_winner_made_it(
    tmp_path: Path,
) -> None:
    """Two openers of a new folder: the second finds events.db and the keys the first wrote,
    and makes the schema again from them. If the first committed in between, the second
    finds the file made and leaves it (it failed with 'UNIQUE constraint failed: meta.name',
    which a CI run met as a provider whose first checkpoint could not open its archive)."""
    folder = tmp_path / "archive"
    store = EventStore.open(folder)
    made = dict(store.conn.execute("SELECT name, value FROM meta").fetchall())
    signer = store.signer
    assert signer is not None
    late = sqlite3.connect(folder / "events.db", isolation_level=None)
    try:
        store_module._initialise(late, made["store_id"], signer)
        assert dict(late.execute("SELECT name, value FROM meta").fetchall()) == made
    finally:
        late.close()
        store.close()
