"""``migrate``: a v1 archive becomes a new v2 archive; the v1 file is kept (FORMAT.md 19).

Nothing is rewritten in place. The v1 file is verified, renamed ``events.v1.db`` (with its
key ``payload.v1.key``) and never written again; a new v2 ``events.db`` gets a new store id,
lookup key and signing key, and its first event, ``migrated_from``, records the v1 head
just verified and the v1 file's BLAKE3. v1 event ``s`` becomes v2 event ``s + 1`` with the
same time, type and session; each part is stored again under a fresh salt, and in the key
and body every text equal to a v1 digest of one of the event's parts is that part's v2
digest (the writer's renaming, :meth:`EventStore.append_in_transaction`).

The spill (FORMAT.md, "Spill file") is carried over: the ``migrate`` command takes it in
first, and whatever still waits (a segment whose removal failed after its commit) is taken
in by the v2 writer, exactly once, because the ``spill_taken:*`` rows that say how far
each segment is in are copied into the v2 ``meta``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from blake3 import blake3

from ..format.canonical import decode
from ..format.digests import Envelope, genesis_chain
from ..format.events import LoadedEvent, NewEvent, Part
from ..format.verifier import schema_problem, verify_database
from .checkpoint_proof import advance
from .safe_files import sync_dir
from .spill import META_TAKEN, in_use, segment_paths
from .store import (
    DB_NAME,
    KEY_NAME,
    V1_DB_NAME,
    EventStore,
    Head,
    PayloadMissing,
    Projection,
    StoreError,
    connect,
    iter_events,
    read_key,
    rename_digests,
)
from .witness import Witness

V1_KEY_NAME = "payload.v1.key"
#: events per v2 transaction at most (a v1 transaction's events share a time and stay together)
BATCH_EVENTS = 2000


class MigrationRefused(StoreError):
    """The archive cannot be migrated as it is; the message says why and what to do."""


@dataclass(frozen=True)
class Migrated:
    """What ``migrate`` did: the v1 head it verified and the new v2 store."""

    v1_store_id: str
    v1_head_seq: int
    v1_head_chain: str
    store_id: str
    vkey: str
    events: int


def file_blake3(path: Path) -> str:
    digest = blake3()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def v1_events(
    conn: sqlite3.Connection, after_seq: int = 0, until_seq: int | None = None
) -> Iterator[LoadedEvent]:
    """The events of a v1 log on ``conn`` in sequence order, with their payload and parts'
    bodies (FORMAT.md Part I: digests and part lists are hex text), streamed.

    The one reader of v1 events in the product. Two statements walk ``events`` by rowid
    side by side: one yields each event with its payload, the other each part
    (``json_each`` over the envelope's part list, in list order) with its body.
    """
    where = " WHERE e.seq > ?" + (" AND e.seq <= ?" if until_seq is not None else "")
    args = [after_seq] if until_seq is None else [after_seq, until_seq]
    events = conn.execute(
        "SELECT e.seq, e.time, e.type, e.session, e.key, e.identity, e.payload, e.parts,"
        " e.chain, p.body FROM events e LEFT JOIN payloads p ON p.digest = e.payload"
        f"{where} ORDER BY e.seq",
        args,
    )
    parts = conn.execute(
        "SELECT e.seq, j.value, q.body FROM events e JOIN json_each(e.parts) j"
        f" JOIN payloads q ON q.digest = j.value{where} AND e.parts != '[]' ORDER BY e.seq",
        args,
    )
    part = next(parts, None)
    for seq, time, type_, session, key, identity, payload, part_list, chain, body in events:
        if body is None:
            raise PayloadMissing(f"v1 event {seq}: its payload {payload} is missing")
        carried: dict[str, bytes] = {}
        while part is not None and part[0] <= seq:
            if part[0] == seq:
                carried[part[1]] = part[2]
            part = next(parts, None)
        envelope = Envelope(
            int(seq),
            str(time),
            str(type_),
            str(session),
            str(key),
            str(identity),
            str(payload),
            str(part_list),
        )
        yield LoadedEvent(envelope, str(chain), bytes(body), carried)


def open_v1(folder: Path) -> tuple[sqlite3.Connection, bytes, str]:
    """The v1 archive in ``folder``, read-only: its connection, payload key and store id.

    The one reader of a v1 archive in the product (the provider and the other commands
    refuse one); an archive that is format v2 already is refused: nothing to migrate.
    """
    db_path = folder / DB_NAME
    if not db_path.exists():
        raise StoreError(f"no archive at {db_path}")
    conn = connect(db_path, readonly=True)
    try:
        problem = schema_problem(conn)
        if problem:
            raise StoreError(f"cannot open {db_path}: {problem}")
        meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        version = meta.get("format_version")
        if version != "1":
            raise MigrationRefused(
                f"the archive at {folder} is already format version 2"
                if version == "2"
                else f"the archive at {folder} has format version {version}: not a v1 archive"
            )
        return conn, read_key(folder / KEY_NAME), str(meta["store_id"])
    except BaseException:
        conn.close()
        raise


def migrate(
    folder: Path,
    *,
    projections: Callable[[sqlite3.Connection], Sequence[Projection]] | None = None,
    progress: Callable[[int], None] | None = None,
    witness: Witness | None = None,
) -> Migrated:
    """Migrate the v1 archive in ``folder`` (``<home>/archive``) to format v2.

    With the profile's ``witness`` (the command passes it) the v1 head must be the one it
    witnessed, if it has a record here (a rolled-back v1 log is not migrated), and the new store is recorded with it
    once its last checkpoint is signed (FORMAT.md 19 step 4): without that record the
    witness would still name the v1 store at this path and refuse the v2 archive as a
    replacement.
    """
    folder = Path(folder)
    if (folder / V1_DB_NAME).exists():
        raise MigrationRefused(
            f"{folder / V1_DB_NAME} exists: this archive was migrated before (or a migration "
            "stopped half-way); move that file aside before migrating again"
        )
    live = [p.name for p in segment_paths(folder) if in_use(p)]
    if live:
        raise MigrationRefused(
            f"a running Hermes process is writing the spill of {folder} ({', '.join(live)}): "
            "stop Hermes and migrate again"
        )
    old, v1_key, v1_store_id = open_v1(folder)  # verifying writes nothing
    try:
        report = verify_database(old, v1_key, progress=progress)
        if not report.ok:
            raise MigrationRefused(
                f"the v1 archive at {folder} does not verify (seq {report.first_bad_seq}: "
                f"{report.problem}); it is not migrated. Restore it from backup first "
                "(docs/RECOVER.md)."
            )
        if witness is not None and witness.read() is not None:
            # the head this machine witnessed must be there: a rolled-back or replaced v1
            # log is not migrated (raises WitnessMismatch). A copy with no witness record
            # here (moved from another machine) is migrated, as FORMAT.md 19 describes
            witness.check(old, v1_store_id)
        row = old.execute("SELECT seq, chain FROM head WHERE id = 1").fetchone()
        head = Head(*row) if row else Head(0, genesis_chain(v1_store_id))
        v1_payloads = old.execute("SELECT count(*) FROM payloads").fetchone()[0]
        taken = old.execute(
            "SELECT name, value FROM meta WHERE substr(name, 1, ?) = ?",
            (len(META_TAKEN), META_TAKEN),
        ).fetchall()
    finally:
        old.close()
    conn = sqlite3.connect(folder / DB_NAME, isolation_level=None)
    try:  # every commit into the file itself, so the renamed file alone holds the v1 log
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        moved = conn.execute("SELECT seq, chain FROM head WHERE id = 1").fetchone()
    finally:
        conn.close()
    if busy or (moved or (0, head.chain)) != (head.seq, head.chain):
        raise MigrationRefused(
            f"another connection holds or wrote the archive at {folder} while it was checked: "
            "stop Hermes (and any hermes-archive command) and migrate again"
        )
    os.rename(folder / DB_NAME, folder / V1_DB_NAME)
    os.rename(folder / KEY_NAME, folder / V1_KEY_NAME)
    for end in ("-wal", "-shm"):
        leftover = folder / (DB_NAME + end)
        if leftover.exists():
            leftover.unlink()  # the checkpoint emptied it: the v1 file holds every commit
    sync_dir(folder)
    v1_blake3 = file_blake3(folder / V1_DB_NAME)

    def migrated_from(store: EventStore) -> NewEvent:
        return NewEvent(
            "migrated_from",
            "archive",
            {"v1_store_id": v1_store_id},
            {
                "v1_store_id": v1_store_id,
                "v1_head_seq": head.seq,
                "v1_head_chain": head.chain,
                "v1_file": V1_DB_NAME,
                "v1_file_blake3": v1_blake3,
                "v1_events": head.seq,
                "v1_payloads": v1_payloads,
                "origin": store.origin,
                "vkey": store.vkey,
            },
        )

    new = EventStore.open(folder, first_event=migrated_from, projections=projections or ())
    try:
        # a multi-row INSERT inside a transaction of up to BATCH_EVENTS events keeps a
        # statement journal, spilled to a temporary file past 64 KiB; in memory it is freed
        # at each statement's end (measured: 64% fewer bytes written by a migrate)
        new.conn.execute("PRAGMA temp_store = MEMORY")
        new.conn.execute("INSERT INTO meta VALUES ('migrated_from', ?)", (v1_store_id,))
        # how far each waiting spill segment is in: its committed records are migrated
        new.conn.executemany("INSERT INTO meta VALUES (?, ?)", taken)
        source = sqlite3.connect(
            (folder / V1_DB_NAME).absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None
        )
        try:
            source.execute("BEGIN")
            for at, events in _by_time(v1_events(source)):
                with new.transaction():
                    results = new.append_in_transaction([_as_new(e) for e in events], time=at)
                for event, result in zip(events, results, strict=True):
                    if result.outcome != "appended" or result.seq != event.seq + 1:
                        raise MigrationRefused(
                            f"v1 event {event.seq} did not become v2 event {event.seq + 1} "
                            f"({result.outcome} at {result.seq}); the v1 file is kept as "
                            f"{V1_DB_NAME}"
                        )
                if progress:
                    progress(events[-1].seq)
            source.execute("COMMIT")
        finally:
            source.close()
        new.checkpoint()
        if witness is not None:
            advance(witness, new)
        return Migrated(v1_store_id, head.seq, head.chain, new.store_id, new.vkey, head.seq + 1)
    finally:
        new.close()


def _by_time(events: Iterator[LoadedEvent]) -> Iterator[tuple[str, list[LoadedEvent]]]:
    """Consecutive events that share a time (one v1 transaction), at most a batch each."""
    batch: list[LoadedEvent] = []
    for event in events:
        if batch and (event.time != batch[0].time or len(batch) >= BATCH_EVENTS):
            yield batch[0].time, batch
            batch = []
        batch.append(event)
    if batch:
        yield batch[0].time, batch


def _as_new(event: LoadedEvent) -> NewEvent:
    """The v1 event as the v2 writer takes it: parts named by their v1 digests (renamed)."""
    parts = []
    for digest in event.part_digests:
        body = event.parts.get(digest)
        if body is None:
            raise MigrationRefused(f"v1 event {event.seq}: part {digest} is missing")
        parts.append(Part(digest, body))
    return NewEvent(event.type, event.session, decode(event.envelope.key), event.body, tuple(parts))


@dataclass(frozen=True)
class Lineage:
    """The result of checking a migrated archive against its kept v1 file (FORMAT.md 19)."""

    ok: bool
    events: int  # v1 events matched
    problem: str | None = None
    v1_seq: int | None = None  # the first v1 event that does not match

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "events": self.events,
            "problem": self.problem,
            "v1_seq": self.v1_seq,
        }


def lineage(store: EventStore, v1_file: Path, v1_key: bytes) -> Lineage:
    """Check that ``store`` (v2) is the migration of ``v1_file`` (read-only).

    The v1 file must verify up to the head that ``migrated_from`` names (its chain value
    equal), and every v1 event ``s`` must be v2 event ``s + 1`` with the same time, type and
    session, and a key and body equal once the digests of its v1 parts are mapped to v2
    (the map is built from byte-equal part bodies, one event at a time: memory does not grow
    with the log).
    """
    first = store.event(1)
    if first is None or first.type != "migrated_from":
        return Lineage(False, 0, "this archive's first event is not migrated_from")
    claim = first.body
    source = sqlite3.connect(Path(v1_file).absolute().as_uri() + "?mode=ro", uri=True)
    try:
        report = verify_database(source, v1_key)
        if not report.ok:
            return Lineage(False, 0, f"the v1 file does not verify: {report.problem}")
        row = source.execute(
            "SELECT chain FROM events WHERE seq = ?", (claim["v1_head_seq"],)
        ).fetchone()
        if claim["v1_head_seq"] and (row is None or row[0] != claim["v1_head_chain"]):
            return Lineage(False, 0, "the v1 file does not hold the head migrated_from names")
        matched = 0
        new_events = iter_events(store.conn, 1, claim["v1_head_seq"] + 1, part_types=None)
        for old in v1_events(source, 0, claim["v1_head_seq"]):
            new = next(new_events, None)
            if new is None or new.seq != old.seq + 1:
                return Lineage(False, matched, "the v2 archive ends early", old.seq)
            same = (new.time, new.type, new.session) == (old.time, old.type, old.session)
            same = same and len(old.part_digests) == len(new.part_digests)
            # migrate renames only the digests of the event's own parts: so does the map
            mapping: dict[str, str] = {}
            for a, b in zip(old.part_digests, new.part_digests, strict=False):
                same = same and old.parts.get(a) == new.parts.get(b) is not None
                same = same and mapping.setdefault(a, b) == b
            if (
                not same
                or rename_digests(old.body, mapping) != new.body
                or rename_digests(decode(old.envelope.key), mapping) != decode(new.envelope.key)
            ):
                return Lineage(
                    False, matched, f"v1 event {old.seq} is not v2 event {new.seq}", old.seq
                )
            matched += 1
        return Lineage(True, matched)
    finally:
        source.close()
