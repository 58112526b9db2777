"""Measure the open-time proof on a large archive (not collected by pytest).

    python tests/reliability/measure_open.py /tmp/big [--events 1000000]

Builds ``--events`` turn events (two messages each) under ``<home>/archive`` when the
archive is smaller, then times: a full ``verify_database`` (the slow path, taken after a
crash or any change), a clean close that records the fingerprint, and the fingerprint fast
path on the next open. Reference machine (2 cores): 1M events, 1.6 GB: verify 34 s,
fingerprint 0.5-0.7 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from archive_provider.format.events import NewEvent
from archive_provider.format.verifier import verify_database
from archive_provider.storage.store import EventStore, archive_dir
from archive_provider.storage.witness import Witness, fast_path_ok
from archive_provider.storage.writer import Writer


def build(folder: Path, events: int) -> None:
    store = EventStore.open(folder)
    try:
        have = store.head().seq
        batch = 20000
        for start in range(have, events, batch):
            new = []
            for i in range(start, min(events, start + batch)):
                user = store.hasher.part({"role": "user", "content": f"user message {i} " * 3})
                reply = store.hasher.part({"role": "assistant", "content": f"reply {i} " * 4})
                digests = [user.digest, reply.digest]
                new.append(
                    NewEvent(
                        "turn",
                        f"s{i // 100}",
                        {"session": f"s{i // 100}", "turn": i, "messages": digests},
                        {"turn": i, "messages": digests, "start": 0, "legacy_shape": False},
                        (user, reply),
                    )
                )
            store.append(new)
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("home", type=Path)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    folder = archive_dir(args.home)
    started = time.monotonic()
    build(folder, args.events)
    print(f"archive ready: {time.monotonic() - started:.1f}s", flush=True)
    store = EventStore.open(folder)
    started = time.monotonic()
    report = verify_database(store.conn, store.key)
    print(
        f"full verify (slow path): {time.monotonic() - started:.1f}s ok={report.ok} "
        f"events={report.events_checked}",
        flush=True,
    )
    store.close()
    witness = Witness(args.home.parent / (args.home.name + ".archive-witness"), folder)
    writer = Writer(folder, witness=witness)
    writer.append_durable(lambda s: (), timeout=600)  # opens (proof) and commits nothing
    print(f"writer open proof: {writer.last_proof}", flush=True)
    started = time.monotonic()
    writer.close(timeout=600)
    print(f"clean close with fingerprint: {time.monotonic() - started:.2f}s", flush=True)
    started = time.monotonic()
    fast = fast_path_ok(folder / "events.db", witness)
    print(f"fingerprint check (fast path): {time.monotonic() - started:.2f}s ok={fast}", flush=True)
    writer = Writer(folder, witness=witness)
    writer.append_durable(lambda s: (), timeout=600)
    print(f"next open proof: {writer.last_proof}", flush=True)
    writer.close(timeout=600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
