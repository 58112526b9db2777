"""The v2 local witness, the open-time proof that costs what is new, and the background walk
(docs/FORMAT.md 16.1, 20.4): real v2 archives, a real writer, tampering done with SQL.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from archive_provider.domain.clock import utc_now
from archive_provider.format.events import NewEvent
from archive_provider.format.signed_note import Verifier, open_checkpoint
from archive_provider.format.verifier import verify_database
from archive_provider.storage import checkpoint_proof
from archive_provider.storage.store import EventStore
from archive_provider.storage.witness import Witness
from archive_provider.storage.writer import Writer


def _turn(store: EventStore, turn: int, text: str, session: str = "s1") -> NewEvent:
    part = store.hasher.part({"content": text, "role": "user"})
    return NewEvent(
        "turn", session, {"turn": turn}, {"turn": turn, "messages": [part.digest]}, (part,)
    )


def _build(turn: int, text: str) -> Callable[[EventStore], list[NewEvent]]:
    return lambda store: [_turn(store, turn, text)]


def _archive(tmp_path: Path) -> tuple[Path, Witness]:
    folder = tmp_path / "archive"
    EventStore.open(folder).close()
    return folder, Witness(tmp_path / "witness", folder)


def _session(folder: Path, witness: Witness, turns: range, *, durable: bool = True) -> Writer:
    """A writer session that appends ``turns`` (each durable: a checkpoint) and closes."""
    writer = Writer(folder, witness=witness)
    for turn in turns:
        if durable:
            writer.append_durable(_build(turn, f"turn {turn} text"), timeout=30)
        else:
            writer.submit(_build(turn, f"turn {turn} text"))
    assert writer.close().complete
    return writer


def _crash_append(folder: Path, turns: range) -> None:
    """Append without a checkpoint and stop without a clean close (a crash)."""
    store = EventStore.open(folder)
    store._last_signed = utc_now().timestamp()  # as a writer that signed a moment ago
    for turn in turns:
        store.append([_turn(store, turn, f"crashed turn {turn}")])
    store.conn.close()  # no closing checkpoint, no witness write


def _raw(folder: Path) -> sqlite3.Connection:
    return sqlite3.connect(folder / "events.db", isolation_level=None)


def test_the_local_witness_cosigns_each_checkpoint_after_checking_it(tmp_path: Path) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 4))
    record = witness.read()
    assert record is not None and record.checkpoint is not None and record.log_vkey
    store = EventStore.open(folder)
    assert record.log_vkey == store.vkey
    head = store.head()
    cosigner = checkpoint_proof.cosigner(witness.directory).verifier
    note = store.checkpoint_note()
    assert note is not None
    checkpoint, _, cosigned = open_checkpoint(note, Verifier.from_vkey(store.vkey), [cosigner])
    assert checkpoint.size == head.seq == record.seq
    assert [s.name for s in cosigned] == [checkpoint_proof.COSIGNER_NAME]
    rows = store.conn.execute("SELECT count(*) FROM cosignatures").fetchone()[0]
    assert rows >= 3  # one per checkpoint it advanced to
    store.close()
    second = _session(folder, witness, range(4, 6))
    assert second.refused is None


def test_a_rollback_of_the_whole_folder_is_refused(tmp_path: Path) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 3))
    shutil.copytree(folder, tmp_path / "old")
    _session(folder, witness, range(3, 6))
    shutil.rmtree(folder)
    shutil.copytree(tmp_path / "old", folder)
    writer = Writer(folder, witness=witness)
    with pytest.raises(Exception, match="witness mismatch"):
        writer.append_durable(_build(9, "after the rollback"), timeout=30)
    assert writer.refused is not None and not writer.proven.is_set()
    writer.close()


def test_a_consistent_looking_rewrite_is_refused_by_the_witness(tmp_path: Path) -> None:
    """A fork made with the archive's own signing key verifies on its own, but the witness
    cosigned the other branch: the open-time proof refuses it."""
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 3))
    shutil.copytree(folder, tmp_path / "fork")
    _session(folder, witness, range(3, 5))
    fork = EventStore.open(tmp_path / "fork")  # the attacker holds the folder and its key
    for turn in range(3, 9):
        fork.append([_turn(fork, turn, f"rewritten {turn}")], durable=True)
    assert verify_database(fork.conn, fork.key, vkey=fork.vkey).ok  # consistent on its own
    fork.close()
    shutil.rmtree(folder)
    shutil.copytree(tmp_path / "fork", folder)
    writer = Writer(folder, witness=witness)
    with pytest.raises(Exception, match="witness mismatch"):
        writer.append_durable(_build(20, "on the fork"), timeout=30)
    assert "witness mismatch" in (writer.refused or "")
    writer.close()


def test_the_checkpoint_check_refuses_an_inconsistent_tree(tmp_path: Path) -> None:
    """check_consistent itself: a fork's checkpoint is not consistent with the witnessed one."""
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 3))
    shutil.copytree(folder, tmp_path / "fork")
    _session(folder, witness, range(3, 5))
    record = witness.read()
    assert record is not None
    log_key = Verifier.from_vkey(record.log_vkey or "")
    witnessed = open_checkpoint(record.checkpoint or "", log_key)[0]
    fork = EventStore.open(tmp_path / "fork")
    for turn in range(3, 9):
        fork.append([_turn(fork, turn, f"rewritten {turn}")], durable=True)
    newest = open_checkpoint(fork.checkpoint_note() or b"", log_key)[0]
    with pytest.raises(checkpoint_proof.WitnessMismatch, match="not consistent"):
        checkpoint_proof.check_consistent(fork, witnessed, newest)
    fork.close()


