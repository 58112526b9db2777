"""Row 3, the spill (issue 20): what ``sync_turn`` costs while the queue spills, what
``journal_every_event`` costs, how long the shutdown spill of 100k queued turns takes, and
how far behind the writer a SIGKILL can find it (the loss window).

Spilling is measured under a sustained overload: whole transcripts back to back, the
queue bound small, so after the first few hundred calls every call writes a spill record
while the writer thread drains the spill beside it (GIL and disk shared, as in a host).
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from archive_provider.domain.clock import utc_now
from archive_provider.host.settings import Settings
from archive_provider.host.spill_kinds import turn_entry
from archive_provider.storage.spill import Spill, segment_paths

from .common import Row, Workdir, percentile
from .s3_provider import open_provider, sync_latencies
from .workload import Text, sessions

Report = Callable[[str], None]


@contextmanager
def settings_env(**values: str) -> Iterator[None]:
    """Provider settings through ARCHIVE_* variables, for the providers opened inside."""
    saved = {k: os.environ.get(f"ARCHIVE_{k.upper()}") for k in values}
    os.environ.update({f"ARCHIVE_{k.upper()}": v for k, v in values.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(f"ARCHIVE_{key.upper()}", None)
            else:
                os.environ[f"ARCHIVE_{key.upper()}"] = value


def spilling_latencies(home: Path, text: Text, calls: int) -> tuple[list[float], int]:
    """Microseconds per sync_turn once the queue is full and every call spills."""
    with settings_env(queue_max_events="50"):
        provider = open_provider(home, "spill-open")
    writer = provider.core.writer
    assert writer is not None
    samples: list[float] = []
    clock = time.perf_counter_ns
    try:
        gc.collect()
        for session, user, assistant in sessions("spill", text, 500, calls):
            spilled = writer.spilled
            start = clock()
            provider.sync_turn(user, assistant, session_id=session.name, messages=session.messages)
            took = (clock() - start) / 1000
            if writer.spilled > spilled:
                samples.append(took)
        writer.flush(3600)
        return samples, writer.spilled
    finally:
        provider.shutdown()


def shutdown_spill_seconds(folder: Path, text: Text, turns: int) -> tuple[float, int]:
    """Seconds to write and fsync ``turns`` queued turns (whole transcripts) as shutdown does."""
    jobs = []
    for session, _, _ in sessions("shutdown", text, 500, turns):
        jobs.append((turn_entry(session.name, list(session.messages), False, True), utc_now()))
    spill = Spill(folder, key=lambda: bytes(32))  # keyed, as a witnessed writer's records are
    start = time.perf_counter()
    with spill.lock:
        spill.prepend(jobs)
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in segment_paths(folder))
    shutil.rmtree(folder / "spill")
    return seconds, size


def commit_lag_ms(home: Path, text: Text, calls: int) -> list[float]:
    """Milliseconds from sync_turn's return to the commit of its turn, one turn at a time:
    what a SIGKILL right after the call would lose."""
    provider = open_provider(home, "lag-open")
    writer = provider.core.writer
    assert writer is not None
    lags = []
    try:
        for session, user, assistant in sessions("lag", text, 500, calls):
            provider.sync_turn(user, assistant, session_id=session.name, messages=session.messages)
            start = time.perf_counter()
            writer.flush(60)
            lags.append((time.perf_counter() - start) * 1000)
    finally:
        provider.shutdown()
    return lags


def spill_rows(work: Workdir, text: Text, calls: int, pending: int, say: Report) -> list[Row]:
    rows: list[Row] = []
    spilling, spilled = spilling_latencies(work.fresh("spilling"), text, calls * 3)
    p99 = percentile(spilling, 99)
    say(f"  sync_turn while spilling: p50 {percentile(spilling, 50):.0f} µs p99 {p99:.0f} µs")
    rows.append(
        Row(
            "3",
            "sync_turn p99 while spilling (sustained overload, queue bound 50)",
            p99,
            "µs",
            absolute_kind="max",
            absolute_value=1000,
            target_text="p99 <= 1 ms",
            extra={"calls": len(spilling), "spilled": spilled, "p50": percentile(spilling, 50)},
        )
    )
    plain_home, journal_home = work.fresh("journal-off"), work.fresh("journal-on")
    provider = open_provider(plain_home, "j0")
    try:
        plain = sync_latencies(provider, text, calls, idle=True, tag="j0")
    finally:
        provider.shutdown()
    with settings_env(journal_every_event="true"):
        provider = open_provider(journal_home, "j1")
    try:
        journal = sync_latencies(provider, text, calls, idle=True, tag="j1")
    finally:
        provider.shutdown()
    say(
        f"  sync_turn p99 journal_every_event: {percentile(journal, 99):.0f} µs "
        f"(off: {percentile(plain, 99):.0f} µs)"
    )
    rows.append(
        Row(
            "3",
            "sync_turn p99 with journal_every_event (info: its cost)",
            percentile(journal, 99),
            "µs",
            percentile(plain, 99),
            "p99 without it",
            extra={"p50": percentile(journal, 50), "p50_off": percentile(plain, 50)},
        )
    )
    seconds, size = shutdown_spill_seconds(work.fresh("shutdown") / "archive", text, pending)
    drain = Settings().drain_timeout_s
    say(f"  shutdown spill of {pending:,} turns: {seconds:.2f} s, {size / 1e6:.0f} MB")
    rows.append(
        Row(
            "3",
            f"shutdown spill of {pending // 1000}k queued turns (written + fsynced)",
            seconds,
            "s",
            drain,
            "drain_timeout_s",
            target_kind="max",
            target_value=0.5,
            target_text="<= half the drain time",
            extra={"bytes": size},
        )
    )
    lags = commit_lag_ms(work.fresh("lag"), text, min(calls, 300))
    say(
        f"  accepted-to-committed: p50 {percentile(lags, 50):.1f} ms p99 {percentile(lags, 99):.1f} ms"
    )
    rows.append(
        Row(
            "3",
            "SIGKILL loss window, normal load: accepted-to-committed p99 (info)",
            percentile(lags, 99),
            "ms",
            extra={"p50": percentile(lags, 50), "calls": len(lags)},
        )
    )
    return rows
