"""Shipping against the real server: in order, idempotent, resumable, only verified events,
never in a hook's way, and never showing a password."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from archive_provider.cli import main
from archive_provider.fleet import central
from archive_provider.fleet.ship import ShipError, Shipper, read_state
from archive_provider.storage.store import archive_dir
from tests.fleet.conftest import (
    PASSWORDS,
    Central,
    append_turns,
    central_rows,
    local_rows,
    make_archive,
)
from tests.fleet.pgserver import PgServer

pytestmark = pytest.mark.postgres


REPO = Path(__file__).resolve().parents[2]


def wait_until(condition: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    """Poll until ``condition`` holds (a liveness bound, not a timed assertion)."""
    done = threading.Event()
    waited = 0.0
    while not condition():
        if waited >= limit:
            pytest.fail(f"gave up waiting for {what}")
        done.wait(0.1)
        waited += 0.1


def _store_id(home: Path) -> str:
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    try:
        return str(conn.execute("SELECT value FROM meta WHERE name = 'store_id'").fetchone()[0])
    finally:
        conn.close()


def test_ship_is_idempotent_and_central_reads_match_the_archive(
    tmp_path: Path, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 25, text="tulip")
    store.close()
    url = central_db.url()
    central_db.register(home)
    assert main(["--home", str(home), "ship", "--to", url, "--batch", "7"]) == 0
    assert "shipped 26 events" in capsys.readouterr().out  # store_created and 25 turns
    assert main(["--home", str(home), "ship", "--to", url]) == 0
    assert "shipped 0 events" in capsys.readouterr().out
    store_id = _store_id(home)
    assert central_rows(central_db, store_id) == local_rows(home)

    reader = central_db.url("read_login")
    assert main(["--db", reader, "--json", "status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [(s["store_id"], s["events"]) for s in status["stores"]] == [(store_id, 26)]
    assert main(["--db", reader, "log", "--limit", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["24", "25", "26"]
    assert main(["--db", reader, "--store", store_id, "--json", "show", "12"]) == 0
    shown = json.loads(capsys.readouterr().out)["events"][0]
    assert shown["parts"][0]["value"]["content"] == "tulip 11 about tulips"
    assert main(["--db", reader, "--json", "search", "tulip", "17"]) == 0
    hits = json.loads(capsys.readouterr().out)["results"]
    assert hits[0]["seq"] == 18 and "17" in hits[0]["text"]
    assert main(["--db", reader, "search", "daffodil"]) == 1
    assert main(["--db", reader, "replay"]) == 2  # not a central command: a usage error
    for output in capsys.readouterr():
        assert PASSWORDS["read_login"] not in output and PASSWORDS["ship_login"] not in output


def test_only_what_the_local_archive_verifies_is_shipped(
    tmp_path: Path, central_db: Central
) -> None:
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 10)
    store.close()
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    conn.execute("DROP TRIGGER payloads_erase_only")
    conn.execute(  # a changed message body under event 7
        'UPDATE payloads SET body = CAST(\'{"content":"forged","role":"user"}\' AS BLOB) '
        "WHERE digest = (SELECT substr(parts, 1, 32) FROM events WHERE seq = 7)"
    )
    conn.commit()
    conn.close()
    central_db.register(home)
    shipper = Shipper(archive_dir(home), central_db.url(), batch=4)
    try:
        with pytest.raises(ShipError, match="fails verification at seq 7"):
            shipper.ship_once()
    finally:
        shipper.close()
    # everything before the damage is shipped, even inside the batch that holds it
    assert [row[0] for row in central_rows(central_db, _store_id(home))] == [1, 2, 3, 4, 5, 6]
    state = read_state(archive_dir(home))
    assert state is not None and "seq 7" in state["last_error"] and state["lag_events"] == 5


def test_a_session_postgresql_cannot_hold_stops_shipping_before_it(
    tmp_path: Path, central_db: Central
) -> None:
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 3)
    append_turns(store, 1, session="odd\x00id")
    append_turns(store, 2)
    store.close()
    central_db.register(home)
    shipper = Shipper(archive_dir(home), central_db.url())
    try:
        with pytest.raises(ShipError, match="event 5 has a NUL character"):
            shipper.ship_once()
    finally:
        shipper.close()
    assert [row[0] for row in central_rows(central_db, _store_id(home))] == [1, 2, 3, 4]


def test_a_diverged_archive_is_not_shipped(tmp_path: Path, central_db: Central) -> None:
    home, copy = tmp_path / "home", tmp_path / "copy"
    store = make_archive(home)
    append_turns(store, 5)
    store.close()
    shutil.copytree(home, copy)  # an older copy of the same store
    store = make_archive(home)
    append_turns(store, 5)
    store.close()
    central_db.register(home)
    shipper = Shipper(archive_dir(home), central_db.url())
    assert shipper.ship_once() == 11
    shipper.close()
    older = make_archive(copy)
    append_turns(older, 7, text="another history")
    older.close()
    central_db.register(copy)
    shipper = Shipper(archive_dir(copy), central_db.url())
    try:
        with pytest.raises(ShipError, match="diverged"):
            shipper.ship_once()
    finally:
        shipper.close()
    assert central_rows(central_db, _store_id(home)) == local_rows(home)


def test_two_profiles_ship_concurrently_through_their_providers(
    tmp_path: Path,
    central_db: Central,
    make_provider: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    homes = [tmp_path / "alpha", tmp_path / "beta"]
    monkeypatch.setenv("ARCHIVE_SHIP_TO", central_db.url())  # never from inside the profile
    for home in homes:
        make_archive(home).close()
        central_db.register(home)
        (home / "archive" / "config.json").write_text(json.dumps({"ship_interval_s": 0.1}))
    providers = [make_provider(home, session=f"s-{home.name}") for home in homes]

    def talk(provider: object, name: str) -> None:
        for turn in range(40):
            provider.sync_turn(f"{name} asks {turn}", f"answer {turn}")  # type: ignore[attr-defined]

    threads = [
        threading.Thread(target=talk, args=(p, h.name))
        for p, h in zip(providers, homes, strict=True)
    ]
    for thread in threads:
        thread.start()
    # meanwhile a second shipper of the first profile (the CLI) races the provider's own
    wait_until(lambda: local_rows(homes[0]) != [], "the first events of alpha")
    assert main(["--home", str(homes[0]), "ship", "--to", central_db.url()]) == 0
    for thread in threads:
        thread.join()
    for provider in providers:
        provider.on_pre_compress(  # type: ignore[attr-defined]
            [{"role": "user", "content": "wrap up"}], require_checkpoint=True
        )
    for home in homes:
        wait_until(
            lambda home=home: central_rows(central_db, _store_id(home)) == local_rows(home),
            f"{home.name} to be shipped",
        )
        assert len(local_rows(home)) >= 42
    with central.connect(central_db.url("read_login")) as conn:
        reports = [central.verify_store(conn, s) for s in central.stores(conn)]
    assert len(reports) == 2 and all(r.ok for r in reports)
    assert sorted(r.events_checked for r in reports) == sorted(len(local_rows(h)) for h in homes)


def test_follow_survives_the_server_killed_and_restarted(
    tmp_path: Path, central_db: Central, pg: PgServer
) -> None:
    home = tmp_path / "home"
    store = make_archive(home)
    first = 1  # store_created
    append_turns(store, 20)
    url = central_db.url()
    central_db.register(home)
    follower = subprocess.Popen(
        [sys.executable, "-m", "archive_provider.cli", "--home", str(home), "ship"]
        + ["--to", url, "--follow", "--interval", "0.1", "--batch", "6"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    store_id = store.store_id
    state_of: Callable[[], dict[str, object]] = lambda: read_state(archive_dir(home)) or {}  # noqa: E731
    try:
        wait_until(lambda: state_of().get("central_seq") == 20 + first, "the first 20 events")
        append_turns(store, 15)  # while it ships...
        pg.kill()  # ...the server dies
        append_turns(store, 15)  # the archive keeps committing locally
        wait_until(lambda: bool(state_of().get("last_error")), "the outage to be noticed")
        pg.start()
        append_turns(store, 10)
        wait_until(
            lambda: state_of().get("central_seq") == 60 + first, "the catch-up after restart"
        )
        assert state_of()["last_error"] is None and state_of()["lag_events"] == 0
    finally:
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
        store.close()
    assert follower.returncode == 0, err
    rows = central_rows(central_db, store_id)
    assert rows == local_rows(home)  # nothing lost, nothing duplicated, in order
    assert [row[0] for row in rows] == list(range(1, 61 + first))
    assert "last error" in out  # the outage was reported while it lasted
    state_text = (archive_dir(home) / "shipping.json").read_text()
    for text in (out, err, state_text):
        assert PASSWORDS["ship_login"] not in text


def test_a_dead_central_store_never_blocks_a_checkpoint_or_leaks_its_password(
    tmp_path: Path,
    make_provider: Callable[..., object],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    password = "do-not-print-me-0451"
    home = tmp_path / "home"
    (home / "archive").mkdir(parents=True)
    dead = f"postgresql://shipper:{password}@127.0.0.1:9/nowhere?sslmode=disable&connect_timeout=1"
    (home / "archive" / "config.json").write_text(json.dumps({"ship_interval_s": 0.1}))
    monkeypatch.setenv("ARCHIVE_SHIP_TO", dead)
    provider = make_provider(home)
    provider.sync_turn("hello", "hi")  # type: ignore[attr-defined]
    receipt = provider.on_pre_compress(  # type: ignore[attr-defined]
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
        require_checkpoint=True,
    )
    assert "seq" in receipt  # committed locally while the central store is unreachable

    def failure_counted() -> bool:  # a pass records its error; a later one counts the lag
        state = read_state(archive_dir(home)) or {}
        return bool(state.get("last_error")) and state.get("lag_events", 0) >= 3

    wait_until(failure_counted, "the shipping failure and its lag to be recorded")
    assert main(["--home", str(home), "status"]) == 0
    out = capsys.readouterr().out
    assert "Shipping to host=127.0.0.1 port=9 dbname=nowhere user=shipper" in out
    assert "last error:" in out and "lag" in out
    state = read_state(archive_dir(home)) or {}
    assert state["lag_events"] >= 3 and state["central_seq"] == 0
    assert main(["--home", str(home), "ship", "--to", dead]) == 1
    everything = capsys.readouterr()
    texts = [*everything, caplog.text, json.dumps(state)]
    assert all(password not in text for text in texts)


def test_pgpassfile_and_a_service_name_are_honoured(
    tmp_path: Path, central_db: Central, pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{pg.port}:*:ship_login:{PASSWORDS['ship_login']}\n")
    passfile.chmod(0o600)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        f"[fleet]\nhost=127.0.0.1\nport={pg.port}\ndbname={central_db.dbname}\n"
        "user=ship_login\nsslmode=disable\n"
    )
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    home = tmp_path / "home"
    store = make_archive(home)
    append_turns(store, 3)
    store.close()
    no_password = central_db.url(password=False)
    assert PASSWORDS["ship_login"] not in no_password
    central_db.register(home)
    shipper = Shipper(archive_dir(home), no_password)
    assert shipper.ship_once() == 4
    shipper.close()
    store = make_archive(home)
    append_turns(store, 2)
    store.close()
    shipper = Shipper(archive_dir(home), "fleet")  # a bare service name
    try:
        assert shipper.ship_once() == 2
        assert shipper.state.target.startswith("service=fleet")
    finally:
        shipper.close()
    with central.connect("fleet") as conn:  # the statement timeout is set on every connection
        assert conn.execute("SHOW statement_timeout").fetchone() == ("30s",)
    assert len(central_rows(central_db, _store_id(home))) == 6
    os.environ.pop("PGPASSFILE", None)


def test_passwords_are_redacted_in_every_form() -> None:
    url = "postgresql://ann:s3cr%40t@db.example:5432/archive?sslmode=verify-full"
    assert central.redacted(url) == (
        "host=db.example port=5432 dbname=archive user=ann sslmode=verify-full"
    )
    kv = "host=db user=ann password='p w' dbname=archive"
    assert "p w" not in central.redacted(kv)
    message = f"failed for {url} and {kv} and password=plain"
    scrubbed = central.scrub(message, url, kv)
    assert all(secret not in scrubbed for secret in ("s3cr", "'p w'", "plain"))
    assert central.conninfo("fleet") == "service=fleet"


def test_a_hanging_central_store_never_holds_up_a_turn_or_a_checkpoint(
    tmp_path: Path, make_provider: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that accepts the connection and never answers: the worst network case."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        home = tmp_path / "home"
        (home / "archive").mkdir(parents=True)
        target = f"postgresql://x:pw@127.0.0.1:{port}/db?sslmode=disable&connect_timeout=60"
        (home / "archive" / "config.json").write_text(json.dumps({"ship_interval_s": 0.1}))
        monkeypatch.setenv("ARCHIVE_SHIP_TO", target)
        provider = make_provider(home)
        silent.settimeout(120)
        caller, _ = silent.accept()  # the shipper connected and now waits for an answer
        for turn in range(5):
            provider.sync_turn(f"question {turn}", f"answer {turn}")  # type: ignore[attr-defined]
        receipt = provider.on_pre_compress(  # type: ignore[attr-defined]
            [{"role": "user", "content": "question 4"}], require_checkpoint=True
        )
        assert "seq" in receipt
        assert [row[0] for row in local_rows(home)][-1] >= 7  # session, 5 turns, checkpoint
        state = read_state(archive_dir(home))
        assert state is None or state["central_seq"] == 0  # nothing reached the silent server
        provider.shutdown()  # returns although the shipper is still waiting for the server
        caller.close()
