"""Rollback and replacement via the witness (the classes of damage to rows are in
tests/test_tamper_v2.py and tests/test_witness_v2.py).

A whole-store rollback (an older copy of the entire archive put back) verifies perfectly;
only the witness catches it, and ``hermes-archive witness accept`` re-anchors it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from archive_provider.host.provider import ArchiveProvider
from archive_provider.host.settings import save_settings
from archive_provider.storage.store import archive_dir
from archive_provider.storage.witness import Witness

from .conftest import events, raw, v2_agent, verify_home
from .test_faults import EVIDENCE, blocked

ROOT = Path(__file__).resolve().parents[2]
ROW = "seq, time, type, session, key, identity, payload, parts, chain"


def build(provider: ArchiveProvider, tag: str = "t") -> None:
    messages: list[dict[str, object]] = []
    for n in range(4):
        messages += [
            {"role": "user", "content": f"{tag} question {n}"},
            {"role": "assistant", "content": f"{tag} answer {n}"},
        ]
        provider.sync_turn(
            f"{tag} question {n}", f"{tag} answer {n}", session_id="s1", messages=list(messages)
        )
        provider.on_memory_write("add", "memory", f"{tag} fact {n}", {"session_id": "s1"})
    assert provider.on_pre_compress(messages, require_checkpoint=True)


def attacker(home: Path) -> sqlite3.Connection:
    """The database as an attacker opens it: every trigger dropped."""
    conn = raw(home)
    for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
        conn.execute(f"DROP TRIGGER {trigger}")
    return conn


def head_of(home: Path) -> int:
    conn = raw(home)
    try:
        return int(conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])
    finally:
        conn.close()


# -- the damage ------------------------------------------------------------------------------


def deletion(home: Path, other: Path) -> int:
    conn = attacker(home)
    conn.execute("DELETE FROM events WHERE seq = 4")
    return 4


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "archive_provider.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def restore(backup: Path, folder: Path) -> None:
    for name in ("events.db-wal", "events.db-shm"):
        (folder / name).unlink(missing_ok=True)
    shutil.copy2(backup / "events.db", folder / "events.db")


def backed_up_then_grown(
    tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> Path:
    """A backup of the archive taken between two sessions of the provider (its folder)."""
    first = providers()
    build(first, "early")
    first.shutdown()
    backup = tmp_path / "backup"
    shutil.copytree(archive_dir(home), backup)
    second = providers()
    build(second, "late")
    second.shutdown()
    return backup


def test_whole_store_rollback_is_caught_by_the_witness_and_accepted_deliberately(
    tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    backup = backed_up_then_grown(tmp_path, home, providers)
    witnessed = Witness.for_home(home).read()
    assert witnessed is not None and witnessed.seq == head_of(home)
    conn = raw(home)
    assert conn.execute("SELECT value FROM meta WHERE name = 'format_version'").fetchone() == ("2",)
    conn.close()

    restore(backup, archive_dir(home))  # the whole store, as it was
    assert verify_home(home).ok  # the log alone cannot tell
    provider = providers()
    provider.sync_turn("after the restore", "queued", session_id="s1")
    message = str(blocked(v2_agent(provider), EVIDENCE))
    assert "witness mismatch" in message and "rolled back" in message, message
    assert "witness accept" in message
    shown = cli(home, "witness", "show")
    assert shown.returncode == 1 and "MISMATCH" in shown.stdout

    refused = cli(home, "witness", "accept")
    assert refused.returncode == 2  # --reason is required
    accepted = cli(home, "--json", "witness", "accept", "--reason", "restored from Monday's backup")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    data = json.loads(accepted.stdout)
    assert data["ok"] and data["previous_witness"]["seq"] == witnessed.seq

    receipt = v2_agent(provider)  # the same provider, no restart
    from tests.host.v2_host import pre_compress_memory_context

    assert "Archive checkpoint" in pre_compress_memory_context(receipt, EVIDENCE, True)
    assert provider.core.writer is not None and provider.core.writer.flush(20)
    logged = events(home)
    accepted_event = next(
        e
        for e in logged
        if e.type == "witness_accepted" and e.body["reason"].startswith("restored")
    )
    assert accepted_event.body["reason"] == "restored from Monday's backup"
    assert (
        accepted_event.body["user"]
        and accepted_event.body["previous_witness"]["seq"] == witnessed.seq
    )
    assert any(
        e.type == "turn" and e.seq > accepted_event.seq for e in logged
    )  # queued turn landed
    assert cli(home, "witness", "show").returncode == 0
    assert verify_home(home).ok


def test_a_replaced_store_is_caught_and_accept_refuses_a_damaged_log(
    tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    first = providers()
    build(first)
    first.shutdown()
    other = tmp_path / "other"
    second = providers(other)
    build(second, "other")
    second.shutdown()
    restore(archive_dir(other), archive_dir(home))
    for key in ("store.key", "signing.key"):
        shutil.copy2(archive_dir(other) / key, archive_dir(home) / key)
    provider = providers()
    message = str(blocked(v2_agent(provider), EVIDENCE))
    assert "witness mismatch" in message and "replaced" in message, message
    provider.shutdown()  # the damage below is done to the files alone (no live writer retrying)
    deletion(home, home)
    result = cli(home, "witness", "accept", "--reason", "try to anchor damage")
    assert result.returncode == 1 and "fails verification" in result.stdout + result.stderr


def test_the_witness_costs_sync_turn_nothing(
    home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    provider = providers()
    assert provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    witness = Witness.for_home(home)
    state = witness.state()
    for n in range(20):
        provider.sync_turn(f"q{n}", f"a{n}", session_id="s1")
    assert provider.core.writer is not None and provider.core.writer.flush(20)
    assert witness.state() == state  # ordinary commits never touch it
    assert provider.on_pre_compress(
        EVIDENCE + [{"role": "user", "content": "more"}], require_checkpoint=True
    )
    record = witness.read()
    assert record is not None and record.seq == head_of(home)  # a FULL commit moved it


def test_a_required_checkpoint_behind_a_journal_fails_at_once_with_the_refusal(
    tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    """With ``journal_every_event``, a turn waits in the spill before the checkpoint; on a
    refused log it can never be taken in, so the checkpoint must fail with the refusal, not
    wait out the proof budget and say only that nothing committed in time."""
    backup = backed_up_then_grown(tmp_path, home, providers)
    restore(backup, archive_dir(home))
    save_settings(home, {"journal_every_event": True})
    provider = providers()
    provider.sync_turn("after the restore", "journaled first", session_id="s1")
    message = str(blocked(v2_agent(provider), EVIDENCE))
    assert "witness mismatch" in message and "did not commit within" not in message, message
