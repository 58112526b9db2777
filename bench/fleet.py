"""Fleet row: shipping throughput beside a raw ``COPY`` of the same rows into the same tables.

``python -m bench.fleet [--turns N] [--batch B] [--json OUT]`` starts its own
PostgreSQL 15 (the test suite's server helper: Debian's binaries, an unprivileged user,
127.0.0.1), builds a corpus archive (format 2), then in the same run and against
the same server

* ships it with :class:`archive_provider.fleet.ship.Shipper` into a fresh central database
  (read, verify with BLAKE3 and, format 2, the checkpoint signatures; send, one transaction
  per batch, server triggers checking every row and, format 2, growing the SHA-256 tree
  and matching each signed checkpoint's root), and
* copies exactly the rows the shipper sent (stores, payloads with salts, events with
  prev_chain, signed checkpoints right after the events they cover; read from the archive
  beforehand, no hashing) into another fresh central database with ``COPY``, in
  transactions of the same size, through the same triggers.

The ratio is shipping / COPY in events per second (target >= 0.5x). Then two real
providers take 100 turns/s each with ``ship_to`` set (a pass every 0.5 s when idle), and
each event's lag from its local commit to its central insert is reported (p50, p99). Kept out of
``python -m bench`` because it needs a PostgreSQL server; the smoke test does not start one.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from archive_provider.fleet import central
from archive_provider.fleet.ship import Shipper, registration
from archive_provider.format import digests_v2
from archive_provider.storage.store import DB_NAME, EventStore

from .common import Row, Workdir, machine, percentile, quiet_logging, table
from .workload import build_log

ROOT = Path(__file__).resolve().parent.parent


def _server() -> Any:
    sys.path.insert(0, str(ROOT))
    from tests.fleet.pgserver import PgServer

    server = PgServer()
    server.start()
    return server


def _database(server: Any, name: str) -> str:
    with psycopg.connect(server.superuser_dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    dsn = str(server.superuser_dsn(name))
    central.init(dsn)
    return dsn


def _hex(value: Any) -> Any:
    return bytes(value).hex() if isinstance(value, bytes) else value


def _rows(
    folder: Path,
) -> tuple[dict[str, Any], list[tuple[Any, ...]], dict[str, tuple[Any, ...]], list[Any]]:
    """The store row, event rows (with author and prev_chain), payloads (body, salt) and
    signed checkpoints the shipper sends, in the central columns' form."""
    conn = sqlite3.connect(folder / DB_NAME)
    try:
        meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        store_id = meta["store_id"]
        events = [
            (
                *(_hex(v) for v in row[:7]),
                digests_v2.parts_from_blob(row[7]),
                _hex(row[8]),
                _hex(row[9]),
            )
            for row in conn.execute(
                "SELECT seq, time, type, session, key, identity, payload, parts, chain, "
                "author FROM events ORDER BY seq"
            )
        ]
        payloads = {
            d.hex(): (body, salt)
            for d, salt, body in conn.execute("SELECT digest, salt, body FROM payloads")
        }
        checkpoints = conn.execute(
            "SELECT size, root, time, signature FROM signed_checkpoints ORDER BY size"
        ).fetchall()
    finally:
        conn.close()
    store = {
        "store_id": store_id,
        "format_version": 2,
        "genesis": digests_v2.genesis(store_id).hex(),
        "payload_key": None,
        "vkey": meta.get("vkey"),
        "label": "copy",
    }
    previous = store["genesis"]
    rows = []
    for row in events:
        rows.append((*row, previous))
        previous = row[8]
    return store, rows, payloads, checkpoints


def raw_copy(dsn: str, folder: Path, batch: int) -> tuple[int, float]:
    """COPY the same rows in transactions of ``batch`` events, each signed checkpoint right
    after the events it covers (as the shipper sends them); (events, seconds)."""
    store, rows, payloads, checkpoints = _rows(folder)
    store_id = store["store_id"]
    chunks = []
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        needed: dict[str, tuple[Any, ...]] = {}
        for row in chunk:
            for digest in [row[6], *json.loads(row[7]), *([row[9]] if row[9] else [])]:
                if digest not in needed:
                    needed[digest] = payloads[digest]
        signed = [c for c in checkpoints if chunk[0][0] - 1 <= c[0] <= chunk[-1][0]]
        chunks.append((chunk, needed, signed))
    sent: set[str] = set()
    with psycopg.connect(dsn) as conn:
        began = time.perf_counter()
        with conn.cursor() as cursor:
            cursor.execute(
                "INSERT INTO hermes_archive.stores (store_id, format_version, genesis, "
                "payload_key, vkey, label, shipper) VALUES (%(store_id)s, %(format_version)s, "
                "%(genesis)s, %(payload_key)s, %(vkey)s, %(label)s, 'hermes_archive_shipper')",
                store,
            )
            conn.commit()
            for chunk, needed, signed in chunks:
                with cursor.copy(
                    "COPY hermes_archive.payloads (store_id, digest, body, salt) FROM STDIN"
                ) as copy:
                    for digest, (body, salt) in needed.items():
                        if digest not in sent:
                            copy.write_row((store_id, digest, body, salt))
                sent.update(needed)
                done = 0
                for size, *rest in [*signed, (None,)]:
                    end = len(chunk) if size is None else sum(r[0] <= size for r in chunk)
                    if end > done:
                        with cursor.copy(
                            "COPY hermes_archive.events (store_id, seq, time, type, session, "
                            "key, identity, payload, parts, chain, author, prev_chain) FROM STDIN"
                        ) as copy:
                            for row in chunk[done:end]:
                                copy.write_row((store_id, *row))
                        done = end
                    if size is not None:
                        cursor.execute(
                            "INSERT INTO hermes_archive.checkpoints (store_id, size, root, time, "
                            "signature) VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                            [store_id, size, *rest],
                        )
                conn.commit()
        seconds = time.perf_counter() - began
    return len(rows), seconds


