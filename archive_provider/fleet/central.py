"""The central PostgreSQL store: many format 2 archives in one schema, keyed by (store_id, seq).

The schema, roles and grants are in ``central.sql`` (shipped in the wheel): PostgreSQL itself
refuses updates, deletes, gaps and forks, recomputes the SHA-256 Merkle tree and refuses a
signed checkpoint whose root is not its own. It cannot compute BLAKE3 or check Ed25519, so
this module's :func:`verify_store` lays a store's rows out as a v2 SQLite archive in a
private temporary folder and runs :func:`verifier.verify_database_v2` (the standalone
verifier's full check, signatures included) over it, then checks each cosignature of a
known witness key. One implementation of the checks for a file and for the server.

Connections: a target is a libpq URL (``postgresql://…?sslmode=require``), a key=value
string, or a bare service name (``PGSERVICE``-style, from ``pg_service.conf``); it is passed
to libpq untouched, so ``PGPASSFILE``, ``PGSERVICEFILE``, ``PGSSLMODE`` and the rest keep
working. A target is never printed or logged as given: :func:`redacted` drops the password
and :func:`scrub` removes it from any message that might echo it.

psycopg 3 and its pool come with the ``fleet`` extra; they are imported only here and in
``ship.py``, so the rest of the package never needs them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ArchiveUnavailable
from ..format import digests_v2, merkle, signed_note
from ..format.verifier import ReportV2, envelope_bytes_v2, verify_database_v2
from ..storage.store_pieces import SCHEMA as ARCHIVE_SCHEMA

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

SCHEMA = "hermes_archive"
DEFAULT_STATEMENT_TIMEOUT_MS = 30_000
DEFAULT_CONNECT_TIMEOUT_S = 10
APPLICATION_NAME = "hermes-archive"
_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/?#@\s]*:)([^@\s]*)(@)")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


class CentralError(ArchiveUnavailable):
    """The central store cannot be used; the message never holds a password."""


def missing_extra() -> CentralError:
    return CentralError(f"the central store needs psycopg 3: {fleet_install_hint()}")


def fleet_install_hint() -> str:
    """The pip line that installs the ``fleet`` extra's packages, read from this package's
    own metadata (``hermes-archive[fleet]`` installs only once the package is published)."""
    from importlib import metadata

    try:
        required = metadata.requires("hermes-archive") or []
    except metadata.PackageNotFoundError:  # run from a source tree
        required = []
    fleet = sorted(r.split(";")[0].strip() for r in required if "extra == 'fleet'" in r)
    return "pip install " + " ".join(f"'{r}'" for r in fleet or ("psycopg[binary]", "psycopg-pool"))


#: the modules the ``fleet`` extra installs
FLEET_MODULES = ("psycopg", "psycopg_pool")


def fleet_missing() -> list[str]:
    """The ``fleet`` extra's modules this interpreter cannot import, found without importing
    them (cheap enough for ``is_available``)."""
    missing = []
    for name in FLEET_MODULES:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a parent that fails, a module without a spec
            found = None
        if found is None:
            missing.append(name)
    return missing


def conninfo(target: str) -> str:
    """The libpq connection string for a URL, a key=value string or a service name."""
    text = target.strip()
    if not text or "://" in text or "=" in text:
        return text
    return f"service={text}"


def _password(target: str) -> str | None:
    try:
        from psycopg.conninfo import conninfo_to_dict

        value = conninfo_to_dict(conninfo(target)).get("password")
    except Exception:
        return None
    return str(value) if value else None


def scrub(message: str, *targets: str) -> str:
    """``message`` with every password it might hold (from ``targets`` or in URL or
    key=value form) replaced by ``***``."""
    for target in targets:
        secret = _password(target)
        if secret:
            message = message.replace(secret, "***")
    message = _URL_PASSWORD.sub(r"\1***\3", message)
    return _KV_PASSWORD.sub(r"\1***", message)


def redacted(target: str) -> str:
    """What to show of a target: where it points, never its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(conninfo(target))
    except ImportError:
        return scrub(target)
    except Exception:
        return "an unreadable connection string"
    shown = [
        f"{name}={params[name]}"
        for name in ("service", "host", "port", "dbname", "user", "sslmode")
        if params.get(name)
    ]
    return " ".join(shown) or "libpq defaults: PGHOST, PGSERVICE, …"


def _connect_kwargs(target: str) -> dict[str, Any]:
    """Defaults the target did not set itself (a target's own settings always win)."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(conninfo(target))
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given:
        extra["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    if "application_name" not in given:
        extra["application_name"] = APPLICATION_NAME
    return extra


def checkout_timeout(target: str) -> float:
    """How long to wait for a pooled connection: twice the connect timeout the target allows."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(conninfo(target)).get("connect_timeout")
    try:
        seconds = int(str(given)) if given is not None else DEFAULT_CONNECT_TIMEOUT_S
    except ValueError:
        seconds = DEFAULT_CONNECT_TIMEOUT_S
    return 2.0 * max(1, seconds)


