"""Format 2 archives in the central store, against the real server.

Shipped whole (envelopes, salted payloads, signed checkpoints, cosignatures); the server
recomputes the SHA-256 Merkle tree and refuses a checkpoint whose root is not its own;
central verify checks digests, chain, tree, signatures and cosignatures; an erasure done
locally ships and blanks what it lists centrally while the proof still verifies.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import psycopg
import pytest

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.cli import main
from archive_provider.fleet import central
from archive_provider.fleet.ship import ShipError, Shipper, read_state
from archive_provider.format import merkle, signed_note
from archive_provider.format.signed_note import Signer
from archive_provider.format.verifier import ReportV2
from archive_provider.storage.store import EventStore, archive_dir
from tests.fleet.conftest import PASSWORDS, Central, append_turns, central_rows, make_archive

pytestmark = pytest.mark.postgres


def _ship(home: Path, db: Central, *, batch: int = 1000) -> int:
    db.register(home)
    shipper = Shipper(archive_dir(home), db.url(), batch=batch)
    try:
        return shipper.ship_once()
    finally:
        shipper.close()


def _v2(home: Path) -> EventStore:
    store = make_archive(home)
    return store


def _hex_rows(home: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    try:
        return [
            (seq, bytes(identity).hex(), bytes(chain).hex())
            for seq, identity, chain in conn.execute(
                "SELECT seq, identity, chain FROM events ORDER BY seq"
            )
        ]
    finally:
        conn.close()


def _verify(db: Central, store_id: str, **kwargs: object) -> ReportV2:
    with central.connect(db.url("read_login")) as conn:
        return central.verify_store(conn, central.stores(conn, store_id)[0], **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def shipped_v2(tmp_path: Path, central_db: Central) -> tuple[str, Path]:
    """A v2 archive of 12 turns in durable commits (each signs a checkpoint), shipped."""
    home = tmp_path / "home"
    store = _v2(home)
    for n in range(12):
        append_turns(store, 1, text=f"tulip{n}")
        store.checkpoint()
    store_id = store.store_id
    store.close()
    assert _ship(home, central_db, batch=5) == 13  # store_created and 12 turns
    return store_id, home


def test_a_v2_archive_ships_whole_and_verifies_centrally(
    shipped_v2: tuple[str, Path], central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    store_id, home = shipped_v2
    assert central_rows(central_db, store_id) == _hex_rows(home)
    local = sqlite3.connect(archive_dir(home) / "events.db")
    sizes = [r[0] for r in local.execute("SELECT size FROM signed_checkpoints ORDER BY size")]
    (root,) = local.execute("SELECT root FROM head").fetchone()
    local.close()
    shipped = central_db.query(
        "SELECT size FROM hermes_archive.checkpoints WHERE store_id = %s ORDER BY size",
        [store_id],
    )
    assert [r[0] for r in shipped] == sizes and len(sizes) >= 12
    # the server grew its own tree to the local root, and salts travelled with bodies
    assert central_db.query(
        "SELECT size, root FROM hermes_archive.trees WHERE store_id = %s", [store_id]
    ) == [(13, root)]
    assert central_db.query(
        "SELECT count(*) FROM hermes_archive.payloads WHERE store_id = %s AND length(salt) = 32",
        [store_id],
    ) == central_db.query(
        "SELECT count(*) FROM hermes_archive.payloads WHERE store_id = %s", [store_id]
    )
    assert _ship(home, central_db) == 0  # idempotent

    report = _verify(central_db, store_id)
    assert report.ok, report.problem
    assert report.events_checked == 13 and report.authenticity == "verified"
    reader = central_db.url("read_login")
    assert main(["--db", reader, "--json", "status"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["stores"]
    assert (listed["format_version"], listed["events"]) == (2, 13)
    assert main(["--db", reader, "--json", "verify"]) == 0
    result = json.loads(capsys.readouterr().out)["stores"][0]
    assert result["format_version"] == 2 and result["checkpoint"]["signature"] == "verified"
    assert main(["--db", reader, "--store", store_id, "--json", "show", "5"]) == 0
    shown = json.loads(capsys.readouterr().out)["events"][0]
    assert shown["parts"][0]["value"]["content"] == "tulip3 4 about tulips"
    assert main(["--db", reader, "--json", "search", "tulip7"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["seq"] == 9


def test_a_checkpoint_the_server_did_not_compute_is_refused(
    shipped_v2: tuple[str, Path], central_db: Central
) -> None:
    """A shipper with valid credentials and a valid key cannot make the server accept a
    signed root that is not the root of the events it holds."""
    store_id, home = shipped_v2
    signer = Signer.from_private_key((archive_dir(home) / "signing.key").read_text().strip())
    (last,) = central_db.query(
        "SELECT chain, payload FROM hermes_archive.events WHERE store_id = %s AND seq = 13",
        [store_id],
    )
    forged_root = bytes(32)
    text = signed_note.format_checkpoint(signed_note.Checkpoint(signer.name, 14, forged_root))
    with psycopg.connect(central_db.url(), autocommit=True) as conn:
        # the server cannot check BLAKE3: an event that only links by prev_chain goes in...
        conn.execute(
            "INSERT INTO hermes_archive.events (store_id, seq, time, type, session, key, "
            "identity, payload, parts, chain, prev_chain) VALUES (%s, 14, "
            "'2026-01-01T00:00:00.000000Z', 'turn', 's1', '{}', %s, %s, '[]', %s, %s)",
            [store_id, "ab" * 32, last[1], "cd" * 32, last[0]],
        )
        # ...but a signed root that is not the root of what it holds is refused
        with pytest.raises(psycopg.errors.CheckViolation, match="not the root"):
            conn.execute(
                "INSERT INTO hermes_archive.checkpoints (store_id, size, root, time, signature) "
                "VALUES (%s, 14, %s, 'now', %s)",
                [store_id, forged_root, signer.sign(text).data],
            )
        # as is a checkpoint for a size the server has not reached, or one shipped before
        with pytest.raises(psycopg.errors.CheckViolation, match="central tree holds 14"):
            conn.execute(
                "INSERT INTO hermes_archive.checkpoints (store_id, size, root, time, signature) "
                "VALUES (%s, 15, %s, 'now', %s)",
                [store_id, forged_root, bytes(64)],
            )
        with pytest.raises(psycopg.errors.CheckViolation, match="different checkpoint"):
            conn.execute(
                "INSERT INTO hermes_archive.checkpoints (store_id, size, root, time, signature) "
                "VALUES (%s, 13, %s, 'now', %s)",
                [store_id, forged_root, bytes(64)],
            )
    # central verify names the event the server could not judge
    report = _verify(central_db, store_id)
    assert not report.ok and report.first_bad_seq == 14
    # and neither the tree nor a shipped checkpoint can be changed by anyone but a superuser
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        central_db.query(
            "UPDATE hermes_archive.trees SET root = %s WHERE store_id = %s",
            [forged_root, store_id],
        )
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        central_db.query("DELETE FROM hermes_archive.checkpoints WHERE store_id = %s", [store_id])


def test_a_superuser_edit_of_a_checkpoint_or_the_tree_is_caught_by_central_verify(
    shipped_v2: tuple[str, Path], central_db: Central
) -> None:
    store_id, _ = shipped_v2
    central_db.query("ALTER TABLE hermes_archive.checkpoints DISABLE TRIGGER USER")
    central_db.query(  # a signature byte flipped
        "UPDATE hermes_archive.checkpoints SET signature = "
        "set_byte(signature, 0, get_byte(signature, 0) # 1) WHERE store_id = %s AND size = 5",
        [store_id],
    )
    report = _verify(central_db, store_id)
    assert not report.ok and report.code == "checkpoint_signature"
    central_db.query(
        "UPDATE hermes_archive.checkpoints SET signature = "
        "set_byte(signature, 0, get_byte(signature, 0) # 1) WHERE store_id = %s AND size = 5",
        [store_id],
    )
    assert _verify(central_db, store_id).ok
    central_db.query("ALTER TABLE hermes_archive.trees DISABLE TRIGGER USER")
    central_db.query(
        "UPDATE hermes_archive.trees SET root = sha256(root) WHERE store_id = %s", [store_id]
    )
    report = _verify(central_db, store_id)
    assert not report.ok and report.code == "head_root"
    central_db.query(  # a message body rewritten behind the triggers' back
        "ALTER TABLE hermes_archive.payloads DISABLE TRIGGER USER"
    )
    central_db.query(
        'UPDATE hermes_archive.payloads SET body = convert_to(\'{"content":"forged"}\', '
        "'UTF8') WHERE store_id = %s AND digest = (SELECT parts::jsonb ->> 0 FROM "
        "hermes_archive.events WHERE store_id = %s AND seq = 4)",
        [store_id, store_id],
    )
    report = _verify(central_db, store_id)
    assert (report.ok, report.first_bad_seq) == (False, 4)
    assert report.code == "payload_mismatch"


def test_a_hostile_v2_shipper_cannot_send_parts_the_tree_would_hash_differently(
    shipped_v2: tuple[str, Path], central_db: Central
) -> None:
    store_id, _ = shipped_v2
    (last,) = central_db.query(
        "SELECT chain, payload FROM hermes_archive.events WHERE store_id = %s AND seq = 13",
        [store_id],
    )
    row = {
        "store_id": store_id,
        "seq": 14,
        "time": "2026-01-01T00:00:00.000000Z",
        "type": "turn",
        "session": "s1",
        "key": "{}",
        "identity": "ab" * 32,
        "payload": last[1],
        "parts": '[ "' + str(last[1]) + '" ]',  # spaced: not the bytes the tree would hash
        "chain": "cd" * 32,
        "prev_chain": last[0],
    }
    with (
        psycopg.connect(central_db.url()) as conn,
        pytest.raises(psycopg.errors.CheckViolation, match="canonical list"),
    ):
        conn.execute(
            f"INSERT INTO hermes_archive.events ({', '.join(row)}) "
            f"VALUES ({', '.join(['%s'] * len(row))})",
            list(row.values()),
        )


def test_cosignatures_ship_later_and_are_checked_with_the_witness_key(
    shipped_v2: tuple[str, Path], central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    store_id, home = shipped_v2
    witness = Signer.generate("witness.example/w1", signed_note.ALG_COSIGNATURE_V1)
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    size, root = conn.execute(
        "SELECT size, root FROM signed_checkpoints ORDER BY size DESC LIMIT 1"
    ).fetchone()
    text = signed_note.format_checkpoint(
        signed_note.Checkpoint(f"hermes-archive.invalid/{store_id}", size, bytes(root))
    )
    cosig = witness.cosign(text, 1_767_000_000)
    conn.execute(
        "INSERT INTO cosignatures VALUES (?, ?, ?, ?, ?)",
        (size, witness.name, cosig.key_id.to_bytes(4, "big"), 1_767_000_000, cosig.data[8:]),
    )
    conn.commit()
    conn.close()
    assert _ship(home, central_db) == 0
    assert central_db.query(
        "SELECT size, name FROM hermes_archive.cosignatures WHERE store_id = %s", [store_id]
    ) == [(size, witness.name)]
    unchecked = _verify(central_db, store_id)
    assert unchecked.ok and "were not checked" in unchecked.warnings[-1]
    given = _verify(central_db, store_id, witness_keys=[witness.vkey])
    assert given.ok and (given.checkpoint or {}).get("cosigned_by") == [witness.name]
    reader = central_db.url("read_login")
    assert main(["--db", reader, "--json", "verify", "--witness-key", witness.vkey]) == 0
    assert json.loads(capsys.readouterr().out)["stores"][0]["checkpoint"]["cosigned_by"] == [
        witness.name
    ]
    # a cosignature changed centrally is caught once its key is known
    central_db.query("ALTER TABLE hermes_archive.cosignatures DISABLE TRIGGER USER")
    central_db.query(
        "UPDATE hermes_archive.cosignatures SET timestamp = timestamp + 1 WHERE store_id = %s",
        [store_id],
    )
    bad = _verify(central_db, store_id, witness_keys=[witness.vkey])
    assert not bad.ok and bad.code == "cosignature"


def test_an_erasure_ships_and_blanks_centrally_and_the_proof_still_verifies(
    tmp_path: Path, central_db: Central
) -> None:
    home = tmp_path / "home"
    store = _v2(home)
    append_turns(store, 3, session="keep", text="daffodil")
    append_turns(store, 3, session="gone", text="secretword")
    store.checkpoint()
    store_id = store.store_id
    store.close()
    assert _ship(home, central_db) == 7
    assert central_db.query(
        "SELECT count(*) FROM hermes_archive.payloads WHERE store_id = %s "
        "AND convert_from(body, 'UTF8') LIKE '%%secretword%%'",
        [store_id],
    ) == [(3,)]

    store = _v2(home)
    receipt = erasure.forget(store, Scope("session", {"session": "gone"}), reason="request")
    store.close()
    assert _ship(home, central_db) == 1
    blanked = central_db.query(
        "SELECT digest FROM hermes_archive.payloads WHERE store_id = %s AND body IS NULL "
        "AND salt IS NULL AND search IS NULL AND erased_by = %s",
        [store_id, receipt.seq],
    )
    assert len(blanked) == receipt.payloads and receipt.payloads >= 3
    assert central_db.query(
        "SELECT count(*) FROM hermes_archive.payloads WHERE store_id = %s "
        "AND convert_from(body, 'UTF8') LIKE '%%secretword%%'",
        [store_id],
    ) == [(0,)]
    report = _verify(central_db, store_id)
    assert report.ok, report.problem
    assert report.payloads_erased == receipt.payloads
    assert report.erasures == [{"seq": receipt.seq, "payloads": receipt.payloads}]
    assert report.authenticity == "verified"

    # the shipping role cannot blank anything itself; the eraser re-applying changes nothing
    kept = central_db.query(
        "SELECT digest FROM hermes_archive.payloads WHERE store_id = %s AND body IS NOT NULL "
        "LIMIT 1",
        [store_id],
    )[0][0]
    with (
        psycopg.connect(central_db.url()) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT hermes_archive.erase(%s, %s)", [store_id, receipt.seq])
    with psycopg.connect(central_db.url("erase_login")) as conn:
        assert conn.execute(
            "SELECT hermes_archive.erase(%s, %s)", [store_id, receipt.seq]
        ).fetchone() == (0,)
        with pytest.raises(psycopg.errors.CheckViolation, match="not a shipped erasure event"):
            conn.execute("SELECT hermes_archive.erase(%s, 2)", [store_id])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not listed: never blanked
        central_db.query(
            "UPDATE hermes_archive.payloads SET body = NULL, salt = NULL, erased_by = %s "
            "WHERE store_id = %s AND digest = %s",
            [receipt.seq, store_id, kept],
        )


def test_an_archive_erased_before_it_was_shipped_ships_tombstones(
    tmp_path: Path, central_db: Central
) -> None:
    home = tmp_path / "home"
    store = _v2(home)
    append_turns(store, 4, session="gone", text="secretword")
    append_turns(store, 6, session="keep", text="daffodil")
    receipt = erasure.forget(store, Scope("session", {"session": "gone"}), reason="request")
    store_id = store.store_id
    store.close()
    # batches of 2: the first names erased payloads, so it reaches the erasure event
    assert _ship(home, central_db, batch=2) == 12
    assert central_db.query(
        "SELECT count(*) FROM hermes_archive.payloads WHERE store_id = %s AND body IS NULL",
        [store_id],
    ) == [(receipt.payloads,)]
    report = _verify(central_db, store_id)
    assert report.ok, report.problem
    assert report.payloads_erased == receipt.payloads


def test_a_tombstone_without_its_erasure_is_refused_at_commit(
    shipped_v2: tuple[str, Path], central_db: Central
) -> None:
    store_id, _ = shipped_v2
    with (
        psycopg.connect(central_db.url()) as conn,
        pytest.raises(psycopg.errors.CheckViolation, match="arrived erased"),
        conn.transaction(),
    ):
        conn.execute(
            "INSERT INTO hermes_archive.payloads (store_id, digest, body, erased_by) "
            "VALUES (%s, %s, NULL, 99)",
            [store_id, "ef" * 32],
        )


def test_a_v2_archive_damaged_locally_ships_up_to_the_damage(
    tmp_path: Path, central_db: Central
) -> None:
    home = tmp_path / "home"
    store = _v2(home)
    append_turns(store, 8)
    store_id = store.store_id
    store.close()
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    conn.execute("DROP TRIGGER payloads_erase_only")
    conn.execute(  # a changed message body under event 6 (turn 5)
        'UPDATE payloads SET body = CAST(\'{"content":"forged","role":"user"}\' AS BLOB) '
        "WHERE digest = (SELECT substr(parts, 1, 32) FROM events WHERE seq = 6)"
    )
    conn.commit()
    conn.close()
    central_db.register(home)
    shipper = Shipper(archive_dir(home), central_db.url(), batch=4)
    try:
        with pytest.raises(ShipError, match="fails verification at seq 6"):
            shipper.ship_once()
    finally:
        shipper.close()
    assert [row[0] for row in central_rows(central_db, store_id)] == [1, 2, 3, 4, 5]
    state = read_state(archive_dir(home))
    assert state is not None and "seq 6" in state["last_error"]


def test_the_server_builds_the_v2_leaves_the_local_tiles_hold(
    shipped_v2: tuple[str, Path], central_db: Central
) -> None:
    store_id, home = shipped_v2
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    tiles = dict(
        ((level, idx), hashes)
        for level, idx, hashes in conn.execute("SELECT level, idx, hashes FROM tiles")
    )
    conn.close()
    with psycopg.connect(central_db.url("read_login")) as pgconn:
        leaves = [
            bytes(r[0])
            for r in pgconn.execute(
                "SELECT sha256('\\x00'::bytea || hermes_archive.envelope(e)) "
                "FROM hermes_archive.events e WHERE store_id = %s ORDER BY seq",
                [store_id],
            )
        ]
    assert b"".join(leaves) == tiles[(0, 0)]
    assert merkle.TileAppender().root() == merkle.EMPTY_ROOT


def test_hermes_memory_status_shows_the_shipping_lag_and_never_the_password(
    tmp_path: Path,
    central_db: Central,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The host's own `hermes memory status`, with the plugin installed and activated."""
    import sys
    from types import SimpleNamespace

    from archive_provider.host.install import activate, install_plugin

    home = tmp_path / "home"
    store = _v2(home)
    append_turns(store, 5)
    store.close()
    url = central_db.url()
    install_plugin(home, "archive")
    activate(home, "archive")
    monkeypatch.setenv("ARCHIVE_SHIP_TO", url)  # never from inside the profile
    with (home / "config.yaml").open("a") as config:  # also where the host keeps its section
        config.write(f"  archive:\n    ship_to: '{url}'\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    for module in [m for m in sys.modules if m.startswith("_hermes_user_memory")]:
        monkeypatch.delitem(sys.modules, module)
    from hermes_cli.memory_setup import cmd_status

    cmd_status(SimpleNamespace())
    before = capsys.readouterr().out
    assert "shipping: configured; nothing shipped yet" in before
    central_db.register(home)
    shipper = Shipper(archive_dir(home), url, batch=2)
    try:
        shipper.ship_once()
        store = _v2(home)
        append_turns(store, 3)
        store.close()
        shipper._failed(RuntimeError(f"connection to {url} lost"))  # as a pass that failed
    finally:
        shipper.close()
    cmd_status(SimpleNamespace())
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "shipping:" in line)
    assert "central seq 6" in line and "lag 3 events" in line and "last error" in line
    assert "user=ship_login" in line and PASSWORDS["ship_login"] not in before + out


