"""An identical checkpoint retry is recognised without per-message work, and only when true.

host/known_checkpoints.py: a retry of a checkpoint this process committed is answered from
the recognition key and one read of the log, so it needs neither the writer nor the write
lock; whatever could make "already archived" untrue (an erasure since, another session,
another transcript) takes the full path.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit import erasure
from archive_provider.host.provider import CheckpointError
from archive_provider.storage.store import EventStore, archive_dir

from .conftest import event_rows


def convo(*texts: str) -> list[dict[str, object]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(texts)]


EVIDENCE = convo("the launch moved to Thursday", "noted: Thursday", "and the venue?", "Hall B")


def test_an_identical_retry_is_answered_while_another_process_holds_the_write_lock(
    make_provider, tmp_path: Path, monkeypatch
) -> None:
    """The old path queued a durable job that waited for the lock and raised CheckpointError;
    the checkpoint was already durable, so the retry needs no write at all."""
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.2")
    monkeypatch.setenv("ARCHIVE_CHECKPOINT_TIMEOUT_S", "1")
    provider = make_provider()
    first = provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    assert "4 messages archived" in first
    before = event_rows(tmp_path / "home")
    blocker = sqlite3.connect(archive_dir(tmp_path / "home") / "events.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        again = provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert again == first.replace(
        "archived (4 newly stored)", "already archived (all already stored)"
    )
    assert provider.core.writer is not None and provider.core.writer.flush(10)
    assert event_rows(tmp_path / "home") == before  # nothing recorded, not even a failure


def test_a_recognised_retry_answers_what_the_full_path_answers(
    make_provider, tmp_path: Path
) -> None:
    provider = make_provider()
    provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    recognised = provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
    provider.shutdown()
    fresh = make_provider()  # a new process's first retry: nothing remembered, the full path
    full = fresh.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
    assert recognised == full
    assert "already archived (all already stored)" in full
    assert [t for _, t, _ in event_rows(tmp_path / "home")].count("checkpoint") == 1


def test_a_retry_after_its_evidence_was_erased_is_archived_again(
    make_provider, tmp_path: Path
) -> None:
    """ "Already archived" would be untrue once an erasure removed the bodies: the full path
    stores what the host still holds, as a retry in a new process would."""
    provider = make_provider()
    provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    store = EventStore.open(
        archive_dir(tmp_path / "home")
    )  # the CLI's `forget`, another connection
    try:
        erasure.forget(store, erasure.Scope("session", {"session": "s1"}), reason="asked")
    finally:
        store.close()
    again = provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
    assert "4 messages archived (4 newly stored)" in again
    assert [t for _, t, _ in event_rows(tmp_path / "home")].count("checkpoint") == 2


def test_the_same_evidence_in_another_session_is_a_new_checkpoint(
    make_provider, tmp_path: Path
) -> None:
    provider = make_provider()
    provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    provider.on_session_switch("s2", parent_session_id="s1", reset=True)
    other = provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
    assert "4 messages archived (all already stored)" in other
    grown = provider.on_pre_compress(EVIDENCE + convo("one more"), require_checkpoint=True)
    assert "5 messages archived (1 newly stored)" in grown
    assert [t for _, t, _ in event_rows(tmp_path / "home")].count("checkpoint") == 3


def test_a_retry_over_an_edited_evidence_body_fails_closed(make_provider, tmp_path: Path) -> None:
    """Remembering the checkpoint must not vouch for a body edited since: the retry checks
    each part's stored body against its salted digest and then takes the full path, which
    refuses (tests/reliability/test_attacks.py covers the same on a v1 log)."""
    provider = make_provider()
    provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    conn = sqlite3.connect(archive_dir(tmp_path / "home") / "events.db", isolation_level=None)
    try:
        conn.execute("DROP TRIGGER payloads_erase_only")  # the attacker's first step
        (parts,) = conn.execute(
            "SELECT parts FROM events WHERE type = 'checkpoint' ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        assert isinstance(parts, bytes)  # format v2: the default
        edited = conn.execute(
            "UPDATE payloads SET body = ? WHERE digest = ?",
            (b'{"content":"I never said that","role":"user"}', parts[:32]),
        ).rowcount
        assert edited == 1
    finally:
        conn.close()
    with pytest.raises(CheckpointError):
        provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)


def _handles(db: Path) -> int:
    """How many file descriptors of this process are open on ``db`` (Linux's /proc)."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            count += Path(os.readlink(fd)) == db
        except OSError:
            continue  # closed while listed
    return count


def test_the_first_retry_finds_the_reader_open(make_provider, tmp_path: Path) -> None:
    """A connection's first statement parses the whole schema (~1 ms with the open): the
    first identical retry of a process paid it on the host's thread (3.6x hashing its
    evidence at 50 messages). The reader now opens on a thread of its own once the log is
    proven, so the retry opens nothing."""
    provider = make_provider(agent_context="checkpoint_only")  # no retention worker's handle
    db = (archive_dir(tmp_path / "home") / "events.db").resolve()
    first = provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    for _ in range(200):  # the writer's and the reader's handle (bounded wait, not timed)
        if _handles(db) >= 2:
            break
        time.sleep(0.05)
    before = _handles(db)
    assert before >= 2
    again = provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
    assert again == first.replace(
        "archived (4 newly stored)", "already archived (all already stored)"
    )
    assert _handles(db) == before


def _retried_after_a_backup(make_provider: Any, tmp_path: Path) -> tuple[Any, Path]:
    """A provider whose archive was backed up to ``before.db`` just before a checkpoint, and
    that checkpoint retried once (answered "already archived")."""
    provider = make_provider()
    db = archive_dir(tmp_path / "home") / "events.db"
    assert provider.core.writer is not None and provider.core.writer.flush(30)
    _sqlite_copy(db, tmp_path / "before.db")
    provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    assert "already archived" in provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
    return provider, db


def _sqlite_copy(source: Path, target: Path) -> None:
    """Copy one database over another with SQLite's backup API (consistent while the writer
    runs; connections open on ``target`` see the copy)."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def test_a_retry_after_the_archive_was_rolled_back_is_not_answered_from_memory(
    make_provider, tmp_path: Path
) -> None:
    """The reader opened ahead must not vouch for a checkpoint the archive no longer holds:
    a backup from before the checkpoint restored in place (SQLite's backup API, so every
    open connection sees it) makes the retry's read fail, so the full path decides: the
    writer finds the log went back and refuses, and nothing is claimed as archived."""
    provider, db = _retried_after_a_backup(make_provider, tmp_path)
    _sqlite_copy(tmp_path / "before.db", db)
    with pytest.raises(CheckpointError, match="rolled back"):  # the writer's verdict
        provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)


def test_a_retry_after_the_archive_file_was_replaced_is_not_answered_from_the_old_file(
    make_provider, tmp_path: Path
) -> None:
    """A backup renamed into place while the provider runs: the reader and the writer kept
    the old file open, so the retry was answered "already archived" from a file no one will
    read again, and later turns were committed into it. Both now notice that the file at the
    path changed and reopen it; the writer's open-time proof finds it behind the witness."""
    provider, db = _retried_after_a_backup(make_provider, tmp_path)
    os.replace(tmp_path / "before.db", db)  # restored as an operator would, in place of it
    for stale in ("-wal", "-shm"):
        Path(f"{db}{stale}").unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="witness mismatch"):
        provider.on_pre_compress(list(EVIDENCE), require_checkpoint=True)