def _configure(statement_timeout_ms: int) -> Callable[[psycopg.Connection[Any]], None]:
    def configure(conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"SET statement_timeout = {int(statement_timeout_ms)}")
        conn.commit()

    return configure


def connect(
    target: str, *, statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
) -> psycopg.Connection[Any]:
    """One connection (for the reading commands), with a statement timeout."""
    try:
        import psycopg
    except ImportError:
        raise missing_extra() from None
    try:
        conn = psycopg.connect(conninfo(target), **_connect_kwargs(target))
        _configure(statement_timeout_ms)(conn)
    except psycopg.Error as exc:
        raise CentralError(
            f"cannot connect to the central store ({redacted(target)}): {scrub(str(exc), target)}"
        ) from None
    return conn


def pool(
    target: str,
    *,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
    max_size: int = 2,
) -> ConnectionPool:
    """A connection pool that reconnects by itself (checked on every checkout)."""
    try:
        from psycopg_pool import ConnectionPool
    except ImportError:
        raise missing_extra() from None
    made = ConnectionPool(
        conninfo(target),
        kwargs=_connect_kwargs(target),
        min_size=1,
        max_size=max_size,
        open=False,
        configure=_configure(statement_timeout_ms),
        check=ConnectionPool.check_connection,
        reconnect_timeout=60,
        timeout=checkout_timeout(target),
        name="hermes-archive-ship",
    )
    made.open(wait=False)
    return made


def schema_sql() -> str:
    return resources.files("archive_provider.fleet").joinpath("central.sql").read_text("utf-8")


def init(target: str) -> None:
    """Create (or bring up to date) the schema, roles and grants, in one transaction."""
    with connect(target) as conn:
        conn.execute(schema_sql())  # a trusted file of ours


@dataclass(frozen=True)
class Registration:
    """What the central store registers of an archive: its id, genesis and verifier key
    (``hermes_archive.head()`` reports the key's SHA-256)."""

    store_id: str
    genesis: str
    vkey: str


def register(target: str, found: Registration, shipper: str, label: str) -> None:
    """Register a store to the login role ``shipper`` (as an administrator: the server
    refuses anyone else, and a store id registered once stays registered)."""
    with connect(target) as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.stores (store_id, format_version, genesis, vkey, label, "
            "shipper) VALUES (%s, %s, %s, %s, %s, %s)",
            [found.store_id, digests_v2.FORMAT_VERSION, found.genesis, found.vkey, label, shipper],
        )


def release_hold(target: str, store_id: str, hold: str, reason: str) -> None:
    """Record that an administrator released the legal hold ``hold`` of ``store_id``: until
    then the server refuses an erasure of what it holds, whatever the shipped log says."""
    with connect(target) as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.hold_releases (store_id, hold, reason) VALUES (%s, %s, %s)",
            [store_id, hold, reason],
        )


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreRow:
    store_id: str
    label: str
    genesis: str
    vkey: str  # the verifier key registered with the store


def stores(conn: psycopg.Connection[Any], store: str | None = None) -> list[StoreRow]:
    """The registered stores (``store``: an id or a prefix of at least 4 hex digits)."""
    sql = f"SELECT store_id, label, genesis, vkey FROM {SCHEMA}.stores"
    args: list[Any] = []
    if store:
        sql += " WHERE store_id LIKE %s"
        args.append(store.lower().replace("%", "").replace("_", "") + "%")
    rows = conn.execute(sql + " ORDER BY store_id", args).fetchall()
    return [StoreRow(*r) for r in rows]


def summary(conn: psycopg.Connection[Any], store: str | None = None) -> list[dict[str, Any]]:
    """Per store: events, head, last event time, last shipped, payloads and erasures."""
    sql = f"""
        SELECT s.store_id, s.label, s.registered, s.shipper, s.format_version,
               h.seq, h.chain, h.time, h.shipped,
               (SELECT count(*) FROM {SCHEMA}.payloads p WHERE p.store_id = s.store_id),
               (SELECT count(*) FROM {SCHEMA}.payloads p
                 WHERE p.store_id = s.store_id AND p.body IS NULL)
          FROM {SCHEMA}.stores s
          LEFT JOIN LATERAL (
              SELECT e.seq, e.chain, e.time, e.shipped FROM {SCHEMA}.events e
               WHERE e.store_id = s.store_id ORDER BY e.seq DESC LIMIT 1) h ON true
         WHERE s.store_id LIKE %s ORDER BY s.store_id"""
    rows = conn.execute(sql, [(store or "").lower() + "%"]).fetchall()
    return [
        {
            "store_id": r[0],
            "label": r[1],
            "registered": r[2].isoformat(),
            "shipper": r[3],
            "format_version": r[4],
            "events": r[5] or 0,
            "head": {"seq": r[5] or 0, "chain": r[6]},
            "last_event_time": r[7],
            "last_shipped": r[8].isoformat() if r[8] else None,
            "payloads": r[9],
            "erased_payloads": r[10],
        }
        for r in rows
    ]