def register(dsn: str, folder: Path, shipper: str) -> None:
    """Register the archive in ``folder`` to ``shipper``, as the administrator does."""
    store = EventStore.open(folder, create=False, readonly=True)
    try:
        found = registration(store)
    finally:
        store.close()
    central.register(dsn, found, shipper, folder.parent.name)


def ship(dsn: str, folder: Path, batch: int) -> tuple[int, float]:
    register(dsn, folder, "hermes_archive_shipper")  # the superuser is a member of it
    shipper = Shipper(folder, dsn, batch=batch)
    try:
        began = time.perf_counter()
        shipped = shipper.ship_once()
        return shipped, time.perf_counter() - began
    finally:
        shipper.close()


def steady_lag(
    server: Any, workdir: Workdir, *, rate: float, seconds: float, interval: float
) -> list[float]:
    """Two providers each taking ``rate`` turns/s for ``seconds``, shipping in the
    background every ``interval`` s: each event's lag from its local commit time to its
    central insert (both clocks are this machine's)."""
    from archive_provider import ArchiveProvider
    from archive_provider.domain.clock import parse_time

    dsn = _database(server, "bench_lag")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(  # type: ignore[arg-type]
            "CREATE ROLE bench_ship LOGIN PASSWORD 'bench' IN ROLE hermes_archive_shipper"
        )
    target = server.url("bench_ship", "bench", "bench_lag")
    providers = []
    for name in ("alpha", "beta"):
        home = workdir.fresh(f"lag-{name}")
        EventStore.open(home / "archive").close()
        register(dsn, home / "archive", "bench_ship")
        (home / "archive" / "config.json").write_text(json.dumps({"ship_interval_s": interval}))
        os.environ["ARCHIVE_SHIP_TO"] = target  # read from the environment only
        provider = ArchiveProvider()
        provider.initialize(name, hermes_home=str(home), platform="cli", agent_context="primary")
        providers.append(provider)

    def talk(provider: Any, name: str) -> None:
        began = time.perf_counter()
        for turn in range(int(rate * seconds)):
            delay = began + turn / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            provider.sync_turn(f"{name} asks about tulips {turn}", f"answer {turn}")

    threads = [
        threading.Thread(target=talk, args=(p, n))
        for p, n in zip(providers, ("alpha", "beta"), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    deadline = time.perf_counter() + 120
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.perf_counter() < deadline:
            shipped = conn.execute(
                "SELECT count(*) FROM hermes_archive.events WHERE type = 'turn'"
            ).fetchone()
            if shipped and shipped[0] >= 2 * int(rate * seconds):
                break
            time.sleep(0.2)
        rows = conn.execute("SELECT time, shipped FROM hermes_archive.events").fetchall()
    for provider in providers:
        provider.shutdown()
    del os.environ["ARCHIVE_SHIP_TO"]
    return sorted((shipped - parse_time(local)).total_seconds() for local, shipped in rows)


def rows_for(turns: int, batch: int, workdir: Workdir, lag_seconds: float) -> list[Row]:
    folder = workdir.fresh("fleet-archive")
    store = EventStore.open(folder)
    try:
        built = build_log(folder, turns, projections=False, store=store)
    finally:
        store.close()  # a clean close: format 2 signs its last checkpoint here
    server = _server()
    try:
        copied, copy_s = raw_copy(_database(server, "bench_copy"), folder, batch)
        shipped, ship_s = ship(_database(server, "bench_ship"), folder, batch)
        interval = 0.5
        lags = steady_lag(server, workdir, rate=100, seconds=lag_seconds, interval=interval)
    finally:
        server.cleanup()
    # the archive's store_created event is shipped too
    assert copied == shipped == built.events + 1, (copied, shipped, built.events)
    return [
        Row(
            "11",
            f"ship {shipped:,} format-2 events to PostgreSQL (verify + send, batches of {batch})",
            shipped / ship_s,
            "events/s",
            baseline=copied / copy_s,
            baseline_name="raw COPY",
            target_kind="min",
            target_value=0.5,
            target_text=">= 0.5x COPY",
        ),
        Row(
            "11",
            f"shipping lag p50, 2 providers x 100 turns/s for {lag_seconds:g} s",
            percentile(lags, 50),
            "s",
            baseline=interval,
            baseline_name="shipping interval",
            note=f"{len(lags)} events",
        ),
        Row(
            "11",
            f"shipping lag p99, 2 providers x 100 turns/s for {lag_seconds:g} s",
            percentile(lags, 99),
            "s",
            baseline=interval,
            baseline_name="shipping interval",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument("--turns", type=int, default=5000, help="corpus turns (default 5000)")
    parser.add_argument("--batch", type=int, default=1000, help="events per transaction")
    parser.add_argument(
        "--lag-seconds", type=float, default=20, help="length of the steady-rate lag run"
    )
    parser.add_argument("--json", type=Path, help="write the rows and machine facts here")
    parser.add_argument("--workdir", type=Path, help="scratch folder (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = Workdir(args.workdir)
    try:
        with quiet_logging():
            rows = rows_for(args.turns, args.batch, workdir, args.lag_seconds)
    finally:
        workdir.cleanup()
    print(table(rows))
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine(), "rows": [r.as_dict() for r in rows]}, indent=2)
        )
    return 0 if all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
