"""Shared helpers for the reliability suite: counts from the environment, log checks, a v2 host.

Counts are sized for CI (2 cores, every test here together well under six minutes);
raise them with ``ARCHIVE_CRASH_KILLS`` (SIGKILL iterations) and ``ARCHIVE_FUZZ_EXAMPLES``
(hypothesis examples per fuzz target under the slow marker).
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from archive_provider.format.canonical import decode
from archive_provider.format.verifier import Report, verify_database
from archive_provider.host.provider import ArchiveProvider
from archive_provider.storage.checkpoint_proof import spill_key
from archive_provider.storage.store import EventStore, archive_dir
from archive_provider.storage.witness import Witness
from archive_provider.storage.writer import writers

HERE = Path(__file__).resolve().parent
CHILD = HERE / "crash_child.py"
RECEIPT = re.compile(r"Archive checkpoint ([0-9a-f]{16}): (\d+) messages .* event seq (\d+)\.")


def env_int(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, "")))
    except ValueError:
        return default


def verify_home(home: Path) -> Report:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return verify_database(store.conn, store.key)
    finally:
        store.close()


def home_spill_key(home: Path) -> bytes | None:
    """The key the profile's writer authenticates spill records with (from its witness)."""
    return spill_key(Witness.for_home(home))


def raw(home: Path) -> sqlite3.Connection:
    """A plain connection, as an auditor or an attacker would open the file."""
    return sqlite3.connect(archive_dir(home) / "events.db", isolation_level=None)


def events(home: Path) -> list[Any]:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return list(store.events())
    finally:
        store.close()


def part_values(home: Path, digests: list[str]) -> list[Any]:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return [decode(store.payload(d) or b"null") for d in digests]
    finally:
        store.close()


def v2_agent(provider: ArchiveProvider) -> SimpleNamespace:
    """An agent-shaped object whose memory manager speaks checkpoint API v2 (main's host)."""
    from tests.host.v2_host import V2MemoryManager

    manager = V2MemoryManager()
    manager.add_provider(provider)
    return SimpleNamespace(_memory_manager=manager, compression_checkpoint_required=True)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def providers(home: Path) -> Iterator[Any]:
    """Make initialized providers on ``home`` (or another); all shut down afterwards."""
    made: list[ArchiveProvider] = []

    def make(where: Path | None = None, session: str = "s1", **kwargs: Any) -> ArchiveProvider:
        provider = ArchiveProvider()
        kwargs.setdefault("platform", "cli")
        provider.initialize(session, hermes_home=str(where or home), **kwargs)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.shutdown()
    assert not writers._writers or all(w.folder.exists() for w, _ in writers._writers.values())


def flush(provider: ArchiveProvider, timeout: float = 20) -> bool:
    return provider.core.writer is not None and provider.core.writer.flush(timeout)


def same_but_redacted(original: str, redacted: str, spans: list[tuple[str, int]]) -> bool:
    """``original`` equals ``redacted`` outside its markers, and each replaced span is of its kind.

    ``spans`` are (kind, marker offset) as ``redact_text`` reports them.
    """
    from archive_provider.domain.redaction import SPAN_PATTERNS, marker

    pattern, position = [], 0
    for kind, at in spans:
        label = marker(kind)
        if redacted[at : at + len(label)] != label:
            return False
        pattern.append(re.escape(redacted[position:at]))
        pattern.append(f"(?:{SPAN_PATTERNS[kind].pattern})")
        position = at + len(label)
    pattern.append(re.escape(redacted[position:]))
    return re.fullmatch("".join(pattern), original, re.DOTALL) is not None