def payload_reader(conn: psycopg.Connection[Any], store_id: str) -> Callable[[str], bytes | None]:
    """``payload_of`` for the verifier and the renderers: a body by digest, None if absent
    or erased."""

    def payload_of(digest: str) -> bytes | None:
        row = conn.execute(
            f"SELECT body FROM {SCHEMA}.payloads WHERE store_id = %s AND digest = %s",
            [store_id, digest],
        ).fetchone()
        return bytes(row[0]) if row and row[0] is not None else None

    return payload_of


def verify_store(
    conn: psycopg.Connection[Any],
    store: StoreRow,
    progress: Callable[[int], None] | None = None,
    *,
    vkey: str | None = None,
    witness_keys: Sequence[str] = (),
) -> ReportV2:
    """The local verifier's checks over one store's central rows, in one snapshot.

    The rows go into a SQLite file in a private temporary folder (removed after), in the
    archive schema (:func:`lay_out_archive`), and the local verifier checks it. There are no central
    tiles: the ones written are those of the shipped envelopes, so the verifier's tile check
    holds by construction while its root, chain, identity, payload, erasure and signature
    checks run as on a local file. Besides that: the registered genesis must be the store
    id's and every ``prev_chain`` the chain of the row before. ``vkey`` pins the log key
    instead of the registered one; ``witness_keys`` adds cosigner keys to those the log's
    ``witness_added`` events name.
    """
    conn.rollback()  # a fresh transaction: one snapshot for the whole pass
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        with tempfile.TemporaryDirectory(prefix="hermes-archive-verify-") as folder:
            db = sqlite3.connect(Path(folder) / "central.db", isolation_level=None)
            try:
                problem = lay_out_archive(conn, store, db, progress)
                if problem is not None:
                    return ReportV2(store_id=store.store_id).fail(*problem)
                report = verify_database_v2(db, vkey or store.vkey)
                if report.ok:
                    _check_cosignatures(db, report, store.store_id, witness_keys)
                return report
            finally:
                db.close()
    finally:
        conn.rollback()


_EVENTS_SQL = (
    f"SELECT seq, time, type, session, key, identity, payload, parts, author, chain, prev_chain "
    f"FROM {SCHEMA}.events WHERE store_id = %s ORDER BY seq"
)


def lay_out_archive(
    conn: psycopg.Connection[Any],
    store: StoreRow,
    db: sqlite3.Connection,
    progress: Callable[[int], None] | None,
) -> tuple[int | None, str, str] | None:
    """Copy one store's central rows into ``db`` (in the caller's snapshot) as a v2 archive;
    a problem (seq, text, code) if they cannot be laid out as one.

    ``verify`` checks the copy; history, as-of, export and prove read it as they read a
    local archive (``commands/central_read.py``)."""
    db.executescript(ARCHIVE_SCHEMA)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [
            ("format_version", "2"),
            ("store_id", store.store_id),
            ("origin", digests_v2.origin(store.store_id)),
            ("vkey", store.vkey),
        ],
    )
    previous = store.genesis
    if previous != digests_v2.genesis(store.store_id).hex():
        return None, "the registered genesis is not the store id's genesis", "chain"
    tree = merkle.TileAppender()
    seq = 0
    with conn.cursor(name="hermes_archive_rows") as cursor:
        cursor.itersize = 2000
        cursor.execute(_EVENTS_SQL, [store.store_id])
        for seq, time, type_, session, key, identity, payload, parts, author, chain, prev in cursor:
            if prev != previous:
                return (
                    seq,
                    (f"seq {seq}: its prev_chain column is not the chain of the row before"),
                    "chain",
                )
            try:
                row = (
                    seq,
                    time,
                    type_,
                    session,
                    key,
                    bytes.fromhex(identity),
                    bytes.fromhex(payload),
                    digests_v2.parts_blob(parts),
                    None if author is None else bytes.fromhex(author),
                    bytes.fromhex(chain),
                )
            except ValueError:
                return seq, f"seq {seq}: a digest column has the wrong form", "malformed_row"
            db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            tree.append([merkle.leaf_hash(envelope_bytes_v2(*row[:9]))])
            previous = chain
            if progress and seq % 2000 == 0:
                progress(seq)
    for digest, salt, body, erased_by in conn.execute(
        f"SELECT digest, salt, body, erased_by FROM {SCHEMA}.payloads WHERE store_id = %s",
        [store.store_id],
    ):
        db.execute(
            "INSERT INTO payloads VALUES (?, ?, NULL, ?)",
            (bytes.fromhex(digest), salt, body),
        )
        if erased_by is not None:
            db.execute("INSERT INTO erased VALUES (?, ?)", (bytes.fromhex(digest), erased_by))
    db.executemany(
        "INSERT INTO tiles VALUES (?, ?, ?)",
        [(level, index, hashes) for (level, index), hashes in tree.changed().items()],
    )
    found = conn.execute(
        f"SELECT root FROM {SCHEMA}.trees WHERE store_id = %s", [store.store_id]
    ).fetchone()
    root = bytes(found[0]) if found else merkle.EMPTY_ROOT
    if seq:
        db.execute("INSERT INTO head VALUES (1, ?, ?, ?)", (seq, bytes.fromhex(previous), root))
    db.executemany(
        "INSERT INTO signed_checkpoints VALUES (?, ?, ?, ?)",
        conn.execute(
            f"SELECT size, root, time, signature FROM {SCHEMA}.checkpoints WHERE store_id = %s",
            [store.store_id],
        ).fetchall(),
    )
    db.executemany(
        "INSERT INTO cosignatures VALUES (?, ?, ?, ?, ?)",
        conn.execute(
            f"SELECT size, name, key_id, timestamp, signature FROM {SCHEMA}.cosignatures "
            "WHERE store_id = %s",
            [store.store_id],
        ).fetchall(),
    )
    db.execute("COMMIT")
    return None


