"""Row 9: how long the command line takes to start, beside ``python -c pass``.

Every ``hermes-archive`` call is a new process, so what the package imports before it does
anything is paid on every call. Two commands: ``--help`` (parser only: the floor of any
call) and ``status`` on a small archive (opens the store, reads the head). Baseline: the
same interpreter starting and doing nothing. Each figure is the median wall time of
``repeats`` runs, interleaved with the baseline.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from archive_provider.domain import builders
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore, archive_dir

from .common import Row, Workdir, interleaved


def _run(argv: list[str]) -> Callable[[], float]:
    def timed() -> float:
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        return time.perf_counter() - started

    return timed


def _small_archive(home: Path) -> None:
    """A few sessions of turns: enough for ``status`` to have something to say."""
    store = EventStore.open(archive_dir(home), projections=default_projections())
    try:
        for index in range(20):
            message = {"role": "user", "content": f"turn {index} about the garden shed"}
            parts = builders.message_parts(store.hasher, [message])
            event = builders.turn(
                store.hasher, f"s{index % 3}", index, parts, start=0, legacy=False
            )
            store.append([event])
    finally:
        store.close()


def run(work: Workdir, repeats: int, say: Callable[[str], None]) -> list[Row]:
    home = work.fresh("startup")
    _small_archive(home)
    cli = [sys.executable, "-m", "archive_provider.cli", "--home", str(home)]
    baseline = _run([sys.executable, "-c", "pass"])
    rows = []
    for label, argv in (("--help", [*cli, "--help"]), ("status, small archive", [*cli, "status"])):
        ours, theirs, _, _ = interleaved(_run(argv), baseline, repeats)
        say(
            f"  hermes-archive {label}: {ours * 1000:.0f} ms (python -c pass {theirs * 1000:.0f} ms)"
        )
        rows.append(
            Row(
                "9",
                f"CLI start-up: hermes-archive {label}",
                ours * 1000,
                "ms",
                baseline=theirs * 1000,
                baseline_name="python -c pass",
                note="info: wall time of a new process, median",
            )
        )
    return rows
