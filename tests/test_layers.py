"""The package's shape holds: cheap imports, a public API that resolves, extensions by registry.

The import contracts themselves (layers, no cycles, hivemind through the public API only,
a standalone verifier) are checked by ``lint-imports`` in ``.ci/run``; these tests pin what
the contracts cannot see: what a process actually loads, and what the registry yields.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import archive_provider
from archive_provider import ArchiveError, InvalidRequest, UsageError, errors
from archive_provider.host.settings import config_path
from archive_provider.projections.registry import default_projections, registered
from archive_provider.storage.store import EventStore, archive_dir

HOST_MODULES = ("agent", "run_agent", "hermes_constants", "hermes_cli", "plugins")


def _loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_the_package_loads_nothing_of_it() -> None:
    loaded = _loaded_after("import archive_provider")
    ours = [name for name in loaded if name.startswith("archive_provider")]
    assert ours == ["archive_provider"], ours
    assert not [name for name in loaded if name.split(".")[0] in (*HOST_MODULES, "blake3")]


def test_status_does_not_import_hermes_agent(tmp_path: Path) -> None:
    store = EventStore.open(archive_dir(tmp_path), projections=default_projections())
    store.close()
    loaded = _loaded_after(
        "from archive_provider.cli import main\n"
        f"assert main(['--home', {str(tmp_path)!r}, '--json', 'status']) == 0"
    )
    assert not [name for name in loaded if name.split(".")[0] in HOST_MODULES]
    assert "archive_provider.host.provider" not in loaded


def test_every_public_name_resolves_to_the_module_that_defines_it() -> None:
    exports = archive_provider._EXPORTS
    assert archive_provider.__all__ == sorted(exports)
    for name, module in exports.items():
        value = getattr(archive_provider, name)
        assert getattr(sys.modules[module], name) is value, name
    assert archive_provider.config_path is config_path


def test_errors_share_one_root_and_say_what_to_do() -> None:
    from archive_provider.audit.export import ExportError
    from archive_provider.format.canonical import CanonicalEncodingError
    from archive_provider.storage.spill import SpillDamaged
    from archive_provider.storage.store import StoreBusy, StoreError
    from archive_provider.storage.witness import WitnessMismatch
    from archive_provider.storage.writer import WriterUnavailable

    for cls in (ExportError, CanonicalEncodingError, StoreError, WitnessMismatch, UsageError):
        assert issubclass(cls, ArchiveError), cls
    assert issubclass(StoreBusy, errors.ArchiveBusy) and issubclass(StoreBusy, StoreError)
    assert issubclass(WitnessMismatch, errors.ArchiveDamaged)
    assert issubclass(SpillDamaged, errors.ArchiveDamaged)
    assert issubclass(WriterUnavailable, errors.ArchiveUnavailable)
    assert issubclass(CanonicalEncodingError, InvalidRequest)
    assert issubclass(InvalidRequest, ValueError)  # callers that caught ValueError still do


def test_sqlite_failures_are_classified_by_sqlite_s_own_code(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "x.db"
    first = sqlite3.connect(path, isolation_level=None, timeout=0)
    second = sqlite3.connect(path, isolation_level=None, timeout=0)
    first.execute("CREATE TABLE t (x)")
    first.execute("BEGIN IMMEDIATE")
    try:
        second.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        busy = exc
    first.execute("ROLLBACK")
    assert errors.classify(busy) is errors.Failure.BUSY
    (tmp_path / "junk.db").write_bytes(b"this is not a database at all, just text" * 100)
    try:
        sqlite3.connect(tmp_path / "junk.db").execute("SELECT * FROM sqlite_master")
    except sqlite3.DatabaseError as exc:
        corrupt = exc
    assert errors.classify(corrupt) is errors.Failure.CORRUPT
    # a message alone says nothing once SQLite's code is there: the code decides
    coded = sqlite3.OperationalError("database is locked")
    coded.sqlite_errorname = "SQLITE_CORRUPT"  # type: ignore[attr-defined]
    assert errors.classify(coded) is errors.Failure.CORRUPT
    # without a code (an error built by hand, or an older Python) the text is the fallback
    assert errors.classify(sqlite3.OperationalError("database is locked")) is errors.Failure.BUSY
    assert errors.classify(OSError(28, "No space left on device")) is errors.Failure.FULL
    assert errors.classify(ValueError("nothing to do with storage")) is None
    first.close()
    second.close()


def test_hivemind_registers_its_projection_through_the_registry(tmp_path: Path) -> None:
    """Core names no hivemind module (lint-imports checks that); the entry point brings peers
    to an archive that keeps them, and only there (a plain archive has no peer tables)."""
    core = ["sessions", "memory", "recall", "checkpoints", "recalls_served"]
    assert [projection.name for projection in default_projections()] == core
    plain = EventStore.open(archive_dir(tmp_path / "plain"), projections=default_projections)
    try:
        assert [projection.name for projection in default_projections(plain.conn)] == core
        assert [projection.name for projection in plain.projections] == core
        peer_tables = "SELECT 1 FROM sqlite_master WHERE name LIKE 'peer%'"
        assert not plain.conn.execute(peer_tables).fetchone()
    finally:
        plain.close()
    (peers_class,) = registered()
    assert peers_class.__module__ == "hivemind.peers"
    folder = archive_dir(tmp_path / "peers")
    EventStore.open(folder, projections=[*default_projections(), peers_class()]).close()
    kept = EventStore.open(folder, projections=default_projections)
    try:
        names = [projection.name for projection in kept.projections]
        assert names == [*core, "peers"]
        assert type(kept.projections[-1]) is peers_class
    finally:
        kept.close()
