"""Forgetting with proof: erasure, legal holds and retention on an archive.

docs/FORMAT.md 12.4 and 18, docs/AUDIT.md, docs/OPERATIONS.md. One erasure is one write
transaction: an ``erasure`` event naming the digests it erases (never their content), the
payloads tombstoned, every payload that quotes them tombstoned too (found through the
sources each event records, and by the erased text itself, both in ``quoting``), each
projection made to forget in place what a replay would no longer hold
(``TableProjection.forget``: the cost follows what is erased, not the archive) and the
full-text index merged so no segment keeps their tokens (retention merges once at the end
of its pass, :func:`merge_index`). The events naming an erased payload are found through
``part_reuse`` and those quoting it through ``quoting``, never by reading every event, so a
batch costs what it erases and what quotes it, not the archive's size. The tombstones come
before the erasure event's own rows, so no split those rows cause copies a body about to
go; after the commit the WAL is checkpointed with truncate. An old image that a split made
before the erasure may stay in a page's unused bytes (docs/OPERATIONS.md). A crash before
the commit leaves the archive as it was; after it, re-running the same ``forget`` finds
nothing left to erase and redoes the physical clean-up.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from ..domain.clock import now_text
from ..errors import ArchiveError
from ..format.events import NewEvent
from ..projections.registry import default_projections
from ..projections.runner import forget_erased, prepare_forgetting, to_rebuild
from ..storage.sql import select_in
from ..storage.store import DB_NAME, EventStore
from ..storage.store_pieces import (
    PART_REUSE_FROM,
    QUOTE_MIN_CHARS,
    QUOTING_FROM,
    QUOTING_TYPES,
    index_owed,
    index_part_reuse,
    index_quoting,
    quote_key,
    split_parts,
    texts,
    tombstone,
    unquote,
)

log = logging.getLogger(__name__)

#: event types whose bodies hold no erasable text: erasure bookkeeping itself
RECORD_TYPES = frozenset(
    {"erasure", "retention_policy", "legal_hold", "legal_hold_released", "store_created"}
)
#: event types whose body holds text the host gave (memory metadata such as a replaced
#: entry's old text, error texts, session details): erased with the event's parts
BODY_TEXT_TYPES = frozenset(
    {
        "memory_write",
        "checkpoint_failed",
        "write_failed",
        "session_started",
        "session_switched",
        "delegation",
        "tool_call",
    }
)
#: events erased per transaction by retention, so a running provider waits at most one batch
RETENTION_BATCH = 500
#: how often a retention worker waiting for the writer's proven open looks whether to stop
READY_POLL_S = 0.25
#: the ``meta`` row naming the newest erasure whose rows' tokens the full-text merge dropped
FTS_MERGED = "fts_merged_through"


class ErasureError(ArchiveError):
    """An erasure cannot be made as asked; the message says why (exit 1 in the CLI)."""


class Held(ErasureError):
    """Data under a legal hold was asked to be erased; the message names the hold."""


class NotInArchive(ErasureError):
    """The session or event to forget was never in this archive (an erased one still is)."""


@dataclass(frozen=True)
class Scope:
    """What to forget, as the operator gave it (recorded without the data that selected it)."""

    kind: str  # session | event | time | author | memory
    value: dict[str, Any]

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.value}


@dataclass
class Plan:
    """What an erasure of a scope would do: computed in the transaction that does it."""

    events: list[int] = field(default_factory=list)  # events in the scope
    digests: set[bytes] = field(default_factory=set)  # payloads to tombstone
    touched: set[int] = field(default_factory=set)  # every event naming an erased payload
    held: list[tuple[dict[str, Any], list[int]]] = field(default_factory=list)
    dangling: set[bytes] = field(default_factory=set)  # erased though named outside the scope
    kept_shared: int = 0  # payloads left because events outside the scope name them


@dataclass(frozen=True)
class Receipt:
    """What an erasure did, with nothing it erased (printed, and listed by ``erasures``)."""

    seq: int | None
    chain: str | None
    time: str | None
    scope: dict[str, Any]
    reason: str
    legal_basis: str
    who: str
    payloads: int
    events: int
    checkpoint: str | None
    dry_run: bool = False
    held: list[dict[str, Any]] = field(default_factory=list)
    kept_shared: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "chain": self.chain,
            "time": self.time,
            "scope": self.scope,
            "reason": self.reason,
            "legal_basis": self.legal_basis,
            "who": self.who,
            "payloads": self.payloads,
            "events": self.events,
            "checkpoint": self.checkpoint,
            "dry_run": self.dry_run,
            "held": self.held,
            "kept_shared": self.kept_shared,
        }


# -- finding what a scope covers --------------------------------------------------------


def _body(conn: sqlite3.Connection, digest: bytes) -> Any:
    row = conn.execute("SELECT body FROM payloads WHERE digest = ?", (digest,)).fetchone()
    if row is None or row[0] is None:
        return None
    try:
        return json.loads(bytes(row[0]))
    except ValueError:
        return None


def _scope_events(conn: sqlite3.Connection, scope: Scope) -> list[int]:
    kind, value = scope.kind, scope.value
    skip = tuple(sorted(RECORD_TYPES))
    not_records = f"type NOT IN ({', '.join('?' * len(skip))})"
    rows: Iterable[Any]
    if kind == "session":
        rows = conn.execute(
            f"SELECT seq FROM events WHERE session = ? AND {not_records}",
            (value["session"], *skip),
        )
    elif kind == "event":
        if "seq" in value:
            rows = conn.execute(
                f"SELECT seq FROM events WHERE seq = ? AND {not_records}", (value["seq"], *skip)
            )
        else:
            prefix = str(value["digest"]).upper()
            rows = conn.execute(
                f"SELECT seq FROM events WHERE (substr(hex(payload), 1, ?) = ?"
                f" OR substr(hex(identity), 1, ?) = ?) AND {not_records}",
                (len(prefix), prefix, len(prefix), prefix, *skip),
            )
    elif kind == "time":  # until: inclusive, as ``log`` (AUDIT §2); before: retention's cutoff
        end, bound = ("<=", value["until"]) if "until" in value else ("<", value["before"])
        rows = conn.execute(
            f"SELECT seq FROM events WHERE time >= ? AND time {end} ? AND seq BETWEEN ? AND ?"
            f" AND {not_records}",
            (value["since"], bound, value.get("from_seq", 0), value.get("to_seq", 2**62), *skip),
        )
    elif kind == "author":
        wanted = str(value["author"])
        authors = [
            bytes(a)
            for (a,) in conn.execute("SELECT DISTINCT author FROM events WHERE author IS NOT NULL")
            if isinstance(found := _body(conn, bytes(a)), dict) and str(found.get("id")) == wanted
        ]
        rows = select_in(conn, "SELECT seq FROM events WHERE author IN ({})", authors)
    elif kind == "memory":
        return _memory_events(conn, str(value["text"]))
    else:
        raise ErasureError(f"unknown scope {kind!r}")
    return sorted(int(seq) for (seq,) in rows)


def _memory_events(conn: sqlite3.Connection, text: str) -> list[int]:
    """Every memory write of each entry whose current or past text contains ``text``."""
    try:
        entries = {
            int(entry)
            for (entry,) in conn.execute(
                "SELECT entry FROM memory_history WHERE entry IS NOT NULL AND"
                " (instr(before, ?1) > 0 OR instr(after, ?1) > 0)",
                (text,),
            )
        }
    except sqlite3.OperationalError:  # no memory projection: read the log itself
        entries = set()
    seqs = {
        int(s)
        for (s,) in select_in(conn, "SELECT seq FROM memory_history WHERE entry IN ({})", entries)
    }
    for seq, parts in conn.execute("SELECT seq, parts FROM events WHERE type = 'memory_write'"):
        for digest in split_parts(parts):
            if any(text in t for t in texts(_body(conn, digest))):
                seqs.add(int(seq))
    return sorted(seqs)


def _quoting(conn: sqlite3.Connection, seqs: set[int], sessions: set[str]) -> set[int]:
    """Events that quote the covered ones through the sources they record, found in
    ``quoting`` (written by the append from the same bodies).

    A recall served names the events it showed (``sources``); a delegation names its
    child session, whose result is the peer's summary of it.
    """
    found: set[int] = set()
    for quoted in (*sorted(seqs), *sorted(sessions)):
        found.update(int(s) for (s,) in conn.execute(_QUOTED, (quoted,)))
    return found - seqs


_QUOTED = "SELECT seq FROM quoting WHERE quoted = ?"


def plan(store: EventStore, scope: Scope) -> Plan:
    """What forgetting ``scope`` erases, read inside the caller's transaction."""
    conn = store.conn
    result = Plan(events=_scope_events(conn, scope))
    covered = set(result.events)
    sessions = {
        str(s)
        for (s,) in select_in(
            conn, "SELECT DISTINCT session FROM events WHERE seq IN ({})", covered
        )
    }
    if scope.kind != "session":
        sessions = set()  # a child session is forgotten only with its whole session
    quoters = _quoting(conn, covered, sessions)
    covered |= quoters
    author_scope = scope.kind == "author"
    bodies: set[bytes] = set()
    read: dict[int, set[bytes]] = {}  # the parts of the events read so far, by seq
    for seq, kind, payload, parts, author in select_in(
        conn, "SELECT seq, type, payload, parts, author FROM events WHERE seq IN ({})", covered
    ):
        read[int(seq)] = set(split_parts(parts))
        if kind == "recall_served" and int(seq) in quoters:
            # what it showed goes (its result, and every echo of it: FORMAT.md 13.4); its
            # query is the later user's own words, erased only with its own event
            result.digests.update(split_parts(parts)[1:])
            continue
        result.digests.update(read[int(seq)])
        if kind in BODY_TEXT_TYPES:  # the host's own text is in the body: it goes whole
            bodies.add(bytes(payload))
        if author is not None and author_scope:
            result.digests.add(bytes(author))
    everything = bool(scope.value.get("shared"))  # every namer of an erased payload is needed
    said = result.digests
    if not everything:  # a text events outside the scope still name is kept: so are its quotes
        first, outside = _naming(conn, said, read, covered, every=False)
        said = said - outside - {d for s, named in first.items() if s not in covered for d in named}
    quoted = {  # the texts said (parts), not the bodies' metadata such as session ids
        t for d in said for t in texts(_body(conn, d)) if len(t) >= QUOTE_MIN_CHARS
    }
    needles = {q.encode() for q in quoted} | {json.dumps(q)[1:-1].encode() for q in quoted}
    swept = _sweep(conn, store.key, quoted, needles, result.digests, read)
    result.digests = {d for d in result.digests | swept | bodies if _body(conn, d) is not None}
    naming, outside = _naming(conn, swept, read, covered, every=True)
    if outside:  # the namers of a swept text go with it, and one is not indexed
        naming = _merged(naming, _scan_naming(conn, swept))
    covered |= set(naming)  # an event naming a swept text goes with it
    more, outside = _naming(conn, result.digests - bodies - swept, read, covered, every=everything)
    naming = _merged(naming, more)
    if outside and everything:  # erased though shared: every namer is touched
        naming, outside = _merged(naming, _scan_naming(conn, outside)), set()
    # a payload an event outside the scope still names (the same text said elsewhere) is
    # that event's too: kept, unless the scope says to erase it anyway ("shared")
    shared = {d for seq, named in naming.items() if seq not in covered for d in named}
    shared |= outside  # stored by an event outside the scope
    if scope.value.get("shared"):
        result.dangling = shared
    else:
        result.digests -= shared
        result.kept_shared = len(shared)
    result.touched = {seq for seq, named in naming.items() if named & result.digests} | covered
    result.held = [
        (hold, hit) for hold in holds(store) if (hit := _held_by(conn, hold, result.touched))
    ]
    return result


