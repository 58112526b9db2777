"""The archive reads as the story in plain SQL: views over the log (docs/AUDIT.md section 6).

They are views (no second copy of any text), they need no projection, verification never
reads them, and a plain archive carries no peer tables (only hivemind creates those).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from archive_provider.cli import main
from archive_provider.format.verifier import verify_database
from archive_provider.storage.store import EventStore, archive_dir
from hivemind.provider import HivemindProvider
from tests.test_cli import build_archive

VIEWS = (
    "audit_events",
    "audit_turns",
    "audit_memory",
    "audit_checkpoints",
    "audit_sessions",
    "audit_recalls",
)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("views") / "home"
    build_archive(folder)
    return folder


def query(home: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"file:{archive_dir(home) / 'events.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_the_audit_objects_are_views_and_the_only_new_schema(home: Path) -> None:
    kinds = dict(query(home, "SELECT name, type FROM sqlite_master WHERE name LIKE 'audit%'"))
    assert kinds == dict.fromkeys(VIEWS, "view")


def test_turns_read_as_the_conversation(home: Path) -> None:
    rows = query(
        home,
        "SELECT seq, session, turn, position, role, text FROM audit_turns ORDER BY seq, position",
    )
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in rows] == [
        ("sess-1", 1, 1, "user", "My cat is called Ziggy"),
        ("sess-1", 1, 2, "assistant", "Ziggy is a fine name for a cat."),
        ("sess-1", 2, 1, "user", "A blue heron sat by the river"),
        ("sess-1", 2, 2, "assistant", "Herons are patient hunters."),
        ("sess-2", 1, 1, "user", "Remind me about the heron"),
        ("sess-2", 1, 2, "assistant", "It was blue, by the river."),
    ]
    # every row leads back to its event and its stored message
    (digest,) = query(home, "SELECT message_digest FROM audit_turns LIMIT 1")[0]
    assert query(
        home, f"SELECT count(*) FROM payloads WHERE digest IN ('{digest}', x'{digest}')"
    ) == [(1,)]


def test_memory_checkpoints_sessions_and_recalls_read_as_text(home: Path) -> None:
    memory = query(home, "SELECT action, target, content, old_text, origin FROM audit_memory")
    assert memory == [
        ("add", "user", "Owns a cat named Ziggy", None, "assistant_tool"),
        ("replace", "user", "Owns a tabby cat named Ziggy", "cat named Ziggy", "assistant_tool"),
        ("remove", "user", "", "tabby", "assistant_tool"),
    ]
    assert query(
        home, "SELECT session, ok, messages, require_checkpoint FROM audit_checkpoints"
    ) == [("sess-1", 1, 4, 1)]
    sessions = query(
        home,
        "SELECT session, turns, memory_writes, switched_from, switch_reason FROM audit_sessions",
    )
    assert sessions == [("sess-1", 2, 2, None, None), ("sess-2", 1, 1, "sess-1", "compression")]
    (recall,) = query(home, "SELECT session, query, result, sources FROM audit_recalls")
    assert recall[:2] == ("sess-2", "what is my cat called") and "Ziggy" in str(recall[2])
    assert recall[3].startswith("[")


def test_verification_ignores_the_views(home: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "archive"
    shutil.copytree(archive_dir(home), copy)
    conn = sqlite3.connect(copy / "events.db")
    key = EventStore.open(copy, create=False).key
    with_views = verify_database(conn, key).as_dict()
    for view in reversed(VIEWS):
        conn.execute(f"DROP VIEW {view}")
    conn.commit()
    assert with_views["ok"] is True
    assert verify_database(conn, key).as_dict() == with_views
    conn.close()


def test_a_plain_archive_has_no_peer_tables_and_hivemind_makes_its_own(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = {
        name for (name,) in query(home, "SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    assert not {t for t in tables if t.startswith("peer")}, tables
    peer_home = tmp_path / "peer-home"
    provider = HivemindProvider()  # no Matrix credentials: peers are off, its archive is not
    provider.initialize("s1", hermes_home=str(peer_home), platform="cli")
    provider.shutdown()
    created = {
        name for (name,) in query(peer_home, "SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    assert {"peers", "peer_messages", "peer_sync"} <= created
    # the CLI keeps (and rebuilds) the peers projection where hivemind has one, only there
    for folder, peers in ((peer_home, True), (home, False)):
        assert main(["--home", str(folder), "--json", "replay"]) == 0
        assert ("peers" in json.loads(capsys.readouterr().out)["projections"]) is peers
