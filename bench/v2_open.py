"""``python -m bench.v2_open [--events 100000 1000000]``: the first open of a v2 archive after
a crash (docs/FORMAT.md 20.4; issue 15 point 5).

Each log is built with the bulk builder (setup only), opened once by a writer with a witness
(the first, full proof; the background walk left to finish), then 200 more events are
appended with no checkpoint and the process "crashes" (the connection is closed without the
closing checkpoint or the witness write). The figure is the next writer's time from
construction until its open-time proof has passed (``Writer.proven``): the newest checkpoint's
signature and consistency with the witnessed one, then only the events after it; recall is
served from then on while the background walk checks older history. The baseline is the same
at the smallest size; the target is <= 2x of it and <= 1 s at 1M. The full verification the
proof replaces is reported beside it for the smallest size.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from archive_provider.domain.clock import utc_now
from archive_provider.format.verifier import verify_database
from archive_provider.storage.store import EventStore
from archive_provider.storage.witness import Witness
from archive_provider.storage.writer import Writer

from .common import Workdir, median, quiet_logging
from .workload import build_log, log_events

CRASHED_EVENTS = 200


def _crash(folder: Path, seed: int) -> None:
    """Append CRASHED_EVENTS with no checkpoint, then stop without a clean close."""
    store = EventStore.open(folder)
    store._last_signed = utc_now().timestamp()  # a writer that signed a moment ago
    events = list(log_events(store, CRASHED_EVENTS, seed))[:CRASHED_EVENTS]
    for start in range(0, len(events), 20):
        store.append(events[start : start + 20])
    store.conn.close()


def crash_and_open(folder: Path, witness: Witness, repeats: int) -> list[float]:
    """Seconds to the open-time proof after each of ``repeats`` crashes (first open proven)."""
    first = Writer(folder, witness=witness)
    first.proven.wait()
    if first.walk is not None:
        first._walk.wait()  # type: ignore[union-attr]
    first.close()
    samples = []
    for repeat in range(repeats):
        _crash(folder, 1000 + repeat)
        started = time.perf_counter()
        writer = Writer(folder, witness=witness)
        writer.proven.wait()
        samples.append(time.perf_counter() - started)
        proof = writer.last_proof
        assert getattr(proof, "path", None) == "checkpoint", proof
        walk = writer._walk
        if walk is not None:
            walk.stop()
        writer.close()
    return samples


def open_after_crash(work: Workdir, events: int, repeats: int) -> dict[str, Any]:
    home = work.fresh(f"v2-open-{events}")
    folder = home / "archive"
    built = build_log(folder, round(events * 40 / 43), projections=False)
    witness = Witness(home.parent / f"{home.name}.witness", folder)
    samples = crash_and_open(folder, witness, repeats)
    return {
        "events": built.events,
        "open_after_crash_s": round(median(samples), 4),
        "samples_s": [round(s, 4) for s in samples],
    }


def full_verify(work: Workdir, events: int) -> float:
    home = work.fresh(f"v2-verify-{events}")
    folder = home / "archive"
    store = EventStore.open(folder)
    build_log(folder, round(events * 40 / 43), store=store, projections=False)
    started = time.perf_counter()
    assert verify_database(store.conn, store.key).ok
    seconds = time.perf_counter() - started
    store.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Workdir(args.root)
    try:
        with quiet_logging():
            rows = [open_after_crash(work, n, args.repeats) for n in sorted(args.events)]
            base = rows[0]
            for row in rows:
                row["ratio_to_smallest"] = round(
                    row["open_after_crash_s"] / base["open_after_crash_s"], 2
                )
            result = {
                "rows": rows,
                "target": "<= 2x of the smallest size and <= 1 s at 1M",
                "full_verify_at_smallest_s": round(full_verify(work, base["events"]), 3),
            }
    finally:
        work.cleanup()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
