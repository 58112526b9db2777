"""``hermes-archive readable-copy``: the archive as auditors' tools read it.

The copy is opened with sqlite-utils, and served by a real Datasette on 127.0.0.1 started
here: its pages and JSON API must show the rows, the column notes and the archive's head.
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from archive_provider.cli import main
from archive_provider.storage.store import archive_dir
from tests.test_cli import build_archive


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("readable") / "home"
    build_archive(folder)
    return folder


def archive_rows(home: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{archive_dir(home) / 'events.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def copy(
    home: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    code = main(["--home", str(home), "--json", "readable-copy", *extra, str(out)])
    return code, json.loads(capsys.readouterr().out)


def test_the_copy_reads_with_sqlite_utils(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("archive_provider.audit.readable.BATCH", 2)  # many batches: rows stream
    out = tmp_path / "audit.db"
    code, data = copy(home, out, capsys)
    (head_seq, head_chain) = archive_rows(home, "SELECT seq, chain FROM head")[0]
    head_chain = head_chain.hex() if isinstance(head_chain, bytes) else head_chain  # v2: a BLOB
    assert code == 0 and data["head"] == {"seq": head_seq, "chain": head_chain}
    db = sqlite_utils.Database(out)
    assert db["events"].count == head_seq
    assert [(r["seq"], r["chain"]) for r in db["events"].rows] == [
        (seq, chain.hex() if isinstance(chain, bytes) else chain)
        for seq, chain in archive_rows(home, "SELECT seq, chain FROM events ORDER BY seq")
    ]
    messages = list(db.query("SELECT seq, position, role, text, message_digest FROM messages"))
    assert [m["text"] for m in messages] == [
        r[0] for r in archive_rows(home, "SELECT text FROM audit_turns ORDER BY seq, position")
    ]
    assert all(len(m["message_digest"]) == 64 for m in messages)
    found = list(db["messages"].search("heron"))
    assert {m["text"] for m in found} == {
        "A blue heron sat by the river",
        "Herons are patient hunters.",
        "Remind me about the heron",
    }
    assert sorted(m["content"] for m in db["memory_writes"].search("tabby")) == [
        "",  # the remove searched for "tabby" (old_text)
        "Owns a tabby cat named Ziggy",
    ]
    assert {(fk.column, fk.other_table) for fk in db["messages"].foreign_keys} == {
        ("seq", "events"),
        ("session", "sessions"),
    }
    sessions = {r["session"]: r for r in db["sessions"].rows}
    assert sessions["sess-1"]["turns"] == 2 and sessions["sess-2"]["switched_from"] == "sess-1"
    (about,) = db["archive"].rows
    assert about["head_seq"] == head_seq and about["head_chain"] == head_chain
    assert about["verified"] == 1 and about["verification"].startswith("ok: ")
    metadata = json.loads((tmp_path / "audit.metadata.json").read_text())
    assert head_chain in metadata["description"] and "ok: " in metadata["description"]
    tables = metadata["databases"]["audit"]["tables"]
    assert "hermes-archive show SEQ" in tables["messages"]["columns"]["seq"]


def test_a_damaged_archive_is_copied_and_says_so(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "home"
    shutil.copytree(home, damaged)
    conn = sqlite3.connect(archive_dir(damaged) / "events.db")
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET session = 'forged' WHERE seq = 3")
    conn.commit()
    conn.close()
    code, data = copy(damaged, tmp_path / "damaged.db", capsys)
    assert code == 1 and data["ok"] is False
    (about,) = sqlite_utils.Database(tmp_path / "damaged.db")["archive"].rows
    assert about["verified"] == 0 and about["verification"].startswith("FAILED at seq 3")


def test_the_copy_is_refused_over_an_existing_file(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine.db"
    out.write_text("mine")
    assert main(["--home", str(home), "readable-copy", str(out)]) == 2
    assert out.read_text() == "mine" and "exists" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback)
        return str(response.read().decode("utf-8"))


def test_datasette_serves_the_copy_with_its_metadata(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "audit.db"
    assert copy(home, out, capsys)[0] == 0
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "datasette", "serve", str(out), "--metadata",
         str(tmp_path / "audit.metadata.json"), "-h", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                index = fetch(base + "/")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    output = server.stdout.read() if server.stdout else ""
                    pytest.fail(f"Datasette did not start on 127.0.0.1:{port}: {output[-2000:]}")
                time.sleep(0.2)
        assert "hermes-archive" in index
        page = fetch(base + "/audit/messages")
        assert "Every message of every archived turn" in page and "Herons are patient" in page
        rows = json.loads(fetch(base + "/audit/messages.json?_shape=array&_search=heron"))
        assert {r["text"] for r in rows} >= {"Remind me about the heron"}
        about = json.loads(fetch(base + "/audit/archive.json?_shape=array"))
        assert about[0]["verified"] == 1
    finally:
        server.terminate()
        server.wait(timeout=30)
