"""The export's writing pipeline: members deflated in a second thread beside the reading.

The bundle must be the same bytes whatever the threads did (the same archive and clock give
the same file, and that file is what one thread deflating each member whole writes), and a
failure on either side (a full disk in the deflating thread, SIGTERM in the reading one)
must stop the export and leave nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from freezegun import freeze_time

from archive_provider.audit.export import Selection, _Stream, export_bundle
from archive_provider.format.verifier import ENVELOPES_V3, MANIFEST, PAYLOADS
from archive_provider.storage.store import EventStore, archive_dir
from bench.corpus import build

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A format-2 archive of ~1,600 events: over 1,000 (the progress step) and both streamed
    members many pieces long."""
    home = tmp_path_factory.mktemp("pipeline") / "home"
    store = EventStore.open(archive_dir(home))
    try:
        build(store, 1500, batch=5000, near_misses=0)
        store.checkpoint()
    finally:
        store.close()
    return archive_dir(home)


def _export(folder: Path, out: Path, progress: Callable[[int], None] | None = None) -> Path:
    store = EventStore.open(folder, create=False, readonly=True)
    try:
        assert export_bundle(store, out, Selection(), progress=progress).verification.ok
    finally:
        store.close()
    return out


def _deflated_in_one_thread(bundle: Path, out: Path) -> Path:
    """The bundle rewritten by ``zipfile`` alone: each member written whole, the comment (and
    so the seal) copied."""
    with zipfile.ZipFile(bundle) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            copy.compress_type, copy.external_attr = info.compress_type, info.external_attr
            data = source.read(info)
            if info.filename == MANIFEST:
                target.writestr(copy, data)
                continue
            with target.open(copy, "w", force_zip64=True) as member:
                member.write(data)
        target.comment = source.comment
    return out


def test_the_same_archive_and_clock_give_the_bytes_one_thread_would_write(
    folder: Path, tmp_path: Path
) -> None:
    with freeze_time("2026-12-02 03:00:00"):
        first = _export(folder, tmp_path / "first.zip").read_bytes()
        second = _export(folder, tmp_path / "second.zip").read_bytes()
    assert first == second
    with zipfile.ZipFile(tmp_path / "first.zip") as bundle:
        sizes = {info.filename: info.file_size for info in bundle.infolist()}
    assert sizes[ENVELOPES_V3] > 4 * _Stream.PIECE and sizes[PAYLOADS] > 4 * _Stream.PIECE
    one_thread = _deflated_in_one_thread(tmp_path / "first.zip", tmp_path / "one.zip")
    assert one_thread.read_bytes() == first


def test_the_members_are_deflated_in_a_second_thread_that_ends_with_the_export(
    folder: Path, tmp_path: Path
) -> None:
    """While the envelopes are read (the progress callback, every 1,000) the deflating thread
    runs; none is left once the export returns."""
    seen: list[set[str]] = []
    _export(
        folder,
        tmp_path / "b.zip",
        progress=lambda done: seen.append({thread.name for thread in threading.enumerate()}),
    )
    assert len(seen) >= 2 and "export-deflate" in seen[0]
    assert "export-deflate" not in {thread.name for thread in threading.enumerate()}


_FULL_DISK_CHILD = """
import errno, resource, signal, sys
from pathlib import Path
from archive_provider.audit.export import Selection, export_bundle
from archive_provider.storage.store import EventStore
store = EventStore.open(Path(sys.argv[1]), create=False, readonly=True)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    export_bundle(store, Path(sys.argv[2]), Selection())
except OSError as exc:
    print("EFBIG" if exc.errno == errno.EFBIG else repr(exc))
"""

_SIGTERM_CHILD = """
import os, signal, sys
from pathlib import Path
from archive_provider.audit.export import Selection, export_bundle
from archive_provider.storage.store import EventStore
store = EventStore.open(Path(sys.argv[1]), create=False, readonly=True)
export_bundle(store, Path(sys.argv[2]), Selection(),
              progress=lambda done: done == 1000 and os.kill(os.getpid(), signal.SIGTERM))
"""


def _child(script: str, folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, str(folder), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_a_full_disk_in_the_deflating_thread_stops_the_export_and_leaves_nothing(
    folder: Path, tmp_path: Path
) -> None:
    """The bundle outgrows the file size limit while the second thread writes it: the error
    reaches the caller and the partial file goes."""
    out = tmp_path / "exports"
    out.mkdir()
    child = _child(_FULL_DISK_CHILD, folder, out / "b.zip")
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "EFBIG"
    assert list(out.iterdir()) == []


def test_sigterm_while_the_second_thread_deflates_leaves_no_partial(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "exports"
    out.mkdir()
    child = _child(_SIGTERM_CHILD, folder, out / "b.zip")
    assert child.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), child.stderr
    assert list(out.iterdir()) == []
