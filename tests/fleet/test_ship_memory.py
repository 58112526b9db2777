"""``ship`` reads the whole archive: its memory must not grow with it (issue 18 point 3).

The same two archive sizes and bounds as tests/test_memory_bounds.py, shipped to the real
PostgreSQL of the fleet fixture by ``hermes-archive ship`` in a child process that reports
its own peak RSS. (Format v1: the central store takes v1 archives, see conftest.)
"""

from __future__ import annotations

from pathlib import Path

from archive_provider.storage.store import EventStore, archive_dir
from bench.common import cli_child
from tests.fleet.conftest import Central
from tests.test_memory_bounds import LARGE_TURNS, SMALL_TURNS, Pair, build_archive


def test_ship_runs_in_bounded_memory(tmp_path: Path, central_db: Central) -> None:
    small = build_archive(tmp_path / "small", SMALL_TURNS)
    large = build_archive(tmp_path / "large", LARGE_TURNS)
    url = central_db.url()
    for home in (small, large):
        central_db.register(home)
    Pair(cli_child(small, "ship", "--to", url), cli_child(large, "ship", "--to", url)).check()
    shipped = central_db.query("SELECT count(*) FROM hermes_archive.events")[0][0]
    assert shipped == _head(small) + _head(large)


def _head(home: Path) -> int:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return store.head().seq
    finally:
        store.close()