def test_open_after_a_crash_verifies_only_what_is_new(tmp_path: Path) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 6))
    _crash_append(folder, range(6, 9))
    writer = Writer(folder, witness=witness)
    assert writer.flush(30)
    proof = writer.last_proof
    assert proof is not None and proof.path == "checkpoint" and proof.ok  # type: ignore[attr-defined]
    assert writer.proven.is_set()
    walk = writer._walk
    assert walk is not None and walk.wait(60) and walk.state.complete
    writer.close()
    record = witness.read()
    assert record is not None and record.walked and record.walked["complete"]


def _edit_turn_text(folder: Path, seq: int) -> None:
    """Replace the stored bytes of the message of the turn at ``seq`` (triggers dropped)."""
    conn = _raw(folder)
    (parts,) = conn.execute("SELECT parts FROM events WHERE seq = ?", (seq,)).fetchone()
    conn.execute("DROP TRIGGER payloads_erase_only")
    changed = conn.execute(
        "UPDATE payloads SET body = ? WHERE digest = ?",
        (b'{"content":"forged","role":"user"}', parts[:32]),
    ).rowcount
    conn.close()
    assert changed == 1


def test_damage_after_the_newest_checkpoint_is_refused_at_open(tmp_path: Path) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 4))
    _crash_append(folder, range(4, 7))
    _edit_turn_text(folder, 6)
    writer = Writer(folder, witness=witness)
    with pytest.raises(Exception, match="failed verification"):
        writer.append_durable(_build(30, "after the damage"), timeout=30)
    assert writer.refused is not None and "seq 6" in writer.refused
    assert writer._walk is None  # refused by the open-time proof itself
    assert not writer.proven.is_set()
    writer.close()


def test_damage_in_deep_history_is_refused_by_the_background_walk(tmp_path: Path) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 8))
    _crash_append(folder, range(8, 10))
    _edit_turn_text(folder, 4)
    conn = _raw(folder)
    newest = conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()[0]
    assert conn.execute("SELECT max(seq) FROM events").fetchone()[0] > newest > 4
    conn.close()  # deep history: before the newest checkpoint
    writer = Writer(folder, witness=witness)
    writer.flush(30)
    walk = writer._walk
    assert walk is not None and walk.wait(60)
    assert walk.state.first_bad_seq == 4
    assert writer.refused is not None and "background walk" in writer.refused
    assert not writer.proven.is_set()
    with pytest.raises(Exception, match="refused"):
        writer.append_durable(_build(30, "after the damage"), timeout=30)
    writer.close()


