"""Every command that reads the whole archive runs in memory that does not grow with it.

Issue 18 point 3. Two archives are built once with the corpus builder: SMALL_TURNS and
LARGE_TURNS turns (7x as many events). Each command runs on both in a child process
(``bench.common.cli_child``: the child reports its own ``VmHWM``, and each process it starts
its own: their sum is the command's), and the larger archive's
peak RSS must stay within GROWTH_MIB of the smaller's and under CEILING_MIB. An O(n) path is
caught: GROWTH_MIB spread over the ~26k extra events is about 240 bytes per event, less than
any per-event or per-payload Python object costs. SQLite's page caches are filled at both
sizes (the small archive is already larger than them), so a bounded path reads as flat.
Nothing here is timed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from archive_provider.projections.builtin import RecallProjection, SessionsProjection
from archive_provider.storage.store import EventStore, archive_dir
from bench.common import ChildRun, cli_child
from bench.corpus import build
from tests.test_recall_index import as_an_older_release_left_it

SMALL_TURNS = 4_000
LARGE_TURNS = 28_000
#: how much more the larger archive may take: noise, never a term that grows with it (a path
#: growing per event, like the old export's ~5.7 KiB, grows ~130 MiB here). verify-bundle
#: once took 6.4 MiB: the set of every digest met spilled to its temporary database in the
#: larger archive only (a window filling, not growth); bundle v3's flag retired that set
GROWTH_MIB = 6.0
#: the issue's bound for a streaming export, and so for every whole-archive path
CEILING_MIB = 100.0


@dataclass
class Pair:
    """A command's runs on the small and the large archive."""

    small: ChildRun
    large: ChildRun

    def check(self) -> None:
        for run in (self.small, self.large):
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        growth = self.large.peak_mib - self.small.peak_mib
        assert growth <= GROWTH_MIB, (
            f"peak RSS grew by {growth:.1f} MiB from {self.small.peak_mib:.1f} to "
            f"{self.large.peak_mib:.1f} MiB with {LARGE_TURNS // SMALL_TURNS}x the archive"
        )
        assert self.large.peak_mib <= CEILING_MIB, f"peak RSS {self.large.peak_mib:.1f} MiB"


def build_archive(home: Path, turns: int) -> Path:
    store = EventStore.open(archive_dir(home))
    try:
        build(store, turns, batch=5000, near_misses=0)
    finally:
        store.close()
    return home


def _copy(home: Path, to: Path) -> Path:
    shutil.copytree(home, to)
    return to


@dataclass
class Archives:
    small: Path
    large: Path
    replay: Pair


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archives]:
    """Both archives in the default format, with their projections built by ``replay``
    (whose runs are the replay test's measurement)."""
    root = tmp_path_factory.mktemp("memory")
    small = build_archive(root / "small", SMALL_TURNS)
    large = build_archive(root / "large", LARGE_TURNS)
    replay = Pair(cli_child(small, "replay"), cli_child(large, "replay"))
    yield Archives(small, large, replay)
    shutil.rmtree(root, ignore_errors=True)


def test_replay_runs_in_bounded_memory(archives: Archives) -> None:
    archives.replay.check()


def test_verify_runs_in_bounded_memory(archives: Archives) -> None:
    Pair(
        cli_child(archives.small, "verify", "--jobs", "1"),
        cli_child(archives.large, "verify", "--jobs", "1"),
    ).check()


def test_verify_with_jobs_runs_in_bounded_memory_counting_its_helper(archives: Archives) -> None:
    """``verify --jobs 2``: the peak is the parent's plus its helper's (each process writes
    its own at exit), and both stay flat."""
    pair = Pair(
        cli_child(archives.small, "verify", "--jobs", "2"),
        cli_child(archives.large, "verify", "--jobs", "2"),
    )
    pair.check()
    assert pair.small.processes == pair.large.processes == 2


