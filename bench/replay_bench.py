"""Replay benchmark: rebuild every projection of a long log, beside the raw floor.

``run(events)`` builds a log of about ``events`` events from the project's corpus (turns in
sessions of 40, a checkpoint and an end per session) without projections, then runs two
children, each timed alone with its peak RSS:

* baseline: the least work any replay must do for recall: one streaming read of every
  turn and checkpoint with its parts, JSON decode of each payload and message, and
  batched inserts of the turns' user/assistant texts (the rows the replay indexes) into a
  fresh FTS5 table with the same tokenizer, in one transaction, committed;
* replay: :func:`archive_provider.audit.replay.rebuild`, every projection from scratch in one
  transaction, committed.

``ratio`` is baseline seconds / replay seconds (target >= 0.8; ``cpu_ratio`` the same in
CPU seconds, steadier on a shared machine; ``ratio_again`` for a second replay that first
drops what the first built). The replay child also samples its RSS as it goes
(``rss_samples_mb``), which shows whether memory stays flat; peak RSS is VmHWM.

    python -m bench.replay_bench 1000000
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCH = 2000


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _rss_mb() -> float:
    return _status_mb("VmRSS") or 0.0


def _peak_mb() -> float:
    """Peak RSS of this process image: VmHWM (ru_maxrss survives exec on Linux, so a child of
    a large parent would report the parent's high-water mark)."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(folder: Path, events: int) -> dict[str, Any]:
    from archive_provider.storage.store import EventStore
    from bench.corpus import build as build_corpus

    turns = max(int(events * 40 / 42), 1)  # 40 turns + start + checkpoint + end per session
    started = time.perf_counter()
    store = EventStore.open(folder)
    try:
        info = build_corpus(store, turns, batch=20000, near_misses=0)
    finally:
        store.close()
    return {"events": info.events, "turns": info.turns, "build_s": time.perf_counter() - started}


def baseline(folder: Path) -> dict[str, Any]:
    """Read + decode + FTS5 insert of the same rows, committed like the replay's; nothing else.

    Reads and decodes what the replay reads for recall (turns and checkpoints with their
    messages) and inserts what it indexes (the turns' user/assistant texts: the corpus's
    checkpoint evidence repeats them). The table is dropped afterwards, untimed.
    """
    import sqlite3

    from archive_provider.projections.builtin import TOKENIZER

    conn = sqlite3.connect(folder / "events.db", isolation_level=None)
    started, cpu = time.perf_counter(), time.process_time()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        f"CREATE VIRTUAL TABLE bench_fts USING fts5(text, kind UNINDEXED, session UNINDEXED,"
        f" seq UNINDEXED, role UNINDEXED, tokenize = '{TOKENIZER}')"
    )
    rows: list[tuple[str, str, str, int, str]] = []
    loads = json.loads
    sql = (  # parts: 32-byte digests end to end, split by SQLite
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n"
        " WHERE i < (SELECT max(length(parts)) / 32 FROM events))"
        " SELECT e.seq, e.type, e.session, p.body, q.body FROM events e"
        " JOIN payloads p ON p.digest = e.payload JOIN n ON 32 * n.i < length(e.parts)"
        " JOIN payloads q ON q.digest = substr(e.parts, 32 * n.i + 1, 32)"
        " WHERE +e.type IN ('turn', 'checkpoint') ORDER BY e.seq, n.i"
    )
    last = 0
    for seq, type_, session, body, part in conn.execute(sql):
        if seq != last:
            loads(body)
            last = seq
        message = loads(part)
        role, content = message.get("role"), message.get("content")
        if type_ == "turn" and role in ("user", "assistant") and isinstance(content, str):
            rows.append((content, type_, session, seq, role))
            if len(rows) >= BATCH:
                conn.executemany("INSERT INTO bench_fts VALUES (?, ?, ?, ?, ?)", rows)
                rows.clear()
    conn.executemany("INSERT INTO bench_fts VALUES (?, ?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    conn.execute("DROP TABLE bench_fts")
    conn.close()
    return {"seconds": elapsed, "cpu_seconds": cpu, "peak_rss_mb": _peak_mb()}


def replay(folder: Path) -> dict[str, Any]:
    from archive_provider.audit.replay import rebuild
    from archive_provider.storage.store import EventStore

    store = EventStore.open(folder)
    samples: list[float] = []
    head = store.head().seq

    def progress(seq: int) -> None:
        if seq % 100000 < 10000 or seq == head:
            samples.append(round(_rss_mb(), 1))

    idle = _rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    count = rebuild(store, progress=progress)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    store.close()
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "events": count,
        "idle_rss_mb": round(idle, 1),
        "peak_rss_mb": _peak_mb(),
        "rss_samples_mb": samples,
    }


def _child(kind: str, folder: Path) -> dict[str, Any]:
    output = subprocess.run(
        [sys.executable, "-m", "bench.replay_bench", "--child", kind, str(folder)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def run(events: int, *, workdir: Path | None = None, keep: bool = False) -> dict[str, Any]:
    """Build a log of ``events`` events, then time the baseline and the replay (children)."""
    root = Path(tempfile.mkdtemp(prefix="replay-bench-", dir=workdir))
    folder = root / "archive"
    try:
        built = build(folder, events)
        for path in folder.iterdir():  # warm the page cache for both children alike
            if path.is_file():
                with open(path, "rb") as handle:
                    while handle.read(1 << 24):
                        pass
        # interleaved, the better of two raw runs; the replay runs first into an archive
        # without projections, then again over the projections it built (drop + rebuild)
        runs = [_child("baseline", folder)]
        first = _child("replay", folder)
        runs.append(_child("baseline", folder))
        again = _child("replay", folder)
        base = min(runs, key=lambda result: result["seconds"])
        cpu = min(result["cpu_seconds"] for result in runs)
        return {
            "events": built["events"],
            "build_s": round(built["build_s"], 1),
            "baseline_s": round(base["seconds"], 2),
            "replay_s": round(first["seconds"], 2),
            "replay_again_s": round(again["seconds"], 2),
            "ratio": round(base["seconds"] / first["seconds"], 3),
            "ratio_again": round(base["seconds"] / again["seconds"], 3),
            "cpu_ratio": round(cpu / first["cpu_seconds"], 3),
            "replay_events_per_s": round(first["events"] / first["seconds"]),
            "baseline_peak_rss_mb": round(base["peak_rss_mb"], 1),
            "replay_peak_rss_mb": round(max(first["peak_rss_mb"], again["peak_rss_mb"]), 1),
            "replay_idle_rss_mb": first["idle_rss_mb"],
            "replay_rss_samples_mb": first["rss_samples_mb"],
            "db_bytes": sum(p.stat().st_size for p in folder.iterdir()),
        }
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        kind, folder = argv[1], Path(argv[2])
        result = baseline(folder) if kind == "baseline" else replay(folder)
        print(json.dumps(result))
        return
    events = int(argv[0]) if argv else 100000
    print(json.dumps(run(events), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
