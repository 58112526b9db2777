"""Shared fixtures: a provider bound to a temporary profile, and a reader for its log."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from archive_provider import ArchiveProvider
from archive_provider.format.signed_note import Signer
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore, archive_dir
from archive_provider.storage.witness import FIRST_WITNESS_REASON

# The suite is a gate: the same examples every run, and no wall-clock deadlines on a slow CI
# box. HYPOTHESIS_PROFILE=explore draws fresh examples, to hunt for new failures.
settings.register_profile("repeatable", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


#: a format-1 archive the 0.1.0 code wrote (tests/fixtures/make_v1_archive.py): migration input
V1_ARCHIVE = Path(__file__).parent / "fixtures" / "v1_archive"


def v1_archive(folder: Path) -> Path:
    """A copy of the frozen format-1 archive in ``folder`` (an ``archive`` folder), returned."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(V1_ARCHIVE, folder)
    os.chmod(folder, 0o700)
    return folder


@contextmanager
def traced(conn: sqlite3.Connection) -> Iterator[list[str]]:
    """The SQL statements ``conn`` runs inside the block, in order (its trace callback,
    taken off at the end): what a test counts to pin how many reads a path costs."""
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        conn.set_trace_callback(None)


@pytest.fixture
def make_provider(tmp_path: Path) -> Iterator[Callable[..., ArchiveProvider]]:
    """Build initialized providers; every one is shut down after the test."""
    made: list[ArchiveProvider] = []

    def _make(home: Path | None = None, session: str = "s1", **kwargs: Any) -> ArchiveProvider:
        provider = ArchiveProvider()
        kwargs.setdefault("platform", "cli")
        kwargs.setdefault("agent_context", "primary")
        provider.initialize(session, hermes_home=str(home or tmp_path / "home"), **kwargs)
        made.append(provider)
        return provider

    yield _make
    for provider in made:
        provider.shutdown()


def open_v2(folder: Path, projections: Any = default_projections) -> EventStore:
    """A format-v2 store in ``folder`` (made if new) with the default projections."""
    opened = EventStore.open(folder, projections=projections)
    return opened


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A profile folder (not made yet): ``home / "archive"`` is where its archive goes."""
    return tmp_path / "home"


@pytest.fixture
def store(home: Path) -> Iterator[EventStore]:
    """A v2 archive in ``home`` with the default projections, closed after the test."""
    opened = open_v2(home / "archive")
    yield opened
    opened.close()


def seed_randomness(patch: pytest.MonkeyPatch, seed: int) -> None:
    """Every random byte an archive draws (salts, keys, ids, the signing key) from one seed:
    the same bytes, so the same rows and pages, on every run."""
    rng = random.Random(seed)
    patch.setattr(secrets, "token_bytes", lambda n=32: rng.randbytes(n))
    patch.setattr(secrets, "token_hex", lambda n=32: rng.randbytes(n).hex())
    patch.setattr(
        Signer, "generate", classmethod(lambda cls, name, alg=1: cls(name, rng.randbytes(32), alg))
    )


@pytest.fixture(scope="module")
def cli_home_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A format-2 archive built once per module by the CLI tests' ``build_archive``."""
    from tests.test_cli import build_archive

    folder = tmp_path_factory.mktemp("cli-v2") / "home"
    build_archive(folder)
    return folder


def verifier_key(home: Path) -> str:
    """The verifier key of a format-2 archive (what an auditor is given)."""
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return store.vkey
    finally:
        store.close()


def open_log(home: Path) -> EventStore:
    """A fresh read-only view of a profile's log (another connection than the writer's)."""
    return EventStore.open(archive_dir(home), create=False, readonly=True)


def event_rows(home: Path) -> list[tuple[int, str, str]]:
    """(seq, type, session) of the events the hooks wrote: the writer's own first-witness
    marker (``witness_accepted``, reason FIRST_WITNESS_REASON) is left out."""
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    try:
        return conn.execute(
            "SELECT e.seq, e.type, e.session FROM events e JOIN payloads p ON p.digest = e.payload"
            " WHERE NOT (e.type = 'witness_accepted'"
            " AND json_extract(CAST(p.body AS TEXT), '$.reason') = ?) ORDER BY e.seq",
            (FIRST_WITNESS_REASON,),
        ).fetchall()
    finally:
        conn.close()