def test_a_checkpoint_not_signed_by_the_archives_key_is_not_shipped(
    tmp_path: Path, central_db: Central
) -> None:
    """Issue 19 point 2: the shipper checks each signed checkpoint's Ed25519 signature with
    the archive's own key before it sends it (the server has no Ed25519)."""
    home = tmp_path / "home"
    store = _v2(home)
    for n in range(8):
        append_turns(store, 1, text=f"tulip{n}")
        store.checkpoint()
    store_id, origin = store.store_id, store.origin
    store.close()
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    (root,) = conn.execute("SELECT root FROM signed_checkpoints WHERE size = 6").fetchone()
    intruder = Signer.generate(origin)  # the archive's name, another key
    text = signed_note.format_checkpoint(signed_note.Checkpoint(origin, 6, bytes(root)))
    conn.execute("DROP TRIGGER signed_checkpoints_no_update")
    conn.execute(
        "UPDATE signed_checkpoints SET signature = ? WHERE size = 6", (intruder.sign(text).data,)
    )
    conn.commit()
    conn.close()
    central_db.register(home)
    shipper = Shipper(archive_dir(home), central_db.url(), batch=4)
    try:
        with pytest.raises(ShipError, match="checkpoint at size 6 is not signed by this archive"):
            shipper.ship_once()
    finally:
        shipper.close()
    # the events it covers went (each was verified); the forged checkpoint and all after it not
    assert [row[0] for row in central_rows(central_db, store_id)] == [1, 2, 3, 4, 5, 6]
    sizes = central_db.query(
        "SELECT size FROM hermes_archive.checkpoints WHERE store_id = %s ORDER BY size", [store_id]
    )
    assert [size for (size,) in sizes] == [1, 2, 3, 4, 5]
    state = read_state(archive_dir(home))
    assert state is not None and "size 6 is not signed" in state["last_error"]


