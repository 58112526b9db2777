"""Row 4: the durable pre-compress checkpoint, its identical retry and a grown transcript.

* checkpoint of n evidence messages (~1 KB each) through ``on_pre_compress(...,
  require_checkpoint=True)``, which returns only after a ``synchronous=FULL`` commit;
  baseline: one ``synchronous=FULL`` transaction inserting exactly the rows the checkpoint
  wrote (payloads, envelope, head, projections and FTS5 rows), precomputed.
* identical retry (the host calls again with the same transcript): nothing is written;
  baseline: the least work that can recognise the evidence, i.e. serialise each message
  with the C JSON encoder and take its keyed lookup digest with the store's key
  (FORMAT.md 12.3).
* the transcript grown by 10 messages: only 10 payloads and one record are new; baseline:
  an identical retry of the old transcript plus a fresh checkpoint of just the 10 new
  messages, i.e. what "cost in proportion to the new messages" allows.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archive_provider.format.digests_v2 import lookup
from archive_provider.storage.store import archive_dir
from archive_provider.storage.store_pieces import STORE_KEY_NAME

from .common import Row, Workdir, median
from .rawcopy import RawCopy, empty_like, extract
from .s3_provider import open_provider
from .workload import Text

Report = Callable[[str], None]


def evidence(text: Text, count: int) -> list[dict[str, Any]]:
    """Alternating user/assistant messages of about 1 KB."""
    out = []
    for index in range(count):
        user, assistant = text.exchange(1000)
        out.append(
            {"role": "user" if index % 2 == 0 else "assistant", "content": user + " " + assistant}
        )
    return out


def _raw_full_commit(db: Path, work: Workdir, seq: int) -> float:
    """Seconds for one synchronous=FULL commit of event ``seq``'s rows (earlier rows loaded first)."""
    plan = RawCopy(extract(db)).prepare([(1, seq - 1), (seq, seq)])
    conn = empty_like(db, work.fresh("raw-cp") / "events.db")
    try:
        RawCopy.insert(conn, plan[:1])
        conn.execute("PRAGMA synchronous = FULL")
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        for statement, rows in plan[1]:
            conn.executemany(statement, rows)
        conn.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        conn.close()


def _hash_floor(messages: list[dict[str, Any]], key: bytes) -> float:
    start = time.perf_counter()
    dumps = json.dumps
    for message in messages:
        body = dumps(message, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
        lookup(key, body)
    return time.perf_counter() - start


def _checkpoint_seq(db: Path) -> int:
    """The seq of the newest checkpoint event (a v2 archive's first durable commit is also
    followed by its ``witness_accepted``)."""
    conn = sqlite3.connect(db)
    try:
        return int(
            conn.execute("SELECT max(seq) FROM events WHERE type = 'checkpoint'").fetchone()[0]
        )
    finally:
        conn.close()


def run(work: Workdir, text: Text, sizes: tuple[int, ...], repeats: int, say: Report) -> list[Row]:
    rows: list[Row] = []
    for count in sizes:
        ours, raws, retries, floors, grown, fresh10 = [], [], [], [], [], []
        for rep in range(repeats):
            home = work.fresh(f"cp-{count}")
            messages = evidence(text, count)
            extra = evidence(text, 10)
            provider = open_provider(home, f"cp-{count}-{rep}")
            writer = provider.core.writer
            assert writer is not None  # the first durable commit starts the witness: not timed
            writer.append_durable(lambda store: [], timeout=60)
            db = archive_dir(home) / "events.db"
            key_file = archive_dir(home) / STORE_KEY_NAME
            try:
                start = time.perf_counter()
                receipt = provider.on_pre_compress(messages, require_checkpoint=True)
                ours.append(time.perf_counter() - start)
                assert "archived" in receipt, receipt
                seq = _checkpoint_seq(db)
                start = time.perf_counter()
                again = provider.on_pre_compress(messages, require_checkpoint=True)
                retries.append(time.perf_counter() - start)
                assert "already archived" in again, again
                key = bytes.fromhex(key_file.read_text().strip())
                floors.append(_hash_floor(messages, key))
                start = time.perf_counter()
                provider.on_pre_compress(messages + extra, require_checkpoint=True)
                grown.append(time.perf_counter() - start)
                start = time.perf_counter()
                provider.on_pre_compress(evidence(text, 10), require_checkpoint=True)
                fresh10.append(time.perf_counter() - start)
            finally:
                provider.shutdown()
            raws.append(_raw_full_commit(db, work, seq))
        ms = 1000.0
        figure, baseline = median(ours) * ms, median(raws) * ms
        say(
            f"  checkpoint {count}: {figure:.1f} ms vs raw FULL commit {baseline:.1f} ms; "
            f"retry {median(retries) * ms:.2f} ms vs hash {median(floors) * ms:.2f} ms"
        )
        rows.append(
            Row(
                "4",
                f"durable checkpoint, {count} msgs x 1 KB",
                figure,
                "ms",
                baseline,
                "raw FULL commit",
                target_kind="max",
                target_value=3.0,
                target_text="<= 3x raw",
                extra={"samples_ms": [x * ms for x in ours], "raw_ms": [x * ms for x in raws]},
            )
        )
        rows.append(
            Row(
                "4",
                f"identical retry, {count} msgs",
                median(retries) * ms,
                "ms",
                median(floors) * ms,
                "BLAKE3 of the evidence",
                target_kind="max",
                target_value=1.5,
                target_text="<= 1.5x hashing",
                extra={"samples_ms": [x * ms for x in retries]},
            )
        )
        proportional = (median(retries) + median(fresh10)) * ms
        rows.append(
            Row(
                "4",
                f"transcript grown by 10, {count}+10 msgs",
                median(grown) * ms,
                "ms",
                proportional,
                "retry + 10-msg checkpoint",
                target_kind="max",
                target_value=1.5,
                target_text="<= 1.5x (proportional)",
                extra={"fresh10_ms": median(fresh10) * ms},
            )
        )
    return rows
