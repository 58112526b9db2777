"""The v2 ``verify`` checks payloads by merging, not by lookups, and reports what it did before.

An intact archive's payloads are checked in one read of the payloads table in digest order,
merged with the digests the events name (sorted by SQLite), with no statement per digest
(issue 18). Anything that does not hold sends the verifier to the ordered pass of
FORMAT.md 20.2, which names the first failure; so every report, intact or tampered, must
equal the ordered pass's own report. The archive is real: a corpus, a part named again far
from where it was first named, a turn with its author, and an erased session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit.erasure import Scope, forget
from archive_provider.domain import builders
from archive_provider.format import verifier
from archive_provider.format.events import NewEvent
from archive_provider.storage.store import EventStore
from bench.corpus import build
from tests.conftest import traced
from tests.test_verifier_bounded import _distinct_named

FAR = "said once long ago, and said again at the very end"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("merged") / "archive"
    store = EventStore.open(folder)
    try:
        far = store.hasher.part({"role": "user", "content": FAR})
        store.append([NewEvent("turn", "far", {"turn": 1}, {"messages": [far.digest]}, (far,))])
        build(store, 600, batch=200, near_misses=0)
        store.append([NewEvent("turn", "far", {"turn": 2}, {"messages": [far.digest]}, (far,))])
        said = store.hasher.part({"role": "user", "content": "a turn with its author"})
        author = {"id": "u1", "name": "Ann", "is_bot": False, "source": "test"}
        store.append(
            [builders.turn(store.hasher, "far", 3, [said], start=0, legacy=False, author=author)]
        )
        session = store.conn.execute(
            "SELECT session FROM events WHERE type = 'turn' AND session != 'far' "
            "ORDER BY seq LIMIT 1 OFFSET 100"
        ).fetchone()[0]
        forget(store, Scope("session", {"session": session}), reason="test")
    finally:
        store.close()
    return folder / "events.db"


def _report(
    db: Path, monkeypatch: pytest.MonkeyPatch | None = None, jobs: int = 1
) -> dict[str, Any]:
    """The verifier's report; with ``monkeypatch``, the ordered pass's (the merge declines)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        if monkeypatch is None:
            return verifier.verify_database(conn, b"", jobs=jobs).as_dict()
        with monkeypatch.context() as patch:
            patch.setattr(verifier._V2Pass, "named", lambda self, until: False)
            return verifier.verify_database(conn, b"").as_dict()
    finally:
        conn.close()


