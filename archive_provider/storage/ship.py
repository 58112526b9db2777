"""Shipping a local archive to the central PostgreSQL store, in the background.

The local log is the commit point (DESIGN invariant 12): shipping reads the archive with
its own read-only connection on its own thread, so a turn or a checkpoint never waits on
the network. Each pass

1. registers the store (id, genesis, payload key) if the server does not know it, and reads
   the central head through ``hermes_archive.head()``;
2. checks the local chain value at that seq equals the central one (same history);
3. verifies the next batch of local events from the central head with the verifier's own
   :func:`verify_rows` (BLAKE3 identity, payload and part digests, chain), capturing the
   payload bodies it checked, so only verified bytes leave the machine;
4. inserts payloads and envelopes in one transaction; the server refuses a gap or a fork.

Re-shipping adds nothing (it starts after the central head), a crash or an outage resumes
from the central head, and a concurrent shipper of the same store only costs a retry.
Lag (events, seconds, last error) is kept in ``archive/shipping.json`` for ``status``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..domain.clock import format_time, parse_time, utc_now
from ..errors import ArchiveDamaged
from ..format.verifier import SUPPORTED_FORMAT, genesis, verify_rows
from .central import SCHEMA, CentralError, pool, redacted, scrub
from .store import DB_NAME, EventStore, EventStoreV2, StoreError

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

STATE_NAME = "shipping.json"
DEFAULT_BATCH = 1000
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 30.0
_ROWS_SQL = (
    "SELECT seq, time, type, session, key, identity, payload, parts, chain FROM events "
    "WHERE seq > ? AND seq <= ? ORDER BY seq"
)


class ShipError(ArchiveDamaged):
    """Shipping cannot go on until someone looks (divergence, local damage, refusal)."""


@dataclass
class ShipState:
    """What ``status`` shows about shipping; written after every pass."""

    target: str = ""
    store_id: str = ""
    local_seq: int = 0
    central_seq: int = 0
    lag_events: int = 0
    lag_seconds: float = 0.0
    last_error: str | None = None
    last_error_time: str | None = None
    last_success_time: str | None = None
    shipped_total: int = field(default=0)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_state(folder: Path) -> dict[str, Any] | None:
    """The last shipping state recorded beside the archive, if any (informational)."""
    try:
        data = json.loads((folder / STATE_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_state(folder: Path, state: ShipState) -> None:
    tmp = folder / (STATE_NAME + ".tmp")
    tmp.write_text(json.dumps(state.as_dict(), indent=2) + "\n", "utf-8")
    os.replace(tmp, folder / STATE_NAME)


class Shipper:
    """Ships one archive folder to one central target; :meth:`ship_once` or :meth:`follow`."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        target: str,
        *,
        batch: int = DEFAULT_BATCH,
        label: str = "",
    ) -> None:
        self.folder = Path(folder)
        self.target = target
        self.batch = max(1, batch)
        # which machine and profile an archive came from, for people reading the fleet
        self.label = label or f"{socket.gethostname()}:{self.folder.resolve().parent.name}"
        self._pool: ConnectionPool | None = None
        self._store: EventStore | None = None
        self.state = ShipState(target=redacted(target))
        self._registered = False

    # -- resources -------------------------------------------------------------------------

    def _connections(self) -> ConnectionPool:
        if self._pool is None:
            self._pool = pool(self.target)
        return self._pool

    def _local(self) -> EventStore | None:
        if self._store is None:
            if not (self.folder / DB_NAME).exists():
                return None
            store = EventStore.open(self.folder, create=False, readonly=True)
            if isinstance(store, EventStoreV2):  # the central schema holds format 1 rows
                store.close()
                raise ShipError(
                    f"the archive at {self.folder} is format 2; the central store takes "
                    f"format {SUPPORTED_FORMAT} archives only (nothing was shipped)"
                )
            self._store = store
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- one pass --------------------------------------------------------------------------

    def ship_once(self) -> int:
        """Ship everything the local archive holds now; return how many events were added."""
        try:
            shipped = self._ship()
        except Exception as exc:
            self._failed(exc)
            raise
        self.state.last_error = None
        self.state.last_success_time = format_time(utc_now())
        self._save()
        return shipped

    def _ship(self) -> int:
        store = self._local()
        if store is None:
            return 0  # nothing archived yet
        shipped = 0
        with self._connections().connection() as conn:
            local = store.head()
            position = self._agreed_head(conn, store, local.seq)
            while position[0] < local.seq:
                rows, bodies, problem = self._verified_batch(store, position, local.seq)
                added = self._send(conn, store.store_id, position, rows, bodies) if rows else 0
                if added is None:  # another shipper of this archive moved the head
                    moved = self._agreed_head(conn, store, local.seq)
                    if moved[0] <= position[0]:
                        raise ShipError(
                            f"the central store refused events {rows[0][0]}..{rows[-1][0]} "
                            "as duplicates without moving its head"
                        )
                    position = moved
                    continue
                shipped += added
                self.state.shipped_total += added
                if rows:
                    position = (rows[-1][0], rows[-1][8])
                    self._note_lag(store, position[0], local.seq)
                if problem:
                    raise ShipError(problem)
        return shipped

    def _agreed_head(
        self, conn: psycopg.Connection[Any], store: EventStore, local_seq: int
    ) -> tuple[int, str]:
        """The central head, once it is known to be a point of this archive's own history."""
        central = self._central_head(conn, store)
        self._note_lag(store, central[0], local_seq)
        if central[0] > local_seq:
            raise ShipError(
                f"the central store holds {central[0]} events of store {store.store_id} "
                f"but this archive only {local_seq}: was the archive restored from an "
                "older copy? Nothing is shipped until someone looks."
            )
        if central[0] and self._local_chain(store, central[0]) != central[1]:
            raise ShipError(
                f"the central chain at seq {central[0]} differs from this archive's: the "
                "two histories diverged. Nothing is shipped until someone looks."
            )
        return central

    def _central_head(self, conn: psycopg.Connection[Any], store: EventStore) -> tuple[int, str]:
        """Register the store if needed; return the central (seq, chain)."""
        key_hex = store.key.hex()
        if not self._registered:
            conn.execute(
                f"INSERT INTO {SCHEMA}.stores (store_id, format_version, genesis, payload_key, "
                "label) VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [
                    store.store_id,
                    SUPPORTED_FORMAT,
                    genesis(store.store_id),
                    key_hex,
                    self.label,
                ],
            )
            conn.commit()
        row = conn.execute(
            f"SELECT seq, chain, genesis, key_sha256 FROM {SCHEMA}.head(%s)", [store.store_id]
        ).fetchone()
        conn.commit()
        if row is None:
            raise ShipError(f"the central store did not register store {store.store_id}")
        if row[2] != genesis(store.store_id) or row[3] != sha256(key_hex.encode()).hexdigest():
            raise ShipError(
                f"store {store.store_id} is registered centrally with another genesis or key: "
                "someone registered this id first. Nothing is shipped until someone looks."
            )
        self._registered = True
        return int(row[0]), str(row[1])

    @staticmethod
    def _local_chain(store: EventStore, seq: int) -> str | None:
        row = store.conn.execute("SELECT chain FROM events WHERE seq = ?", (seq,)).fetchone()
        return str(row[0]) if row else None

    def _verified_batch(
        self, store: EventStore, start: tuple[int, str], last: int
    ) -> tuple[list[tuple[Any, ...]], dict[str, bytes], str | None]:
        """The next rows after ``start`` that the verifier passes, the bodies they name (as
        it checked them), and why the batch stops early (None when it does not)."""
        until = min(last, start[0] + self.batch)
        checked: dict[str, bytes] = {}

        def payload_of(digest: str) -> bytes | None:
            body = store.payload(digest)
            if body is not None:
                checked[digest] = body
            return body

        rows = store.conn.execute(_ROWS_SQL, (start[0], until)).fetchall()
        report = verify_rows(
            rows,
            store_id=store.store_id,
            key=store.key,
            payload_of=payload_of,
            head=(until, rows[-1][8]) if rows else (until, start[1]),
            start=start,
        )
        problem = None
        if not report.ok:
            bad = report.first_bad_seq if report.first_bad_seq is not None else start[0] + 1
            rows = [row for row in rows if row[0] < bad]
            problem = (
                f"the local archive fails verification at seq {bad}: {report.problem}; "
                "nothing from there on is shipped (hermes-archive verify, docs/RECOVER.md)"
            )
        for index, row in enumerate(rows):
            if any("\x00" in text for text in row[1:4]):
                rows = rows[:index]
                problem = (
                    f"event {row[0]} has a NUL character in its time, type or session, which "
                    "PostgreSQL text cannot hold; it and what follows stay local"
                )
                break
        named = {digest for row in rows for digest in (row[6], *json.loads(row[7]))}
        return rows, {d: b for d, b in checked.items() if d in named}, problem

    def _send(
        self,
        conn: psycopg.Connection[Any],
        store_id: str,
        start: tuple[int, str],
        rows: list[tuple[Any, ...]],
        bodies: dict[str, bytes],
    ) -> int | None:
        """Insert one verified batch in one transaction; None when another shipper won."""
        import psycopg

        prev = [start[1], *(row[8] for row in rows[:-1])]
        columns = list(zip(*rows, strict=True))
        try:
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {SCHEMA}.payloads (store_id, digest, body) "
                    "SELECT %s, d, b FROM unnest(%s::text[], %s::bytea[]) AS u(d, b) "
                    "ON CONFLICT DO NOTHING",
                    [store_id, list(bodies), list(bodies.values())],
                )
                conn.execute(
                    f"INSERT INTO {SCHEMA}.events (store_id, seq, time, type, session, key, "
                    "identity, payload, parts, chain, prev_chain) "
                    "SELECT %s, u.* FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], "
                    "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[]) "
                    "AS u ORDER BY 1",
                    [store_id, *(list(column) for column in columns), prev],
                )
        except psycopg.errors.UniqueViolation:
            return None
        except psycopg.errors.IntegrityError as exc:
            raise ShipError(
                f"the central store refused events {rows[0][0]}..{rows[-1][0]}: "
                f"{scrub(str(exc).strip(), self.target)}"
            ) from None
        return len(rows)

    # -- state ----------------------------------------------------------------------------

    def _note_lag(self, store: EventStore, central_seq: int, local_seq: int) -> None:
        state = self.state
        state.store_id, state.local_seq, state.central_seq = store.store_id, local_seq, central_seq
        state.lag_events = max(0, local_seq - central_seq)
        row = store.conn.execute(
            "SELECT time FROM events WHERE seq = ?", (central_seq + 1,)
        ).fetchone()
        state.lag_seconds = (
            max(0.0, round((utc_now() - parse_time(row[0])).total_seconds(), 3)) if row else 0.0
        )

    def _failed(self, exc: BaseException) -> None:
        message = scrub(f"{type(exc).__name__}: {exc}".strip(), self.target)
        if isinstance(exc, (ShipError, CentralError, StoreError)):
            message = scrub(str(exc), self.target)
        self.state.last_error = message
        self.state.last_error_time = format_time(utc_now())
        store = self._store
        if store is not None:
            # the state is informational; the error is what matters
            with contextlib.suppress(Exception):
                self._note_lag(store, self.state.central_seq, store.head().seq)
        self._save()

    def _save(self) -> None:
        try:
            if self.folder.exists():
                _write_state(self.folder, self.state)
        except OSError as exc:
            log.warning("archive: cannot record the shipping state: %s", exc)

    # -- following -------------------------------------------------------------------------

    def follow(
        self,
        stop: threading.Event,
        *,
        interval: float = 2.0,
        on_pass: Callable[[int, BaseException | None], None] | None = None,
    ) -> None:
        """Ship, then wait ``interval`` (or back off after a failure), until ``stop`` is set."""
        backoff = BACKOFF_FIRST_S
        while not stop.is_set():
            try:
                added = self.ship_once()
            except Exception as exc:
                log.warning(
                    "archive: shipping failed, retrying in %.1fs: %s",
                    backoff,
                    self.state.last_error,
                )
                if on_pass:
                    on_pass(0, exc)
                stop.wait(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                continue
            backoff = BACKOFF_FIRST_S
            if on_pass:
                on_pass(added, None)
            if not added:
                stop.wait(interval)


class BackgroundShipper:
    """The provider's shipper: one daemon thread per archive, never in a hook's way."""

    def __init__(
        self,
        folder: Path,
        target: str,
        *,
        interval: float,
        thread_factory: Callable[..., threading.Thread],
    ) -> None:
        self.shipper = Shipper(folder, target)
        self._stop = threading.Event()
        self._interval = interval
        self._thread = thread_factory(self._main, name="hermes-archive-ship", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self.shipper.follow(self._stop, interval=self._interval)
        finally:
            self.shipper.close()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to stop; never wait longer than ``timeout`` (it is a daemon)."""
        self._stop.set()
        self._thread.join(timeout)


class _Shippers:
    """One background shipper per archive folder in a process, shared by its providers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Path, list[Any]] = {}  # folder -> [shipper, users]

    def acquire(
        self,
        folder: Path,
        target: str,
        *,
        interval: float,
        thread_factory: Callable[..., threading.Thread],
    ) -> BackgroundShipper:
        with self._lock:
            entry = self._running.get(folder)
            if entry is None:
                entry = [
                    BackgroundShipper(
                        folder, target, interval=interval, thread_factory=thread_factory
                    ),
                    0,
                ]
                self._running[folder] = entry
            entry[1] += 1
            shipper: BackgroundShipper = entry[0]
            return shipper

    def release(self, shipper: BackgroundShipper) -> None:
        with self._lock:
            entry = self._running.get(shipper.shipper.folder)
            if entry is None or entry[0] is not shipper:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self._running[shipper.shipper.folder]
        shipper.stop()


shippers = _Shippers()
