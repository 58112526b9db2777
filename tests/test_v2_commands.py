"""Reading a format-v2 archive through the commands and helpers that used to speak v1 only.

A v2 turn's author is the envelope's own erasable payload (FORMAT.md 13.1), digests are
32-byte BLOBs: ``log``, ``show``, ``search --author``, the demo's manifest and the envelope
schema must read them as they read a v1 archive.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from archive_provider.cli import main
from archive_provider.demo.demo import _archive_head
from archive_provider.host.provider import ArchiveProvider
from archive_provider.host.schemas import load_envelope_schema
from archive_provider.storage.store import EventStore, archive_dir

ALICE = {"id": "bot:ops/alice", "name": "Alice", "is_bot": True}


@pytest.fixture
def home(make_provider: Callable[..., ArchiveProvider], tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    provider = make_provider(folder)
    convo = [
        {"role": "user", "content": "deploy the heron service"},
        {"role": "assistant", "content": "Deploying heron now."},
    ]
    provider.sync_turn(convo[0]["content"], convo[1]["content"], messages=convo,
                       turn_author=dict(ALICE))  # fmt: skip
    provider.shutdown()
    return folder


def cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str]:
    code = main(["--home", str(home), *args])
    return code, capsys.readouterr().out


def test_log_show_and_search_name_a_v2_turns_author(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        (turn,) = [e for e in store.events() if e.type == "turn"]
    finally:
        store.close()
    assert turn.envelope.version == 2 and turn.author_digest == turn.envelope.author
    code, out = cli(capsys, home, "log", "--type", "turn")
    assert code == 0 and "by Alice <bot:ops/alice> [bot]" in out
    code, out = cli(capsys, home, "show", str(turn.seq))
    assert "author    Alice <bot:ops/alice> [bot]" in out
    code, out = cli(capsys, home, "search", "heron", "--author", "bot:ops/alice")
    assert code == 0 and "Deploying heron now." in out


def test_v2_envelopes_match_the_envelope_schema_and_the_demo_manifest_reads_the_head(
    home: Path,
) -> None:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        for event in store.events():
            jsonschema.validate(event.envelope.as_value(), load_envelope_schema())
        head = store.head()
    finally:
        store.close()
    summary = _archive_head(archive_dir(home))
    assert json.loads(json.dumps(summary))["chain"] == head.chain  # hex text, not bytes