def test_an_intact_archive_reports_as_the_ordered_pass_does(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    merged = _report(archive)
    assert merged["ok"], merged["problem"]
    assert merged == _report(archive, monkeypatch)
    assert merged["payloads_erased"] > 0 and len(merged["erasures"]) == 1
    assert merged["payloads_checked"] + merged["payloads_erased"] == _distinct_named(archive)


@pytest.fixture
def helper_pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of every helper ``verify --jobs`` starts in the test."""
    pids: list[int] = []
    real_start = verifier._Helpers.start

    def start(conn: sqlite3.Connection, jobs: int) -> verifier._Helpers | None:
        helpers = real_start(conn, jobs)
        assert helpers is not None
        pids.extend(process.pid for process in helpers.processes)
        return helpers

    monkeypatch.setattr(verifier._Helpers, "start", start)
    return pids


@pytest.mark.parametrize("jobs", [2, 3])
def test_an_intact_archive_reports_the_same_with_jobs(
    archive: Path, jobs: int, helper_pids: list[int]
) -> None:
    """``verify --jobs``: the payload merge in ``jobs - 1`` other processes, one range of
    digests each, gives the one-process report."""
    assert _report(archive, jobs=jobs) == _report(archive)
    assert len(helper_pids) == jobs - 1 and not [p for p in helper_pids if _running(p)]


def test_helpers_that_cannot_start_leave_the_verify_to_one_process(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verifier, "_HELPER", "import sys; sys.exit(3)")
    assert _report(archive, jobs=3) == _report(archive)


@pytest.mark.parametrize("jobs", [2, 3])
def test_with_jobs_the_checking_process_merges_at_most_its_own_range(
    archive: Path, jobs: int
) -> None:
    """With 2 processes the parent merges the first quarter of the digests after its events
    pass (the events cost about half the merge); with 3, none."""
    conn = sqlite3.connect(archive, isolation_level=None)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        report = verifier.verify_database(conn, b"", jobs=jobs)
    finally:
        conn.close()
    assert report.ok, report.problem
    assert report.payloads_checked > 1000
    merged = [s for s in statements if "FROM payloads" in s and "ORDER BY digest" in s]
    expected = [] if jobs == 3 else ["WHERE digest < x'40' ORDER BY digest"]
    assert [s[s.index("WHERE") :] for s in merged] == expected


def test_an_intact_archive_is_read_without_a_statement_per_payload(archive: Path) -> None:
    conn = sqlite3.connect(archive, isolation_level=None)
    try:
        with traced(conn) as statements:
            report = verifier.verify_database(conn, b"")
    finally:
        conn.close()
    assert report.ok, report.problem
    lookups = [s for s in statements if "FROM payloads WHERE digest" in s]
    assert len(lookups) <= len(report.erasures)  # each erasure's own body, read first
    assert report.payloads_checked > 1000 and len(statements) < 50


def _tampered(source: Path, to: Path, sql: list[str]) -> Path:
    to.write_bytes(source.read_bytes())
    conn = sqlite3.connect(to, isolation_level=None)
    for name in ("payloads_no_delete", "payloads_erase_only"):
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    for statement in sql:
        conn.execute(statement)
    conn.close()
    return to


_DEEP_PART = (
    "(SELECT substr(parts, 33, 32) FROM events WHERE length(parts) >= 64 "
    "ORDER BY seq LIMIT 1 OFFSET 20)"
)
_FAR_PART = "(SELECT parts FROM events WHERE session = 'far' ORDER BY seq LIMIT 1)"
_EVENT_BODY = "(SELECT payload FROM events WHERE seq = 30)"
_AUTHOR = "(SELECT author FROM events WHERE author IS NOT NULL ORDER BY seq LIMIT 1)"

TAMPERS: dict[str, tuple[list[str], str | None]] = {
    "a part deep in history deleted": (
        [f"DELETE FROM payloads WHERE digest = {_DEEP_PART}"],
        "missing_payload",
    ),
    "the far repeat's body changed": (
        [f"UPDATE payloads SET body = CAST('x' AS BLOB) WHERE digest = {_FAR_PART}"],
        "payload_mismatch",
    ),
    "an event body stored as text": (
        [f"UPDATE payloads SET body = CAST(body AS TEXT) WHERE digest = {_EVENT_BODY}"],
        "payload_type",
    ),
    "a salt cut short": (
        [f"UPDATE payloads SET salt = substr(salt, 1, 31) WHERE digest = {_DEEP_PART}"],
        "payload_mismatch",
    ),
    "a part made a tombstone with no erasure": (
        [
            "UPDATE payloads SET salt = NULL, lookup = NULL, body = NULL "
            f"WHERE digest = {_DEEP_PART}"
        ],
        "erased_without_erasure",
    ),
    "the last payload row deleted": (
        ["DELETE FROM payloads WHERE digest = (SELECT max(digest) FROM payloads)"],
        "missing_payload",
    ),
    "an author payload deleted": (
        [f"DELETE FROM payloads WHERE digest = {_AUTHOR}"],
        "missing_payload",
    ),
    "rows no event names, one keyed by text, one with a wrong digest": (
        [
            "INSERT INTO payloads VALUES ('not a digest', NULL, NULL, CAST('x' AS BLOB))",
            "INSERT INTO payloads VALUES (zeroblob(32), zeroblob(32), NULL, CAST('y' AS BLOB))",
            "INSERT INTO payloads VALUES (randomblob(32), NULL, NULL, 42)",
        ],
        None,
    ),
    "the payloads table rebuilt without its key, one row twice": (
        [
            "PRAGMA legacy_alter_table = ON",
            "CREATE TABLE copy AS SELECT * FROM payloads",
            f"INSERT INTO copy SELECT * FROM payloads WHERE digest = {_FAR_PART}",
            "DROP TABLE payloads",
            "ALTER TABLE copy RENAME TO payloads",
        ],
        None,
    ),
}


@pytest.mark.parametrize("name", TAMPERS)
def test_a_tampered_archive_reports_as_the_ordered_pass_does(
    archive: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    helper_pids: list[int],
) -> None:
    """With ``--jobs`` 2 and 3 too: the helpers decline, the parent's ordered pass names it."""
    sql, code = TAMPERS[name]
    db = _tampered(archive, tmp_path / "events.db", sql)
    merged = _report(db)
    assert (merged["ok"], merged["code"]) == (code is None, code), merged["problem"]
    assert merged == _report(db, monkeypatch)
    assert merged == _report(db, jobs=2) == _report(db, jobs=3)
    assert len(helper_pids) == 3 and not [p for p in helper_pids if _running(p)]


def _copy(archive: Path, to: Path) -> Path:
    shutil.copytree(archive.parent, to)
    return to / "events.db"


def test_helpers_take_the_parents_snapshot_when_a_writer_commits_between(
    archive: Path, tmp_path: Path
) -> None:
    """A helper starts its read transaction before the parent does; an event appended between
    is seen by the parent, so both start again and agree on the new head."""
    db = _copy(archive, tmp_path / "archive")
    conn = sqlite3.connect(db, isolation_level=None)
    helpers = verifier._Helpers.start(conn, 2)
    assert helpers is not None
    try:
        helpers.links[0].poll(None)  # the helper's head is sent: its snapshot is taken
        store = EventStore.open(db.parent)
        try:
            said = store.hasher.part({"role": "user", "content": "appended while verifying"})
            store.append([builders.turn(store.hasher, "late", 1, [said], start=0, legacy=False)])
            head = store.head().seq
        finally:
            store.close()
        assert helpers.share(conn)
        report = verifier.ReportV2()
        check = verifier._V2Pass(conn, report)
        check.erasures()
        assert helpers.merged(check, head)  # the helper's last seq is the new event's
    finally:
        helpers.close()
        if conn.in_transaction:
            conn.execute("COMMIT")
        conn.close()
    alone = _report(db)
    assert alone["payloads_checked"] == report.payloads_checked
    assert alone["erasures"][0]["payloads"] == check.erasure_counts[alone["erasures"][0]["seq"]]


def test_an_interrupted_verify_leaves_no_helper_behind(
    archive: Path, monkeypatch: pytest.MonkeyPatch, helper_pids: list[int]
) -> None:
    """Ctrl-C reaches the parent mid-pass (the helpers ignore it): it stops and waits for them."""

    def interrupted(*args: object, **kwargs: object) -> None:
        assert all(_running(pid) for pid in helper_pids)
        raise KeyboardInterrupt

    monkeypatch.setattr(verifier._V2Pass, "events", interrupted)
    conn = sqlite3.connect(archive, isolation_level=None)
    try:
        with pytest.raises(KeyboardInterrupt):
            verifier.verify_database(conn, b"", jobs=3)
        assert not conn.in_transaction
    finally:
        conn.close()
    assert len(helper_pids) == 2
    assert not [pid for pid in helper_pids if _running(pid)]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


_KILLED_PARENT = """
import sqlite3, sys
from archive_provider.format import verifier
if __name__ == "__main__":
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    helpers = verifier._Helpers.start(conn, 2)
    helpers.links[0].poll(None)
    print(helpers.processes[0].pid, flush=True)
    sys.stdin.read()
"""


def test_a_helper_does_not_outlive_a_parent_killed_outright(archive: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PARENT, str(archive)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )
    assert parent.stdout is not None
    helper = int(parent.stdout.readline())
    assert _running(helper)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(600):  # a deadline for the helper to go, not a measurement
        if not _running(helper):
            break
        time.sleep(0.1)
    assert not _running(helper)


STANDALONE = ("verifier.py", "merkle.py", "signed_note.py", "tlog_proof.py")


def test_the_standalone_verifier_copied_alone_verifies_with_jobs(
    archive: Path, tmp_path: Path
) -> None:
    """Its helpers run the copied verifier.py, isolated as it is (``-I``): same report."""
    alone = tmp_path / "auditor"
    alone.mkdir()
    for name in STANDALONE:
        shutil.copy(Path(verifier.__file__).parent / name, alone / name)

    def check(jobs: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-I", "verifier.py", "database", str(archive), "--json"]
            + ["--jobs", jobs],
            cwd=alone,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return dict(json.loads(done.stdout))

    one = check("1")
    assert one["ok"] and one == check("2") == check("3")


_NO_MAIN_GUARD = """
import sqlite3, sys
from archive_provider.format import verifier
print("verifying", flush=True)
report = verifier.verify_database(sqlite3.connect(sys.argv[1], isolation_level=None), b"", jobs=2)
print(report.ok, report.payloads_checked, flush=True)
"""


def test_a_caller_without_a_main_guard_is_not_run_again_by_the_helpers(
    archive: Path, tmp_path: Path
) -> None:
    script = tmp_path / "caller.py"
    script.write_text(_NO_MAIN_GUARD)
    done = subprocess.run(
        [sys.executable, str(script), str(archive)],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["verifying", f"True {_report(archive)['payloads_checked']}"]
