"""Pieces of the store: schema, key files, part resolution, the kept tree edge, erasure indexes.

docs/FORMAT.md sections 10, 12.3, 14.3, 15 and 17, used by
:class:`archive_provider.storage.store.EventStore`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blake3 import blake3

from ..errors import ArchiveError
from ..format import merkle
from ..format.canonical import canonical_bytes
from ..format.digests_v2 import lookup, new_salt, payload_digest
from ..format.events import Hasher, Part
from ..format.signed_note import NoteError, Signer
from .outside import SIGNING_KEY_ENV, InsideProfile, outside_value
from .safe_files import UnsafeFile, read_small

STORE_KEY_NAME = "store.key"
SIGNING_KEY_NAME = "signing.key"
#: a new archive is made whole in ``<archive>/.making-<random>/`` and then placed beside it
MAKING_PREFIX = ".making-"
#: a commit at least this long after the previous checkpoint signs one (FORMAT.md 15.4)
CHECKPOINT_INTERVAL_S = 5.0
#: how many committed tree roots a store remembers for the serve-time proof (FORMAT.md 20.5)
COMMITTED_ROOTS_KEPT = 1024

#: which events name a part an earlier event stored (FORMAT.md 17): an erasure finds every
#: event naming a payload from here, never by reading every event's parts
PART_REUSE_SCHEMA = """CREATE TABLE IF NOT EXISTS part_reuse (
    digest BLOB    NOT NULL,
    seq    INTEGER NOT NULL,
    PRIMARY KEY (digest, seq)
) WITHOUT ROWID"""

#: what each quoting event may quote (FORMAT.md 17): a source seq it showed (INTEGER), a
#: child session (TEXT), or the keyed 8-byte hash of a text of its parts (BLOB); an erasure
#: finds the events quoting an erased text from here, never by reading every one
QUOTING_SCHEMA = """CREATE TABLE IF NOT EXISTS quoting (
    quoted  NOT NULL,
    seq     INTEGER NOT NULL,
    PRIMARY KEY (quoted, seq)
) WITHOUT ROWID"""

#: the inner row of each full leaf tile (FORMAT.md 14.5): derived from ``tiles``, outside
#: every digest, read by the serve-time proof only after it hashes up to the tile's entry
#: in level 1; a missing row costs that proof the whole tile's hashing, nothing else
TILE_INNER_SCHEMA = """CREATE TABLE IF NOT EXISTS tile_inner (
    idx    INTEGER PRIMARY KEY,
    hashes BLOB NOT NULL
)"""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    time     TEXT NOT NULL,
    type     TEXT NOT NULL,
    session  TEXT NOT NULL,
    key      TEXT NOT NULL,
    identity BLOB NOT NULL UNIQUE,
    payload  BLOB NOT NULL,
    parts    BLOB NOT NULL,
    author   BLOB,
    chain    BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_session ON events(session, seq);
CREATE INDEX IF NOT EXISTS events_type ON events(type, seq);
CREATE INDEX IF NOT EXISTS events_time ON events(time);
CREATE INDEX IF NOT EXISTS events_author ON events(author, seq) WHERE author IS NOT NULL;
-- a rowid table: rows in append order keep their pages full (FORMAT.md 17)
CREATE TABLE IF NOT EXISTS payloads (
    digest BLOB PRIMARY KEY,
    salt   BLOB,
    lookup BLOB,
    body   BLOB
);
CREATE UNIQUE INDEX IF NOT EXISTS payloads_lookup ON payloads(lookup) WHERE lookup IS NOT NULL;
CREATE TABLE IF NOT EXISTS erased (
    digest      BLOB PRIMARY KEY,
    erasure_seq INTEGER NOT NULL
) WITHOUT ROWID;
{PART_REUSE_SCHEMA};
{QUOTING_SCHEMA};
{TILE_INNER_SCHEMA};
CREATE TABLE IF NOT EXISTS tiles (
    level  INTEGER NOT NULL,
    idx    INTEGER NOT NULL,
    hashes BLOB    NOT NULL,
    PRIMARY KEY (level, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS signed_checkpoints (
    size      INTEGER PRIMARY KEY,
    root      BLOB    NOT NULL,
    time      TEXT    NOT NULL,
    signature BLOB    NOT NULL
);
CREATE TABLE IF NOT EXISTS cosignatures (
    size      INTEGER NOT NULL,
    name      TEXT    NOT NULL,
    key_id    BLOB    NOT NULL,
    timestamp INTEGER NOT NULL,
    signature BLOB    NOT NULL,
    PRIMARY KEY (size, name, key_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS head (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    seq   INTEGER NOT NULL,
    chain BLOB    NOT NULL,
    root  BLOB    NOT NULL
);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS payloads_no_delete BEFORE DELETE ON payloads
BEGIN SELECT RAISE(ABORT, 'payloads are kept; an erasure leaves a tombstone'); END;
CREATE TRIGGER IF NOT EXISTS payloads_erase_only BEFORE UPDATE ON payloads
WHEN NOT (NEW.digest = OLD.digest AND NEW.salt IS NULL AND NEW.lookup IS NULL
          AND NEW.body IS NULL
          AND EXISTS (SELECT 1 FROM erased WHERE erased.digest = OLD.digest))
BEGIN SELECT RAISE(ABORT, 'a payload changes only by being erased'); END;
CREATE TRIGGER IF NOT EXISTS erased_no_change BEFORE UPDATE ON erased
BEGIN SELECT RAISE(ABORT, 'erasures are final'); END;
CREATE TRIGGER IF NOT EXISTS erased_no_delete BEFORE DELETE ON erased
BEGIN SELECT RAISE(ABORT, 'erasures are final'); END;
CREATE TRIGGER IF NOT EXISTS tiles_grow_only BEFORE UPDATE ON tiles
WHEN NOT (NEW.level = OLD.level AND NEW.idx = OLD.idx AND length(OLD.hashes) < 8192
          AND length(NEW.hashes) > length(OLD.hashes) AND length(NEW.hashes) <= 8192
          AND substr(NEW.hashes, 1, length(OLD.hashes)) = OLD.hashes)
BEGIN SELECT RAISE(ABORT, 'a tile only grows, and a full tile never changes'); END;
CREATE TRIGGER IF NOT EXISTS tiles_no_delete BEFORE DELETE ON tiles
BEGIN SELECT RAISE(ABORT, 'tiles are append-only'); END;
CREATE TRIGGER IF NOT EXISTS signed_checkpoints_no_update BEFORE UPDATE ON signed_checkpoints
BEGIN SELECT RAISE(ABORT, 'signed checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS signed_checkpoints_no_delete BEFORE DELETE ON signed_checkpoints
BEGIN SELECT RAISE(ABORT, 'signed checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS cosignatures_no_update BEFORE UPDATE ON cosignatures
BEGIN SELECT RAISE(ABORT, 'cosignatures are append-only'); END;
CREATE TRIGGER IF NOT EXISTS cosignatures_no_delete BEFORE DELETE ON cosignatures
BEGIN SELECT RAISE(ABORT, 'cosignatures are append-only'); END;
CREATE VIEW IF NOT EXISTS events_v AS
  SELECT seq, time, type, session, key, lower(hex(identity)) AS identity,
         lower(hex(payload)) AS payload, lower(hex(parts)) AS parts,
         lower(hex(author)) AS author, lower(hex(chain)) AS chain FROM events;
CREATE VIEW IF NOT EXISTS payloads_v AS
  SELECT lower(hex(digest)) AS digest, lower(hex(salt)) AS salt,
         CAST(body AS TEXT) AS body, body IS NULL AS erased FROM payloads;
CREATE VIEW IF NOT EXISTS bodies_v AS
  SELECT e.seq, e.time, e.type, e.session, CAST(p.body AS TEXT) AS body
  FROM events e JOIN payloads p ON p.digest = e.payload
"""


