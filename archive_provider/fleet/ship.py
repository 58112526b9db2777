"""Shipping a local archive to the central PostgreSQL store, in the background.

The local log is the commit point (DESIGN invariant 12): shipping reads the archive with
its own read-only connection on its own thread, so a turn or a checkpoint never waits on
the network. Each pass

1. reads the central head through ``hermes_archive.head()``, which answers only for a
   store an administrator registered to this login (id, format, genesis and the
   archive's verifier key: :func:`registration`), and checks the registered genesis and
   key are this archive's;
2. checks the local chain value at that seq equals the central one (same history);
3. verifies the next batch of local events from the central head with the verifier's own
   checks (:func:`verify_range_v2`, and each signed checkpoint's signature with the
   archive's key), in one read snapshot, so only verified bytes leave the machine;
4. inserts payloads (with their salts; a payload erased before it was shipped as
   a tombstone, with its erasure event in the same batch), envelopes and, right after the
   events each covers, the signed checkpoints, in one transaction; then the cosignatures
   the server lacks. The server refuses a gap, a fork, or a checkpoint whose root is not
   the one it computed; a shipped erasure event blanks what it lists centrally. A
   cosignature from a witness the log names (``witness_added``) is checked with that
   witness's key first; one that does not verify stays local and the pass reports it.

Re-shipping adds nothing (it starts after the central head), a crash or an outage resumes
from the central head, and a concurrent shipper of the same store only costs a retry.
Lag (events, seconds, last error) is kept in ``archive/shipping.json`` for ``status``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..domain.clock import format_time, parse_time, utc_now
from ..domain.fence import one_line
from ..errors import ArchiveDamaged
from ..format import digests_v2, signed_note
from ..format.verifier import verify_range_v2
from ..storage.store import DB_NAME, EventStore, KeyFileError, StoreError
from ..storage.store_pieces import write_private
from .central import (
    COSIGNATURES_SQL,
    SCHEMA,
    CentralError,
    Registration,
    cosignature_verifies,
    pool,
    redacted,
    scrub,
    witness_keys,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

STATE_NAME = "shipping.json"
DEFAULT_BATCH = 1000
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 30.0
_ROWS_SQL = (
    "SELECT seq, time, type, session, key, identity, payload, parts, chain, author FROM events "
    "WHERE seq > ? AND seq <= ? ORDER BY seq"
)
#: (seq, time, type, session, key, identity, payload, parts, chain, author) as the central
#: columns hold them: digests as lowercase hex, parts as the canonical list text
Row = tuple[Any, ...]


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
    #: time of the oldest event not shipped yet: readers age the lag by the clock, so a
    #: shipper that stopped writing this file (a hung server, a dead process) still ages
    oldest_unshipped_time: str | None = None
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


def lag_seconds(state: dict[str, Any]) -> float:
    """Seconds the oldest unshipped event has waited, by the clock now (the recorded value
    when the state predates ``oldest_unshipped_time``); 0 when nothing waits."""
    if not state.get("lag_events"):
        return 0.0
    oldest = state.get("oldest_unshipped_time")
    if isinstance(oldest, str):
        with contextlib.suppress(ValueError):
            return max(0.0, round((utc_now() - parse_time(oldest)).total_seconds(), 3))
    return float(state.get("lag_seconds") or 0)


def _lag(conn: sqlite3.Connection, central_seq: int, local_seq: int) -> tuple[int, int, str | None]:
    """The local head, the events after the central head and the oldest one's time."""
    lag = max(0, local_seq - central_seq)
    row = conn.execute("SELECT time FROM events WHERE seq = ?", (central_seq + 1,)).fetchone()
    return local_seq, lag, str(row[0]) if row and lag else None


def at_local_head(state: dict[str, Any], store: EventStore) -> dict[str, Any]:
    """``state`` (written at the shipper's last pass) with the lag counted from the local
    head now: events appended since that pass wait too. A state of another store is kept."""
    if state.get("store_id") != store.store_id:
        return state
    central = int(state.get("central_seq") or 0)
    local, lag, oldest = _lag(store.conn, central, store.head().seq)
    return {**state, "local_seq": local, "lag_events": lag, "oldest_unshipped_time": oldest}


