"""``migrate`` (docs/FORMAT.md 19) on tests/fixtures/v1_archive, a v1 archive the v1 code wrote.

The fixture is copied for each test; the v1 file must be kept byte for byte, the new v2
archive must verify (signatures included) and hold every v1 event at ``seq + 1`` with the
same time, type and session and the same payloads once v1 part digests are mapped to v2.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from archive_provider.format.canonical import decode
from archive_provider.format.verifier import verify_database
from archive_provider.storage.migrate import (
    V1_DB_NAME,
    V1_KEY_NAME,
    MigrationRefused,
    file_blake3,
    migrate,
    v1_events,
)
from archive_provider.storage.store import EventStore, Head, iter_events
from bench.common import ChildRun, cli_child
from tests.v1_writer import TURNS_PER_SESSION, events_in, messages, write_v1_archive

FIXTURE = Path(__file__).parent / "fixtures" / "v1_archive"
#: conversations in the two v1 archives the memory test migrates (50 events each: 2k, 20k)
SMALL_SESSIONS, LARGE_SESSIONS = 40, 400
#: how much more the larger migrate may take: noise only. The v1 verify's set of every
#: digest met (~560 B an event) once grew it 5.5 MiB, and a copy that held the v1 log or
#: its digest map would grow it by more
GROWTH_MIB = 3.0
#: ``verify --lineage`` fills its several connections' page caches up to the larger archive
#: (3.0 MiB measured); its map of every part's v1 and v2 digest once grew it 13.1 MiB
LINEAGE_GROWTH_MIB = 6.0
CEILING_MIB = 100.0


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home" / "archive"
    shutil.copytree(FIXTURE, folder)
    os.chmod(folder, 0o700)
    for name in ("events.db", "payload.key"):
        os.chmod(folder / name, 0o600)
    return tmp_path / "home"


def _map(value: Any, mapping: dict[str, str]) -> Any:
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, list):
        return [_map(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: _map(v, mapping) for k, v in value.items()}
    return value


def test_the_fixture_is_a_v1_archive_that_verifies() -> None:
    conn = sqlite3.connect(f"{(FIXTURE / 'events.db').absolute().as_uri()}?mode=ro", uri=True)
    assert conn.execute("SELECT value FROM meta WHERE name = 'format_version'").fetchone() == ("1",)
    key = bytes.fromhex((FIXTURE / "payload.key").read_text().strip())
    report = verify_database(conn, key)
    assert report.ok and report.events_checked == 11


def test_migrate_keeps_the_v1_file_and_maps_every_event(home: Path) -> None:
    folder = home / "archive"
    before = file_blake3(folder / "events.db")
    v1 = sqlite3.connect(folder / "events.db")
    old_events = list(v1_events(v1))
    v1_head = Head(*v1.execute("SELECT seq, chain FROM head").fetchone())
    v1.close()
    done = migrate(folder)
    assert (done.v1_head_seq, done.v1_head_chain) == (v1_head.seq, v1_head.chain)
    assert file_blake3(folder / V1_DB_NAME) == before  # kept, never written again
    assert (folder / V1_KEY_NAME).exists() and not (folder / "payload.key").exists()
    store = EventStore.open(folder)
    assert store.store_id != v1_head.chain
    try:
        report = verify_database(store.conn, store.key, vkey=store.vkey)
        assert report.ok and report.as_dict()["authenticity"] == "verified", report.problem
        first = store.event(1)
        assert first is not None and first.type == "migrated_from"
        assert first.body["v1_head_seq"] == v1_head.seq
        assert first.body["v1_head_chain"] == v1_head.chain
        assert first.body["v1_file_blake3"] == before
        assert first.body["vkey"] == store.vkey
        meta = dict(store.conn.execute("SELECT name, value FROM meta"))
        assert meta["migrated_from"] == first.body["v1_store_id"]
        new_events = list(iter_events(store.conn, 1, part_types=None))
        assert len(new_events) == len(old_events)
        mapping: dict[str, str] = {}
        for old, new in zip(old_events, new_events, strict=True):
            assert new.seq == old.seq + 1
            assert (new.time, new.type, new.session) == (old.time, old.type, old.session)
            assert len(old.part_digests) == len(new.part_digests)
            for a, b in zip(old.part_digests, new.part_digests, strict=True):
                assert old.parts[a] == new.parts[b]  # the same part bytes
                assert mapping.setdefault(a, b) == b
            assert _map(old.body, mapping) == new.body
            assert _map(decode(old.envelope.key), mapping) == decode(new.envelope.key)
        # a part named by two v1 events is one v2 payload: deduplicated through the lookup
        assert len(set(mapping.values())) == len(mapping)
        assert (
            store.conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()[0]
            == len(old_events) + 1
        )
    finally:
        store.close()


def test_a_v1_archive_that_does_not_verify_is_not_migrated(home: Path) -> None:
    folder = home / "archive"
    conn = sqlite3.connect(folder / "events.db")
    conn.execute("DROP TRIGGER payloads_immutable")
    conn.execute(
        "UPDATE payloads SET body = CAST('{\"forged\":1}' AS BLOB) WHERE digest = (SELECT min(digest) FROM payloads)"
    )
    conn.commit()
    conn.close()
    with pytest.raises(MigrationRefused, match="does not verify"):
        migrate(folder)
    assert (folder / "events.db").exists() and not (folder / V1_DB_NAME).exists()


def test_a_v2_archive_and_a_second_migration_are_refused(home: Path) -> None:
    folder = home / "archive"
    migrate(folder)
    with pytest.raises(MigrationRefused, match="migrated before"):
        migrate(folder)
    (folder / V1_DB_NAME).rename(folder / "aside.db")
    with pytest.raises(MigrationRefused, match="already format version 2"):
        migrate(folder)


def test_the_migrate_command(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from archive_provider.cli import main

    assert main(["--home", str(home), "--json", "migrate"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["v1_head"]["seq"] == 11 and data["events"] == 12
    assert main(["--home", str(home), "--json", "verify", "--key", data["vkey"]]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert verified["log"]["authenticity"] == "verified"
    # the projections were rebuilt as the events were appended: recall finds the v1 text
    assert main(["--home", str(home), "--json", "search", "Ziggy"]) == 0
    assert "Ziggy" in capsys.readouterr().out
    # the command refuses a migrated archive (before it takes in any spill)
    assert main(["--home", str(home), "--json", "migrate"]) == 1
    assert "migrated before" in json.loads(capsys.readouterr().out)["error"]


def test_the_lineage_of_a_migrated_archive(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from archive_provider.cli import main

    folder = home / "archive"
    migrate(folder)
    v1 = str(folder / V1_DB_NAME)
    assert main(["--home", str(home), "--json", "verify", "--lineage", v1]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lineage"] == {"ok": True, "events": 11, "problem": None, "v1_seq": None}
    # a v1 event whose session is changed afterwards (and re-chained from there) is caught:
    # the v1 file no longer verifies against the head migrated_from names
    conn = sqlite3.connect(v1)
    conn.execute("DROP TRIGGER events_append_only_update")
    conn.execute("UPDATE events SET session = 'other' WHERE seq = 11")
    conn.commit()
    conn.close()
    assert main(["--home", str(home), "--json", "verify", "--lineage", v1]) == 1
    data = json.loads(capsys.readouterr().out)
    assert not data["lineage"]["ok"] and "does not verify" in data["lineage"]["problem"]


def test_the_lineage_against_another_v1_file_fails(home: Path, tmp_path: Path) -> None:
    from archive_provider.storage.migrate import lineage

    folder = home / "archive"
    migrate(folder)
    other = tmp_path / "other.db"  # the same store cut back to seq 5: it verifies on its own
    shutil.copy(FIXTURE / "events.db", other)
    conn = sqlite3.connect(other, isolation_level=None)
    conn.execute("DROP TRIGGER events_append_only_delete")
    conn.execute("DELETE FROM events WHERE seq > 5")
    conn.execute("UPDATE head SET seq = 5, chain = (SELECT chain FROM events WHERE seq = 5)")
    conn.close()
    key = bytes.fromhex((FIXTURE / "payload.key").read_text().strip())
    assert verify_database(sqlite3.connect(other), key).ok
    store = EventStore.open(folder)
    try:
        found = lineage(store, other, key)
    finally:
        store.close()
    assert not found.ok and "does not hold the head" in (found.problem or "")


def test_a_migration_stopped_before_the_witness_moved_names_the_way_to_finish(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fault after the v2 archive is made and before the witness moves to it (the state
    ``migrate`` leaves without its witness step) left every open refusing with "the archive
    was replaced ... restore the newest backup": now the refusal says a migration stopped,
    and its way out (lineage check, then ``witness accept``) opens the archive whole."""
    from archive_provider import ArchiveProvider
    from archive_provider.cli import main
    from archive_provider.storage.store import archive_dir
    from archive_provider.storage.witness import Witness

    conn = sqlite3.connect(archive_dir(home) / "events.db")
    store_id = conn.execute("SELECT value FROM meta WHERE name = 'store_id'").fetchone()[0]
    seq, chain = conn.execute("SELECT seq, chain FROM head").fetchone()
    conn.close()
    assert Witness.for_home(home).write(store_id, seq, chain)  # as 0.1.0 left it: the v1 head
    migrate(archive_dir(home))  # made and filled, the witness never moved

    def checkpoint() -> str:
        provider = ArchiveProvider()
        provider.initialize("s1", hermes_home=str(home), platform="cli")
        try:
            return provider.on_pre_compress(
                [{"role": "user", "content": "after"}], require_checkpoint=True
            )
        finally:
            provider.shutdown()

    with pytest.raises(Exception, match="the migration stopped before it finished") as refused:
        checkpoint()
    v1_file = archive_dir(home) / V1_DB_NAME
    assert f"verify --lineage {v1_file}" in str(refused.value)
    assert "witness accept" in str(refused.value)
    assert main(["--home", str(home), "verify", "--lineage", str(v1_file)]) == 0
    reason = ["--reason", "migration finished"]
    assert main(["--home", str(home), "witness", "accept", *reason]) == 0
    capsys.readouterr()
    assert "Archive checkpoint" in checkpoint()
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        texts = [
            decode(store.payload(d) or b"null")
            for e in store.events()
            if e.type == "turn"
            for d in e.messages
        ]
    finally:
        store.close()
    assert {"role": "user", "content": "A blue heron sat by the river"} in texts