class KeyFileError(ArchiveError):
    """A key file (store.key, the signing key) cannot be used; the message names it."""


class TamperedPart(ArchiveError):
    """A stored part found by its lookup is not the bytes, or not under the digest, it claims."""


def signing_key_path(folder: Path) -> Path:
    """Where this archive's signing key lives: outside the profile when ``SIGNING_KEY_ENV``
    (FORMAT.md 10) says so. :class:`KeyFileError` when the variable comes from inside the
    profile (``folder``'s parent): its ``.env`` sets it, or it points into the profile.

    An archive being made (in its :data:`MAKING_PREFIX` folder) keeps its key there until
    the whole archive is placed (``store.make_archive``).
    """
    if folder.name.startswith(MAKING_PREFIX):
        return folder / SIGNING_KEY_NAME
    try:
        named = outside_value(SIGNING_KEY_ENV, folder.parent)
    except InsideProfile as exc:
        raise KeyFileError(str(exc)) from None
    return Path(named) if named else folder / SIGNING_KEY_NAME


def write_private(path: Path, text: str) -> None:
    """Create ``path`` 0600 with ``text`` (never over an existing file), fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def read_signer(path: Path, origin: str) -> Signer:
    """The store's Ed25519 signing key, in Go's note private-key form, named by ``origin``."""
    try:
        text = read_small(path, 4096).decode("ascii")
        signer = Signer.from_private_key(text)
    except FileNotFoundError:
        raise KeyFileError(
            f"the signing key {path} is missing; restore it from your backup (or point "
            f"{SIGNING_KEY_ENV} at it). Without it no checkpoint can be signed."
        ) from None
    except UnsafeFile as exc:
        raise KeyFileError(f"the signing key {path} cannot be used: {exc.strerror}") from None
    except (UnicodeDecodeError, NoteError) as exc:
        raise KeyFileError(f"the signing key {path} is not a note private key: {exc}") from None
    if signer.name != origin:
        raise KeyFileError(
            f"the signing key {path} is for {signer.name}, not for this archive ({origin})"
        )
    return signer


def make_signer(path: Path, origin: str) -> Signer:
    """A new signing key for ``origin``, written to ``path`` (0600, never overwritten)."""
    signer = Signer.generate(origin)
    write_private(path, signer.private_key + "\n")
    return signer


class PartHasher(Hasher):
    """Names parts for the store: the digest of a body already stored, or a fresh salt.

    Used inside the append transaction on the writer's thread (FORMAT.md 12.3): a stored
    body is found by its keyed lookup and checked byte for byte; a new one gets a random salt
    that :meth:`resolve` inserts with the event. Two parts of the same new text in one
    transaction share the salt drawn first (``pending``).
    """

    def __init__(self, key: bytes, conn: sqlite3.Connection) -> None:
        super().__init__(key)
        self._conn = conn
        self.pending: dict[bytes, Part] = {}

    def part(self, value: Any) -> Part:
        return self.named(canonical_bytes(value))

    def named(self, body: bytes) -> Part:
        """The part for these canonical bytes: stored, pending, or new with a fresh salt."""
        found = lookup(self._key, body)
        stored = self._stored(found, body)
        if stored is not None:
            return Part(stored.hex(), body)
        pending = self.pending.get(found)
        if pending is None:
            salt = new_salt()
            pending = Part(payload_digest(salt, body).hex(), body, salt, found)
            self.pending[found] = pending
        return pending

    def digest(self, body: bytes) -> str:
        """A keyed, deterministic digest of ``body`` (for identity keys that name a list)."""
        return blake3(b"hermes-archive/v2/key-digest\x00" + body, key=self._key).hexdigest()

    def resolve(self, part: Part) -> tuple[Part, bool]:
        """The part as this transaction stores it (``salt`` set means: insert it now), and
        whether it is *fresh*: a part :meth:`named` drew a salt for in this transaction and
        no event has stored since (it is still ``pending``).

        A fresh part was not stored then and is not now: it is not looked up again (one
        probe per new part, not two), and its digest is named by no event yet.
        """
        if part.lookup is not None and self.pending.get(part.lookup) is part:
            return part, True
        found = part.lookup or lookup(self._key, part.body)
        stored = self._stored(found, part.body)
        if stored is not None:
            return Part(stored.hex(), part.body), False
        if part.salt is not None:
            return part, False
        return self.named(part.body), False

    def _stored(self, found: bytes, body: bytes) -> bytes | None:
        row = self._conn.execute(
            "SELECT digest, salt, body FROM payloads WHERE lookup = ?", (found,)
        ).fetchone()
        if row is None:
            return None
        digest, salt, stored = row
        if (
            not isinstance(stored, bytes)
            or stored != body
            or not isinstance(salt, bytes)
            or payload_digest(salt, stored) != digest
        ):
            shown = digest.hex() if isinstance(digest, bytes) else repr(digest)
            raise TamperedPart(
                f"the payload stored under {shown} is not the bytes its lookup and digest "
                "name (the row was edited after it was written)"
            )
        return bytes(digest)


@dataclass
class TreeEdge:
    """The tiles' right edge and compact range kept between commits (FORMAT.md 14.3)."""

    size: int = 0
    edge: dict[int, bytes] = field(default_factory=dict)
    compact: list[bytes] = field(default_factory=list)

    @classmethod
    def read(cls, size: int, read_tile: Callable[[int, int], bytes | None]) -> TreeEdge:
        edge = merkle.read_edge(size, read_tile)
        appender = merkle.TileAppender(size, edge)
        return cls(size, edge, appender.compact())

    def appender(self) -> merkle.TileAppender:
        return merkle.TileAppender(self.size, self.edge, self.compact)