def _sweep(
    conn: sqlite3.Connection,
    key: bytes,
    quoted: set[str],
    needles: set[bytes],
    erased: set[bytes],
    read: dict[int, set[bytes]],
) -> set[bytes]:
    """The parts of quoting events holding an erased text verbatim (they go with it).

    The candidates come from ``quoting``: the events one of whose texts is an erased text
    (a checkpoint's evidence, a memory entry, a recall's query), then, for each event found
    quoting, the events that name it as a source (a recall that showed that checkpoint);
    each candidate's parts are searched for every erased text. Never every quoting event.
    """
    swept: set[bytes] = set()
    pending: set[int] = set()
    for text in quoted:
        pending.update(int(s) for (s,) in conn.execute(_QUOTED, (quote_key(key, text),)))
    searched: set[int] = set()
    while pending:
        seq = pending.pop()
        searched.add(seq)
        row = conn.execute(_QUOTING_PARTS, (seq,)).fetchone()
        if row is None or row[0] not in QUOTING_TYPES:
            continue
        read.setdefault(seq, set(split_parts(row[1])))
        hit = False
        for digest in split_parts(row[1]):
            if digest in erased or digest in swept:
                continue
            data = (conn.execute(_BODY, (digest,)).fetchone() or (None,))[0]
            if data is not None and any(n in bytes(data) for n in needles):
                swept.add(digest)
                hit = True
        if hit:  # who showed this event may have quoted the text from it
            pending.update(s for s in _quoting(conn, {seq}, set()) if s not in searched)
    return swept


