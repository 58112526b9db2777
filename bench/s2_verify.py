"""Row 2: ``verify`` over the big log beside the thinnest code that does the same hashing.

The floor is one sequential pass over ``events`` (identity, chain and Merkle leaf of every
envelope, the tree's interior hashes) and one over ``payloads`` (the salted BLAKE3 of every
body), no per-row lookups. It checks nothing the verifier does not and reports only a count
of mismatches.
"""

from __future__ import annotations

import os
import resource
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blake3 import blake3

from archive_provider.format import merkle
from archive_provider.format.verifier import (
    V2_CHAIN,
    V2_GENESIS,
    V2_PAYLOAD,
    envelope_bytes_v2,
    identity_v2,
    verify_database,
)

from .common import Row, Workdir, interleaved, median
from .peers import eventsourcing_read_back, eventsourcing_turns
from .workload import Text, sessions


def verify_floor(conn: sqlite3.Connection) -> tuple[int, int]:
    """(events checked, mismatches) of the log: every event's identity, chain and leaf (and
    the tree above the leaves) in one pass over ``events``, every body's salted digest in one
    pass over ``payloads`` in table order. No lookups, no sets, no per-row checks of form."""
    store_id = conn.execute("SELECT value FROM meta WHERE name = 'store_id'").fetchone()[0]
    previous = blake3(V2_GENESIS + store_id.encode("ascii")).digest()
    tree = merkle.CompactRange()
    events = bad = 0
    conn.execute("BEGIN")
    try:
        for row in conn.execute(
            "SELECT seq, time, type, session, key, identity, payload, parts, author, chain"
            " FROM events ORDER BY seq"
        ):
            seq, time_, type_, session, key_, identity, payload, parts, author, chain = row
            if identity_v2(type_, session, key_, parts) != identity:
                bad += 1
            data = envelope_bytes_v2(
                seq, time_, type_, session, key_, identity, payload, parts, author
            )
            if blake3(V2_CHAIN + previous + data).digest() != chain:
                bad += 1
            tree.append(merkle.leaf_hash(data))
            previous = chain
            events += 1
        tree.root()
        for digest, salt, body in conn.execute("SELECT digest, salt, body FROM payloads"):
            if body is not None and blake3(V2_PAYLOAD + salt + body).digest() != digest:
                bad += 1
    finally:
        conn.execute("COMMIT")
    return events, bad


def warm(folder: Path) -> None:
    """Read the files once so both sides start from the page cache."""
    for path in folder.iterdir():
        if path.is_file():
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass


def against_floor(
    check: Callable[[], Any],
    floor: Callable[[], tuple[int, int]],
    folder: Path,
    repeats: int,
    what: str,
) -> tuple[int, float, float, list[float], list[float]]:
    """A verification timed against its floor, interleaved on a warm page cache.

    ``check`` returns a verifier report, which must pass; ``floor`` returns (events, bad),
    which must agree with it. Returns the events checked, both medians and all samples.
    """
    checked: list[int] = []

    def ours() -> float:
        start = time.perf_counter()
        report = check()
        seconds = time.perf_counter() - start
        if not report.ok:
            raise RuntimeError(f"the bench {what} failed verification: {report.problem}")
        checked.append(report.events_checked)
        return seconds

    def theirs() -> float:
        start = time.perf_counter()
        count, bad = floor()
        seconds = time.perf_counter() - start
        if bad or (checked and count != checked[-1]):
            raise RuntimeError(f"the floor disagrees: {count} events, {bad} mismatches")
        return seconds

    warm(folder)
    medians_and_samples = interleaved(ours, theirs, repeats)
    return (checked[-1] if checked else 0, *medians_and_samples)


Report = Callable[[str], None]