#: the ``meta`` row naming the last seq whose parts ``part_reuse`` does not index yet: events
#: appended before the table existed (FORMAT.md 17); absent means every event so far
PART_REUSE_FROM = "part_reuse_from"


def split_parts(blob: bytes | None) -> list[bytes]:
    """The 32-byte digests of a ``parts`` column, in order."""
    data = bytes(blob or b"")
    return [data[i : i + 32] for i in range(0, len(data), 32)]


def fill_tile_inner(conn: sqlite3.Connection) -> int:
    """Write the inner row of every full leaf tile that has none (an archive made before
    ``tile_inner`` existed); inside the caller's write transaction. Returns rows written."""
    written, after = 0, -1
    while True:
        batch = conn.execute(
            "SELECT idx, hashes FROM tiles WHERE level = 0 AND idx > ? AND length(hashes) = ?"
            " AND idx NOT IN (SELECT idx FROM tile_inner) ORDER BY idx LIMIT 256",
            (after, merkle.FULL_TILE_BYTES),
        ).fetchall()
        if not batch:
            return written
        conn.executemany(
            "INSERT INTO tile_inner (idx, hashes) VALUES (?, ?)",
            [(index, merkle.inner_row(bytes(hashes))) for index, hashes in batch],
        )
        written += len(batch)
        after = int(batch[-1][0])


