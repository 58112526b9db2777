"""The central store holds format 2 archives only, and says so in its own schema.

PostgreSQL refuses a format 1 registration whoever writes it (the schema has no payload
key and no format but 2), and `central init` over a database made by the schema that
still took format 1 brings it to format 2 only, keeping its stores and their shipping, or
refuses it unchanged when it holds a format 1 store.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from archive_provider.cli import main
from archive_provider.fleet.ship import Shipper
from archive_provider.storage.store import archive_dir
from tests.fleet.conftest import Central, append_turns, central_rows, make_archive, make_central
from tests.fleet.pgserver import PgServer

pytestmark = pytest.mark.postgres

EARLIER_SCHEMA = (Path(__file__).parent / "data" / "central_with_format_1.sql").read_text("utf-8")
REGISTER = (
    "INSERT INTO hermes_archive.stores (store_id, format_version, genesis, {key}, shipper) "
    "VALUES (%s, %s, %s, %s, 'ship_login')"
)


def _register_as_admin(db: Central, sql: str, args: list[object]) -> None:
    with psycopg.connect(db.url("admin_login")) as conn:
        conn.execute(sql, args)


def _ship(db: Central, home: Path) -> int:
    shipper = Shipper(archive_dir(home), db.url())
    try:
        return shipper.ship_once()
    finally:
        shipper.close()


def _stores_columns(db: Central) -> list[str]:
    return [
        str(name)
        for (name,) in db.query(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'hermes_archive.stores'::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
    ]


def test_the_server_refuses_a_format_1_registration(central_db: Central) -> None:
    """An administrator's raw INSERT of a format 1 store (the shape the schema took before:
    format_version 1 with its payload key) is refused by PostgreSQL itself, and so is
    format 1 with a verifier key; format 2 is what the table holds."""
    store_id, genesis = "0" * 32, "11" * 32
    with pytest.raises(psycopg.errors.UndefinedColumn, match="payload_key"):
        _register_as_admin(
            central_db, REGISTER.format(key="payload_key"), [store_id, 1, genesis, "22" * 32]
        )
    for version in (1, 3):
        with pytest.raises(psycopg.errors.CheckViolation, match="stores_format_version_check"):
            _register_as_admin(
                central_db, REGISTER.format(key="vkey"), [store_id, version, genesis, "k+0+A"]
            )
    with pytest.raises(psycopg.errors.NotNullViolation, match="vkey"):
        _register_as_admin(
            central_db,
            "INSERT INTO hermes_archive.stores (store_id, format_version, genesis, shipper) "
            "VALUES (%s, 2, %s, 'ship_login')",
            [store_id, genesis],
        )
    assert central_db.query("SELECT count(*) FROM hermes_archive.stores") == [(0,)]
    _register_as_admin(central_db, REGISTER.format(key="vkey"), [store_id, 2, genesis, "k+0+A"])
    assert central_db.query("SELECT format_version FROM hermes_archive.stores") == [(2,)]


def test_init_brings_a_database_of_the_earlier_schema_to_format_2_only(
    tmp_path: Path, pg: PgServer, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_central(pg, EARLIER_SCHEMA)
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 3)
    store_id = store.store_id
    store.close()
    db.register(home)
    assert _ship(db, home) == 4
    assert "payload_key" in _stores_columns(db)

    assert main(["--db", db.admin, "central", "init"]) == 0
    capsys.readouterr()
    assert "payload_key" not in _stores_columns(db)
    assert db.query(
        "SELECT count(*) FROM pg_proc WHERE proname IN ('format_of', 'envelope_bytes') "
        "AND pronamespace = 'hermes_archive'::regnamespace"
    ) == [(1,)]  # envelope_bytes, without the format argument
    with pytest.raises(psycopg.errors.CheckViolation, match="stores_format_version_check"):
        _register_as_admin(db, REGISTER.format(key="vkey"), ["0" * 32, 1, "11" * 32, "k+0+A"])

    # the store shipped before goes on shipping, and verifies centrally
    store = make_archive(home)
    append_turns(store, 2)
    store.close()
    assert _ship(db, home) == 2 and len(central_rows(db, store_id)) == 6
    assert main(["--db", db.url("read_login"), "--json", "verify"]) == 0
    [result] = json.loads(capsys.readouterr().out)["stores"]
    assert result["ok"] and result["events_checked"] == 6
    assert main(["--db", db.admin, "central", "init"]) == 0  # and init stays idempotent


def test_init_refuses_a_database_holding_a_format_1_store_and_leaves_it_unchanged(
    pg: PgServer, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_central(pg, EARLIER_SCHEMA)
    old_store = "ab" * 16
    _register_as_admin(db, REGISTER.format(key="payload_key"), [old_store, 1, "11" * 32, "22" * 32])

    assert main(["--db", db.admin, "central", "init"]) == 1
    error = capsys.readouterr().err
    assert f"holds format 1 store {old_store}" in error and "hermes-archive migrate" in error
    assert "payload_key" in _stores_columns(db)
    assert db.query("SELECT store_id, format_version FROM hermes_archive.stores") == [
        (old_store, 1)
    ]
