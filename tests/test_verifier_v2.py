"""The v2 verifier (docs/FORMAT.md 20): the rule vectors, real archives, the standalone files.

tests/vectors/reports.json holds one small database per rule (as SQL) with its verdict;
each is built as a real SQLite file and checked through the package's ``verify_database``
and, for a sample, through ``verifier.py`` run alone from a folder holding only it and its
two pure sibling modules (the standalone verifier is those three files).
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive_provider.format import verifier
from archive_provider.format.events import NewEvent
from archive_provider.storage.store import EventStore
from tests.conftest import v1_archive

REPO = Path(__file__).resolve().parents[1]
VECTORS = json.loads((REPO / "tests" / "vectors" / "reports.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = VECTORS["cases"]
REPORT_FIELDS = {
    "ok", "format_version", "store_id", "events_checked", "envelopes_only", "payloads_checked",
    "payloads_erased", "erasures", "last_seq", "head_seq", "tree_size", "root", "checkpoint",
    "authenticity", "first_bad_seq", "code", "problem", "warnings", "details",
}  # fmt: skip


def _database(folder: Path, case: dict[str, Any]) -> Path:
    path = folder / "events.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in [*VECTORS["bases"][case.get("base", "standard")], *case["sql"]]:
        conn.execute(statement)
    conn.close()
    return path


def _verdict(report: verifier.Report) -> dict[str, Any]:
    data = report.as_dict()
    return {"ok": data["ok"], "first_bad_seq": data["first_bad_seq"], "code": data["code"]}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_rule_gives_its_verdict(tmp_path: Path, case: dict[str, Any]) -> None:
    path = _database(tmp_path, case)
    conn = sqlite3.connect(path, isolation_level=None)
    vkey = VECTORS["log_vkey"] if case["vkey"] else None
    report = verifier.verify_database(conn, b"", vkey=vkey)
    assert _verdict(report) == case["expected"], report.problem
    assert set(report.as_dict()) == REPORT_FIELDS
    if not report.ok:
        assert (
            report.problem and "Traceback" not in report.problem and "Error" not in report.problem
        )


def test_the_erased_case_counts_what_was_erased(tmp_path: Path) -> None:
    case = next(c for c in CASES if c["name"] == "erased and covered by a later erasure")
    conn = sqlite3.connect(_database(tmp_path, case), isolation_level=None)
    report = verifier.verify_database_v2(conn, VECTORS["log_vkey"])
    assert report.ok and report.payloads_erased == 1
    assert report.erasures == [{"seq": 6, "payloads": 1}]
    (tmp_path / "intact").mkdir()
    intact = sqlite3.connect(_database(tmp_path / "intact", CASES[0]), isolation_level=None)
    full = verifier.verify_database_v2(intact, VECTORS["log_vkey"])
    assert full.payloads_checked == report.payloads_checked + 1  # distinct digests, once each


def test_authenticity_and_checkpoint_fields(tmp_path: Path) -> None:
    conn = sqlite3.connect(_database(tmp_path, CASES[0]), isolation_level=None)
    pinned = verifier.verify_database_v2(conn, VECTORS["log_vkey"])
    assert pinned.authenticity == "verified" and pinned.checkpoint == {
        "size": 6,
        "signature": "verified",
        "cosigned_by": [],
    }
    assert pinned.tree_size == 6 and pinned.events_checked == 6 and pinned.head_seq == 6
    unpinned = verifier.verify_database_v2(conn, None)
    assert unpinned.ok and unpinned.authenticity == "not checked" and unpinned.warnings
    other = verifier.verify_database_v2(
        conn, "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
    )
    assert (other.ok, other.authenticity, other.code) == (False, "failed", "checkpoint_signature")


def _standalone(tmp_path: Path) -> Path:
    """verifier.py with only its two pure siblings, in a folder outside the package."""
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("verifier.py", "merkle.py", "signed_note.py"):
        shutil.copy(REPO / "archive_provider" / "format" / name, alone / name)
    return alone / "verifier.py"


def _run(script: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-I", str(script), *args, "--json"],
        capture_output=True,
        text=True,
        cwd=script.parent,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize(
    "name",
    ["intact", "tombstone without erasure", "invalid UTF-8 in session", "store_id uppercase"],
)
def test_the_standalone_files_agree(tmp_path: Path, name: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    path = _database(tmp_path, case)
    code, report = _run(_standalone(tmp_path), str(path), "--key", VECTORS["log_vkey"])
    assert {k: report[k] for k in ("ok", "first_bad_seq", "code")} == case["expected"]
    assert code == (0 if case["expected"]["ok"] else 1)


def test_a_real_v2_archive_verifies_alone_with_its_vkey(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "archive")
    for turn in range(1, 40):
        part = store.hasher.part({"role": "user", "content": f"message {turn % 7}"})
        body = {"turn": turn, "messages": [part.digest]}
        store.append([NewEvent("turn", "s", {"turn": turn}, body, (part,))], durable=turn % 9 == 0)
    vkey = store.vkey
    store.close()
    key_file = tmp_path / "vkey.txt"
    key_file.write_text(vkey + "\n")
    code, report = _run(
        _standalone(tmp_path), str(tmp_path / "archive" / "events.db"), "--key", str(key_file)
    )
    assert code == 0 and report["ok"] and report["authenticity"] == "verified"
    assert report["events_checked"] == report["tree_size"] == 40
    assert report["checkpoint"]["size"] == 40  # the clean close signed the head
    assert report["payloads_checked"] == 40 + 7  # event bodies, and 7 distinct messages


def test_a_v1_key_file_in_uppercase_verifies_the_same(tmp_path: Path) -> None:
    v1_archive(tmp_path / "archive")  # the standalone verifier still reads format 1
    key = tmp_path / "archive" / "payload.key"
    script = _standalone(tmp_path)
    code, lower = _run(script, str(tmp_path / "archive" / "events.db"))
    key.write_text(key.read_text().upper())
    code_upper, upper = _run(script, str(tmp_path / "archive" / "events.db"))
    assert code == code_upper == 0 and lower == upper
    key.write_text("not a key\n")
    code, bad = _run(script, str(tmp_path / "archive" / "events.db"))
    assert code == 1 and bad["first_bad_seq"] is None and "64 hex digits" in bad["problem"]


def test_the_verify_command_checks_signatures_with_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from archive_provider.cli import main

    store = EventStore.open(tmp_path / "archive")
    vkey = store.vkey
    store.close()
    assert main(["--home", str(tmp_path), "--json", "verify", "--key", vkey]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["log"]["authenticity"] == "verified"
    assert data["log"]["format_version"] == 2


def _archive(folder: Path) -> Path:
    store = EventStore.open(folder)
    for turn in range(1, 13):
        part = store.hasher.part({"role": "user", "content": f"message {turn % 5}"})
        body = {"turn": turn, "messages": [part.digest]}
        store.append([NewEvent("turn", f"s{turn % 3}", {"turn": turn}, body, (part,))])
    store.close()
    return folder / "events.db"


_TAMPERS = {
    # column edit -> (code, whether the edited event itself is named)
    "time": ("UPDATE events SET time = time || 'x' WHERE seq = ?", "chain"),
    "session": ("UPDATE events SET session = session || 'x' WHERE seq = ?", "identity"),
    "key": ("UPDATE events SET key = '{\"turn\":999}' WHERE seq = ?", "identity"),
    "type": ("UPDATE events SET type = 'memory_write' WHERE seq = ?", "identity"),
    "payload": (
        "UPDATE events SET payload = (SELECT payload FROM events WHERE seq = 1) WHERE seq = ?",
        "chain",
    ),
    "chain": ("UPDATE events SET chain = zeroblob(32) WHERE seq = ?", "chain"),
    "utf8": ("UPDATE events SET session = CAST(X'c3' AS TEXT) WHERE seq = ?", "invalid_utf8"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _archive(tmp_path_factory.mktemp("pristine") / "archive")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seq=st.integers(min_value=2, max_value=13), column=st.sampled_from(sorted(_TAMPERS)))
def test_a_one_column_edit_is_located_by_seq(
    pristine: Path, tmp_path_factory: pytest.TempPathFactory, seq: int, column: str
) -> None:
    """Any single envelope edit is found at the edited event with the rule's code."""
    copy = tmp_path_factory.mktemp("tampered") / "events.db"
    shutil.copy(pristine, copy)
    statement, code = _TAMPERS[column]
    conn = sqlite3.connect(copy, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute(statement, (seq,))
    report = verifier.verify_database(conn, b"")
    conn.close()
    assert (report.ok, report.first_bad_seq, report.as_dict()["code"]) == (False, seq, code)


def test_a_missing_head_row_reports_head_seq_null(tmp_path: Path) -> None:
    """FORMAT.md 20.3: ``head_seq`` is null when the source records no head (not 0)."""
    case = next(c for c in CASES if c["name"] == "head row missing")
    conn = sqlite3.connect(_database(tmp_path, case), isolation_level=None)
    report = verifier.verify_database(conn, b"", vkey=VECTORS["log_vkey"])
    assert (report.ok, report.head_seq, report.code) == (False, None, "after_head")


@pytest.mark.parametrize("version", ["missing", "3"])
def test_the_standalone_verifier_names_an_unknown_format(tmp_path: Path, version: str) -> None:
    """A format it does not read is code ``format_version``: never the format-1 path, which
    took ``--key VKEY`` for a file name and showed Python's exception text."""
    statement = (
        "DELETE FROM meta WHERE name = 'format_version'"
        if version == "missing"
        else "UPDATE meta SET value = '3' WHERE name = 'format_version'"
    )
    path = _database(tmp_path, {"sql": [statement]})
    for name in ("verifier.py", "merkle.py", "signed_note.py"):
        shutil.copy(Path(verifier.__file__).with_name(name), tmp_path / name)
    done = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "verifier.py"), str(path), "--json"]
        + ["--key", VECTORS["log_vkey"]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(done.stdout)
    assert (done.returncode, report["code"], report["first_bad_seq"]) == (1, "format_version", None)
    assert "Error" not in report["problem"] and "No such file" not in report["problem"]