#: events a step of :func:`index_part_reuse` reads in one write transaction
PART_REUSE_STEP = 20000


def index_owed(conn: sqlite3.Connection, owed: str, head: int) -> int:
    """The last seq an erasure index does not list yet (0: it is complete); ``owed`` is its
    ``meta`` row (:data:`PART_REUSE_FROM` or :data:`QUOTING_FROM`).

    ``part_reuse`` holds a row per event naming a part an earlier event stored (the event
    that stored it has none), ``quoting`` what each quoting event may quote; the append
    writes both, so only an archive made before a table existed, or a copy laid out from
    central rows (no ``meta`` row), is owed any.
    """
    row = conn.execute("SELECT value FROM meta WHERE name = ?", (owed,)).fetchone()
    return head if row is None else int(row[0])


def index_part_reuse(conn: sqlite3.Connection, after: int, upto: int) -> int:
    """One step of indexing the owed events: those after ``after`` (0: the first step) up
    to ``upto``, at most :data:`PART_REUSE_STEP`; returns the last seq read. Inside the
    caller's write transaction; the step reaching ``upto`` marks the table complete.

    The digests seen so far are kept in a temporary table of this connection between steps
    (rolled back with a step that fails); a new pass starts from the first event again.
    Every row a step writes is true whatever happens later, so a pass cut short only costs
    the next one its time.
    """
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS part_seen (digest BLOB PRIMARY KEY)")
    if after == 0:
        conn.execute("DELETE FROM temp.part_seen")
    last = after
    for seq, parts in conn.execute(
        "SELECT seq, parts FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        (after, upto, PART_REUSE_STEP),
    ).fetchall():
        for digest in dict.fromkeys(split_parts(parts)):
            seen = conn.execute("INSERT OR IGNORE INTO temp.part_seen VALUES (?)", (digest,))
            if seen.rowcount == 0:
                conn.execute("INSERT OR IGNORE INTO part_reuse VALUES (?, ?)", (digest, seq))
        last = int(seq)
    if last >= upto or last == after:
        conn.execute("DELETE FROM temp.part_seen")
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, '0')", (PART_REUSE_FROM,))
        return upto
    return last