def witness_keys(
    db: sqlite3.Connection, given: Sequence[str] = ()
) -> dict[tuple[str, int], signed_note.Verifier]:
    """Cosigner keys by (name, key id): those given, and every key a ``witness_added``
    event of the v2 log in ``db`` names (erased bodies and bad keys are skipped)."""
    keys: dict[tuple[str, int], signed_note.Verifier] = {}
    named = [
        json.loads(body).get("vkey")
        for (body,) in db.execute(
            "SELECT p.body FROM events e JOIN payloads p ON p.digest = e.payload "
            "WHERE e.type = 'witness_added' AND p.body IS NOT NULL"
        )
    ]
    for vkey in [*given, *named]:
        try:
            verifier = signed_note.Verifier.from_vkey(str(vkey))
        except signed_note.NoteError:
            continue
        keys[(verifier.name, verifier.key_id)] = verifier
    return keys


#: the cosignatures of a v2 log, each with the root of the checkpoint it cosigns
COSIGNATURES_SQL = (
    "SELECT c.size, c.name, c.key_id, c.timestamp, c.signature, s.root FROM cosignatures c "
    "JOIN signed_checkpoints s ON s.size = c.size"
)


def cosignature_verifies(
    keys: dict[tuple[str, int], signed_note.Verifier], origin: str, row: Sequence[Any]
) -> bool | None:
    """Whether a :data:`COSIGNATURES_SQL` row verifies with its witness's key; None when
    that key is not among ``keys``."""
    size, name, key_id, timestamp, signature, root = row
    known = keys.get((name, int.from_bytes(key_id, "big")))
    if known is None:
        return None
    text = signed_note.format_checkpoint(signed_note.Checkpoint(origin, size, bytes(root)))
    line = signed_note.Signature(
        name, known.key_id, int(timestamp).to_bytes(8, "big") + bytes(signature)
    )
    return bool(known.verify(text, line))


def _check_cosignatures(
    db: sqlite3.Connection, report: ReportV2, store_id: str, given: Sequence[str]
) -> None:
    """Each cosignature from a known witness key must verify (FORMAT.md 20.2 step 6).

    Known keys: those given, and every key a ``witness_added`` event of the log names. A
    cosignature from another key is counted and left unchecked (a warning says how many).
    """
    keys = witness_keys(db, given)
    origin = digests_v2.origin(store_id)
    newest = (report.checkpoint or {}).get("size")
    unchecked = 0
    for row in db.execute(COSIGNATURES_SQL + " ORDER BY c.size"):
        size, name = row[0], row[1]
        verified = cosignature_verifies(keys, origin, row)
        if verified is None:
            unchecked += 1
            continue
        if not verified:
            report.fail(
                None,
                f"the cosignature of {name} on the checkpoint at size {size} does not verify",
                "cosignature",
            )
            return
        if size == newest and report.checkpoint is not None:
            report.checkpoint["cosigned_by"].append(name)
    if unchecked:
        report.warnings.append(
            f"{unchecked} cosignatures are from witness keys neither given (--witness-key) "
            "nor named by the log; they were not checked"
        )
