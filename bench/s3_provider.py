"""Row 3: what ``sync_turn`` costs the host, and sustained ingest through the provider.

Latency is measured at the caller, around the ``sync_turn`` call only, the way a host
calls it: once per completed turn with the whole transcript (0.19.0 re-sends it), the
writer idle in between (turns are seconds apart). The floor it is compared with is the
least an enqueueing hook can do: copy the transcript list and put a closure on a
``SimpleQueue`` that a parked thread waits on (waking it costs a futex call), timed just
before each call so both see the same machine noise. A second,
informational figure times back-to-back calls while the writer thread is busy, where the
GIL, not the provider, sets the tail.

Ingest submits turns back to back through the provider (projections included) and waits
for the writer to drain; the raw baseline inserts the rows the provider wrote (payloads,
envelopes, head, transcript, sessions, projection state, FTS5 rows) in the same
transactions with ``executemany``, digests precomputed.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archive_provider import ArchiveProvider
from archive_provider.storage.store import archive_dir

from .common import Row, Workdir, median, percentile
from .peers import eventsourcing_rows
from .rawcopy import RawCopy, empty_like, event_batches, extract
from .s1_append import count_batches
from .workload import Session, Text, sessions

Report = Callable[[str], None]


def open_provider(home: Path, session: str = "bench-0") -> ArchiveProvider:
    """A provider on ``home`` (a new archive is made in the default format, as in use)."""
    provider = ArchiveProvider()
    provider.initialize(session, hermes_home=str(home), platform="cli", agent_context="primary")
    if provider.core.writer is None or not provider.core.writer.flush(3600):
        raise RuntimeError(f"the provider at {home} did not open its log")
    return provider


def sync_latencies(
    provider: ArchiveProvider,
    text: Text,
    calls: int,
    *,
    idle: bool,
    tag: str,
    floor: list[float] | None = None,
    beside: ArchiveProvider | None = None,
    beside_samples: list[float] | None = None,
) -> list[float]:
    """Microseconds per ``sync_turn`` call; ``idle`` lets the writer drain between calls.

    With ``floor``, the least an enqueue-only hook can do is timed right before each call
    (same moment, same noise) and appended there: copy the transcript list and put a closure
    on a queue a parked consumer thread is blocked on (waking it is part of the cost).
    With ``beside`` (a provider on a fresh log), the same turn is sent there right after
    each call and timed into ``beside_samples``: the two logs see the same machine noise.
    """
    writer = provider.core.writer
    assert writer is not None
    other = beside.core.writer if beside is not None else None
    sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
    drained: queue.SimpleQueue[None] = queue.SimpleQueue()

    def consume() -> None:
        while sink.get() is not None:
            drained.put(None)

    consumer = threading.Thread(target=consume, name="bench-floor-consumer", daemon=True)
    consumer.start()
    samples: list[float] = []
    clock = time.perf_counter_ns
    for index, (session, user, assistant) in enumerate(sessions(f"lat-{tag}", text, 500, calls)):
        provider.on_turn_start(session.turns, user)
        messages = session.messages
        if floor is not None:
            start = clock()
            snapshot = list(messages)
            sink.put(lambda snapshot=snapshot: snapshot)
            floor.append((clock() - start) / 1000)
            drained.get()
        start = clock()
        provider.sync_turn(user, assistant, session_id=session.name, messages=messages)
        samples.append((clock() - start) / 1000)
        if idle or index % 200 == 199:
            writer.flush(60)
        if beside is not None and other is not None and beside_samples is not None:
            beside.on_turn_start(session.turns, user)
            start = clock()
            beside.sync_turn(user, assistant, session_id=session.name, messages=messages)
            beside_samples.append((clock() - start) / 1000)
            if idle or index % 200 == 199:
                other.flush(60)
    writer.flush(600)
    if other is not None:
        other.flush(600)
    sink.put(None)
    consumer.join()
    return samples


def measure_latency(
    provider: ArchiveProvider,
    text: Text,
    calls: int,
    tag: str,
    beside: ArchiveProvider | None = None,
) -> dict[str, list[float]]:
    """Idle-writer and back-to-back sync_turn samples on an open provider; with ``beside``
    (a fresh log), idle samples there too, interleaved call by call (``beside``)."""
    gc.collect()
    floor: list[float] = []
    fresh: list[float] = []
    idle = sync_latencies(
        provider, text, calls, idle=True, tag=tag, floor=floor, beside=beside, beside_samples=fresh
    )
    busy = sync_latencies(provider, text, calls, idle=False, tag=f"{tag}b")
    return {"idle": idle, "busy": busy, "floor": floor, "beside": fresh}


def size_label(size: int) -> str:
    if size == 0:
        return "empty log"
    return (
        f"log of {size / 1000:,.0f}k events"
        if size < 1_000_000
        else f"log of {size / 1e6:.0f}M events"
    )


def _spread(samples: list[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(samples, q), 2) for q in (50, 90, 95, 99, 99.9)} | {
        "max": max(samples)
    }


def latency_rows(samples: dict[int, dict[str, list[float]]], say: Report) -> list[Row]:
    """p50/p99 per log size; p99 on a big log is compared with a fresh log's, measured
    interleaved call by call in the same loop (else with the empty log's own run)."""
    rows: list[Row] = []
    base_p99: float | None = None
    for size, measured in sorted(samples.items()):
        idle, busy, floor = measured["idle"], measured["busy"], measured["floor"]
        p50, p99 = percentile(idle, 50), percentile(idle, 99)
        label = size_label(size)
        say(
            f"  sync_turn {label}: p50 {p50:.1f} µs p99 {p99:.1f} µs; "
            f"back-to-back p99 {percentile(busy, 99):.0f} µs"
        )
        rows.append(
            Row("3", f"sync_turn p50, {label}", p50, "µs", percentile(floor, 50), "bare enqueue")
        )
        if base_p99 is None:
            base_p99 = p99
            rows.append(
                Row(
                    "3",
                    f"sync_turn p99, {label}",
                    p99,
                    "µs",
                    percentile(floor, 99),
                    "bare enqueue",
                    absolute_kind="max",
                    absolute_value=50,
                    target_text="p99 <= 50 µs",
                    extra={"calls": len(idle), "spread": _spread(idle), "floor": _spread(floor)},
                )
            )
        else:
            fresh = measured.get("beside") or []
            rows.append(
                Row(
                    "3",
                    f"sync_turn p99, {label}",
                    p99,
                    "µs",
                    percentile(fresh, 99) if fresh else base_p99,
                    "p99 on a fresh log, interleaved" if fresh else "p99 on empty log",
                    target_kind="max",
                    target_value=2.0,
                    absolute_kind="max",
                    absolute_value=50,
                    target_text="<= 50 µs, flat (<= 2x empty)",
                    extra={
                        "calls": len(idle),
                        "spread": _spread(idle),
                        "floor": _spread(floor),
                        **({"fresh_log": _spread(fresh)} if fresh else {}),
                    },
                )
            )
        rows.append(
            Row(
                "3",
                f"sync_turn p99 back-to-back (writer busy, info), {label}",
                percentile(busy, 99),
                "µs",
                percentile(floor, 99),
                "bare enqueue",
                extra={"calls": len(busy), "spread": _spread(busy)},
            )
        )
    return rows


def ingest_on(provider: ArchiveProvider, text: Text, size: int, turns: int, tag: str) -> float:
    """Turns per second of back-to-back sync_turns into an open provider's (big) log."""
    seconds, _, _ = _ingest_with(provider, text, size, turns, tag)
    return turns / seconds


def _ingest(
    home: Path, text: Text, size: int, turns: int
) -> tuple[float, list[int], list[tuple[str, list[dict[str, Any]]]]]:
    """Seconds for ``turns`` back-to-back sync_turns to be committed; batches; the new messages."""
    provider = open_provider(home, f"ingest-open-{size}")
    try:
        return _ingest_with(provider, text, size, turns, f"ingest-{size}")
    finally:
        provider.shutdown()


def _ingest_with(
    provider: ArchiveProvider, text: Text, size: int, turns: int, tag: str
) -> tuple[float, list[int], list[tuple[str, list[dict[str, Any]]]]]:
    writer = provider.core.writer
    assert writer is not None
    batches = count_batches(writer)
    writer.flush(60)
    batches.clear()
    work = list(sessions(tag, text, size, turns))  # texts generated ahead of timing
    snapshots = [
        (s.name, u, a, list(s.messages[: 1 + 2 * k])) for (s, u, a), k in _turn_numbers(work)
    ]
    new = [
        (name, messages[-3:] if len(messages) == 3 else messages[-2:])
        for name, _, _, messages in snapshots
    ]
    start = time.perf_counter()
    for name, user, assistant, messages in snapshots:
        provider.sync_turn(user, assistant, session_id=name, messages=messages)
    if not writer.flush(3600):
        raise RuntimeError("the writer did not drain")
    seconds = time.perf_counter() - start
    return seconds, list(batches), new


def _turn_numbers(
    work: list[tuple[Session, str, str]],
) -> list[tuple[tuple[Session, str, str], int]]:
    """Each turn with its ordinal in its session (sessions() mutates one transcript per session)."""
    counts: dict[str, int] = {}
    out = []
    for item in work:
        counts[item[0].name] = counts.get(item[0].name, 0) + 1
        out.append((item, counts[item[0].name]))
    return out


def ingest_rows(
    work: Workdir,
    text: Text,
    plan: dict[int, int],
    repeats: int,
    say: Report,
) -> list[Row]:
    rows: list[Row] = []
    for size, turns in plan.items():
        label = f"{size // 1000} KB" if size >= 1000 else f"{size} B"
        ours, raws = [], []
        new: list[tuple[str, list[dict[str, Any]]]] = []
        for _ in range(max(1, repeats - 1)):
            home = work.fresh(f"ingest-{size}")
            seconds, batches, new = _ingest(home, text, size, turns)
            ours.append(seconds)
            db = archive_dir(home) / "events.db"
            plan_rows = RawCopy(extract(db)).prepare(event_batches(db, [1, *batches]))
            conn = empty_like(db, work.fresh("raw") / "events.db")
            try:
                start = time.perf_counter()
                RawCopy.insert(conn, plan_rows)
                raws.append(time.perf_counter() - start)
            finally:
                conn.close()
        figure, baseline = turns / median(ours), turns / median(raws)
        say(f"  ingest {label}: {figure:,.0f} turns/s vs raw {baseline:,.0f}/s")
        rows.append(
            Row(
                "3",
                f"ingest {label} turns via provider (projections incl.)",
                figure,
                "turns/s",
                baseline,
                "raw executemany + FTS5",
                target_kind="min",
                target_value=0.5,
                target_text=">= 0.5x raw",
                extra={"turns": turns, "seconds": ours, "raw_seconds": raws},
            )
        )
        rows += eventsourcing_rows(  # on the very turns the last run ingested
            work, "3", f"ingest {label} via provider", figure, "turns/s", new, 1, say
        )
    return rows