_QUOTING_OF = (
    "SELECT seq, parts FROM events WHERE seq IN ({}) AND type IN ("
    + ", ".join(f"'{t}'" for t in sorted(QUOTING_TYPES))
    + ")"
)
_QUOTING_PARTS = "SELECT type, parts FROM events WHERE seq = ?"
_BODY = "SELECT body FROM payloads WHERE digest = ?"


def _naming(
    conn: sqlite3.Connection,
    digests: set[bytes],
    read: dict[int, set[bytes]],
    covered: set[int],
    *,
    every: bool,
) -> tuple[dict[int, set[bytes]], set[bytes]]:
    """Which events name ``digests`` (in their parts or as author), found through indexes,
    and the digests also named by an event the indexes cannot name.

    ``read`` holds the parts of the events already read. ``part_reuse`` lists every event
    naming a part that an earlier event stored; the one that stored it is not listed, so a
    digest no read event names unlisted was stored by an event not read: outside ``covered``
    (returned, for the caller to keep it, or to read every event). Unless ``every``, a
    digest's list stops at its first namer outside ``covered``, which is enough to keep it:
    a text said in every session costs one row, not one per session.
    """
    naming: dict[int, set[bytes]] = {}
    holders: dict[bytes, set[int]] = {}
    for seq, named in read.items():
        for digest in named & digests:
            naming.setdefault(seq, set()).add(digest)
            holders.setdefault(digest, set()).add(seq)
    outside: set[bytes] = set()
    for digest in digests:
        authored = [int(s) for (s,) in conn.execute(_AUTHORED, (digest,))]
        for seq in authored:
            naming.setdefault(seq, set()).add(digest)
        reusers = set()
        for (seq,) in conn.execute(_REUSED, (digest,)):
            reusers.add(int(seq))
            naming.setdefault(int(seq), set()).add(digest)
            if not every and seq not in covered:
                break
        if not authored and not holders.get(digest, set()) - reusers:
            outside.add(digest)
    return naming, outside


