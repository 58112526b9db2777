"""Legal holds and retention in the central store: the policy, holds and erasure receipts
read centrally (`--db retention show | hold list | erasures`); retention's erasures ship
and blank centrally; and the server itself refuses an erasure that reaches held data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from freezegun import freeze_time

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.cli import main
from archive_provider.fleet.ship import ShipError, Shipper
from archive_provider.storage.store import archive_dir
from tests.fleet.conftest import Central, append_turns, make_archive

pytestmark = pytest.mark.postgres


def _ship(home: Path, db: Central) -> int:
    db.register(home)
    shipper = Shipper(archive_dir(home), db.url())
    try:
        return shipper.ship_once()
    finally:
        shipper.close()


def _bodies_with(db: Central, store_id: str, text: str) -> int:
    (count,) = db.query(
        "SELECT count(*) FROM hermes_archive.payloads WHERE store_id = %s "
        "AND convert_from(body, 'UTF8') LIKE %s",
        [store_id, f"%{text}%"],
    )[0]
    return int(count)  # type: ignore[call-overload]


def test_retention_and_holds_reach_the_central_store(
    tmp_path: Path, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    with freeze_time("2026-01-01T00:00:00Z"):
        store = make_archive(home)
        append_turns(store, 2, session="old", text="expiredword")
        append_turns(store, 2, session="held", text="counselword")
    with freeze_time("2026-09-01T00:00:00Z"):
        append_turns(store, 2, session="new", text="freshword")
        erasure.set_retention(store, 180, "policy", "ops", confirmed=True)
        hold = erasure.add_hold(store, {"session": "held"}, "audit", "counsel")
    store_id = store.store_id
    assert _ship(home, central_db) == 9  # (outside frozen time: the pool keeps real time)
    assert _bodies_with(central_db, store_id, "expiredword") == 2
    with freeze_time("2026-09-01T00:00:00Z"):
        done = erasure.apply_retention(store)
    store.close()
    assert _ship(home, central_db) == 1
    assert [r.reason for r in done if r.seq] == ["retention"]
    assert _bodies_with(central_db, store_id, "expiredword") == 0
    assert _bodies_with(central_db, store_id, "counselword") == 2  # held: kept
    assert _bodies_with(central_db, store_id, "freshword") == 2

    central = ["--db", central_db.url("read_login"), "--store", store_id, "--json"]
    assert main([*central, "retention", "show"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["days"] == 180
    assert main([*central, "hold", "list"]) == 0
    assert [h["hold"] for h in json.loads(capsys.readouterr().out)["holds"]] == [hold]
    assert main([*central, "erasures"]) == 0
    receipts = json.loads(capsys.readouterr().out)["erasures"]
    assert [(r["seq"], r["reason"]) for r in receipts] == [(done[-1].seq, "retention")]
    # writing actions are the host's: refused against the central store
    assert main([*central, "hold", "add", "--session", "x", "--reason", "r"]) == 2
    assert "run it on the host" in capsys.readouterr().out


def test_the_server_refuses_an_erasure_that_reaches_held_data(
    tmp_path: Path, central_db: Central, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 2, session="held", text="counselword")
    hold = erasure.add_hold(store, {"session": "held"}, "audit", "counsel")
    store_id = store.store_id
    assert _ship(home, central_db) == 4
    # a host whose hold check is broken (or a forged log) erases held data locally...
    with monkeypatch.context() as patched:
        patched.setattr(erasure, "holds", lambda store: [])
        erasure.forget(store, Scope("session", {"session": "held"}), reason="bug")
    store.close()
    # ...the server refuses the erasure event, and nothing is blanked centrally
    shipper = Shipper(archive_dir(home), central_db.url())
    try:
        with pytest.raises(ShipError, match=f"legal hold {hold}"):
            shipper.ship_once()
    finally:
        shipper.close()
    assert _bodies_with(central_db, store_id, "counselword") == 2
    assert central_db.query(
        "SELECT max(seq) FROM hermes_archive.events WHERE store_id = %s", [store_id]
    ) == [(4,)]


def test_a_shipped_hold_release_does_not_release_the_hold_centrally(
    tmp_path: Path, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 point 8: the host's `legal_hold_released`, shipped before the erasure, is its
    word only; the server keeps held data until an administrator released the hold."""
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 2, session="held", text="counselword")
    hold = erasure.add_hold(store, {"session": "held"}, "audit", "counsel")
    store_id = store.store_id
    assert _ship(home, central_db) == 4
    erasure.release_hold(store, hold, "case closed", "counsel")
    erasure.forget(store, Scope("session", {"session": "held"}), reason="request")
    store.close()
    shipper = Shipper(archive_dir(home), central_db.url())
    try:
        with pytest.raises(ShipError, match=f"legal hold {hold}"):
            shipper.ship_once()
        assert _bodies_with(central_db, store_id, "counselword") == 2

        # releasing takes the administrator's role: the shipping and reading logins cannot
        release = ["central", "release-hold", hold, "--store", store_id, "--reason", "closed"]
        for login in ("ship_login", "read_login"):
            assert main(["--db", central_db.url(login), *release]) == 1
            assert "release" in capsys.readouterr().err
        assert main(["--db", central_db.url("admin_login"), *release]) == 0
        assert f"released legal hold {hold}" in capsys.readouterr().out
        assert shipper.ship_once() == 2  # the release event and the erasure
    finally:
        shipper.close()
    assert _bodies_with(central_db, store_id, "counselword") == 0
