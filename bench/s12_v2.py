"""Row 12: what format v2 adds, measured on the big logs (docs/FORMAT.md 15.4, 20.4, 21.1).

* **Open after a crash** (bench/v2_open.py's procedure): a writer with a witness opens the
  log once (the full proof), 200 events are appended with no checkpoint and the process
  "crashes"; the figure is the next writer's time until its open-time proof passed. Beside
  the same at the smallest log; target <= 2x of it and <= 1 s at 1M.
* **Signed durable commit** (bench/v2_format.py): a one-turn ``durable=True`` append to a v2
  archive (tiles grown, head root, an Ed25519-signed checkpoint, ``synchronous=FULL``)
  beside a raw ``synchronous=FULL`` commit of one small row, interleaved (info).
* **Proof size and verify time**: ``prove`` of one turn in the middle of the biggest log
  (inclusion proof, signed checkpoint, disclosed bodies) and the offline check of that file
  with the verifier key, beside the same on a log of 1,000 events; target <= 3x the 1k
  log's verify time (O(log n)).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from archive_provider.audit.prove import prove
from archive_provider.format.verifier import verify_proof
from archive_provider.storage.store import EventStore
from archive_provider.storage.witness import Witness

from .common import Row, Workdir, median
from .s3_provider import size_label
from .v2_format import commit_cost
from .v2_open import crash_and_open
from .workload import build_log

Report = Callable[[str], None]


def open_rows(folders: dict[int, Path], repeats: int, say: Report) -> list[Row]:
    """Open after a crash on each big log (each gains 200 events per repeat)."""
    seconds: dict[int, float] = {}
    for events, folder in sorted(folders.items()):
        witness = Witness.for_home(folder.parent)  # the one the provider used on this log
        samples = crash_and_open(folder, witness, repeats)
        seconds[events] = median(samples)
        say(f"  open after a crash @ {size_label(events)}: {seconds[events] * 1000:.1f} ms")
    smallest = min(seconds)
    return [
        Row(
            "12",
            f"v2 open after a crash, {size_label(events).removeprefix('log of ')}",
            value,
            "s",
            seconds[smallest],
            f"same at {size_label(smallest).removeprefix('log of ')}",
            target_kind="max",
            target_value=2.0,
            target_text="<= 2x smallest, <= 1 s",
            absolute_kind="max",
            absolute_value=1.0,
            extra={"repeats": repeats},
        )
        for events, value in sorted(seconds.items())
    ]


def commit_row(work: Workdir, repeats: int, say: Report) -> Row:
    cost = commit_cost(work, repeats)
    say(
        f"  signed durable commit {cost['v2_durable_signed_ms']:.2f} ms vs raw FULL commit "
        f"{cost['raw_full_commit_ms']:.2f} ms"
    )
    return Row(
        "12",
        "v2 durable one-turn append (signed checkpoint) vs raw FULL commit (info)",
        cost["v2_durable_signed_ms"],
        "ms",
        cost["raw_full_commit_ms"],
        "raw FULL commit",
        extra=cost,
    )


def _proof(folder: Path, repeats: int) -> tuple[int, float]:
    """(bytes, median seconds to verify) of the proof of one turn in the middle of the log."""
    store = EventStore.open(folder, create=False)
    try:
        middle = store.head().seq // 2
        seq = store.conn.execute(
            "SELECT min(seq) FROM events WHERE type = 'turn' AND seq >= ?", (middle,)
        ).fetchone()[0]
        data = prove(store, [seq])[seq]
        vkey = store.vkey
    finally:
        store.close()
    path = folder.parent / "bench-proof.tlog"
    path.write_bytes(data)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        report = verify_proof(path, vkey)
        samples.append(time.perf_counter() - started)
        if not report.ok:
            raise RuntimeError(f"the bench proof did not verify: {report.problem}")
    path.unlink()
    return len(data), median(samples)


def proof_rows(work: Workdir, folder: Path, events: int, repeats: int, say: Report) -> list[Row]:
    small = work.fresh("proof-1k") / "archive"
    build_log(small, round(1000 * 40 / 43), projections=False)
    small_bytes, small_s = _proof(small, repeats)
    big_bytes, big_s = _proof(folder, repeats)
    label = size_label(events).removeprefix("log of ")
    say(
        f"  proof of one turn @ {label}: {big_bytes:,} B, verified in {big_s * 1000:.2f} ms "
        f"(1k events: {small_bytes:,} B, {small_s * 1000:.2f} ms)"
    )
    return [
        Row(
            "12",
            f"v2 proof of one turn, file size, {label}",
            big_bytes,
            "B",
            small_bytes,
            "same at 1k events",
        ),
        Row(
            "12",
            f"v2 proof of one turn, offline verify, {label}",
            big_s * 1000,
            "ms",
            small_s * 1000,
            "same at 1k events",
            target_kind="max",
            target_value=3.0,
            target_text="<= 3x the 1k log (O(log n))",
            extra={"repeats": repeats},
        ),
    ]