_AUTHORED = "SELECT seq FROM events WHERE author = ?"
_REUSED = "SELECT seq FROM part_reuse WHERE digest = ? ORDER BY seq"


def _merged(naming: dict[int, set[bytes]], more: dict[int, set[bytes]]) -> dict[int, set[bytes]]:
    for seq, named in more.items():
        naming.setdefault(seq, set()).update(named)
    return naming


def _scan_naming(conn: sqlite3.Connection, digests: set[bytes]) -> dict[int, set[bytes]]:
    """Every event naming one of ``digests`` in its parts, read from the whole log (only
    when one was stored by an event outside the scope and all its namers are wanted)."""
    naming: dict[int, set[bytes]] = {}
    for seq, parts in conn.execute("SELECT seq, parts FROM events"):
        named = digests.intersection(split_parts(parts))
        if named:
            naming[int(seq)] = named
    return naming


# -- holds and retention ----------------------------------------------------------------


def holds(store: EventStore) -> list[dict[str, Any]]:
    """Legal holds in force: each ``legal_hold`` event not followed by its release."""
    active: dict[str, dict[str, Any]] = {}
    for seq, kind, payload in store.conn.execute(
        "SELECT seq, type, payload FROM events"
        " WHERE type IN ('legal_hold', 'legal_hold_released') ORDER BY seq"
    ):
        body = _body(store.conn, bytes(payload))
        if not isinstance(body, dict):
            continue
        if kind == "legal_hold":
            active[str(body["hold"])] = {**body, "seq": int(seq)}
        else:
            active.pop(str(body["hold"]), None)
    return list(active.values())


def _held_by(conn: sqlite3.Connection, hold: dict[str, Any], seqs: set[int]) -> list[int]:
    selector = hold.get("selector") or {}
    hit = []
    for seq, time, session, author in select_in(
        conn, "SELECT seq, time, session, author FROM events WHERE seq IN ({})", seqs
    ):
        by_session = "session" in selector and session == selector["session"]
        by_time = "since" in selector and selector["since"] <= time <= selector["until"]
        if by_session or by_time:
            hit.append(int(seq))
        elif "author" in selector and author is not None:
            found = _body(conn, bytes(author))
            if isinstance(found, dict) and str(found.get("id")) == str(selector["author"]):
                hit.append(int(seq))
    return sorted(hit)


def add_hold(store: EventStore, selector: dict[str, Any], reason: str, who: str) -> str:
    """Record a legal hold; returns its id (``H`` and the seq it gets)."""
    hold = f"H{store.head().seq + 1}"
    body = {"hold": hold, "selector": selector, "reason": reason, "who": who}
    store.append([NewEvent("legal_hold", "archive", {"hold": hold}, body)], durable=True)
    return hold


def release_hold(store: EventStore, hold: str, reason: str, who: str) -> int:
    if hold not in {h["hold"] for h in holds(store)}:
        raise ErasureError(f"no legal hold {hold} is in force (hermes-archive hold list)")
    body = {"hold": hold, "reason": reason, "who": who}
    result = store.append(
        [NewEvent("legal_hold_released", "archive", {"hold": hold}, body)], durable=True
    )
    return result[0].seq


