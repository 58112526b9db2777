"""The spill is part of the archive (issue 20): ``migrate`` takes it in, erasure reaches it, and a
segment a live process is writing is never taken by another.

Real archives, real spill segments written by :class:`Spill` as a shutdown writes them, the
real commands (``hermes-archive migrate`` / ``forget``) and a real second process holding a
segment.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from archive_provider import ArchiveProvider
from archive_provider.domain.clock import utc_now
from archive_provider.host.spill_kinds import (
    SpillNotTakenIn,
    spill_entry,
    take_in_spill,
    turn_entry,
)
from archive_provider.storage.migrate import V1_DB_NAME, migrate, v1_events
from archive_provider.storage.spill import (
    HEADER_BYTES,
    MAGIC,
    META_TAKEN,
    Spill,
    in_use,
    open_segment,
    segment_paths,
)
from archive_provider.storage.store import archive_dir
from archive_provider.storage.witness import Witness

from ..conftest import v1_archive
from .conftest import events, home_spill_key, verify_home

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Zorblax Quimby lives at 42 Wallaby Way"
KEPT = "the weather in Lisbon is mild today"


def write_spill(home: Path, sessions: dict[str, str], turns: int = 3) -> None:
    """A spill segment as a shutdown leaves it: for each session ``turns`` turns whose user
    text is the session's text, then one memory write of it (a kind whose events a second
    take-in would double: it carries no transcript to compare against)."""
    jobs = []
    for session, text in sessions.items():
        messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
        for turn in range(turns):
            messages = [
                *messages,
                {"role": "user", "content": f"{text} ({turn})"},
                {"role": "assistant", "content": f"noted {turn}"},
            ]
            jobs.append((turn_entry(session, messages, False, False), utc_now()))
        memory = spill_entry(
            "memory_write",
            session=session,
            action="add",
            target="memory",
            content=f"remember: {text}",
            meta={},
            redact=False,
        )
        jobs.append((memory, utc_now()))
    spill = Spill(archive_dir(home), key=lambda: home_spill_key(home))
    with spill.lock:
        spill.prepend(jobs)


def take_in(home: Path) -> None:
    """Open the archive as the next process does; it must be served (never refused, so a
    refusal fails here at once instead of waiting out a flush) and take in the spill."""
    provider = ArchiveProvider()
    provider.initialize("after", hermes_home=str(home), platform="cli")
    try:
        writer = provider.core.writer
        assert writer is not None and writer.proven.wait(60), writer.refused
        assert writer.refused is None and writer.flush(120), writer.last_error
    finally:
        provider.shutdown()


def counts(home: Path, session: str) -> tuple[int, int]:
    """(turns, memory writes) of ``session`` in the log (envelopes: an erased one counts)."""
    conn = sqlite3.connect(
        f"{(archive_dir(home) / 'events.db').absolute().as_uri()}?mode=ro", uri=True
    )
    try:
        found = dict(
            conn.execute(
                "SELECT type, count(*) FROM events WHERE session = ? GROUP BY type", (session,)
            ).fetchall()
        )
    finally:
        conn.close()
    return found.get("turn", 0), found.get("memory_write", 0)


def cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, Any]:
    from archive_provider.cli import main

    code = main(["--home", str(home), "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def raw_hits(home: Path, text: str) -> list[str]:
    """Files under the profile whose bytes hold ``text`` (as written, or JSON-escaped)."""
    needles = {text.encode(), json.dumps(text)[1:-1].encode()}
    return [
        str(path.relative_to(home))
        for path in home.rglob("*")
        if path.is_file() and any(n in path.read_bytes() for n in needles)
    ]


# -- migrate ------------------------------------------------------------------------------


def test_migrate_takes_the_pending_spill_into_the_new_archive_exactly_once(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = v1_archive(archive_dir(home))
    write_spill(home, {"sp": "spilled before the migration"})
    code, data = cli(capsys, home, "migrate")
    assert code == 0 and data["ok"]
    assert not segment_paths(folder), "migrate took the spill in"
    # into the new archive: nothing writes the kept v1 file
    v1 = sqlite3.connect(f"{(folder / V1_DB_NAME).absolute().as_uri()}?mode=ro", uri=True)
    try:
        assert not [e for e in v1_events(v1) if e.session == "sp"]
    finally:
        v1.close()
    assert counts(home, "sp") == (3, 1)
    take_in(home)  # the next open of the v2 archive adds nothing of it again
    assert counts(home, "sp") == (3, 1)
    assert verify_home(home).ok


def test_a_spill_taken_row_survives_migration(home: Path) -> None:
    # a crash after the v1 commit that took a segment in, before its removal: the segment is
    # still there and only the v1 meta row says it is in. Migrated without that row, the v2
    # writer would take it in a second time (the memory write twice).
    folder = v1_archive(archive_dir(home))
    write_spill(home, {"sp": "taken in before the migration"})
    (segment,) = segment_paths(folder)
    with open_segment(segment) as handle:
        segment_id = handle.read(HEADER_BYTES)[len(MAGIC) :]
    v1 = sqlite3.connect(folder / "events.db", isolation_level=None)
    v1.execute(  # as the v1 writer left it: every record of the segment taken in
        "INSERT INTO meta (name, value) VALUES (?, ?)",
        (META_TAKEN + segment_id.hex(), str(segment.stat().st_size)),
    )
    v1.close()
    migrate(folder, witness=Witness.for_home(home))  # no take-in: the segment is carried over
    conn = sqlite3.connect(folder / "events.db")
    try:
        rows = conn.execute(
            "SELECT count(*) FROM meta WHERE name LIKE ?", (META_TAKEN + "%",)
        ).fetchone()
    finally:
        conn.close()
    assert rows == (1,)
    take_in(home)
    assert counts(home, "sp") == (0, 0), "the migrated spill_taken row kept it from doubling"
    assert not segment_paths(folder) and verify_home(home).ok


# -- erasure ------------------------------------------------------------------------------


def test_forget_takes_the_spill_in_first_so_no_spill_file_keeps_the_erased_text(
    home: Path, providers: Callable[..., ArchiveProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    providers(session="before").shutdown()  # a v2 archive
    write_spill(home, {"s-secret": SECRET, "s-kept": KEPT})
    folder = archive_dir(home)
    assert any(SECRET.encode() in p.read_bytes() for p in segment_paths(folder))
    code, dry = cli(capsys, home, "forget", "--session", "s-secret", "--reason", "r", "--dry-run")
    assert code == 0 and dry["spill_pending"] == 1 and segment_paths(folder), "dry run: as it was"
    code, data = cli(capsys, home, "forget", "--session", "s-secret", "--reason", "r", "--yes")
    assert code == 0 and data["spill_taken_in"] == 1 and data["payloads"] > 0
    assert raw_hits(home, SECRET) == [], "no file, spill or database, holds the erased text"
    assert not segment_paths(folder)
    assert counts(home, "s-kept") == (3, 1), "the rest of the spill is archived, not dropped"
    assert raw_hits(home, KEPT)
    take_in(home)  # nothing of the erased session comes back on the next open
    assert counts(home, "s-secret") == (3, 1) and raw_hits(home, SECRET) == []
    assert verify_home(home).ok


# -- a segment a live process is writing --------------------------------------------------

HOLDER = """
import sys
from archive_provider.domain.clock import utc_now
from archive_provider.host.spill_kinds import spill_entry
from archive_provider.storage.checkpoint_proof import spill_key
from archive_provider.storage.spill import Spill
from archive_provider.storage.witness import Witness
home = __import__("pathlib").Path(sys.argv[1])
spill = Spill(home / "archive", key=lambda: spill_key(Witness.for_home(home)))
with spill.lock:
    entry = spill_entry("write_failed", session="live", at="t", hook="h", error="e")
    spill.append(entry, utc_now(), now=True)
print("holding", flush=True)
sys.stdin.readline()
"""


def test_a_segment_a_live_process_writes_is_never_taken_by_another(
    home: Path, providers: Callable[..., ArchiveProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    providers(session="before").shutdown()
    folder = archive_dir(home)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        (segment,) = segment_paths(folder)
        assert in_use(segment)
        with pytest.raises(SpillNotTakenIn, match="running Hermes process"):
            take_in_spill(home)
        code, data = cli(capsys, home, "forget", "--session", "live", "--reason", "r", "--yes")
        assert code == 1 and "running Hermes process" in data["error"]
        take_in(home)  # a provider of this process leaves it to its owner
        assert segment.exists() and counts(home, "live") == (0, 0)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    assert not in_use(segment), "the lock went with the process"
    assert take_in_spill(home) == 1
    assert not segment_paths(folder)
    assert [e.type for e in events(home) if e.session == "live"] == ["write_failed"]
