"""The central PostgreSQL store: many archives in one schema, keyed by (store_id, seq).

The schema, roles and grants are in ``central.sql`` (shipped in the wheel): PostgreSQL itself
refuses updates, deletes, gaps and forks. It cannot compute BLAKE3, so this module's
:func:`verify_store` runs the package's own row checks (:func:`verifier.verify_rows`) over
the central rows: one implementation of the checks for a file and for the server.

Connections: a target is a libpq URL (``postgresql://…?sslmode=require``), a key=value
string, or a bare service name (``PGSERVICE``-style, from ``pg_service.conf``); it is passed
to libpq untouched, so ``PGPASSFILE``, ``PGSERVICEFILE``, ``PGSSLMODE`` and the rest keep
working. A target is never printed or logged as given: :func:`redacted` drops the password
and :func:`scrub` removes it from any message that might echo it.

psycopg 3 and its pool come with the ``fleet`` extra; they are imported only here and in
``ship.py``, so the rest of the package never needs them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..errors import ArchiveUnavailable
from ..format.verifier import Report, genesis, verify_rows

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
    return CentralError("the central store needs psycopg 3: pip install 'hermes-archive[fleet]'")


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
        return "(an unreadable connection string)"
    shown = [
        f"{name}={params[name]}"
        for name in ("service", "host", "port", "dbname", "user", "sslmode")
        if params.get(name)
    ]
    return " ".join(shown) or "(libpq defaults: PGHOST, PGSERVICE, …)"


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
    return resources.files("archive_provider.storage").joinpath("central.sql").read_text("utf-8")


def init(target: str) -> None:
    """Create (or bring up to date) the schema, roles and grants, in one transaction."""
    with connect(target) as conn:
        conn.execute(schema_sql())  # a trusted file of ours


# -- reading --------------------------------------------------------------------------------

_EVENT_COLUMNS = "seq, time, type, session, key, identity, payload, parts, chain"


@dataclass(frozen=True)
class StoreRow:
    store_id: str
    label: str
    key: bytes
    genesis: str


def stores(conn: psycopg.Connection[Any], store: str | None = None) -> list[StoreRow]:
    """The registered stores (``store``: an id or a prefix of at least 4 hex digits)."""
    sql = f"SELECT store_id, label, payload_key, genesis FROM {SCHEMA}.stores"
    args: list[Any] = []
    if store:
        sql += " WHERE store_id LIKE %s"
        args.append(store.lower().replace("%", "").replace("_", "") + "%")
    rows = conn.execute(sql + " ORDER BY store_id", args).fetchall()
    return [StoreRow(r[0], r[1], bytes.fromhex(r[2]), r[3]) for r in rows]


def summary(conn: psycopg.Connection[Any], store: str | None = None) -> list[dict[str, Any]]:
    """Per store: events, head, last event time, last shipped, payloads and erasures."""
    sql = f"""
        SELECT s.store_id, s.label, s.registered, s.shipper,
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
            "events": r[4] or 0,
            "head": {"seq": r[4] or 0, "chain": r[5]},
            "last_event_time": r[6],
            "last_shipped": r[7].isoformat() if r[7] else None,
            "payloads": r[8],
            "erased_payloads": r[9],
        }
        for r in rows
    ]


def _rows(
    conn: psycopg.Connection[Any], store_id: str, after: int = 0, until: int | None = None
) -> Iterator[tuple[Any, ...]]:
    """Event rows with prev_chain, streamed by a server-side cursor in seq order."""
    sql = (
        f"SELECT {_EVENT_COLUMNS}, prev_chain FROM {SCHEMA}.events "
        "WHERE store_id = %s AND seq > %s AND seq <= %s ORDER BY seq"
    )
    with conn.cursor(name="hermes_archive_rows") as cursor:
        cursor.itersize = 2000
        cursor.execute(sql, [store_id, after, until if until is not None else 2**63 - 1])
        yield from cursor


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
) -> Report:
    """The local verifier's checks over one store's central rows, in one snapshot.

    Besides :func:`verify_rows`: the registered genesis must be the store id's, and each
    row's ``prev_chain`` column must be the chain of the row before (the server checked it
    on insert; a superuser edit after that is caught here). Payloads blanked by an erasure
    are accepted only where the erasure event at ``erased_by`` (itself verified) lists them;
    events naming them are checked for identity and chain only, and a warning says so.
    """
    conn.rollback()  # a fresh transaction: one snapshot for the whole pass
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        if store.genesis != genesis(store.store_id):
            return Report().fail(None, "the registered genesis is not the store id's genesis")
        erased = dict(
            conn.execute(
                f"SELECT digest, erased_by FROM {SCHEMA}.payloads "
                "WHERE store_id = %s AND body IS NULL",
                [store.store_id],
            ).fetchall()
        )
        payload_of = payload_reader(conn, store.store_id)

        def rows() -> Iterator[Any]:
            previous = store.genesis
            for *row, prev_chain in _rows(conn, store.store_id):
                if prev_chain != previous:
                    raise ValueError("its prev_chain column is not the chain of the row before")
                previous = row[8]
                yield tuple(row)

        def payload_needed(row: Any) -> bool:
            return not erased or (
                row[6] not in erased and not set(json.loads(row[7])) & erased.keys()
            )

        report = verify_rows(
            rows(),
            store_id=store.store_id,
            key=store.key,
            payload_of=payload_of,
            head=None,
            progress=progress,
            payload_needed=payload_needed,
        )
        if report.ok and erased:
            problem = _erasure_problem(conn, store, erased)
            if problem:
                return report.fail(None, problem)
            report.warnings.append(
                f"{len(erased)} payloads were erased; {report.envelopes_only} events naming "
                "them were checked for identity and chain only"
            )
        return report
    finally:
        conn.rollback()


def _erasure_problem(
    conn: psycopg.Connection[Any], store: StoreRow, erased: dict[str, int]
) -> str | None:
    """Why an erased payload is not covered by the erasure event it names, if it is not.

    STUB until format v2 (issue 16) defines the erasure event: a body ``{"covers": [...]}``.
    """
    payload_of = payload_reader(conn, store.store_id)
    for digest, seq in sorted(erased.items()):
        row = conn.execute(
            f"SELECT type, payload FROM {SCHEMA}.events WHERE store_id = %s AND seq = %s",
            [store.store_id, seq],
        ).fetchone()
        body = payload_of(row[1]) if row and row[0] == "erasure" else None
        covers = json.loads(body).get("covers", []) if body else []
        if digest not in covers:
            return f"payload {digest} is blank but erasure event {seq} does not cover it"
    return None