def retention_policy(store: EventStore) -> dict[str, Any] | None:
    """The newest ``retention_policy`` event's body (None: keep forever)."""
    row = store.conn.execute(
        "SELECT payload FROM events WHERE type = 'retention_policy' ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    body = _body(store.conn, bytes(row[0])) if row else None
    return body if isinstance(body, dict) else None


def check_retention_days(days: int | None) -> None:
    """Refuse a period :func:`retention_cutoff` could not compute (before year 1)."""
    if days is not None and not 1 <= days <= MAX_RETENTION_DAYS:
        raise ErasureError(
            f"retention of {days} days is outside 1 to {MAX_RETENTION_DAYS} (1,000 years): "
            "use --keep to keep forever"
        )


def set_retention(
    store: EventStore, days: int | None, reason: str, who: str, *, confirmed: bool
) -> int:
    """Record a retention policy; a shorter one than in force needs ``confirmed``."""
    check_retention_days(days)
    current = retention_policy(store)
    old = current.get("days") if current else None
    shorter = days is not None and (old is None or days < old)
    if shorter and not confirmed:
        raise ErasureError(
            f"retention of {days} days is shorter than the policy in force "
            f"({'keep forever' if old is None else f'{old} days'}): it erases data; confirm it"
        )
    at = now_text()
    body = {"days": days, "reason": reason, "who": who, "confirmed": bool(confirmed)}
    return store.append([NewEvent("retention_policy", "archive", {"at": at}, body)], durable=True)[
        0
    ].seq


def retention_cutoff(store: EventStore, now: str) -> str | None:
    """The time before which events expire under the policy in force (None: keep)."""
    from datetime import timedelta

    from ..domain.clock import format_time, parse_time

    policy = retention_policy(store)
    days = policy.get("days") if policy else None
    if not isinstance(days, int) or isinstance(days, bool):
        return None
    try:
        return format_time(parse_time(now) - timedelta(days=days))
    except (OverflowError, ValueError):  # a policy recorded before the bound: before year 1
        return None  # nothing is that old


def apply_retention(
    store: EventStore,
    *,
    dry_run: bool = False,
    batch: int = RETENTION_BATCH,
    who: str = "retention",
    between: Callable[[], bool] = lambda: True,
) -> list[Receipt]:
    """Erase what the retention policy says has expired, ``batch`` events per transaction.

    Held data is skipped, not refused: retention is a policy, a hold an exception to it.
    ``between`` runs after each batch (the background worker pauses there, so a running
    writer waits for at most one batch); False stops early, the rest is left for next time.
    A pass that ends merges the full-text index once (:func:`merge_index`), also when it
    finds a merge owed by an earlier pass cut short.
    """
    now = now_text()
    cutoff = retention_cutoff(store, now)
    done: list[Receipt] = []
    after = 0
    stopped = False
    projections: list[Any] | None = None  # the pass's setup, made before its first batch
    while cutoff is not None:
        expired = store.conn.execute(
            "SELECT seq FROM events WHERE seq > ? AND time < ? ORDER BY seq", (after, cutoff)
        )
        seqs = list(islice((int(s) for (s,) in expired if _erasable(store.conn, int(s))), batch))
        expired.close()  # read no further: an open statement would hold the WAL checkpoint
        if not seqs:
            break
        scope = Scope(
            "time", {"since": "", "before": cutoff, "from_seq": seqs[0], "to_seq": seqs[-1]}
        )
        if projections is None:
            projections = _prepared(store)
        receipt = _forget(
            store,
            projections,
            scope,
            reason="retention",
            legal_basis="retention policy",
            who=who,
            dry_run=dry_run,
            skip_held=True,
            merge=False,
        )
        done.append(receipt)
        if dry_run:
            break
        if not between():
            stopped = True
            break
        after = seqs[-1]  # a batch all held erases nothing: the next one goes on after it
    if not dry_run and not stopped:
        merge_index(store)
    return done


def merge_index(store: EventStore) -> bool:
    """Merge the full-text indexes when an erasure has not had them merged since (a
    retention pass merges once at its end, not per batch); True when it did.

    Until then an erased row's tokens are out of every search and of ``fts5vocab`` but
    still in an older segment's bytes. A pass cut short (the worker stopping, a crash)
    leaves the merge to the next pass, which finds it owed here.
    """
    conn = store.conn
    last = conn.execute("SELECT max(seq) FROM events WHERE type = 'erasure'").fetchone()[0]
    row = conn.execute("SELECT value FROM meta WHERE name = ?", (FTS_MERGED,)).fetchone()
    if last is None or (row is not None and int(row[0]) >= int(last)):
        return False
    _secure(store)  # the merge frees the old segments' pages
    with store.transaction(durable=True):
        _merge_fts(conn, int(last))
    scrub(store)
    return True


class RetentionWorker:
    """Applies the retention policy in the background: once at start, then every interval.

    Its own connection, one bounded batch per transaction and a pause between batches, so a
    turn or a checkpoint on the provider's writer waits for one batch at most (each batch's
    cost is bounded by :data:`RETENTION_BATCH` events, not by the archive's size). It never
    rebuilds a projection: that would hold the write lock for the whole log while the writer
    waits out its busy timeout. Its first pass waits for ``ready`` (the writer's proven open,
    which rebuilds what a release changed), and a pass that finds a projection to rebuild
    leaves it to the writer. The provider starts it with the host's thread factory; nothing
    in it raises into the host.
    """

    def __init__(
        self,
        folder: Path,
        projections: Callable[[sqlite3.Connection], Any],
        thread_factory: Callable[..., threading.Thread],
        *,
        interval_s: float = 86400.0,
        pause_s: float = 0.5,
        batch: int = RETENTION_BATCH,
        ready: threading.Event | None = None,
    ) -> None:
        self.folder, self.projections, self.ready = folder, projections, ready
        self.interval_s, self.pause_s, self.batch = interval_s, pause_s, batch
        self._stop = threading.Event()
        self.passes = 0  # completed passes (status and tests read it)
        self.passed = threading.Event()  # set after each pass
        self._thread = thread_factory(self._run, name="archive-retention", daemon=True)

    def start(self) -> RetentionWorker:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while self.ready is not None and not self.ready.wait(READY_POLL_S):
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # never into the host: logged, retried next interval
                log.warning("archive: retention not applied this time: %s", exc)
            self.passes += 1
            self.passed.set()
            self._stop.wait(self.interval_s)

    def run_once(self) -> list[Receipt]:
        if not (self.folder / DB_NAME).exists():
            return []  # a new profile: the writer is still making it, and nothing has expired
        looked = EventStore.open(self.folder, create=False, readonly=True)
        try:  # before opening for writing: nothing to do, or a rebuild that is the writer's
            if retention_policy(looked) is None:
                return []
            rebuild = to_rebuild(looked.conn, self.projections(looked.conn))
        finally:
            looked.close()
        if rebuild:
            log.info("archive: retention waits for the writer to rebuild %s", ", ".join(rebuild))
            return []
        store = EventStore.open(self.folder, create=False, projections=self.projections)
        try:
            return apply_retention(
                store, batch=self.batch, between=lambda: not self._stop.wait(self.pause_s)
            )
        finally:
            store.close()


def _erasable(conn: sqlite3.Connection, seq: int) -> bool:
    row = conn.execute("SELECT type, parts FROM events WHERE seq = ?", (seq,)).fetchone()
    if row is None or row[0] in RECORD_TYPES:
        return False
    return any(_body(conn, d) is not None for d in split_parts(row[1]))


# -- the erasure transaction ------------------------------------------------------------


def forget(
    store: EventStore,
    scope: Scope,
    *,
    reason: str,
    legal_basis: str = "",
    who: str = "operator",
    dry_run: bool = False,
    skip_held: bool = False,
    merge: bool = True,
    pending_spill: bool = False,
) -> Receipt:
    """Erase what ``scope`` covers in one transaction; see the module docstring.

    The same transaction has every projection forget the erased texts in place, so the
    projections equal a replay (``verify --projections``) the moment it commits.
    ``merge`` False leaves the full-text merge to :func:`merge_index` (retention batches:
    the merge costs the whole index, a batch only what it erases). A dry run beside a
    ``pending_spill`` (not taken in: the real run takes it in first) cannot tell a scope
    that names nothing from one only the spill holds, so it refuses neither.
    """
    projections = _prepared(store)
    if not (dry_run and pending_spill):
        _require_present(store.conn, scope)
    return _forget(
        store,
        projections,
        scope,
        reason=reason,
        legal_basis=legal_basis,
        who=who,
        dry_run=dry_run,
        skip_held=skip_held,
        merge=merge,
    )


def _require_present(conn: sqlite3.Connection, scope: Scope) -> None:
    """Refuse a session or event scope that names nothing in the log (a typo must not read
    as "already erased"). An erased session or event is still in the log: it passes."""
    value = scope.value
    if scope.kind == "session":
        found = conn.execute(
            "SELECT 1 FROM events WHERE session = ? LIMIT 1", (value["session"],)
        ).fetchone()
        if found is None:
            raise NotInArchive(f"no session {value['session']} in this archive: nothing erased")
    elif scope.kind == "event" and "seq" in value:
        found = conn.execute("SELECT 1 FROM events WHERE seq = ?", (value["seq"],)).fetchone()
        if found is None:
            raise NotInArchive(f"no event at seq {value['seq']} in this archive: nothing erased")
    elif scope.kind == "event":
        prefix = str(value["digest"]).upper()
        found = conn.execute(
            "SELECT 1 FROM events WHERE substr(hex(payload), 1, ?) = ?"
            " OR substr(hex(identity), 1, ?) = ? LIMIT 1",
            (len(prefix), prefix, len(prefix), prefix),
        ).fetchone()
        if found is None:
            raise NotInArchive(
                f"no event with an identity or payload digest starting {value['digest']} in "
                "this archive: nothing erased"
            )


def scope_text(scope: dict[str, Any]) -> str:
    """An erasure's scope as a person reads it (never a Python repr)."""
    kind = scope.get("kind")
    shared = " (shared texts too)" if scope.get("shared") else ""
    if kind == "session":
        said = f"session {scope.get('session')}"
    elif kind == "event" and "seq" in scope:
        said = f"event seq {scope['seq']}"
    elif kind == "event":
        said = f"events with digest {scope.get('digest')}…"
    elif kind == "time" and "until" in scope:
        said = f"events from {scope.get('since')} to {scope['until']} (inclusive)"
    elif kind == "time":
        since = scope.get("since") or "the start"
        said = f"events from {since} to before {scope.get('before')}"
        if "from_seq" in scope:
            said += f", seq {scope['from_seq']} to {scope.get('to_seq')}"
    elif kind == "author":
        authors = scope.get("authors")
        said = (
            f"turns of {len(authors)} author payload(s)"
            if isinstance(authors, list)
            else f"turns of author {scope.get('author')}"
        )
    elif kind == "memory":
        writes = scope.get("writes")
        said = (
            "memory writes at seq " + ", ".join(str(w) for w in writes)
            if isinstance(writes, list)
            else "the memory entry holding the given text, every version"
        )
    else:
        said = str(kind)
    return said + shared


#: retention's longest period: now minus this many days is a time at any date up to 9999
MAX_RETENTION_DAYS = 365_250


def erased_texts(store: EventStore, scope: Scope) -> list[str]:
    """The texts forgetting ``scope`` would erase (those of QUOTE_MIN_CHARS or more), read
    before it does: what ``forget`` looks for in the host's files (audit/host_copies.py)."""
    found = plan(store, scope)
    return sorted(
        {t for d in found.digests for t in texts(_body(store.conn, d)) if len(t) >= QUOTE_MIN_CHARS}
    )


def _secure(store: EventStore) -> None:
    """The store, with ``secure_delete`` on: SQLite then zeroes the bytes every row, index
    entry and merged segment of an erasure frees (the one place it is set)."""
    store.conn.execute("PRAGMA secure_delete = ON")


def _prepared(store: EventStore) -> list[Any]:
    """What every erasure needs first, once per ``forget`` or retention pass (not per
    batch): ``secure_delete`` on before any row of an erased text goes, the erasure
    indexes complete, and the projections that forget in place."""
    _secure(store)
    _index_reuse(store)
    return _projections(store)


def _forget(
    store: EventStore,
    projections: list[Any],
    scope: Scope,
    *,
    reason: str,
    legal_basis: str,
    who: str,
    dry_run: bool,
    skip_held: bool,
    merge: bool,
) -> Receipt:
    """:func:`forget` on a store :func:`_prepared` has readied."""
    conn = store.conn
    scope_record = scope.record()
    if dry_run:
        found = plan(store, scope)
        return _receipt(None, None, None, scope_record, reason, legal_basis, who, found, True)
    receipt: Receipt | None = None
    with store.transaction(durable=True):
        found = plan(store, scope)
        if found.held and not skip_held:
            hold, hit = found.held[0]
            raise Held(
                f"legal hold {hold['hold']} ({hold.get('reason', '')}) covers "
                f"{len(hit)} of these events (first seq {hit[0]}): release it first "
                "(hermes-archive hold release) or narrow the scope"
            )
        if skip_held and found.held:
            kept = {s for _, hit in found.held for s in hit}
            for parts, author in select_in(
                conn, "SELECT parts, author FROM events WHERE seq IN ({})", kept
            ):
                found.digests.difference_update(split_parts(parts))
                if author is not None:
                    found.digests.discard(bytes(author))
        if found.digests:
            at = store._time
            scope_record = _recorded(conn, scope, found)
            body = {
                "scope": scope_record,
                "reason": reason,
                "legal_basis": legal_basis,
                "who": who,
                "digests": sorted(d.hex() for d in found.digests),
                "payloads": len(found.digests),
                "events": len(found.touched),
                "dangling": sorted(d.hex() for d in found.dangling),
                "kept_shared": found.kept_shared,
            }
            event = NewEvent("erasure", "archive", {"at": at, "scope": scope_record}, body)
            seq = store.head().seq + 1  # the erasure event's: appended right after the tombstones
            touched = frozenset(found.touched)
            prepare_forgetting(conn, projections, touched)
            # the quoting events' text keys, read from their bodies before the bodies go
            for quoting, parts in select_in(conn, _QUOTING_OF, found.touched):
                unquote(conn, store.key, int(quoting), parts, found.digests)
            # Tombstones first: the event's own payload rows can split the leaf holding the
            # bodies, and a split copies its live cells, leaving their old images in the
            # page's unused area, which secure_delete never zeroes (docs/OPERATIONS.md).
            tombstone(conn, sorted(found.digests), seq)
            appended = store.append_in_transaction([event])[0].seq
            if appended != seq:  # the same scope erased at the same instant: rolled back
                raise ErasureError(f"an erasure of this scope at {at} is seq {appended}: retry")
            forget_erased(conn, projections, touched, seq)
            if merge:
                _merge_fts(conn, seq)
            receipt = _receipt(seq, None, at, scope_record, reason, legal_basis, who, found, False)
    scrub(store)
    if receipt is None:
        return _receipt(None, None, None, scope_record, reason, legal_basis, who, Plan(), False)
    return erasure_receipt(store, receipt.seq or 0)


def _projections(store: EventStore) -> list[Any]:
    """The store's projections, or the built-in ones the archive keeps (a store opened
    without any still has their tables, which hold the text)."""
    if store.projections:
        return list(store.projections)
    try:
        kept = {str(n) for (n,) in store.conn.execute("SELECT name FROM projection_state")}
    except sqlite3.OperationalError:  # no projection was ever created here
        return []
    return [p for p in default_projections(store.conn) if p.name in kept]


def _recorded(conn: sqlite3.Connection, scope: Scope, found: Plan) -> dict[str, Any]:
    """The scope as the erasure records it: never the personal data it was selected by.

    A memory scope's search text and an author's id are themselves the data being erased:
    the record names the memory writes (seqs) and the author payloads (digests) instead.
    """
    if scope.kind == "memory":
        return {"kind": "memory", "writes": found.events}
    if scope.kind == "author":
        authors = {
            bytes(a).hex()
            for (a,) in select_in(conn, "SELECT author FROM events WHERE seq IN ({})", found.events)
            if a is not None
        }
        return {"kind": "author", "authors": sorted(authors)}
    return scope.record()


def _receipt(
    seq: int | None,
    chain: str | None,
    time: str | None,
    scope: dict[str, Any],
    reason: str,
    legal_basis: str,
    who: str,
    found: Plan,
    dry_run: bool,
) -> Receipt:
    return Receipt(
        seq,
        chain,
        time,
        scope,
        reason,
        legal_basis,
        who,
        len(found.digests),
        len(found.touched),
        None,
        dry_run,
        [{"hold": h["hold"], "reason": h.get("reason"), "events": len(s)} for h, s in found.held],
        found.kept_shared,
    )


def _merge_fts(conn: sqlite3.Connection, through: int) -> None:
    """Merge every full-text index into one segment, dropping deleted rows' tokens, and
    record that the erasures up to seq ``through`` are merged.

    SQLite 3.40 has no FTS5 ``secure-delete``: a DELETE only adds a tombstone to a newer
    segment, and the tokens stay in the old one until the segments are merged. 'optimize'
    merges them all into one, which keeps no deleted token (docs/OPERATIONS.md).
    """
    for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%USING fts5(%'"
    ).fetchall():
        conn.execute(f'INSERT INTO "{name}"("{name}") VALUES (\'optimize\')')
    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (FTS_MERGED, str(through)))


