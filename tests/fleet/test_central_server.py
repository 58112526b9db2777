"""What PostgreSQL itself enforces on the central store, whoever the client is.

A hostile client holding the shipping role writes raw SQL (a fork, a rewrite, a gap, a
replayed row, a part it never shipped); the server refuses each. No role can update or
delete; erasure goes through one function and only for covered payloads. A superuser who
bypasses the triggers is caught by central verify.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg
import pytest

from archive_provider.cli import main
from archive_provider.fleet import central
from archive_provider.fleet.ship import ShipError, Shipper
from archive_provider.storage.store import archive_dir
from tests.fleet.conftest import Central, append_turns, central_rows, make_archive

pytestmark = pytest.mark.postgres

COLUMNS = "store_id, seq, time, type, session, key, identity, payload, parts, prev_chain, chain"


@pytest.fixture
def shipped(tmp_path: Path, central_db: Central) -> tuple[str, Path]:
    """A real archive of store_created and 6 turns, shipped; returns (store_id, home)."""
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 6)
    store_id = store.store_id
    store.close()
    central_db.register(home)
    shipper = Shipper(archive_dir(home), central_db.url())
    try:
        assert shipper.ship_once() == 7
    finally:
        shipper.close()
    return store_id, home


def _row(db: Central, store_id: str, seq: int) -> dict[str, object]:
    names = [c.strip() for c in COLUMNS.split(",")]
    (values,) = db.query(
        f"SELECT {COLUMNS} FROM hermes_archive.events WHERE store_id = %s AND seq = %s",
        [store_id, seq],
    )
    return dict(zip(names, values, strict=True))


def _insert_as_shipper(db: Central, row: dict[str, object], login: str = "ship_login") -> None:
    with psycopg.connect(db.url(login)) as conn:
        conn.execute(
            f"INSERT INTO hermes_archive.events ({', '.join(row)}) "
            f"VALUES ({', '.join(['%s'] * len(row))})",
            list(row.values()),
        )


def test_init_is_idempotent_and_needs_no_ownership_change(central_db: Central) -> None:
    before = central_db.query(
        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY tgname"
    )
    central.init(central_db.admin)
    after = central_db.query("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY tgname")
    assert before == after and len(after) == 27
    owners = central_db.query(
        "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'hermes_archive'"
    )
    assert owners == [("hermes_archive_owner",)]


def test_a_hostile_shipper_cannot_fork_rewrite_gap_or_replay(
    shipped: tuple[str, Path], central_db: Central
) -> None:
    store_id, _ = shipped
    before = central_rows(central_db, store_id)
    last = _row(central_db, store_id, 6)
    third = _row(central_db, store_id, 3)
    forged = {**last, "seq": 7, "identity": "ab" * 32, "chain": "cd" * 32}

    attacks = {
        # a fork: seq 7 claiming another predecessor than the stored seq 6
        "fork": ({**forged, "prev_chain": "ee" * 32}, psycopg.errors.CheckViolation),
        # a rewrite of history: seq 4 again, with other content
        "rewrite": (
            {**_row(central_db, store_id, 4), "session": "rewritten"},
            psycopg.errors.UniqueViolation,
        ),
        # a gap: seq 9 after 6
        "gap": ({**forged, "seq": 9, "prev_chain": last["chain"]}, psycopg.errors.CheckViolation),
        # a replayed row: seq 3's event again as seq 7, correctly chained
        "replay": (
            {**third, "seq": 7, "prev_chain": last["chain"]},
            psycopg.errors.UniqueViolation,
        ),
        # an event naming a part that was never shipped
        "unshipped part": (
            {**forged, "prev_chain": last["chain"], "parts": f'["{"12" * 32}"]'},
            psycopg.errors.ForeignKeyViolation,
        ),
    }
    for name, (row, error) in attacks.items():
        with pytest.raises(error):
            _insert_as_shipper(central_db, row)
        assert central_rows(central_db, store_id) == before, name

    # a new store (registered to it) whose first event does not start at its genesis
    with psycopg.connect(central_db.url("admin_login")) as conn:
        conn.execute(
            "INSERT INTO hermes_archive.stores (store_id, format_version, genesis, vkey, "
            "shipper) VALUES (%s, 2, %s, 'other+00000000+AAAA', 'ship_login')",
            ["0" * 32, "11" * 32],
        )
    with pytest.raises(psycopg.errors.CheckViolation):
        _insert_as_shipper(central_db, {**forged, "store_id": "0" * 32, "seq": 1})
    # a payload row that arrives without its body
    with pytest.raises(psycopg.errors.CheckViolation), psycopg.connect(central_db.url()) as conn:
        conn.execute(
            "INSERT INTO hermes_archive.payloads (store_id, digest, body, erased_by) "
            "VALUES (%s, %s, NULL, 1)",
            [store_id, "33" * 32],
        )


def test_another_host_cannot_append_to_a_store_it_did_not_register(
    shipped: tuple[str, Path], central_db: Central
) -> None:
    store_id, _ = shipped
    before = central_rows(central_db, store_id)
    last = _row(central_db, store_id, 6)
    # correctly chained, so only the store's owner check can refuse it
    forged = {**last, "seq": 7, "identity": "ab" * 32, "prev_chain": last["chain"]}
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="did not register it"):
        _insert_as_shipper(central_db, forged, "ship_other")
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege),
        psycopg.connect(central_db.url("ship_other")) as conn,
    ):
        conn.execute(
            "INSERT INTO hermes_archive.payloads (store_id, digest, body) VALUES (%s, %s, 'x')",
            [store_id, "44" * 32],
        )
    assert central_rows(central_db, store_id) == before


def test_only_the_administrator_registers_a_store_and_a_shipper_sees_only_its_own(
    tmp_path: Path, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 point 7: a shipping login registered a victim's store id (public: it is the
    checkpoint origin) with its own genesis and key first, so the victim could never ship
    and an auditor without a pinned key read a forged history that verified; and any
    shipper read every store's head."""
    victim = tmp_path / "victim"
    store = make_archive(victim)
    append_turns(store, 3)
    store_id = store.store_id
    store.close()
    # the attacker's claim of the id, with a genesis and key of its own
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"),
        psycopg.connect(central_db.url("ship_other")) as conn,
    ):
        conn.execute(
            "INSERT INTO hermes_archive.stores (store_id, format_version, genesis, vkey, "
            "shipper) VALUES (%s, 2, %s, 'attacker+00000000+AAAA', 'ship_other')",
            [store_id, "11" * 32],
        )
    register = ["--home", str(victim), "central", "register", "--shipper", "ship_login"]
    assert main(["--db", central_db.url("ship_other"), *register]) == 1  # nor by the command
    assert "permission denied for table stores" in capsys.readouterr().err
    assert central_db.query("SELECT count(*) FROM hermes_archive.stores") == [(0,)]

    # the administrator registers it to its host's login, with the archive's own key
    assert main(["--db", central_db.url("admin_login"), "--json", *register]) == 0
    registered = json.loads(capsys.readouterr().out)
    assert (registered["store_id"], registered["shipper"]) == (store_id, "ship_login")
    assert central_db.query(
        "SELECT shipper, registered_by FROM hermes_archive.stores WHERE store_id = %s",
        [store_id],
    ) == [("ship_login", "admin_login")]

    # another shipping login can neither ship it nor see its head
    copy = tmp_path / "copy"
    shutil.copytree(victim, copy)
    intruder = Shipper(archive_dir(copy), central_db.url("ship_other"))
    try:
        with pytest.raises(ShipError, match="not registered to this login"):
            intruder.ship_once()
    finally:
        intruder.close()
    head = "SELECT seq FROM hermes_archive.head(%s)"
    with psycopg.connect(central_db.url("ship_other")) as conn:
        assert conn.execute(head, [store_id]).fetchall() == []
    assert central_rows(central_db, store_id) == []
    # its own login ships it; it and the auditors see its head
    shipper = Shipper(archive_dir(victim), central_db.url())
    try:
        assert shipper.ship_once() == 4  # store_created and 3 turns
    finally:
        shipper.close()
    for login in ("ship_login", "read_login", "admin_login"):
        with psycopg.connect(central_db.url(login)) as conn:
            assert conn.execute(head, [store_id]).fetchall() == [(4,)], login


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE hermes_archive.events SET session = 'x' WHERE seq = 2",
        "DELETE FROM hermes_archive.events WHERE seq = 6",
        "UPDATE hermes_archive.payloads SET body = 'x'",
        "DELETE FROM hermes_archive.payloads",
        "UPDATE hermes_archive.stores SET label = 'x'",
        "TRUNCATE hermes_archive.events CASCADE",
        "SELECT body FROM hermes_archive.payloads",  # other stores' bodies stay unread
        "SELECT hermes_archive.erase(store_id, 1) FROM hermes_archive.stores",
    ],
)
def test_the_shipping_role_cannot_change_or_read_back(
    shipped: tuple[str, Path], central_db: Central, statement: str
) -> None:
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege),
        psycopg.connect(central_db.url()) as conn,
    ):
        conn.execute(statement)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE hermes_archive.events SET session = 'x' WHERE seq = 2",
        "DELETE FROM hermes_archive.events WHERE seq = 6",
        "UPDATE hermes_archive.payloads SET body = NULL, erased_by = 6",
        "DELETE FROM hermes_archive.payloads",
        "TRUNCATE hermes_archive.events, hermes_archive.payloads, hermes_archive.stores CASCADE",
    ],
)
def test_even_the_owner_is_refused_by_the_triggers(
    shipped: tuple[str, Path], central_db: Central, statement: str
) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only|immutable"):
        central_db.query("SET ROLE hermes_archive_owner; " + statement)


