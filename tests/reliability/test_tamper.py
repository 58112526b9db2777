"""Tamper evidence when the store is opened, not only by ``verify``; rollback via the witness.

Each class of damage is made the way an attacker with the file would (drop the append-only
triggers, change rows with plain SQL). Then: ``verify`` names it (where the log alone can),
and a provider opening the store refuses to append and says why, so a v2 host fails closed.
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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from archive_provider.host.provider import ArchiveProvider
from archive_provider.host.settings import save_settings
from archive_provider.storage.store import archive_dir
from archive_provider.storage.witness import Witness

from ..conftest import archive_format
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


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def fmt(request: pytest.FixtureRequest) -> Iterator[int]:
    """New archives in each format, for what the witness must catch in both."""
    with archive_format(request.param):
        yield request.param


def head_of(home: Path) -> int:
    conn = raw(home)
    try:
        return int(conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])
    finally:
        conn.close()


# -- the classes ----------------------------------------------------------------------------


def content_edit(home: Path, other: Path) -> int:
    conn = attacker(home)
    seq, digest = conn.execute(
        "SELECT seq, json_extract(parts, '$[0]') FROM events WHERE type = 'turn' ORDER BY seq LIMIT 1"
    ).fetchone()
    conn.execute(
        "UPDATE payloads SET body = CAST(? AS BLOB) WHERE digest = ?",
        ('{"content":"I never said that","role":"user"}', digest),
    )
    return int(seq)


def truncation(home: Path, other: Path) -> int:
    conn = attacker(home)
    last = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
    conn.execute("DELETE FROM events WHERE seq > ?", (last - 2,))
    return int(last - 1)


def deletion(home: Path, other: Path) -> int:
    conn = attacker(home)
    conn.execute("DELETE FROM events WHERE seq = 4")
    return 4


def reordering(home: Path, other: Path) -> int:
    conn = attacker(home)
    conn.execute("UPDATE events SET seq = -1 WHERE seq = 5")
    conn.execute("UPDATE events SET seq = 5 WHERE seq = 6")
    conn.execute("UPDATE events SET seq = 6 WHERE seq = -1")
    return 5


def forged_insertion(home: Path, other: Path) -> int:
    conn = attacker(home)
    row = conn.execute(f"SELECT {ROW} FROM events WHERE seq = 3").fetchone()
    last = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
    forged = (last + 1, row[1], "turn", "s1", '{"forged":1}', "f" * 64, row[6], row[7], "e" * 64)
    conn.execute(f"INSERT INTO events ({ROW}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", forged)
    conn.execute("UPDATE head SET seq = ?, chain = ?", (last + 1, "e" * 64))
    return int(last + 1)


def copied_from_another_store(home: Path, other: Path) -> int:
    source = raw(other)
    row = source.execute(f"SELECT {ROW} FROM events WHERE type = 'memory_write' LIMIT 1").fetchone()
    bodies = source.execute(
        "SELECT digest, body FROM payloads WHERE digest = ? OR digest IN "
        "(SELECT value FROM json_each(?))",
        (row[6], row[7]),
    ).fetchall()
    source.close()
    conn = attacker(home)
    last = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
    conn.executemany("INSERT OR IGNORE INTO payloads VALUES (?, ?)", bodies)
    conn.execute(
        f"INSERT INTO events ({ROW}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (last + 1, *row[1:])
    )
    conn.execute("UPDATE head SET seq = ?, chain = ?", (last + 1, row[8]))
    return int(last + 1)


def older_over_newest(home: Path, other: Path) -> int:
    conn = attacker(home)
    last = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
    older = conn.execute(
        "SELECT time, type, session, payload, parts FROM events WHERE seq = 2"
    ).fetchone()
    conn.execute(
        "UPDATE events SET time = ?, type = ?, session = ?, payload = ?, parts = ? WHERE seq = ?",
        (*older, last),
    )
    return int(last)


def envelope_metadata_edit(home: Path, other: Path) -> int:
    conn = attacker(home)
    conn.execute(
        "UPDATE events SET session = 'someone-else', time = '2020-01-01T00:00:00.000000Z' "
        "WHERE seq = 3"
    )
    return 3


def store_metadata_edit(home: Path, other: Path) -> int:
    conn = attacker(home)
    conn.execute(
        "UPDATE meta SET value = '00000000000000000000000000000000' WHERE name = 'store_id'"
    )
    return 1


CLASSES: dict[str, Callable[[Path, Path], int]] = {
    "content edit": content_edit,
    "truncation": truncation,
    "deletion": deletion,
    "reordering": reordering,
    "forged insertion": forged_insertion,
    "event copied from another profile's store": copied_from_another_store,
    "older event copied over the newest": older_over_newest,
    "envelope metadata edit": envelope_metadata_edit,
    "store metadata edit (store_id)": store_metadata_edit,
}


# The classes are made with v1's JSON parts and text digests: they run on a v1 archive; the
# same classes on v2 are in tests/test_tamper_v2.py and tests/test_witness_v2.py.
@pytest.mark.usefixtures("v1_format")
@pytest.mark.parametrize("name", list(CLASSES))
def test_tamper_is_caught_by_verify_and_refused_at_open(
    name: str, tmp_path: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    home, other = tmp_path / "home", tmp_path / "other"
    first = providers(home)
    build(first)
    first.shutdown()  # clean close: the witness has a fingerprint, the fast path is armed
    second = providers(other)
    build(second, "other")
    second.shutdown()
    bad_seq = CLASSES[name](home, other)

    report = verify_home(home)
    assert not report.ok and report.first_bad_seq == bad_seq, (report.problem, report.first_bad_seq)

    before = head_of(home)
    provider = providers(home)
    provider.sync_turn("after the tamper", "must not land", session_id="s1")
    message = str(blocked(v2_agent(provider), EVIDENCE))
    assert "failed verification" in message and "refused" in message, message
    assert f"seq {bad_seq}" in message or "store" in name, message
    assert provider.core.writer is not None and provider.core.writer.refused
    assert head_of(home) == before  # nothing was built on the damage
    withheld = provider.prefetch("question")  # nor recalled from it: a fenced notice says why
    assert "recall withheld" in withheld and "after the tamper" not in withheld
    assert (
        "withheld"
        in json.loads(provider.handle_tool_call("archive_search", {"query": "question"}))["error"]
    )
    print(f"\n{name}: verify names seq {bad_seq}; refused at open")


@pytest.mark.usefixtures("v1_format")  # v1's full verify on open (v2 proves from checkpoints)
def test_refusal_is_not_re_verified_until_the_files_change(
    home: Path, providers: Callable[..., ArchiveProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = providers()
    build(first)
    first.shutdown()
    deletion(home, home)
    from archive_provider.storage import witness as witness_module

    calls = []
    real = witness_module.verify_database
    monkeypatch.setattr(
        witness_module, "verify_database", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    provider = providers()
    for _ in range(3):
        blocked(v2_agent(provider), EVIDENCE)
    assert len(calls) == 1


# -- whole-store rollback: only the witness can tell ----------------------------------------


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
    fmt: int, tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    backup = backed_up_then_grown(tmp_path, home, providers)
    witnessed = Witness.for_home(home).read()
    assert witnessed is not None and witnessed.seq == head_of(home)
    conn = raw(home)
    assert conn.execute("SELECT value FROM meta WHERE name = 'format_version'").fetchone() == (
        str(fmt),
    )
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
    fmt: int, tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    first = providers()
    build(first)
    first.shutdown()
    other = tmp_path / "other"
    second = providers(other)
    build(second, "other")
    second.shutdown()
    restore(archive_dir(other), archive_dir(home))
    for key in ("payload.key",) if fmt == 1 else ("store.key", "signing.key"):
        shutil.copy2(archive_dir(other) / key, archive_dir(home) / key)
    provider = providers()
    message = str(blocked(v2_agent(provider), EVIDENCE))
    assert "witness mismatch" in message and "replaced" in message, message
    provider.shutdown()  # the damage below is done to the files alone (no live writer retrying)
    deletion(home, home)
    result = cli(home, "witness", "accept", "--reason", "try to anchor damage")
    assert result.returncode == 1 and "fails verification" in result.stdout + result.stderr


def test_the_witness_costs_sync_turn_nothing(
    fmt: int, home: Path, providers: Callable[..., ArchiveProvider]
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


@pytest.mark.usefixtures("v1_format")  # v2 keeps tiles and signed checkpoints: its rollback is
# the whole-store one above (and tests/test_witness_v2.py's consistent-looking rewrite)
def test_a_consistent_truncation_passes_verify_but_not_the_witness(
    home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    first = providers()
    build(first)
    first.shutdown()
    conn = attacker(home)
    last = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
    conn.execute("DELETE FROM events WHERE seq > ?", (last - 3,))
    chain = conn.execute("SELECT chain FROM events WHERE seq = ?", (last - 3,)).fetchone()[0]
    conn.execute("UPDATE head SET seq = ?, chain = ?", (last - 3, chain))
    conn.close()
    assert verify_home(home).ok  # consistent: the log alone cannot tell
    provider = providers()
    message = str(blocked(v2_agent(provider), EVIDENCE))
    assert "witness mismatch" in message and "rolled back by 3 events" in message, message


def test_a_required_checkpoint_behind_a_journal_fails_at_once_with_the_refusal(
    fmt: int, tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
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
