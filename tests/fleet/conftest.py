"""Fixtures for the fleet tests: one real PostgreSQL 15 server per session, a fresh central
database per test, and login roles in each of the central roles.

A server that cannot start makes the tests fail, never skip: the fleet is tested against
the real thing or not at all.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from archive_provider.fleet import central
from archive_provider.fleet.ship import Shipper, registration
from archive_provider.format.events import NewEvent
from archive_provider.storage.store import EventStore, archive_dir
from tests.fleet.pgserver import PgServer

PASSWORDS = {
    "ship_login": "ship-pw-7c1d",
    "ship_other": "other-pw-5a3e",
    "read_login": "read-pw-9e2a",
    "erase_login": "erase-pw-4b6f",
    "admin_login": "admin-pw-2d8c",
}
GROUPS = {
    "ship_login": "hermes_archive_shipper",
    "ship_other": "hermes_archive_shipper",
    "read_login": "hermes_archive_reader",
    "erase_login": "hermes_archive_eraser",
    "admin_login": "hermes_archive_admin",
}
_databases = itertools.count(1)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    try:
        server = PgServer()
        server.start()
    except Exception as exc:  # never skip: a fleet test without its server fails
        pytest.fail(f"the PostgreSQL test server did not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.cleanup()


@dataclass
class Central:
    server: PgServer
    dbname: str

    @property
    def admin(self) -> str:
        """Superuser over the trusted unix socket (for tampering and inspection)."""
        return self.server.superuser_dsn(self.dbname)

    def url(self, login: str = "ship_login", *, password: bool = True) -> str:
        return self.server.url(login, PASSWORDS[login] if password else None, self.dbname)

    def register(self, home: Path, login: str = "ship_login") -> str:
        """Register the archive of ``home`` to ``login``, as the administrator does before
        a store may ship (once: a registered store stays registered); its store id."""
        store = EventStore.open(archive_dir(home), create=False, readonly=True)
        try:
            found = registration(store)
        finally:
            store.close()
        if not self.query(
            "SELECT 1 FROM hermes_archive.stores WHERE store_id = %s", [found.store_id]
        ):
            central.register(self.url("admin_login"), found, login, f"test:{home.name}")
        return found.store_id

    def ship(self, home: Path) -> None:
        """Register the archive of ``home`` and ship all of it once, as its shipper does."""
        self.register(home)
        shipper = Shipper(archive_dir(home), self.url())
        try:
            shipper.ship_once()
        finally:
            shipper.close()

    def query(self, sql: str, args: list[object] | None = None) -> list[tuple[object, ...]]:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            cursor = conn.execute(sql, args)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []


@pytest.fixture
def central_db(pg: PgServer) -> Central:
    """A fresh database with the central schema, made by `central.init` as the superuser."""
    return make_central(pg)


def make_central(pg: PgServer, schema: str | None = None) -> Central:
    """A fresh central database on ``pg`` with its login roles (also the fault campaign's),
    made by `central.init`, or by the SQL text ``schema`` instead."""
    if not pg.running():  # a test that killed the server and failed before restarting it
        pg.start()
    dbname = f"fleet_{next(_databases)}"
    with psycopg.connect(pg.superuser_dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {dbname}")  # type: ignore[arg-type]
    if schema is None:
        central.init(pg.superuser_dsn(dbname))
    else:
        with psycopg.connect(pg.superuser_dsn(dbname)) as conn:
            conn.execute(schema)  # type: ignore[call-overload]
    with psycopg.connect(pg.superuser_dsn(dbname), autocommit=True) as conn:
        for login, group in GROUPS.items():
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [login]).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(
                f"{verb} ROLE {login} LOGIN PASSWORD '{PASSWORDS[login]}'"  # type: ignore[arg-type]
            )
            conn.execute(f"GRANT {group} TO {login}")  # type: ignore[arg-type]
    return Central(pg, dbname)


def make_archive(home: Path) -> EventStore:
    """A real local archive (writable store) under ``home``."""
    return EventStore.open(archive_dir(home))


def append_turns(store: EventStore, count: int, *, session: str = "s1", text: str = "note") -> None:
    """Append ``count`` turn events, each with one message part, one transaction each."""
    start = store.head().seq
    for n in range(start, start + count):
        message = store.hasher.part({"role": "user", "content": f"{text} {n} about tulips"})
        store.append(
            [
                NewEvent(
                    "turn",
                    session,
                    {"session": session, "turn": n},
                    {"turn": n, "messages": [message.digest]},
                    (message,),
                )
            ]
        )


def local_rows(home: Path) -> list[tuple[object, ...]]:
    """(seq, identity, chain) of every local event, in order, digests as hex in either format
    (none before the archive exists)."""
    if not (archive_dir(home) / "events.db").exists():
        return []
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    try:
        rows = conn.execute("SELECT seq, identity, chain FROM events ORDER BY seq").fetchall()
    except sqlite3.OperationalError:  # the writer made the file and not yet its tables
        return []
    finally:
        conn.close()
    return [tuple(v.hex() if isinstance(v, bytes) else v for v in row) for row in rows]


def central_rows(db: Central, store_id: str) -> list[tuple[object, ...]]:
    return db.query(
        "SELECT seq, identity, chain FROM hermes_archive.events WHERE store_id = %s ORDER BY seq",
        [store_id],
    )