def describe_state(state: dict[str, Any]) -> str:
    """The one line ``status`` and ``hermes memory status`` show about shipping."""
    return (
        f"to {state.get('target')}: central seq {state.get('central_seq')}, lag "
        f"{state.get('lag_events')} events / {lag_seconds(state):.1f} s"
        + (f"; last shipped {state['last_success_time']}" if state.get("last_success_time") else "")
        + (
            f"; last error: {one_line(str(state['last_error']), 300)}"
            if state.get("last_error")
            else ""
        )
    )


#: how the lag alarm begins wherever it is shown
BEHIND = "shipping required but behind"


def behind(state: dict[str, Any] | None, max_lag_s: float) -> str | None:
    """The alarm line when events wait to be shipped and the oldest has waited longer than
    ``max_lag_s`` (aged by the clock, so a shipper that stopped reporting still ages); else
    None. A failed pass alone is not behind: every outage starts with one, and a blip of
    one pass is what the bound is for; the line then names the last error.

    Read from the state file only (no database, no network): the provider's
    ``unavailable_reason``, its recall label, ``hermes memory status`` and ``status`` all
    show this same line.
    """
    if not state or not state.get("lag_events"):
        return None
    events, seconds, error = int(state["lag_events"]), lag_seconds(state), state.get("last_error")
    if seconds <= max_lag_s:
        return None
    return (
        f"{BEHIND}: {events:,} events, {seconds:,.1f} s, last error: "
        f"{one_line(str(error), 300) if error else 'none'} (bound {max_lag_s:g} s, to "
        f"{state.get('target')}); bring the central store back or fix ship_to, then "
        "hermes-archive status"
    )


def _write_state(folder: Path, state: ShipState) -> None:
    tmp = folder / f"{STATE_NAME}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    write_private(tmp, json.dumps(state.as_dict(), indent=2) + "\n")  # 0600, as the archive's
    os.replace(tmp, folder / STATE_NAME)


def _local_damage(seq: int, problem: str | None) -> str:
    return (
        f"the local archive fails verification at seq {seq}: {problem}; "
        "nothing from there on is shipped (hermes-archive verify, docs/RECOVER.md)"
    )


@dataclass
class _Batch:
    """One verified batch: rows, payloads ``(digest, body, salt, erased_by)`` and signed
    checkpoints ``(size, root, time, signature)`` within it, and why it stops early."""

    rows: list[Row]
    payloads: list[tuple[str, bytes | None, bytes | None, int | None]] = field(default_factory=list)
    checkpoints: list[tuple[int, bytes, str, bytes]] = field(default_factory=list)
    problem: str | None = None

    def cut(self, seq: int) -> None:
        """Keep only what comes before event ``seq``."""
        self.rows = [row for row in self.rows if row[0] < seq]
        self.checkpoints = [c for c in self.checkpoints if c[0] < seq]
        named = {d for row in self.rows for d in _named(row)}
        self.payloads = [p for p in self.payloads if p[0] in named]


def _named(row: Row) -> list[str]:
    return [row[6], *json.loads(row[7]), *([row[9]] if row[9] else [])]