def _assert_flat(what: str, runs: dict[int, ChildRun], bound: float) -> None:
    small, large = runs[SMALL_SESSIONS], runs[LARGE_SESSIONS]
    growth = large.peak_mib - small.peak_mib
    assert growth <= bound, (
        f"{what}'s peak grew by {growth:.1f} MiB from {small.peak_mib:.1f} MiB "
        f"({events_in(SMALL_SESSIONS)} events) to {large.peak_mib:.1f} MiB "
        f"({events_in(LARGE_SESSIONS)} events)"
    )
    assert large.peak_mib <= CEILING_MIB


def test_migrate_runs_in_bounded_memory_and_keeps_every_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """v1 archives of 2k and 20k events (tests/v1_writer.py), each migrated by the command
    in a child that reports its own peak (VmHWM), then checked against its v1 file (``verify
    --lineage``) the same way: the larger may not take more than noise above the smaller;
    the migrated archive verifies with every event and every text."""
    homes = {n: tmp_path / f"home-{n}" for n in (SMALL_SESSIONS, LARGE_SESSIONS)}
    runs = {}
    for sessions, home in homes.items():
        assert write_v1_archive(home / "archive", sessions) == events_in(sessions)
        runs[sessions] = cli_child(home, "--json", "migrate")
        assert runs[sessions].returncode == 0, runs[sessions].stdout + runs[sessions].stderr
    _assert_flat("migrate", runs, GROWTH_MIB)
    # the lineage check reads both logs side by side (FORMAT.md 19), one event at a time
    lineage_runs = {
        sessions: cli_child(
            home, "--json", "verify", "--jobs", "1", "--lineage", str(home / "archive" / V1_DB_NAME)
        )
        for sessions, home in homes.items()
    }
    for run in lineage_runs.values():
        assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout)["lineage"]["ok"]
    _assert_flat("verify --lineage", lineage_runs, LINEAGE_GROWTH_MIB)
    home, events = homes[LARGE_SESSIONS], events_in(LARGE_SESSIONS)
    done = json.loads(runs[LARGE_SESSIONS].stdout)
    assert done["v1_head"]["seq"] == events and done["events"] == events + 1
    from archive_provider.cli import main

    assert main(["--home", str(home), "--json", "verify", "--key", done["vkey"]]) == 0
    log = json.loads(capsys.readouterr().out)["log"]
    assert log["authenticity"] == "verified" and log["events_checked"] == events + 1
    # every message, in its session, turn and place (the documented audit view)
    conn = sqlite3.connect(f"{(home / 'archive' / 'events.db').as_uri()}?mode=ro", uri=True)
    try:
        found = conn.execute(
            "SELECT session, turn, position, role, text FROM audit_turns ORDER BY seq, position"
        ).fetchall()
    finally:
        conn.close()
    assert found == [
        (f"sess-{session:05d}", turn, position, message["role"], message["content"])
        for session in range(1, LARGE_SESSIONS + 1)
        for turn in range(1, TURNS_PER_SESSION + 1)
        for position, message in enumerate(messages(session, turn), start=1)
    ]