#: events whose parts may quote other events' text: ``quoting`` lists what each may quote
QUOTING_TYPES = frozenset(
    {
        "recall_served",
        "delegation",
        "tool_call",
        "checkpoint",
        "memory_write",
        "peer_summary_updated",
        "peer_message_sent",
        "peer_message_received",
    }
)
#: a text shorter than this is neither listed in ``quoting`` nor searched for (too common)
QUOTE_MIN_CHARS = 12
#: the ``meta`` row naming the last seq ``quoting`` does not index yet (as PART_REUSE_FROM)
QUOTING_FROM = "quoting_from"
#: quoting events a step of :func:`index_quoting` reads in one write transaction
QUOTING_STEP = 5000
_QUOTE_DOMAIN = b"hermes-archive/v2/quote\x00"


def texts(value: Any) -> Iterator[str]:
    """Every text inside a decoded payload (message contents, memory texts, results)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from texts(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from texts(item)


def decoded(body: bytes | None) -> Any:
    """A payload body as JSON, or None (erased, or not JSON)."""
    if body is None:
        return None
    try:
        return json.loads(bytes(body))
    except ValueError:
        return None


def quote_key(store_key: bytes, text: str) -> bytes:
    """The ``quoting`` key of a text: keyed (a row left behind confirms no guess without the
    store key) and deleted with the last part holding the text, like a part's lookup."""
    return blake3(_QUOTE_DOMAIN + text.encode("utf-8", "surrogatepass"), key=store_key).digest(8)


def quote_keys(store_key: bytes, bodies: Iterable[bytes | None]) -> set[bytes]:
    """The text keys of these part bodies: one per text of at least QUOTE_MIN_CHARS."""
    return {
        quote_key(store_key, t)
        for body in bodies
        for t in texts(decoded(body))
        if len(t) >= QUOTE_MIN_CHARS
    }


def quoted_by(
    store_key: bytes, event_type: str, body: Any, part_bodies: Iterable[bytes | None]
) -> set[int | str | bytes]:
    """What an event of ``event_type`` may quote: the ``quoting`` keys of its rows.

    ``part_bodies`` are the parts the event stores (not those an earlier event stored, which
    ``part_reuse`` lists it for): a text is keyed once, by the event whose part holds it, and
    an erasure finds every other event naming that part through ``part_reuse``."""
    if event_type not in QUOTING_TYPES:
        return set()
    found: set[int | str | bytes] = set(quote_keys(store_key, part_bodies))
    if isinstance(body, Mapping):
        sources = body.get("sources")
        if isinstance(sources, list):
            found.update(s for s in sources if isinstance(s, int) and not isinstance(s, bool))
        child = body.get("child_session")
        if isinstance(child, str) and child:
            found.add(child)
    return found


