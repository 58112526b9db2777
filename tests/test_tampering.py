"""Tamper evidence on real files (docs/FORMAT.md section 7).

The tests drop the append-only triggers (as an attacker with the file could), change the
database, and check that ``verify_database`` and the standalone verifier run as a separate
process both name the exact first bad sequence number.
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

from archive_provider.format import verifier
from archive_provider.format.canonical import canonical_bytes
from archive_provider.format.digests import (
    Envelope,
    chain_hash,
    identity_digest,
    key_text,
    parts_text,
    payload_digest,
)
from archive_provider.storage.store import DB_NAME, KEY_NAME

from .conftest import v1_archive
from .test_store import VERIFIER, raw

#: the v1 archive the tamper classes start from, and the v1 triggers they drop
TAMPER_FIXTURE = Path(__file__).parent / "fixtures" / "v1_tamper"
TRIGGERS = (
    "events_append_only_update",
    "events_append_only_delete",
    "payloads_immutable",
    "payloads_no_delete",
)

# The verifier's format-1 path (migrate and the standalone verifier read old archives): v1's
# rows, triggers and keyed text digests; v2's tamper classes are in test_tamper_v2.py and
# test_verifier_v2.py.


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "home" / "archive"


# -- tamper evidence ------------------------------------------------------------------------


@pytest.fixture
def log(folder: Path) -> Path:
    """Six events (two naming the same part), appended in three transactions by the 0.1.0
    code (tests/fixtures/v1_tamper: session_started; turn 1 naming the shared part, turns 2
    and 3; a checkpoint naming it again and turn 5)."""
    shutil.copytree(TAMPER_FIXTURE, folder)
    conn = raw(folder)
    for trigger in TRIGGERS:
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.close()
    return folder


def key_of(folder: Path) -> bytes:
    return bytes.fromhex((folder / KEY_NAME).read_text())


def verify_both(folder: Path) -> tuple[verifier.Report, dict[str, Any], int]:
    conn = sqlite3.connect(folder / DB_NAME, isolation_level=None)
    try:
        report = verifier.verify_database(conn, key_of(folder))
    finally:
        conn.close()
    done = subprocess.run(
        [sys.executable, str(VERIFIER), str(folder / DB_NAME), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
    )
    return report, json.loads(done.stdout), done.returncode


def assert_first_bad(folder: Path, seq: int, problem: str = "") -> None:
    report, cli, code = verify_both(folder)
    assert not report.ok
    assert report.first_bad_seq == seq, report.problem
    assert problem in (report.problem or "")
    assert code == 1
    assert cli["ok"] is False and cli["first_bad_seq"] == seq and cli["problem"] == report.problem


def test_untampered_log_verifies(log: Path) -> None:
    report, cli, code = verify_both(log)
    assert report.ok and report.events_checked == 6 and report.last_seq == 6
    assert code == 0 and cli["ok"] is True and cli["first_bad_seq"] is None


def _payload_of(conn: sqlite3.Connection, seq: int) -> str:
    return str(conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()[0])


def test_changed_payload_byte(log: Path) -> None:
    conn = raw(log)
    digest = _payload_of(conn, 3)
    body = bytearray(
        conn.execute("SELECT body FROM payloads WHERE digest = ?", (digest,)).fetchone()[0]
    )
    body[-3] ^= 0x01
    conn.execute("UPDATE payloads SET body = ? WHERE digest = ?", (bytes(body), digest))
    conn.close()
    assert_first_bad(log, 3, "does not match its bytes")


def test_changed_shared_part_names_the_first_event_using_it(log: Path) -> None:
    conn = raw(log)
    (parts,) = conn.execute("SELECT parts FROM events WHERE seq = 2").fetchone()
    conn.execute(
        "UPDATE payloads SET body = ? WHERE digest = ?", (b'"forged"', json.loads(parts)[0])
    )
    conn.close()
    assert_first_bad(log, 2, "part")


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("type", "session_ended", "identity"),
        ("time", "2020-01-01T00:00:00.000000Z", "chain hash"),
        ("session", "someone-else", "chain hash"),
        ("key", '{"session":"s1","turn":99}', "identity"),
        ("parts", "(SELECT parts FROM events WHERE seq = 2)", "chain hash"),  # real parts
        ("chain", "0" * 64, "chain hash"),
    ],
)
def test_changed_envelope_field(log: Path, column: str, value: str, problem: str) -> None:
    conn = raw(log)
    if value.startswith("(SELECT"):
        conn.execute(f"UPDATE events SET {column} = {value} WHERE seq = 4")
    else:
        conn.execute(f"UPDATE events SET {column} = ? WHERE seq = 4", (value,))
    conn.close()
    assert_first_bad(log, 4, problem)


def test_changed_type_with_recomputed_identity(log: Path) -> None:
    """Recomputing the identity does not help: the chain commits to the whole envelope."""
    conn = raw(log)
    (key,) = conn.execute("SELECT key FROM events WHERE seq = 4").fetchone()
    identity = verifier.identity_of("session_ended", key)
    conn.execute(
        "UPDATE events SET type = 'session_ended', identity = ? WHERE seq = 4", (identity,)
    )
    conn.close()
    assert_first_bad(log, 4, "chain hash")


def test_payload_pointer_moved_to_another_valid_payload(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE events SET payload = ? WHERE seq = 4", (_payload_of(conn, 6),))
    conn.close()
    assert_first_bad(log, 4, "chain hash")


def test_payload_rows_swapped(log: Path) -> None:
    conn = raw(log)
    a, b = _payload_of(conn, 3), _payload_of(conn, 5)
    body_a = conn.execute("SELECT body FROM payloads WHERE digest = ?", (a,)).fetchone()[0]
    body_b = conn.execute("SELECT body FROM payloads WHERE digest = ?", (b,)).fetchone()[0]
    conn.execute("UPDATE payloads SET body = ? WHERE digest = ?", (body_b, a))
    conn.execute("UPDATE payloads SET body = ? WHERE digest = ?", (body_a, b))
    conn.close()
    assert_first_bad(log, 3, "does not match its bytes")


def test_payload_row_missing(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM payloads WHERE digest = ?", (_payload_of(conn, 5),))
    conn.close()
    assert_first_bad(log, 5, "missing")


def test_middle_event_deleted(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq = 3")
    conn.close()
    assert_first_bad(log, 3, "sequence gap")


def test_middle_event_deleted_and_later_ones_renumbered(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq = 3")
    for seq in (4, 5, 6):
        conn.execute("UPDATE events SET seq = ? WHERE seq = ?", (seq - 1, seq))
    conn.close()
    assert_first_bad(log, 3, "chain hash")


def test_tail_truncated_with_head_left(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq >= 5")
    conn.close()
    assert_first_bad(log, 5, "truncated")


def test_all_events_deleted_with_head_left(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events")
    conn.close()
    assert_first_bad(log, 1, "truncated")


def test_two_events_swapped(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE events SET seq = -3 WHERE seq = 3")
    conn.execute("UPDATE events SET seq = 3 WHERE seq = 4")
    conn.execute("UPDATE events SET seq = 4 WHERE seq = -3")
    conn.close()
    assert_first_bad(log, 3, "chain hash")


def _forge(conn: sqlite3.Connection, key: bytes, seq: int, previous_chain: str) -> str:
    """Insert a well-formed event at ``seq`` chained correctly to ``previous_chain``."""
    body = canonical_bytes({"text": "forged"})
    payload = payload_digest(key, body)
    identity_key = {"session": "s1", "turn": 1000 + seq}
    envelope = Envelope(
        seq,
        "2026-01-01T00:00:00.000000Z",
        "turn",
        "s1",
        key_text(identity_key),
        identity_digest("turn", identity_key),
        payload,
        parts_text([]),
    )
    chain = chain_hash(previous_chain, envelope)
    conn.execute("INSERT OR IGNORE INTO payloads VALUES (?, ?)", (payload, body))
    conn.execute(
        "INSERT INTO events (seq, time, type, session, key, identity, payload, parts, chain) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            seq,
            envelope.time,
            "turn",
            "s1",
            envelope.key,
            envelope.identity,
            payload,
            envelope.parts,
            chain,
        ),
    )
    return chain


def _chain_at(conn: sqlite3.Connection, seq: int) -> str:
    return str(conn.execute("SELECT chain FROM events WHERE seq = ?", (seq,)).fetchone()[0])


def test_forged_event_appended_after_the_head(log: Path) -> None:
    conn = raw(log)
    _forge(conn, key_of(log), 7, _chain_at(conn, 6))
    conn.close()
    assert_first_bad(log, 7, "after the recorded head")


def test_forged_event_inserted_with_later_events_renumbered(log: Path) -> None:
    """The forged event itself verifies (its chain is right); its successor cannot."""
    conn = raw(log)
    for seq in (6, 5, 4):
        conn.execute("UPDATE events SET seq = ? WHERE seq = ?", (seq + 1, seq))
    _forge(conn, key_of(log), 4, _chain_at(conn, 3))
    conn.execute("UPDATE head SET seq = 7")
    conn.close()
    assert_first_bad(log, 5, "chain hash")


def test_forged_event_replacing_one_in_place(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq = 4")
    _forge(conn, key_of(log), 4, _chain_at(conn, 3))
    conn.close()
    assert_first_bad(log, 5, "chain hash")


def test_head_chain_changed(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE head SET chain = ?", ("0" * 64,))
    conn.close()
    assert_first_bad(log, 6, "head")


def test_store_id_changed(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE meta SET value = ? WHERE name = 'store_id'", ("f" * 32,))
    conn.close()
    assert_first_bad(log, 1, "chain hash")


def test_a_blob_where_text_belongs_is_reported_not_crashed_on(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE events SET session = CAST('s1' AS BLOB) WHERE seq = 2")
    conn.close()
    assert_first_bad(log, 2, "malformed")


def test_known_limit_a_consistent_rewrite_of_the_tail_is_not_detected(log: Path) -> None:
    """Documented in FORMAT.md s7: whoever holds the file and the key can rewrite the tail
    (or roll the whole store back) consistently; only an external witness catches that."""
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq >= 5")
    chain = _forge(conn, key_of(log), 5, _chain_at(conn, 4))
    conn.execute("UPDATE head SET seq = 5, chain = ?", (chain,))
    conn.close()
    report, cli, code = verify_both(log)
    assert report.ok and code == 0 and cli["last_seq"] == 5


def test_verifier_cli_with_a_path_needing_quoting(tmp_path: Path) -> None:
    folder = v1_archive(tmp_path / "backup #3 ?50%" / "archive")
    done = subprocess.run(
        [sys.executable, str(VERIFIER), str(folder / DB_NAME), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["events_checked"] == 11


def test_verifier_cli_without_a_key_fails_cleanly(log: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(VERIFIER),
            str(log / DB_NAME),
            "--key",
            str(tmp_path / "none"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["ok"] is False and report["first_bad_seq"] is None
    assert "cannot read the archive" in report["problem"]