def test_forget_after_a_migration_names_the_kept_v1_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The migrated turns (bodies naming their messages, FORMAT.md 13.4) are erased from the
    new archive, which verifies with the erasure; the v1 file migrate kept still holds the
    texts, and no erasure reaches it: forget lists it, as it lists host copies."""
    from archive_provider.cli import main

    folder = home / "archive"
    assert main(["--home", str(home), "migrate"]) == 0
    capsys.readouterr()
    forget = ["forget", "--session", "sess-1", "--reason", "request 7", "--yes"]
    assert main(["--home", str(home), "--json", *forget]) == 0
    receipt = json.loads(capsys.readouterr().out)
    assert receipt["payloads"] > 0
    assert b"Ziggy" not in (folder / "events.db").read_bytes()
    assert b"Ziggy" in (folder / V1_DB_NAME).read_bytes()
    assert [f["path"] for f in receipt["host_copies"]["files"]] == ["archive/events.v1.db"]
    assert main(["--home", str(home), "--json", "verify"]) == 0
    assert json.loads(capsys.readouterr().out)["log"]["erasures"]
    assert main(["--home", str(home), "search", "Ziggy"]) == 1


def test_a_copy_stopped_part_way_fails_its_lineage_and_the_documented_way_back_migrates(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/RECOVER.md, "A migration stopped half-way", step 3: the copy fails after its
    first transaction; the v1 file is untouched, a second migrate refuses, the lineage check
    says the new archive ends early, and the way back the page gives (move the v2 files
    aside, rename the v1 files back) migrates again to an archive whose lineage passes."""
    from archive_provider.cli import main

    folder = home / "archive"
    before = file_blake3(folder / "events.db")

    def disk_full(seq: int) -> None:  # called after each committed transaction of the copy
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        migrate(folder, progress=disk_full)
    assert file_blake3(folder / V1_DB_NAME) == before
    with pytest.raises(MigrationRefused, match="stopped half-way"):
        migrate(folder)
    check = ["--home", str(home), "--json", "verify", "--lineage", str(folder / V1_DB_NAME)]
    assert main(check) == 1
    found = json.loads(capsys.readouterr().out)["lineage"]
    assert not found["ok"] and "ends early" in found["problem"] and found["v1_seq"] > 1

    aside = home / "aside"
    aside.mkdir()
    for name in os.listdir(folder):
        if name.startswith("events.db") or name in ("store.key", "signing.key"):
            os.rename(folder / name, aside / name)
    os.rename(folder / V1_DB_NAME, folder / "events.db")
    os.rename(folder / V1_KEY_NAME, folder / "payload.key")
    assert main(["--home", str(home), "--json", "migrate"]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == 12
    assert main(check) == 0
    assert json.loads(capsys.readouterr().out)["lineage"] == {
        "ok": True,
        "events": 11,
        "problem": None,
        "v1_seq": None,
    }
