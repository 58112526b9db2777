"""Format v2 costs (docs/FORMAT.md 17, 15.4): bytes per turn and the price of a signed commit.

* Bytes per turn of the log alone, then with the default projections, on generated turns (session_started, then turns of two new ~500-byte messages),
  split by table with ``dbstat``, beside the raw UTF-8 bytes of the messages.
* Bytes per turn of a v2 archive with its projections by message size (``--sizes``): most
  of the overhead is per turn, so the ratio to the text falls as turns grow (issue 18).
* Commit cost, interleaved: a durable one-turn append to a v2 archive (tiles grown, head
  root, an Ed25519-signed checkpoint in the same ``synchronous=FULL`` transaction) and a raw
  ``synchronous=FULL`` commit of one small row (the floor).

    python -m bench.v2_format [--turns 5000] [--repeats 41] [--sizes 250,500,1000,2000]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from archive_provider.domain import builders
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore

from .common import Workdir, interleaved, quiet_logging
from .s7_storage import components, file_bytes, table_bytes
from .workload import corpus, turn_events


def bytes_per_turn(
    work: Workdir, turns: int, *, projections: bool = False, size: int = 500
) -> dict[str, Any]:
    folder = work.fresh(f"v2-{size}") / "archive"
    text, _ = corpus()
    store = EventStore.open(folder, projections=default_projections if projections else ())
    raw = text_bytes = 0
    try:
        chunk = []
        for event in turn_events(store, "v2", text, size, turns):
            chunk.append(event)
            if event.type == "turn":
                raw += sum(len(p.body) for p in event.parts)
                text_bytes += sum(len(json.loads(p.body)["content"].encode()) for p in event.parts)
            if len(chunk) >= 50:  # commits of ~50 events, as a busy writer groups them
                store.append(chunk)
                chunk = []
        if chunk:
            store.append(chunk)
    finally:
        store.close()
    db = folder / "events.db"
    used = file_bytes(db)
    return {
        "format_version": 2,
        "projections": projections,
        "turns": turns,
        "message_size": size,
        "bytes_per_turn": round(used / turns, 1),
        "message_bytes_per_turn": round(raw / turns, 1),  # their canonical JSON
        "text_bytes_per_turn": round(text_bytes / turns, 1),  # the texts alone, as row 7
        "ratio_to_text": round(used / text_bytes, 2),
        "per_turn_by_component": {k: round(v / turns, 1) for k, v in components(db).items()},
        "per_turn_by_table": {k: round(v / turns, 1) for k, v in table_bytes(db).items()},
    }


def commit_cost(work: Workdir, repeats: int) -> dict[str, Any]:
    text, _ = corpus()
    store = EventStore.open(work.fresh("c2") / "archive")
    floor = sqlite3.connect(work.fresh("floor") / "floor.db", isolation_level=None)
    floor.execute("PRAGMA journal_mode = WAL")
    floor.execute("PRAGMA synchronous = FULL")
    floor.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
    turn = 0

    def durable() -> float:
        nonlocal turn
        turn += 1
        user, assistant = text.exchange(500)
        parts = [
            store.hasher.part({"role": "user", "content": user}),
            store.hasher.part({"role": "assistant", "content": assistant}),
        ]
        event = builders.turn(store.hasher, "s", turn, parts, start=0, legacy=False)
        start = time.perf_counter()
        store.append([event], durable=True)
        return time.perf_counter() - start

    def raw() -> float:
        start = time.perf_counter()
        floor.execute("BEGIN IMMEDIATE")
        floor.execute("INSERT INTO t (v) VALUES (randomblob(1200))")
        floor.execute("COMMIT")
        return time.perf_counter() - start

    try:
        v2, floor_s, _, _ = interleaved(durable, raw, repeats)
        signed = store.conn.execute("SELECT count(*) FROM signed_checkpoints").fetchone()[0]
    finally:
        store.close()
        floor.close()
    return {
        "repeats": repeats,
        "v2_durable_signed_ms": round(v2 * 1000, 3),
        "raw_full_commit_ms": round(floor_s * 1000, 3),
        "v2_over_raw_full_commit": round(v2 / floor_s, 2),
        "v2_checkpoints_signed": signed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--sizes", default="", help="message sizes for the v2 by-size split")
    args = parser.parse_args(argv)
    work = Workdir(args.root)
    try:
        with quiet_logging():
            result = {
                "bytes": [bytes_per_turn(work, args.turns, projections=p) for p in (False, True)],
                "commit": commit_cost(work, args.repeats),
                "by_size": [
                    bytes_per_turn(work, args.turns, projections=True, size=int(size))
                    for size in args.sizes.split(",")
                    if size
                ],
            }
    finally:
        work.cleanup()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