def test_a_cosignature_that_does_not_verify_with_its_witness_key_is_not_shipped(
    tmp_path: Path, central_db: Central
) -> None:
    """Issue 19 point 2 for cosignatures: the key is the one the log's `witness_added`
    names; a cosignature that does not verify with it stays local and the pass says so."""
    from archive_provider.witnesses.remote import witness_added

    home = tmp_path / "home"
    store = _v2(home)
    witness = Signer.generate("witness.example/w1", signed_note.ALG_COSIGNATURE_V1)
    store.append([witness_added(None, witness.vkey, "the team's witness", {"id": "ops"})])
    for n in range(3):
        append_turns(store, 1, text=f"tulip{n}")
        store.checkpoint()
    store_id, origin = store.store_id, store.origin
    store.close()
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    (new_size, new_root), (old_size, old_root) = conn.execute(
        "SELECT size, root FROM signed_checkpoints ORDER BY size DESC LIMIT 2"
    ).fetchall()
    for size, root, forged in ((new_size, new_root, 0), (old_size, old_root, 1)):
        text = signed_note.format_checkpoint(signed_note.Checkpoint(origin, size, bytes(root)))
        cosig = witness.cosign(text, 1_767_000_000)
        conn.execute(  # the older one claims a time the witness never signed
            "INSERT INTO cosignatures VALUES (?, ?, ?, ?, ?)",
            (size, witness.name, cosig.key_id.to_bytes(4, "big"), 1_767_000_000 + forged,
             cosig.data[8:]),
        )  # fmt: skip
    conn.commit()
    conn.close()
    central_db.register(home)
    shipper = Shipper(archive_dir(home), central_db.url())
    try:
        with pytest.raises(ShipError, match=f"size {old_size} does not verify with the key"):
            shipper.ship_once()
    finally:
        shipper.close()
    assert len(central_rows(central_db, store_id)) == new_size  # every event went
    assert central_db.query(
        "SELECT size, name FROM hermes_archive.cosignatures WHERE store_id = %s", [store_id]
    ) == [(new_size, witness.name)]
    assert _verify(central_db, store_id).ok  # what was shipped verifies centrally