def test_a_superuser_edit_is_caught_by_central_verify(
    shipped: tuple[str, Path], central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    store_id, _ = shipped
    assert main(["--db", central_db.url("read_login"), "verify"]) == 0
    capsys.readouterr()
    central_db.query(
        "SET session_replication_role = replica; "  # what a superuser does to skip triggers
        "UPDATE hermes_archive.events SET session = 'elsewhere' WHERE seq = 4"
    )
    assert main(["--db", central_db.url("read_login"), "verify", "--store", store_id[:8]]) == 1
    out = capsys.readouterr().out
    assert f"FAILED: {store_id}" in out and "at seq 4: seq 4: the identity does not match" in out


def test_a_payload_edited_by_a_superuser_is_caught(
    shipped: tuple[str, Path], central_db: Central
) -> None:
    store_id, _ = shipped
    central_db.query(
        "SET session_replication_role = replica; "
        "UPDATE hermes_archive.payloads p SET body = convert_to('{\"turn\":99}', 'UTF8') "
        "FROM hermes_archive.events e WHERE e.store_id = p.store_id AND e.payload = p.digest "
        "AND e.seq = 5"
    )
    with central.connect(central_db.url("read_login")) as conn:
        (store,) = central.stores(conn)
        report = central.verify_store(conn, store)
    assert (report.ok, report.first_bad_seq) == (False, 5)
    assert "does not match its bytes" in str(report.problem)


def test_a_prev_chain_column_edited_by_a_superuser_is_caught(
    shipped: tuple[str, Path], central_db: Central
) -> None:
    store_id, _ = shipped
    central_db.query(
        "SET session_replication_role = replica; "
        "UPDATE hermes_archive.events SET prev_chain = repeat('0', 64) WHERE seq = 3"
    )
    with central.connect(central_db.url("read_login")) as conn:
        report = central.verify_store(conn, central.stores(conn, store_id)[0])
    assert (report.ok, report.first_bad_seq) == (False, 3)
    assert "prev_chain" in str(report.problem)


def test_central_init_from_the_command_line(
    pg: object, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    central_db.query("DROP SCHEMA hermes_archive CASCADE")
    assert main(["central", "init"]) == 2  # needs --db
    assert main(["--store", "abcd", "status"]) == 2  # --store only means something with --db
    capsys.readouterr()
    assert main(["central", "init", "--db", central_db.admin]) == 0
    assert "central store ready" in capsys.readouterr().out
    assert central_db.query(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'hermes_archive'"
    ) == [(8,)]
    assert main(["central", "sql"]) == 0
    assert "CREATE TABLE IF NOT EXISTS hermes_archive.events" in capsys.readouterr().out