def _index_reuse(store: EventStore) -> None:
    """Index what ``part_reuse`` and ``quoting`` are owed (once, for an archive made before
    them), in steps of their own transactions, so a running writer waits for one step at
    most."""
    steps: tuple[tuple[str, Callable[[sqlite3.Connection, int, int], int]], ...] = (
        (PART_REUSE_FROM, index_part_reuse),  # first: index_quoting reads part_reuse
        (QUOTING_FROM, lambda conn, after, upto: index_quoting(conn, store.key, after, upto)),
    )
    for owed, step in steps:
        upto = index_owed(store.conn, owed, store.head().seq)
        done = 0
        while done < upto:
            with store.transaction():
                done = step(store.conn, done, upto)


def scrub(store: EventStore) -> None:
    """Make the freed bytes physically gone: the WAL checkpointed into the file and truncated.

    With ``secure_delete`` the pages the erasure freed were zeroed; the old page images
    still in the WAL go with the truncate. A busy reader can hold the checkpoint back: it is
    retried on the next erasure or ``forget`` re-run (idempotent).
    """
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()


# -- receipts ---------------------------------------------------------------------------


def erasure_receipt(store: EventStore, seq: int) -> Receipt:
    """The receipt of the erasure event at ``seq``, with the checkpoint that includes it."""
    row = store.conn.execute(
        "SELECT time, payload, chain FROM events WHERE seq = ? AND type = 'erasure'", (seq,)
    ).fetchone()
    if row is None:
        raise ErasureError(f"seq {seq} is not an erasure event")
    body = _body(store.conn, bytes(row[1])) or {}
    size = store.conn.execute(
        "SELECT min(size) FROM signed_checkpoints WHERE size >= ?", (seq,)
    ).fetchone()[0]
    note = store.checkpoint_note(int(size)) if size is not None else None
    return Receipt(
        seq,
        bytes(row[2]).hex(),
        str(row[0]),
        body.get("scope", {}),
        str(body.get("reason", "")),
        str(body.get("legal_basis", "")),
        str(body.get("who", "")),
        int(body.get("payloads", 0)),
        int(body.get("events", 0)),
        note.decode() if note else None,
        kept_shared=int(body.get("kept_shared", 0)),
    )


def receipts(store: EventStore) -> list[Receipt]:
    """Every erasure's receipt, oldest first (``hermes-archive erasures``)."""
    seqs = [
        int(s)
        for (s,) in store.conn.execute("SELECT seq FROM events WHERE type = 'erasure' ORDER BY seq")
    ]
    return [erasure_receipt(store, s) for s in seqs]


def erased_slot(conn: sqlite3.Connection, digest: str) -> str | None:
    """ "erased at T by seq E: reason" for an erased payload, or None when it is not erased."""
    try:
        raw = bytes.fromhex(digest)
        row = conn.execute(
            "SELECT x.erasure_seq, e.time, e.payload FROM erased x"
            " JOIN events e ON e.seq = x.erasure_seq WHERE x.digest = ?",
            (raw,),
        ).fetchone()
    except (ValueError, sqlite3.OperationalError):
        return None
    if row is None:
        return None
    body = _body(conn, bytes(row[2])) or {}
    return f"erased at {row[1]} by seq {row[0]}: {body.get('reason', '')}"