def _verified_rows(
    store: EventStore,
    start: tuple[int, str],
    until: int,
    last: int,
    checkpoint: int,
    vkey: str,
) -> _Batch:
    """A verified format 2 batch, read in one snapshot (FORMAT.md 20.2 over the range).

    A payload erased before it was shipped goes as a tombstone, and the batch then reaches
    the erasure event that lists it (the server checks the pair at commit).
    """
    conn = store.conn
    conn.execute("BEGIN")
    try:
        while True:
            rows = [
                (
                    seq,
                    time,
                    type_,
                    session,
                    key,
                    bytes(identity).hex(),
                    bytes(payload).hex(),
                    digests_v2.parts_from_blob(bytes(parts)),
                    bytes(chain).hex(),
                    None if author is None else bytes(author).hex(),
                )
                for seq, time, type_, session, key, identity, payload, parts, chain, author in conn.execute(
                    _ROWS_SQL, (start[0], until)
                )
            ]
            payloads: dict[str, tuple[str, bytes | None, bytes | None, int | None]] = {}
            for digest in {d for row in rows for d in _named(row)}:
                found = conn.execute(
                    "SELECT p.salt, p.body, x.erasure_seq FROM payloads p "
                    "LEFT JOIN erased x ON x.digest = p.digest WHERE p.digest = ?",
                    (bytes.fromhex(digest),),
                ).fetchone()
                if found is not None:  # a missing one fails the verification below
                    salt, body, erased_by = found
                    payloads[digest] = (
                        digest,
                        None if body is None else bytes(body),
                        None if body is None else bytes(salt),
                        None if body is not None else erased_by,
                    )
            reach = max((p[3] or 0 for p in payloads.values()), default=0)
            if reach <= until or reach > last:
                break
            until = reach
        report, _, _ = verify_range_v2(conn, start[0], bytes.fromhex(start[1]), until)
        signed = conn.execute(
            "SELECT size, root, time, signature FROM signed_checkpoints "
            "WHERE size >= ? AND size > ? AND size <= ? ORDER BY size",
            (start[0], checkpoint, until),
        ).fetchall()
    finally:
        conn.execute("COMMIT")
    batch = _Batch(rows, list(payloads.values()))
    if not report.ok:
        bad = report.first_bad_seq if report.first_bad_seq is not None else start[0] + 1
        batch.cut(bad)
        batch.problem = _local_damage(bad, report.problem)
    log_key = signed_note.Verifier.from_vkey(vkey)
    for size, root, time, signature in signed:
        text = signed_note.format_checkpoint(
            signed_note.Checkpoint(store.origin, size, bytes(root))
        )
        if not log_key.verify(
            text, signed_note.Signature(log_key.name, log_key.key_id, bytes(signature))
        ):
            batch.cut(size + 1)
            batch.problem = (
                f"the signed checkpoint at size {size} is not signed by this archive's key; "
                "nothing after it is shipped (hermes-archive verify --key)"
            )
            break
        if batch.rows and size > batch.rows[-1][0] or not batch.rows and size != start[0]:
            break
        batch.checkpoints.append((size, bytes(root), str(time), bytes(signature)))
    return batch


def registration(store: EventStore) -> Registration:
    """The registration of the archive ``store`` (read by the administrator who registers
    it, and compared by its shipper with what the server holds)."""
    try:
        vkey = store.vkey
    except KeyFileError:  # the key lives elsewhere: the one the archive recorded
        vkey = str(store.conn.execute("SELECT value FROM meta WHERE name = 'vkey'").fetchone()[0])
    return Registration(store.store_id, digests_v2.genesis(store.store_id).hex(), vkey)