def run(folder: Path, events: int, repeats: int, say: Report) -> list[Row]:
    conn = sqlite3.connect(folder / "events.db", isolation_level=None)
    conn.execute("PRAGMA cache_size = -262144")
    floor_name = "sequential pass, no lookups"
    try:
        n, ours, theirs, all_ours, all_theirs = against_floor(
            lambda: verify_database(conn, b""), lambda: verify_floor(conn), folder, repeats, "log"
        )
    finally:
        conn.close()
    label = f"{n / 1000:,.0f}k" if n < 1_000_000 else f"{n / 1e6:.1f}M"
    say(f"  verify {label}: {n / ours:,.0f}/s vs {floor_name} {n / theirs:,.0f}/s")
    return [
        Row(
            "2",
            f"verify {label} events (format v2)",
            n / ours,
            "events/s",
            n / theirs,
            floor_name,
            target_kind="min",
            target_value=0.5,
            target_text=">= 0.5x floor, >= 300k/s",
            absolute_kind="min",
            absolute_value=300_000,
            extra={"events": n, "seconds": all_ours, "loop_seconds": all_theirs},
        )
    ]


def jobs_rows(folder: Path, jobs: int, repeats: int, say: Report) -> list[Row]:
    """``verify --jobs`` (the payload merge in helper processes) beside the same floor.

    On a shared machine the wall time shows the load as much as the code, so the CPU time
    of this process and of its helpers is recorded too: with one helper, the larger of the
    two is what the verify would take with two free cores."""
    conn = sqlite3.connect(folder / "events.db", isolation_level=None)
    conn.execute("PRAGMA cache_size = -262144")
    cpu: dict[str, list[float]] = {"parent": [], "helpers": [], "floor": []}

    def spent(who: int) -> float:
        used = resource.getrusage(who)
        return used.ru_utime + used.ru_stime

    def counted(action: Callable[[], Any], *names: str) -> Callable[[], Any]:
        def run() -> Any:
            start = [spent(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
            result = action()
            end = [spent(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
            for name, before, after in zip(names, start, end, strict=False):
                cpu[name].append(after - before)
            return result

        return run

    try:
        n, ours, theirs, all_ours, all_theirs = against_floor(
            counted(lambda: verify_database(conn, b"", jobs=jobs), "parent", "helpers"),
            counted(lambda: verify_floor(conn), "floor"),
            folder,
            repeats,
            "log",
        )
    finally:
        conn.close()
    load = os.getloadavg()[0]
    parent, helpers, floor = (median(cpu[name]) for name in ("parent", "helpers", "floor"))
    cpu_text = f"CPU: this process {parent:.2f} s, helpers {helpers:.2f} s, floor {floor:.2f} s"
    say(
        f"  verify --jobs {jobs}: {n / ours:,.0f}/s vs the floor {n / theirs:,.0f}/s; "
        f"{cpu_text} (load {load:.1f})"
    )
    return [
        Row(
            "2",
            f"verify {n / 1000:,.0f}k events --jobs {jobs}",
            n / ours,
            "events/s",
            n / theirs,
            "sequential pass, no lookups",
            note=f"{cpu_text}; load {load:.1f}",
            extra={
                "events": n,
                "seconds": all_ours,
                "loop_seconds": all_theirs,
                "cpu_seconds": cpu,
                "load": load,
            },
        )
    ]


def eventsourcing_row(
    work: Workdir, text: Text, count: int, repeats: int, verify_rate: float, say: Report
) -> Row:
    """Verify beside the eventsourcing library reading its own log of ``count`` turns back."""
    path = work.fresh("es-read") / "es.db"
    turns = [
        (session.name, session.messages[-2:]) for session, _, _ in sessions("es", text, 500, count)
    ]
    eventsourcing_turns(path, turns, synchronous="OFF")  # setup; the read is what is timed
    runs = [eventsourcing_read_back(path) for _ in range(repeats)]
    events = runs[0][1]
    rate = events / median([seconds for seconds, _ in runs])
    say(f"  eventsourcing reads its log back at {rate:,.0f}/s ({events:,} events)")
    return Row(
        "2",
        "verify vs eventsourcing reading its own log back (read and decode, no checks)",
        verify_rate,
        "events/s",
        rate,
        "eventsourcing read",
        target_kind="min",
        target_value=10,
        target_text=">= 10x eventsourcing",
        extra={"events": events, "seconds": [seconds for seconds, _ in runs]},
        note="eventsourcing's log of 500 B turns, one aggregate per session, read through "
        "its notification log and mapped to domain events",
    )
