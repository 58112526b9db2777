"""Forgetting reaches what the archive itself repeated (FORMAT.md 13.4), on the demo's flow.

The demo runs as a user runs it (a real hermes-agent, the loopback fake LLM): session one
states a fact, session two is served it as recall and the host hands the recall back inside
the second session's user message (``api_content``). The first session is forgotten with
the CLI; then no byte of its words is in any file of the archive folder, a later export, a
readable copy or the central store it was shipped to (before and after the erasure), while
the second session's own question is kept and every verifier passes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import archive_provider.format as fmt
from archive_provider.demo.demo import FACT, QUESTION, SESSION_ONE
from tests.fleet.conftest import Central

REPO = Path(__file__).resolve().parents[2]
#: the first session's words: each thing its user said, and the fact's date on its own (the
#: second session's answer restates the codename in the model's own words, which it keeps)
WORDS = (*SESSION_ONE, "March 3rd")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HERMES_HOME"}
    return subprocess.run(
        [sys.executable, "-m", "archive_provider.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )


def needles(words: tuple[str, ...] = WORDS) -> list[bytes]:
    """Each word as UTF-8, as JSON escapes it and as hex (how a row text shows a bytea)."""
    found = []
    for word in words:
        raw = word.encode()
        found += [raw, json.dumps(word)[1:-1].encode(), raw.hex().encode()]
    return found


def holders(path: Path, words: tuple[str, ...] = WORDS) -> list[str]:
    """The files under ``path`` (and the members of zip files) holding one of ``words``."""
    hits = []
    for file in sorted(p for p in (path.rglob("*") if path.is_dir() else [path]) if p.is_file()):
        blobs = [(file.name, file.read_bytes())]
        if zipfile.is_zipfile(file):
            with zipfile.ZipFile(file) as bundle:
                blobs += [(f"{file.name}:{n}", bundle.read(n)) for n in bundle.namelist()]
        hits += [name for name, data in blobs if any(n in data for n in needles(words))]
    return hits


def central_holders(db: Central, words: tuple[str, ...] = WORDS) -> list[str]:
    """The central tables with a row whose text (bytea as hex) holds one of ``words``."""
    tables = [
        str(t)
        for (t,) in db.query(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = 'hermes_archive' AND table_type = 'BASE TABLE'"
        )
    ]
    hits = []
    for table in tables:
        for (row,) in db.query(f"SELECT t::text FROM hermes_archive.{table} t"):
            if any(n.decode() in str(row) for n in needles(words)):
                hits.append(table)
                break
    return hits


def test_forgetting_the_first_demo_session_leaves_no_byte_of_it_anywhere(
    tmp_path: Path, central_db: Central
) -> None:
    home = tmp_path / "profile"
    done = cli(home, "--json", "demo")
    assert done.returncode == 0, done.stderr[-3000:]
    demo = json.loads(done.stdout)
    assert demo["fact_recalled"] is True
    timeline = demo["timeline"]
    first = next(e["session"] for e in timeline if e["type"] == "session_started")
    second = [e["session"] for e in timeline if e["type"] == "session_started"][-1]
    recall = next(e for e in timeline if e["type"] == "recall_served")
    assert recall["session"] == second
    archive = home / "archive"
    assert holders(archive), "the demo archived the first session's words"
    central_db.register(home)  # an administrator registers a store before it may ship
    assert cli(home, "ship", "--to", central_db.url()).returncode == 0
    assert central_holders(central_db)

    # the turn holds the host's message without the recall block: a reference in its place
    shown = json.loads(cli(home, "--json", "show", str(recall["seq"] + 1)).stdout)
    assert shown["events"][0]["payload"]["echoes"][0]["recall"] == recall["seq"]
    assert FACT in json.dumps(shown)  # rendered from the recall while it stands

    # the host's own copies are named, never touched (the scan reads only)
    host_files = {n: (home / n).read_bytes() for n in ("logs/agent.log", "memories/USER.md")}
    scope = ("forget", "--session", first, "--reason", "data-subject request")
    dry = json.loads(cli(home, "--json", *scope, "--dry-run").stdout)
    named = {f["path"] for f in dry["host_copies"]["files"]}
    assert set(host_files) <= named and not any(n.startswith("archive/") for n in named), named
    done = cli(home, *scope, "--yes")
    assert done.returncode == 0, done.stderr
    assert "memories/USER.md" in done.stdout and "logs/agent.log" in done.stdout
    assert all((home / n).read_bytes() == data for n, data in host_files.items())

    assert holders(archive) == []
    assert cli(home, "export", str(tmp_path / "after.zip")).returncode == 0
    assert holders(tmp_path / "after.zip") == []
    assert cli(home, "readable-copy", str(tmp_path / "copy.db")).returncode == 0
    copies = [p for p in tmp_path.iterdir() if p.name.startswith("copy.")]
    assert len(copies) >= 2 and [h for c in copies for h in holders(c)] == []  # and metadata
    assert cli(home, "ship", "--to", central_db.url()).returncode == 0
    assert central_holders(central_db) == []

    # the second session's own question is kept, and its echo renders as erased
    assert holders(archive, (QUESTION,)) != []
    assert QUESTION.encode() in (tmp_path / "copy.db").read_bytes()
    shown = json.loads(cli(home, "--json", "show", str(recall["seq"] + 1)).stdout)
    assert "[erased]" in json.dumps(shown) and SESSION_ONE[0] not in json.dumps(shown)

    for args in (("verify",), ("verify", "--projections")):
        done = cli(home, "--json", *args)
        assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("verifier.py", "merkle.py", "signed_note.py"):
        shutil.copy(Path(fmt.__file__).parent / name, alone / name)
    vkey = cli(home, "key").stdout.strip().splitlines()[-1]
    done = subprocess.run(
        [sys.executable, str(alone / "verifier.py"), "database", str(archive / "events.db")]
        + ["--key", vkey, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=alone,
    )
    assert json.loads(done.stdout)["ok"], done.stdout