def index_quoting(conn: sqlite3.Connection, store_key: bytes, after: int, upto: int) -> int:
    """One step of indexing the owed quoting events after ``after`` up to ``upto``, at most
    :data:`QUOTING_STEP`; returns the last seq read (``upto`` once complete). Inside the
    caller's write transaction; every row it writes is true, so a pass cut short only costs
    the next one its time."""
    marks = ", ".join("?" * len(QUOTING_TYPES))
    rows = conn.execute(
        f"SELECT seq, type, payload, parts FROM events WHERE type IN ({marks})"
        " AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        (*sorted(QUOTING_TYPES), after, upto, QUOTING_STEP),
    ).fetchall()
    for seq, kind, payload, parts in rows:  # after part_reuse is complete: a reuse has a row
        bodies = [
            _stored_body(conn, d)
            for d in split_parts(parts)
            if conn.execute(_REUSE_ROW, (d, seq)).fetchone() is None
        ]
        for quoted in quoted_by(store_key, kind, decoded(_stored_body(conn, payload)), bodies):
            conn.execute("INSERT OR IGNORE INTO quoting VALUES (?, ?)", (quoted, seq))
    if len(rows) < QUOTING_STEP or int(rows[-1][0]) >= upto:
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, '0')", (QUOTING_FROM,))
        return upto
    return int(rows[-1][0])


_REUSE_ROW = "SELECT 1 FROM part_reuse WHERE digest = ? AND seq = ?"


def unquote(
    conn: sqlite3.Connection, store_key: bytes, seq: int, parts: bytes | None, gone: set[bytes]
) -> None:
    """Delete the text keys of event ``seq`` (whose ``parts`` column the caller read) that
    only its parts in ``gone`` held (they are being erased): no key of an erased text stays
    behind."""
    named = split_parts(parts)
    kept = quote_keys(store_key, (_stored_body(conn, d) for d in named if d not in gone))
    for key in quote_keys(store_key, (_stored_body(conn, d) for d in named if d in gone)) - kept:
        conn.execute("DELETE FROM quoting WHERE quoted = ? AND seq = ?", (key, seq))


def _stored_body(conn: sqlite3.Connection, digest: bytes) -> bytes | None:
    row = conn.execute("SELECT body FROM payloads WHERE digest = ?", (bytes(digest),)).fetchone()
    return bytes(row[0]) if row and row[0] is not None else None


def tombstone(conn: sqlite3.Connection, digests: list[bytes], erasure_seq: int) -> int:
    """Erase payloads inside the caller's transaction (FORMAT.md 12.4 steps 2 and 3).

    Each digest goes into ``erased`` first (the trigger then allows the update), then its
    salt, lookup and body become NULL. The caller has set ``secure_delete`` (the erasure
    does, before any row of the erased text goes), so SQLite zeroes the freed bytes.
    Returns how many rows were tombstoned; a digest already erased is left as it is.
    """
    done = 0
    for digest in digests:
        row = conn.execute("SELECT body FROM payloads WHERE digest = ?", (digest,)).fetchone()
        if row is None or row[0] is None:
            continue
        conn.execute("INSERT OR IGNORE INTO erased VALUES (?, ?)", (digest, erasure_seq))
        conn.execute(
            "UPDATE payloads SET salt = NULL, lookup = NULL, body = NULL WHERE digest = ?",
            (digest,),
        )
        done += 1
    return done


def served_results(conn: sqlite3.Connection, session: str) -> Iterator[tuple[int, str]]:
    """(seq, result text) of each ``recall_served`` of ``session``, newest first, read from the
    log as it is consumed (FORMAT.md 13.4: the recalls a turn's messages may echo). An
    erased result is skipped: its text is gone, so nothing can be cut for it."""
    rows = conn.execute(
        "SELECT seq, parts FROM events WHERE session = ? AND type = 'recall_served'"
        " ORDER BY seq DESC",
        (session,),
    )
    try:
        for seq, parts in rows:
            named = split_parts(parts)
            result = decoded(_stored_body(conn, named[1])) if len(named) > 1 else None
            if isinstance(result, str):
                yield int(seq), result
    finally:
        rows.close()
