"""Child-process side of the durability checks (tier B3). Not a test module.

``python archive_child.py read``
    Open ``$HERMES_HOME``'s log from this (separate) process and print, as one JSON line,
    every checkpoint with its decoded evidence, the event count and the verifier verdict.

``python archive_child.py checkpoint_then_hang MESSAGES_JSON``
    Take a required checkpoint of the transcript in MESSAGES_JSON through the v2 manager
    (as a v2 host would), print the receipt as one JSON line, flush, and then hang until
    the parent kills it (``kill -9`` right after the return).

``python archive_child.py write_turns STOP_FILE``
    Archive turns in ``$HERMES_HOME`` from this process: after the first 50 are committed
    print ``{"ready": n}``, then go on committing until STOP_FILE exists (at most 20,000
    turns), shut down and print ``{"turns": n}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def read() -> dict[str, object]:
    from archive_provider.format.canonical import decode
    from archive_provider.format.verifier import verify_database
    from archive_provider.storage.store import EventStore, archive_dir

    store = EventStore.open(archive_dir(os.environ["HERMES_HOME"]), create=False, readonly=True)
    try:
        checkpoints = []
        total = 0
        for event in store.events():
            total += 1
            if event.type != "checkpoint":
                continue
            bodies = [store.payload(d) for d in event.body["evidence"]]
            checkpoints.append(
                {
                    "seq": event.seq,
                    "session": event.session,
                    "identity": event.envelope.identity,
                    "evidence_digest": event.body["evidence_digest"],
                    "all_parts_present": all(b is not None for b in bodies),
                    "evidence": [decode(b) for b in bodies if b is not None],
                }
            )
        report = verify_database(store.conn, store.key)
        return {
            "events": total,
            "checkpoints": checkpoints,
            "verify_ok": report.ok,
            "problem": report.problem,
        }
    finally:
        store.close()


def checkpoint_then_hang(messages_file: str) -> None:
    import v2_host as h

    from archive_provider import ArchiveProvider

    raw = json.loads(Path(messages_file).read_text(encoding="utf-8"))
    manager = h.V2MemoryManager()
    provider = ArchiveProvider()
    manager.add_provider(provider)
    manager.initialize_all("child-session", platform="cli", agent_context="primary")
    receipt = manager.on_pre_compress(
        raw,
        evidence_messages=h.direct_messages_for_pre_compress_memory(raw),
        require_checkpoint=True,
    )
    sys.stdout.write(json.dumps({"receipt": receipt, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    time.sleep(600)  # the parent kills us with SIGKILL; never shut down cleanly


def write_turns(stop_file: str) -> None:
    from archive_provider import ArchiveProvider

    provider = ArchiveProvider()
    provider.initialize("writer-session", platform="cli", agent_context="primary")
    turns = 0
    while turns < 20_000 and not Path(stop_file).exists():
        turns += 1
        provider.sync_turn(f"question {turns}: " + "q" * 200, f"answer {turns}: " + "a" * 600)
        if turns % 10 == 0:
            provider.flush_pending(30.0)
        if turns == 50:
            sys.stdout.write(json.dumps({"ready": turns}) + "\n")
            sys.stdout.flush()
    provider.shutdown()
    sys.stdout.write(json.dumps({"turns": turns}) + "\n")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "read":
        print(json.dumps(read()))
    elif mode == "checkpoint_then_hang":
        checkpoint_then_hang(sys.argv[2])
    elif mode == "write_turns":
        write_turns(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
