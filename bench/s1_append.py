"""Row 1: append throughput of the log itself (no projections), three ways, beside raw SQLite.

Events are turns (two messages) of about 500 B and 10 KB, built ahead of timing (their
message digests computed), so each figure is what ``append`` adds: canonical encoding,
keyed payload digest, identity digest and duplicate check, chain, inserts, commit. The
raw baseline inserts exactly the rows the project wrote (read back from its database)
with ``executemany`` into an empty database of the same schema, with the same pragmas and
the same transaction boundaries, every digest precomputed. The eventsourcing library then
records the very events of the last group-commit run, so its rate is on the same events
and the same count (a short run flatters neither side).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archive_provider.format.canonical import decode
from archive_provider.format.events import NewEvent
from archive_provider.storage.store import EventStore
from archive_provider.storage.writer import Writer

from .common import Row, Workdir, median
from .peers import eventsourcing_rows
from .rawcopy import RawCopy, empty_like, event_batches, extract
from .workload import Text, turn_events

Report = Callable[[str], None]


def _events(folder: Path, text: Text, size: int, count: int) -> list[NewEvent]:
    """``count`` turn events of about ``size`` bytes, hashed with the store's keys (the store is
    made in the default format, as a new archive is)."""
    store = EventStore.open(folder)
    try:
        return [
            e for e in turn_events(store, f"a{size}", text, size, count * 2) if e.type == "turn"
        ][:count]
    finally:
        store.close()


def _fresh(
    work: Workdir, name: str, text: Text, size: int, count: int
) -> tuple[Path, list[NewEvent]]:
    folder = work.fresh(name)
    return folder, _events(folder, text, size, count)


def _one_per_transaction(folder: Path, events: list[NewEvent]) -> tuple[float, list[int]]:
    store = EventStore.open(folder)
    try:
        start = time.perf_counter()
        for event in events:
            store.append([event])
        return time.perf_counter() - start, [1] * len(events)
    finally:
        store.close()


def _bulk(folder: Path, events: list[NewEvent]) -> tuple[float, list[int]]:
    store = EventStore.open(folder)
    try:
        start = time.perf_counter()
        store.append(events)
        return time.perf_counter() - start, [len(events)]
    finally:
        store.close()


def _group(folder: Path, events: list[NewEvent]) -> tuple[float, list[int]]:
    """Through the Writer: submit every event as its own job, then flush."""
    writer = Writer(folder)
    batches = count_batches(writer)
    try:
        writer.flush(30)  # store opened (and verified) before the clock starts
        batches.clear()
        start = time.perf_counter()
        for event in events:
            writer.submit(lambda store, e=event: [e])
        if not writer.flush(600):
            raise RuntimeError("the writer did not drain")
        seconds = time.perf_counter() - start
    finally:
        writer.close(30)
    return seconds, [b for b in batches if b]


def count_batches(writer: Writer) -> list[int]:
    """Record how many events every transaction the writer commits holds (bench instrumentation)."""
    batches: list[int] = []
    original = writer._write_batch

    def counting(store: Any) -> bool:
        jobs = list(writer._pending)
        ok = original(store)
        events = sum(len(job.events or ()) for job in jobs)
        if ok and events:
            batches.append(events)
        return ok

    writer._write_batch = counting  # type: ignore[method-assign]
    return batches


def _raw(source: Path, work: Workdir, batches: list[int]) -> float:
    """The same rows, same transactions, plain executemany."""
    db = source / "events.db"
    plan = RawCopy(extract(db)).prepare(event_batches(db, batches))
    conn = empty_like(db, work.fresh("raw") / "events.db")
    try:
        start = time.perf_counter()
        RawCopy.insert(conn, plan)
        return time.perf_counter() - start
    finally:
        conn.close()


def _session_messages(events: list[NewEvent]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(session, new messages) per event, for the eventsourcing peer."""
    return [(e.session, [decode(p.body) for p in e.parts]) for e in events]


def run(
    work: Workdir, text: Text, sizes: dict[int, dict[str, int]], repeats: int, say: Report
) -> list[Row]:
    rows: list[Row] = []
    modes = {
        "one per transaction": _one_per_transaction,
        "group-committed (Writer)": _group,
        "bulk (one transaction)": _bulk,
    }
    for size, counts in sizes.items():
        label = f"{size // 1000} KB" if size >= 1000 else f"{size} B"
        for mode, append in modes.items():
            count = counts["one" if mode.startswith("one") else "many"]
            ours, raws, details = [], [], []
            for _ in range(repeats):
                folder, events = _fresh(work, f"append-{size}", text, size, count)
                seconds, batches = append(folder, events)
                ours.append(seconds)
                raws.append(_raw(folder, work, batches))
                details.append(batches)
            figure, baseline = count / median(ours), count / median(raws)
            batches = details[-1]
            rows.append(
                Row(
                    "1",
                    f"append {label}, {mode}",
                    figure,
                    "events/s",
                    baseline,
                    "raw executemany",
                    target_kind="min" if mode.startswith("group") else None,
                    target_value=0.5 if mode.startswith("group") else None,
                    target_text=">= 0.5x raw" if mode.startswith("group") else "",
                    extra={
                        "events": count,
                        "repeats": repeats,
                        "seconds": ours,
                        "raw_seconds": raws,
                        "transactions": len(batches),
                        "mean_batch": sum(batches) / max(len(batches), 1),
                    },
                )
            )
            say(f"  append {label} {mode}: {figure:,.0f}/s vs raw {baseline:,.0f}/s")
            if mode.startswith("group"):
                group_figure, group_events = figure, events
        rows += eventsourcing_rows(
            work,
            "1",
            f"append {label}, group-committed",
            group_figure,
            "events/s",
            _session_messages(group_events),
            max(1, repeats - 1),
            say,
        )
    return rows