def test_recall_is_withheld_with_a_fenced_notice_until_the_log_is_proven(
    make_provider: Callable[..., object], tmp_path: Path
) -> None:
    """A refused open-time proof (here a rolled-back folder): prefetch returns a fenced
    notice saying why, the tool an error; nothing archived is shown (issue 15 point 6)."""
    import json

    from archive_provider.projections.recall import FENCE_CLOSE, FENCE_OPEN
    from archive_provider.storage.store import archive_dir

    home = tmp_path / "home"
    first: Any = make_provider(home)
    first.sync_turn(
        "",
        "",
        session_id="s1",
        messages=[
            {"role": "user", "content": "My sister's name is Ingrid"},
            {"role": "assistant", "content": "Noted"},
        ],
    )
    first.shutdown()
    shutil.copytree(archive_dir(home), tmp_path / "old")
    second: Any = make_provider(home)
    second.sync_turn(
        "",
        "",
        session_id="s2",
        messages=[
            {"role": "user", "content": "Ingrid moved to Bergen"},
            {"role": "assistant", "content": "Noted"},
        ],
    )
    second.shutdown()
    shutil.rmtree(archive_dir(home))
    shutil.copytree(tmp_path / "old", archive_dir(home))
    third: Any = make_provider(home)
    text = third.prefetch("what is my sister called?")
    lines = text.splitlines()
    assert lines[0] == FENCE_OPEN and lines[-1] == FENCE_CLOSE
    assert "recall withheld" in text and "witness mismatch" in text
    assert "Ingrid" not in text
    answer = json.loads(third.handle_tool_call("archive_search", {"query": "Ingrid"}))
    assert "withheld" in answer["error"] and "results" not in answer


def test_an_unusable_witness_key_weakens_the_witness_but_never_stops_archiving(
    tmp_path: Path,
) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 3))
    key = witness.directory / checkpoint_proof.COSIGNER_KEY
    key.unlink()
    key.mkdir()  # not a key file any more
    writer = Writer(folder, witness=witness)
    results = writer.append_durable(_build(3, "still archived"), timeout=30)
    assert results[0].outcome == "appended"
    assert writer.refused is None and writer.proven.is_set()
    assert "could not cosign" in (witness.last_error or "")
    writer.close()


def test_an_identical_checkpoint_retried_is_not_cosigned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry that appends nothing commits nothing new: the witness has cosigned this head
    already, so it is not proven, cosigned and recorded again on every retry (that was most
    of an identical retry's cost). A new event is cosigned as before."""
    cosigned: list[int] = []
    real_cosign = checkpoint_proof._cosign

    def counted(witness: Witness, store: EventStore, newest: Any, *args: Any) -> bool:
        cosigned.append(newest.size)
        return real_cosign(witness, store, newest, *args)

    monkeypatch.setattr(checkpoint_proof, "_cosign", counted)
    folder, witness = _archive(tmp_path)
    writer = Writer(folder, witness=witness)
    try:
        build = _build(1, "the evidence")
        assert writer.append_durable(build, timeout=30)[0].outcome == "appended"
        first = list(cosigned)
        record = witness.read()
        for _ in range(3):
            assert writer.append_durable(build, timeout=30)[0].outcome != "appended"
        assert cosigned == first and witness.read() == record
        assert writer.append_durable(_build(2, "new evidence"), timeout=30)[0].outcome == "appended"
        advanced = witness.read()
        assert advanced is not None and record is not None and advanced.seq > record.seq
        assert len(cosigned) == len(first) + 1
    finally:
        writer.close()
