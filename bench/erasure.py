"""Erasure costs (issue 16): forgetting one session, and a retention batch, in a large archive.

Builds a v2 archive with the default projections (sessions of generated turns), then in a
child process each (so its peak RSS is the erasure's own, not the build's):

* ``forget --session`` of one session: the whole erasure (plan, tombstones, each
  projection forgetting in place, FTS5 'optimize', WAL truncate); before it, one 'optimize'
  of the index as built (many segments: the cold cost of making tokens physically gone);
  after it, a full rebuild of the projections, which is what an erasure cost before the
  projections forgot in place (for the ratio);
* a retention-like erasure of the oldest 10% of the events, in batches of
  ``RETENTION_BATCH`` as ``apply_retention`` makes them (no full-text merge per batch):
  time per batch, the first and the last, then the one merge at the end of the pass
  (``--batches N`` measures the first N only, for the largest archives).

Reported as numbers and as ratios to the same archive's full ``verify`` (no timed
assertions anywhere).

    python -m bench.erasure [--turns 20000] [--batches N]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from archive_provider.audit import erasure
from archive_provider.audit.replay import rebuild
from archive_provider.format.verifier import verify_database
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore

from .common import Workdir, quiet_logging
from .workload import bulk_append, corpus, turn_events


def build(folder: Path, turns: int) -> dict[str, Any]:
    text, _ = corpus()
    store = EventStore.open(folder, projections=default_projections)
    started = time.perf_counter()
    try:
        events = bulk_append(store, turn_events(store, "e", text, 500, turns), batch=2000)
    finally:
        store.close()
    return {"events": events, "build_s": round(time.perf_counter() - started, 2)}


def _child(folder: Path, what: str, batches: int | None) -> dict[str, Any]:
    store = EventStore.open(folder, create=False, projections=default_projections)
    result: dict[str, Any] = {}
    try:
        if what == "verify":
            started = time.perf_counter()
            assert verify_database(store.conn, store.key).ok
            result["seconds"] = time.perf_counter() - started
        elif what == "forget":
            session = store.conn.execute(
                "SELECT session FROM events WHERE type = 'turn' ORDER BY seq LIMIT 1"
            ).fetchone()[0]
            started = time.perf_counter()
            with store.transaction():
                erasure._merge_fts(store.conn, 0)  # the index as built: many segments
            result["optimize_cold_s"] = time.perf_counter() - started
            started = time.perf_counter()
            receipt = erasure.forget(
                store, erasure.Scope("session", {"session": session}), reason="b"
            )
            result["seconds"] = time.perf_counter() - started  # all of it, projections included
            result["payloads"] = receipt.payloads
            result["events"] = receipt.events
            started = time.perf_counter()
            rebuild(store)  # what each erasure added before projections forgot in place
            result["rebuild_s"] = time.perf_counter() - started
        else:
            last = store.head().seq // 10
            started = time.perf_counter()
            times: list[float] = []
            for low in range(1, last + 1, erasure.RETENTION_BATCH):
                if batches is not None and len(times) >= batches:
                    break
                high = min(last, low + erasure.RETENTION_BATCH - 1)
                scope = erasure.Scope(
                    "time", {"since": "", "until": "9999", "from_seq": low, "to_seq": high}
                )
                began = time.perf_counter()
                erasure.forget(store, scope, reason="retention", merge=False)  # as a pass does
                times.append(time.perf_counter() - began)
            result["seconds"] = time.perf_counter() - started
            result["batches"] = len(times)
            result["per_batch_s"] = result["seconds"] / max(len(times), 1)
            result["first_batch_s"], result["last_batch_s"] = times[0], times[-1]
            began = time.perf_counter()
            erasure.merge_index(store)  # once, at the end of the pass
            result["pass_end_merge_s"] = time.perf_counter() - began
    finally:
        store.close()
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def measure(folder: Path, what: str, batches: int | None = None) -> dict[str, Any]:
    more = [] if batches is None else ["--batches", str(batches)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.erasure", "--child", what, str(folder), *more],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return dict(json.loads(done.stdout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.erasure")
    parser.add_argument("--turns", type=int, default=20000)
    parser.add_argument("--batches", type=int, help="retention: measure the first N batches")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        with quiet_logging():
            print(json.dumps(_child(Path(args.child[1]), args.child[0], args.batches)))
        return 0
    work = Workdir(None)
    try:
        folder = work.fresh("erasure") / "archive"
        with quiet_logging():
            out: dict[str, Any] = {"turns": args.turns, **build(folder, args.turns)}
        out["verify"] = measure(folder, "verify")
        out["forget_session"] = measure(folder, "forget")
        out["retention_10pct"] = measure(folder, "retention", args.batches)
        full = out["verify"]["seconds"]
        out["ratios_to_verify"] = {
            "forget_session": round(out["forget_session"]["seconds"] / full, 3),
            "optimize_cold": round(out["forget_session"]["optimize_cold_s"] / full, 3),
            "rebuild_before_in_place": round(out["forget_session"]["rebuild_s"] / full, 3),
            "retention_batch": round(out["retention_10pct"]["per_batch_s"] / full, 3),
            "retention_pass_end_merge": round(out["retention_10pct"]["pass_end_merge_s"] / full, 3),
        }
        print(json.dumps(out, indent=2))
    finally:
        work.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