@pytest.fixture(scope="module")
def bundles(archives: Archives) -> Pair:
    """A whole-archive export of each (the export test's measurement); bundles beside them."""
    return Pair(
        cli_child(archives.small, "export", str(archives.small / "all.zip")),
        cli_child(archives.large, "export", str(archives.large / "all.zip")),
    )


def test_export_runs_in_bounded_memory(bundles: Pair) -> None:
    """Bundle version 3 (FORMAT.md 21.3): three members, a manifest of fixed size, the
    digests already written in bounded memory; the export's own check included."""
    bundles.check()


def test_verify_bundle_runs_in_bounded_memory(archives: Archives, bundles: Pair) -> None:
    assert bundles.small.returncode == 0 and bundles.large.returncode == 0
    Pair(
        cli_child(archives.small, "verify-bundle", str(archives.small / "all.zip")),
        cli_child(archives.large, "verify-bundle", str(archives.large / "all.zip")),
    ).check()


def test_forget_runs_in_bounded_memory(archives: Archives, tmp_path: Path) -> None:
    """One session forgotten: the erasure searches every payload for quotes of it."""
    runs = [
        cli_child(
            _copy(home, tmp_path / home.name),
            *("forget", "--session", "corpus-7-000002", "--reason", "test", "--yes"),
        )
        for home in (archives.small, archives.large)
    ]
    Pair(*runs).check()


#: the open that catches projections up (``EventStore.open`` with the default set, as the
#: provider's writer and every writing command open), then the child prints its own peak
#: (VmHWM: ru_maxrss would carry the forking test process's across exec)
_OPEN = """
import sys
from pathlib import Path
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore
EventStore.open(Path(sys.argv[1]), create=False, projections=default_projections).close()
with open("/proc/self/status") as status:
    print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")))
"""


#: the clean close's fingerprint of the whole database file (the local witness's fast path)
_FINGERPRINT = """
import sys
from pathlib import Path
from archive_provider.storage.witness import fingerprint_file
fingerprint_file(Path(sys.argv[1]) / "events.db")
with open("/proc/self/status") as status:
    print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")))
"""


def open_child(home: Path, script: str = _OPEN) -> ChildRun:
    done = subprocess.run(
        [sys.executable, "-c", script, str(archive_dir(home))],
        capture_output=True,
        text=True,
        check=False,
    )
    peak = int(done.stdout.split()[-1]) / 1024 if done.returncode == 0 else float("nan")
    return ChildRun(done.returncode, peak, 0.0, done.stdout, done.stderr)


def test_an_older_projection_is_rebuilt_on_open_in_bounded_memory(
    archives: Archives, tmp_path: Path
) -> None:
    """Recall and sessions as an older release left them (tests/test_recall_index.py): the
    open drops both and rebuilds them from the log in the runner's one streamed pass, so its
    peak does not grow with the archive."""
    homes = [_copy(home, tmp_path / home.name) for home in (archives.small, archives.large)]
    for home in homes:
        as_an_older_release_left_it(archive_dir(home) / "events.db")
    pair = Pair(*(open_child(home) for home in homes))
    pair.check()
    for home in homes:  # rebuilt in the child, to the head
        store = EventStore.open(archive_dir(home), create=False, readonly=True)
        try:
            state = dict(store.conn.execute("SELECT name, version FROM projection_state"))
            behind = store.conn.execute(
                "SELECT count(*) FROM projection_state WHERE last_seq != ?", (store.head().seq,)
            ).fetchone()[0]
        finally:
            store.close()
        assert state["recall"] == RecallProjection.version and behind == 0
        assert state["sessions"] == SessionsProjection.version


def test_the_clean_close_fingerprints_the_file_in_bounded_memory(archives: Archives) -> None:
    """The hash of the whole database a clean close records reads the file in chunks: a
    memory-mapped file counted every page of the archive in the provider's RSS."""
    Pair(*(open_child(home, _FINGERPRINT) for home in (archives.small, archives.large))).check()