class Shipper:
    """Ships one archive folder to one central target; :meth:`ship_once` or :meth:`follow`."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        target: str,
        *,
        batch: int = DEFAULT_BATCH,
        record_state: bool = True,
    ) -> None:
        self.folder = Path(folder)
        #: write ``shipping.json`` (False: a run to another target than the provider's,
        #: whose state is not this archive's shipping)
        self.record_state = record_state
        self.target = target
        self.batch = max(1, batch)
        self._pool: ConnectionPool | None = None
        self._store: EventStore | None = None
        self.state = ShipState(target=redacted(target))
        self._vkey = ""  # format 2: the key its signed checkpoints are checked with

    # -- resources -------------------------------------------------------------------------

    def _connections(self) -> ConnectionPool:
        if self._pool is None:
            self._pool = pool(self.target)
        return self._pool

    def _local(self) -> EventStore | None:
        if self._store is None:
            if not (self.folder / DB_NAME).exists():
                return None
            self._store = EventStore.open(self.folder, create=False, readonly=True)
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
            position, checkpoint = self._agreed_head(conn, store, local.seq)
            while True:
                batch = self._verified_batch(store, position, local.seq, checkpoint)
                if not batch.rows and not batch.checkpoints:
                    if batch.problem:
                        raise ShipError(batch.problem)
                    break
                added = self._send(conn, store.store_id, position, batch)
                if added is None:  # another shipper of this archive moved the head
                    moved, checkpoint = self._agreed_head(conn, store, local.seq)
                    if moved[0] <= position[0]:
                        raise ShipError(
                            f"the central store refused events {position[0] + 1}.. "
                            "as duplicates without moving its head"
                        )
                    position = moved
                    continue
                shipped += added
                self.state.shipped_total += added
                if batch.checkpoints:
                    checkpoint = batch.checkpoints[-1][0]
                if batch.rows:
                    position = (batch.rows[-1][0], batch.rows[-1][8])
                    self._note_lag(store, position[0], local.seq)
                if batch.problem:
                    raise ShipError(batch.problem)
            self._send_cosignatures(conn, store, checkpoint)
        return shipped

    def _agreed_head(
        self, conn: psycopg.Connection[Any], store: EventStore, local_seq: int
    ) -> tuple[tuple[int, str], int]:
        """The central head, once it is known to be a point of this archive's own history,
        and the size of the newest checkpoint shipped (-1: none)."""
        central, checkpoint = self._central_head(conn, store)
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
        return central, checkpoint

    def _central_head(
        self, conn: psycopg.Connection[Any], store: EventStore
    ) -> tuple[tuple[int, str], int]:
        """The central (seq, chain) and checkpoint of a store registered to this login."""
        found = registration(store)
        self._vkey = found.vkey
        row = conn.execute(
            f"SELECT seq, chain, genesis, key_sha256, checkpoint FROM {SCHEMA}.head(%s)",
            [store.store_id],
        ).fetchone()
        conn.commit()
        if row is None:
            raise ShipError(
                f"store {store.store_id} is not registered to this login in the central "
                "store: an administrator registers it (`hermes-archive central register "
                '--shipper ROLE`, docs/OPERATIONS.md "Fleet")'
            )
        if row[2] != found.genesis or row[3] != sha256(found.vkey.encode()).hexdigest():
            raise ShipError(
                f"store {store.store_id} is registered centrally with another genesis or key "
                "than this archive's. Nothing is shipped until someone looks."
            )
        return (int(row[0]), str(row[1])), int(row[4])

    @staticmethod
    def _local_chain(store: EventStore, seq: int) -> str | None:
        row = store.conn.execute("SELECT chain FROM events WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else bytes(row[0]).hex()

    def _verified_batch(
        self, store: EventStore, start: tuple[int, str], last: int, checkpoint: int
    ) -> _Batch:
        """The next rows after ``start`` that the verifier passes, what they need shipped
        with them, and why the batch stops early (None when it does not)."""
        batch = _verified_rows(
            store, start, min(last, start[0] + self.batch), last, checkpoint, self._vkey
        )
        for row in batch.rows:
            if any("\x00" in text for text in row[1:4]):
                batch.cut(row[0])
                batch.problem = (
                    f"event {row[0]} has a NUL character in its time, type or session, which "
                    "PostgreSQL text cannot hold; it and what follows stay local"
                )
                break
        return batch

    def _send(
        self,
        conn: psycopg.Connection[Any],
        store_id: str,
        start: tuple[int, str],
        batch: _Batch,
    ) -> int | None:
        """Insert one verified batch in one transaction; None when another shipper won.

        Each signed checkpoint goes in right after the events it covers: the server checks
        its root against the tree it has grown to exactly that size.
        """
        import psycopg

        rows = batch.rows
        prev = [start[1], *(row[8] for row in rows[:-1])]
        try:
            with conn.transaction():
                if batch.payloads:
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.payloads (store_id, digest, body, salt, erased_by) "
                        "SELECT %s, d, b, s, e FROM unnest(%s::text[], %s::bytea[], %s::bytea[], "
                        "%s::bigint[]) AS u(d, b, s, e) ON CONFLICT DO NOTHING",
                        [store_id, *(list(column) for column in zip(*batch.payloads, strict=True))],
                    )
                seqs = [row[0] for row in rows]
                done = 0
                for size, root, time, signature in batch.checkpoints:
                    end = bisect_right(seqs, size)
                    if end > done:
                        self._insert_events(conn, store_id, rows[done:end], prev[done:end])
                        done = end
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.checkpoints (store_id, size, root, time, "
                        "signature) VALUES (%s, %s, %s, %s, %s)",
                        [store_id, size, root, time, signature],
                    )
                if done < len(rows):
                    self._insert_events(conn, store_id, rows[done:], prev[done:])
        except psycopg.errors.UniqueViolation:
            return None
        except (psycopg.errors.IntegrityError, psycopg.errors.RaiseException) as exc:
            span = f"events {rows[0][0]}..{rows[-1][0]}" if rows else "a checkpoint"
            raise ShipError(
                f"the central store refused {span}: {scrub(str(exc).strip(), self.target)}"
            ) from None
        return len(rows)

    @staticmethod
    def _insert_events(
        conn: psycopg.Connection[Any], store_id: str, rows: list[Row], prev: list[str]
    ) -> None:
        columns = list(zip(*rows, strict=True))
        conn.execute(
            f"INSERT INTO {SCHEMA}.events (store_id, seq, time, type, session, key, "
            "identity, payload, parts, chain, author, prev_chain) "
            "SELECT %s, u.* FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], "
            "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], "
            "%s::text[]) AS u ORDER BY 1",
            [store_id, *(list(column) for column in columns), prev],
        )

    def _send_cosignatures(
        self, conn: psycopg.Connection[Any], store: EventStore, checkpoint: int
    ) -> None:
        """Ship the cosignatures of shipped checkpoints the server does not hold yet
        (witnesses cosign in the background, after the checkpoint was shipped).

        One from a witness the log names (``witness_added``) is checked with that key first
        and, when it does not verify, kept back and reported; one from another key (the
        local witness, whose key lives outside the profile) goes unchecked, as central
        ``verify`` then says.
        """
        import psycopg

        local = store.conn.execute(
            COSIGNATURES_SQL + " WHERE c.size <= ?", (checkpoint,)
        ).fetchall()
        if not local:
            return
        have = {
            (int(r[0]), str(r[1]), bytes(r[2]))
            for r in conn.execute(f"SELECT * FROM {SCHEMA}.cosigned(%s)", [store.store_id])
        }
        conn.commit()
        keys = None  # the witnesses' keys, read once a cosignature is to be sent
        refused = None
        for row in local:
            size, name, key_id, timestamp, signature, _ = row
            if (size, name, bytes(key_id)) in have:
                continue
            if keys is None:
                keys = witness_keys(store.conn)
            if cosignature_verifies(keys, store.origin, row) is False:
                refused = refused or (
                    f"the cosignature of {name} on the checkpoint at size {size} does not verify "
                    "with the key the log names for that witness; it is not shipped "
                    "(hermes-archive verify)"
                )
                continue
            try:
                with conn.transaction():
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.cosignatures (store_id, size, name, key_id, "
                        "timestamp, signature) VALUES (%s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING",
                        [store.store_id, size, name, key_id, timestamp, signature],
                    )
            except psycopg.errors.ForeignKeyViolation:
                continue  # its checkpoint was never shipped (signed below the central head)
        if refused:
            raise ShipError(refused)

    # -- state ----------------------------------------------------------------------------

    def _note_lag(self, store: EventStore, central_seq: int, local_seq: int) -> None:
        state = self.state
        state.store_id, state.central_seq = store.store_id, central_seq
        state.local_seq, state.lag_events, state.oldest_unshipped_time = _lag(
            store.conn, central_seq, local_seq
        )
        state.lag_seconds = lag_seconds(state.as_dict())

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
            if self.record_state and self.folder.exists():
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
