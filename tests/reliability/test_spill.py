"""Nothing accepted is dropped (issue 20): the bounded queue, the durable spill, the loss window.

Real child processes drive the provider and are shut down the ordinary way or SIGKILLed;
the test then opens the archive as the next process would (projections, proof, spill
take-in) and counts what is there.
"""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from archive_provider import ArchiveProvider
from archive_provider.domain.clock import utc_now
from archive_provider.format.canonical import decode
from archive_provider.host.settings import (
    SettingError,
    Settings,
    check_value,
    load_settings,
    save_settings,
)
from archive_provider.host.spill_kinds import turn_entry
from archive_provider.projections.builtin import transcript_digests
from archive_provider.storage.spill import (
    HEADER_BYTES,
    MAGIC,
    Spill,
    damaged_paths,
    read_records,
    segment_paths,
)
from archive_provider.storage.store import EventStore, archive_dir
from archive_provider.storage.writer import MAX_BATCH_JOBS

from .conftest import CHILD, RECEIPT, env_int, events, flush, home_spill_key, raw, verify_home
from .test_crash import Zygote, check_after_kill

ROOT = Path(__file__).resolve().parents[2]


def run_burst(home: Path, turns: int, sessions: int, **settings: str) -> tuple[int, int, int]:
    """The burst in a child process, ended by an ordinary shutdown: (spilled, most queued, bound)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.update({f"ARCHIVE_{k.upper()}": v for k, v in settings.items()})
    done = subprocess.run(
        [sys.executable, str(CHILD), "burst", str(home), str(turns), str(sessions)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()
    assert words[0] == "burst", done.stdout
    return int(words[1]), int(words[2]), int(words[3])


def take_in(home: Path) -> None:
    """Open the archive as the next process does and wait until the spill is in."""
    provider = ArchiveProvider()
    provider.initialize("after", hermes_home=str(home), platform="cli")
    try:
        assert provider.core.writer is not None and provider.core.writer.flush(900)
    finally:
        provider.shutdown()


def expected_burst(turns: int, sessions: int) -> dict[str, list[dict[str, Any]]]:
    """The transcripts crash_child.burst sent (the same recipe)."""
    transcripts: dict[str, list[dict[str, Any]]] = {}
    for turn in range(turns):
        session = f"b{turn % sessions}"
        messages = transcripts.setdefault(session, [{"role": "system", "content": "sys"}])
        messages += [
            {"role": "user", "content": f"user {session} {turn}"},
            {"role": "assistant", "content": f"answer {session} {turn} " + "y" * 300},
        ]
    return transcripts


def archived_transcripts(home: Path, sessions: list[str]) -> dict[str, list[Any]]:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return {
            session: [
                decode(store.payload(d) or b"null") for d in transcript_digests(store.conn, session)
            ]
            for session in sessions
        }
    finally:
        store.close()


def turns_in_order(home: Path) -> list[tuple[str, int]]:
    """(session, turn ordinal) of every turn event, in log order."""
    return [(e.session, e.key["turn"]) for e in events(home) if e.type == "turn"]


def check_burst(home: Path, turns: int, sessions: int) -> None:
    expected = expected_burst(turns, sessions)
    order = turns_in_order(home)
    assert len(order) == turns, f"{turns - len(order)} of {turns} turns were lost"
    assert archived_transcripts(home, sorted(expected)) == expected
    for session in expected:  # every turn once, in the order it was accepted
        ordinals = [n for s, n in order if s == session]
        assert ordinals == list(range(1, len(expected[session]) // 2 + 1))
    assert not segment_paths(archive_dir(home)), "the spill is removed once it is in"
    assert verify_home(home).ok


@pytest.mark.timeout(1200)
def test_the_burst_of_issue_20_loses_nothing_across_shutdown_and_restart(tmp_path: Path) -> None:
    # 20,000 whole-transcript turns accepted far faster than the writer commits them,
    # then the ordinary shutdown: main archived 11,592 and dropped the rest
    home = tmp_path / "home"
    spilled, _, _ = run_burst(home, 20_000, 40, drain_timeout_s="0.5")
    assert segment_paths(archive_dir(home)), "what the drain could not commit is spilled"
    take_in(home)
    check_burst(home, 20_000, 40)


@pytest.mark.timeout(1200)
def test_a_larger_burst_under_a_small_memory_bound_spills_in_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spilled, most, bound = run_burst(
        home,
        30_000,
        7,
        queue_max_events="100",
        queue_max_bytes="65536",
        drain_timeout_s="0.3",
    )
    assert bound == 100 and most <= bound, "the queue in memory stays within its bound"
    assert spilled > 10_000, "beyond the bound accepted turns went to the spill"
    take_in(home)
    check_burst(home, 30_000, 7)


def spill_of(home: Path, count: int, session: str = "sp") -> list[dict[str, Any]]:
    """Write ``count`` turns straight into a spill segment, as a shutdown would."""
    spill = Spill(archive_dir(home), key=lambda: home_spill_key(home))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    jobs = []
    for turn in range(count):
        messages = [
            *messages,
            {"role": "user", "content": f"spilled {turn}"},
            {"role": "assistant", "content": f"reply {turn}"},
        ]
        jobs.append((turn_entry(session, messages, False, True), utc_now()))
    with spill.lock:
        spill.prepend(jobs)
    return messages


def test_events_taken_in_from_the_spill_carry_the_time_they_were_accepted(
    home: Path,
) -> None:
    with freeze_time("2026-11-30T07:00:00Z"):
        take_in(home)  # the archive the spill was written beside (its head is earlier)
    with freeze_time("2026-11-30T08:00:00Z"):
        spill_of(home, 5)
    with freeze_time("2026-12-01T09:30:00Z"):
        take_in(home)
    log = events(home)
    turns = [e for e in log if e.type == "turn"]
    assert len(turns) == 5 and {e.time for e in turns} == {"2026-11-30T08:00:00.000000Z"}
    started = [e for e in log if e.type == "session_started" and e.seq > turns[0].seq]
    assert started and all(e.time.startswith("2026-12-01T09:30") for e in started)
    assert started[0].seq > turns[-1].seq, "the spill is appended before anything new"


def test_once_the_spill_is_in_new_work_queues_in_memory_again(
    home: Path, providers: Callable[..., ArchiveProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    spill_of(home, 20)
    monkeypatch.setenv("ARCHIVE_CRON_TURNS", "false")  # a cron job's turns are archived by default
    quiet = providers(session="cron", agent_context="cron")  # writes nothing of its own
    writer = quiet.core.writer
    assert writer is not None and writer.flush(60) and not segment_paths(archive_dir(home))
    provider = providers(session="next")  # the same writer
    provider.sync_turn("q", "a", session_id="next", messages=[{"role": "user", "content": "q"}])
    assert provider.core.writer is writer and writer.flush(60)
    assert writer.spilled == 0, "the spill is empty: nothing more goes through it"
    assert [e.type for e in events(home)][-2:] == ["session_started", "turn"]


def test_a_spill_taken_in_twice_adds_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a crash after the commit and before the removal leaves the segment behind: the meta
    # row written with the commit says how far it was taken in. (Identities alone would not
    # do: a turn's includes its ordinal, and an old transcript re-sent reads as a rewind.)
    from archive_provider.storage import writer as writer_module

    spill_of(home, 30)
    (segment,) = segment_paths(archive_dir(home))

    def crashed(path: Path) -> None:
        raise OSError("the process died before the removal")

    monkeypatch.setattr(writer_module, "remove", crashed)
    take_in(home)
    first = [e.envelope.identity for e in events(home) if e.type == "turn"]
    assert len(first) == 30 and segment.exists()
    monkeypatch.undo()
    take_in(home)
    take_in(home)
    assert [e.envelope.identity for e in events(home) if e.type == "turn"] == first
    assert not segment_paths(archive_dir(home)) and verify_home(home).ok
    conn = raw(home)
    rows = conn.execute("SELECT count(*) FROM meta WHERE name LIKE 'spill_taken:%'").fetchone()
    conn.close()
    assert rows[0] <= 1, "rows of removed segments are dropped"


def test_a_taken_in_segment_copied_back_adds_nothing(home: Path) -> None:
    # a genuine segment restored from a backup after it was taken in (its meta row long
    # dropped): the log itself says the segment is in, so the copy adds nothing; a forged
    # segment beside it is still set aside
    from archive_provider.commands.status import collect
    from archive_provider.host.spill_kinds import take_in_spill

    from .test_trust_boundary import plant_segment

    take_in(home)
    spill_of(home, 5)
    (segment,) = segment_paths(archive_dir(home))
    backup = segment.read_bytes()
    assert take_in_spill(home) == 1
    before = [e.envelope.identity for e in events(home)]
    assert sum(1 for e in events(home) if e.type == "turn") == 5
    conn = raw(home)
    assert not conn.execute("SELECT 1 FROM meta WHERE name LIKE 'spill_taken:%'").fetchall()
    conn.close()
    for name in (segment, segment.with_name(f"{900:012d}.spill")):  # its own name, or later
        name.write_bytes(backup)
        assert take_in_spill(home) == 1
        added = [(e.type, e.body) for e in events(home)[len(before) :]]
        assert not added, f"a copy of a segment taken in was replayed into the log: {added}"
        assert not segment_paths(archive_dir(home)) and verify_home(home).ok
        status = collect(context(home))["spill"]
        assert (status["segments"], status["damaged"]) == (0, [])
    length = int.from_bytes(backup[HEADER_BYTES : HEADER_BYTES + 4], "big")
    body = backup[HEADER_BYTES + 36 : HEADER_BYTES + 36 + length]  # a genuine record's body
    forged = plant_segment(home, 901, [body], MAGIC)  # under a check made without the key
    take_in_spill(home)
    assert not forged.exists() and len(damaged_paths(archive_dir(home))) == 1
    assert sum(1 for e in events(home) if e.type == "turn") == 5


def test_records_nothing_authenticates_enter_the_log_only_when_an_operator_accepts_them(
    home: Path,
) -> None:
    # a writer whose witness folder could not be used keys nothing: its segment is set aside
    # at the next open; `spill show` lets the operator review it and `spill accept` takes
    # it in after an event that says who and why, once
    import json

    from .test_attacks import cli

    take_in(home)
    unkeyed = Spill(archive_dir(home), key=lambda: None)  # what spill_key gives such a writer
    messages: list[dict[str, Any]] = []
    jobs = []
    for turn in range(3):
        messages = [
            *messages,
            {"role": "user", "content": f"said while the witness was away {turn}"},
            {"role": "assistant", "content": f"reply {turn}"},
        ]
        jobs.append((turn_entry("away", messages, False, True), utc_now()))
    with unkeyed.lock:
        unkeyed.prepend(jobs)
    take_in(home)
    assert not [e for e in events(home) if e.type == "turn"], "never archived on its own"
    (kept,) = damaged_paths(archive_dir(home))

    shown = cli(home, "--json", "spill", "show", kept.name)
    assert shown.returncode == 0, shown.stderr
    (described,) = json.loads(shown.stdout)["kept"]
    assert (described["checked_with"], described["kinds"]) == ("nothing", {"turn": 3})
    assert "witness was away 2" in json.loads(shown.stdout)["records"][2]["args"]

    refused = cli(home, "spill", "accept", kept.name, "--reason", "mine")
    assert refused.returncode == 2 and "--yes" in refused.stderr  # not without confirmation
    accepted = cli(
        home, "spill", "accept", kept.name, "--reason", "mine: witness disk was full", "--yes"
    )
    assert accepted.returncode == 0, accepted.stderr
    log = events(home)
    (event,) = [e for e in log if e.type == "spill_accepted"]
    assert event.body["reason"] == "mine: witness disk was full" and event.body["user"]
    assert event.body["kinds"] == {"turn": 3}
    turns = [e for e in log if e.type == "turn"]
    assert len(turns) == 3 and all(t.seq > event.seq for t in turns)
    assert verify_home(home).ok

    again = cli(home, "spill", "accept", kept.name, "--reason", "twice", "--yes")
    assert again.returncode == 0 and "0 events added" in again.stdout, again.stdout
    assert len(events(home)) == len(log), "a second acceptance adds nothing"
    assert "accepted into the log at seq" in cli(home, "spill", "show").stdout


@pytest.mark.parametrize("damage", ["torn tail", "changed record", "no header"])
def test_a_damaged_spill_is_reported_and_kept_aside(home: Path, damage: str) -> None:
    spill_of(home, 10)
    (segment,) = segment_paths(archive_dir(home))
    data = bytearray(segment.read_bytes())
    offsets = [HEADER_BYTES, *(r.end for r in read_records(segment, key=home_spill_key(home)))]
    if damage == "torn tail":
        data = data[: offsets[-1] - 7]  # the last record cut short, as a crash mid-write would
        good = 9
    elif damage == "changed record":
        data[offsets[6] + 40] ^= 0x01  # a bit of the seventh record's body
        good = 6
    else:
        data = data[:5]
        good = 0
    segment.write_bytes(bytes(data))
    take_in(home)
    log = events(home)
    assert sum(1 for e in log if e.type == "turn") == good  # what precedes the damage is in
    reports = [e for e in log if e.type == "write_failed" and e.body["hook"] == "spill"]
    assert len(reports) == 1 and "damaged" in reports[0].body["error"]
    (kept,) = damaged_paths(archive_dir(home))
    assert kept.read_bytes() == bytes(data), "the damaged segment is kept, byte for byte"
    assert not segment_paths(archive_dir(home))
    from archive_provider.commands.status import collect

    status = collect(context(home))
    assert status["spill"]["damaged"] == [kept.name]


@pytest.mark.parametrize("entry", ["link to another profile's segment", "fifo"])
def test_a_spill_entry_that_is_not_a_regular_file_is_set_aside_not_read(
    tmp_path: Path, home: Path, entry: str
) -> None:
    # a link would take another profile's accepted work into this log (and a FIFO would
    # hang the writer on open): like the store and its key, the spill reads only its own files
    folder = archive_dir(home) / "spill"
    folder.mkdir(parents=True, mode=0o700)
    path = folder / "000000000001.spill"
    if entry == "fifo":
        os.mkfifo(path, 0o600)
    else:
        other = tmp_path / "other"
        spill_of(other, 3, session="other-profile")
        (foreign,) = segment_paths(archive_dir(other))
        path.symlink_to(foreign)
    take_in(home)
    log = events(home)
    assert not [e for e in log if e.session == "other-profile"]
    reports = [e for e in log if e.type == "write_failed" and e.body["hook"] == "spill"]
    assert len(reports) == 1
    said = "not a regular file" if entry == "fifo" else "is a symbolic link"
    assert said in reports[0].body["error"], reports[0].body["error"]
    (kept,) = damaged_paths(archive_dir(home))
    assert kept.is_symlink() if entry != "fifo" else stat.S_ISFIFO(os.lstat(kept).st_mode)
    assert not segment_paths(archive_dir(home)) and verify_home(home).ok


def context(home: Path) -> Any:
    from argparse import Namespace

    from archive_provider.commands import CommandContext

    return CommandContext(home=home, json=True, args=Namespace())


def test_status_shows_the_spill_waiting(home: Path) -> None:
    from archive_provider.commands.status import _human, collect

    spill_of(home, 3)
    status = collect(context(home))
    assert status["spill"]["segments"] == 1 and status["spill"]["bytes"] > HEADER_BYTES
    assert "Spill: 1 segment(s)" in _human(status)
    take_in(home)
    assert collect(context(home))["spill"]["segments"] == 0


def test_nothing_in_memory_overtakes_the_spill(
    home: Path, providers: Callable[..., ArchiveProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a tiny bound: turns alternate between memory and the spill; a required checkpoint and
    # a memory write in between must land after every turn accepted before them
    monkeypatch.setenv("ARCHIVE_QUEUE_MAX_EVENTS", "3")
    provider = providers(session="o")
    messages: list[dict[str, Any]] = []
    accepted: list[tuple[str, int]] = []
    for turn in range(1, 301):
        messages = [
            *messages,
            {"role": "user", "content": f"q {turn}"},
            {"role": "assistant", "content": f"a {turn}"},
        ]
        provider.sync_turn(f"q {turn}", f"a {turn}", session_id="o", messages=messages)
        accepted.append(("turn", turn))
        if turn % 100 == 0:
            provider.on_memory_write("add", "memory", f"fact {turn}", {"session_id": "o"})
            accepted.append(("memory_write", turn))
    writer = provider.core.writer
    assert writer is not None and writer.spilled > 0
    receipt = provider.on_pre_compress(messages, require_checkpoint=True)
    assert RECEIPT.search(receipt)
    assert writer.flush(120)
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        seen = []
        for e in store.events():
            if e.type == "turn":
                seen.append(("turn", e.key["turn"]))
            elif e.type == "memory_write":
                fact = decode(store.payload(e.part_digests[0]) or b"null")
                seen.append(("memory_write", int(str(fact).split()[1])))
            elif e.type == "checkpoint":
                seen.append(("checkpoint", 0))
    finally:
        store.close()
    assert seen == [*accepted, ("checkpoint", 0)]


def test_queue_and_spill_settings_are_checked() -> None:
    assert Settings().queue_max_events == 2_000 and Settings().spill_fsync_s == 1.0
    for name, bad in (
        ("queue_max_events", 0),
        ("queue_max_events", "1.5"),
        ("queue_max_bytes", 1000),
        ("spill_fsync_s", -1.0),
        ("spill_fsync_s", 3600.0),
        ("journal_every_event", "sometimes"),
    ):
        with pytest.raises(SettingError, match=name):
            check_value(name, bad)
    assert check_value("queue_max_bytes", "65536") == 65536
    assert check_value("spill_fsync_s", 0) == 0.0
    assert check_value("journal_every_event", "on") is True


def test_a_bad_setting_falls_back_to_its_default_with_an_error(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ARCHIVE_QUEUE_MAX_EVENTS", "0")
    monkeypatch.setenv("ARCHIVE_SPILL_FSYNC_S", "0.5")
    assert load_settings(home) == Settings(spill_fsync_s=0.5)
    provider = ArchiveProvider()
    provider.initialize("s", hermes_home=str(home), platform="cli")
    try:
        assert provider.core.settings == Settings(spill_fsync_s=0.5)
        assert "queue_max_events = '0' is out of range" in caplog.text
    finally:
        provider.shutdown()


# -- SIGKILL: the stated loss window ------------------------------------------------------

SPILL_KILLS = env_int("ARCHIVE_SPILL_KILLS", 24)
LOSS_BOUND = 40 + MAX_BATCH_JOBS  # queue_max_events in the worker, plus one batch in flight


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sigkill_loses_no_more_than_the_stated_window(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("ARCHIVE_CRASH_SEED", "20261201")))
    zygote = Zygote()
    worst = {True: 0, False: 0}
    kills = 0
    try:
        for kill in range(SPILL_KILLS):
            journal = kill % 2 == 0
            home = tmp_path / f"home{kill}"
            zygote.send(f"spill {home} {kill} {int(journal)}")
            line = zygote.readline()
            assert line.startswith("pid "), line
            pid = int(line.split()[1])
            time.sleep(rng.uniform(0.3, 2.5))
            os.kill(pid, signal.SIGKILL)
            lines = zygote.reap(pid)
            kills += 1
            last: dict[str, int] = {}
            receipts = []
            for text in lines:
                words = text.split()
                if words[0] == "accepted":
                    last[words[2]] = int(words[3])
                else:
                    match = RECEIPT.search(text)
                    assert match, text
                    receipts.append((match.group(1), int(match.group(2)), int(match.group(3))))
            take_in(home)
            check_after_kill(home, receipts)  # verifies, and every receipt's checkpoint is there
            lost = 0
            for session, turn in last.items():
                texts = archived_user_turns(home, session)
                accepted = [n for n in range(1, turn + 1) if n % 3 == int(session[-1])]
                missing = [n for n in accepted if n not in texts]
                # what is lost is the newest accepted work, never a gap in the middle
                assert missing == accepted[len(accepted) - len(missing) :], (session, missing)
                lost += len(missing)
            worst[journal] = max(worst[journal], lost)
            assert lost == 0 if journal else lost <= LOSS_BOUND, (journal, lost)
    finally:
        zygote.close()
    print(
        f"\n{kills} SIGKILLs: most accepted turns lost, journal off {worst[False]}, on {worst[True]}"
    )
    assert kills == SPILL_KILLS


def archived_user_turns(home: Path, session: str) -> set[int]:
    found = set()
    for message in archived_transcripts(home, [session])[session]:
        if isinstance(message, dict) and message.get("role") == "user":
            found.add(int(str(message["content"]).split()[2]))
    return found


def test_the_spill_file_is_private_and_holds_only_what_is_new(home: Path) -> None:
    spill_of(home, 2)
    (segment,) = segment_paths(archive_dir(home))
    assert segment.stat().st_mode & 0o777 == 0o600
    assert (archive_dir(home) / "spill").stat().st_mode & 0o777 == 0o700
    records = list(read_records(segment, key=home_spill_key(home)))
    assert [r.kind for r in records] == ["turn", "turn"]
    assert records[1].args["base"] == 3 and len(records[1].args["rows"]) == 2


# -- a spilled job rebuilds exactly the direct path's events (authors, masks, rewinds) --------

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


def host_session(provider: ArchiveProvider) -> None:
    """One session as main's host drives it: two authors, host masks, an /undo, memory, end."""
    m1: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "my token is abc123...wxyz, use it"},
        {"role": "assistant", "content": "set password=*** for you"},
    ]
    m2 = [*m1, {"role": "user", "content": "and then?"}, {"role": "assistant", "content": "done"}]
    m3 = [*m2, {"role": "user", "content": "delete it"}, {"role": "assistant", "content": "gone"}]
    m4 = [*m2, {"role": "user", "content": "keep it"}, {"role": "assistant", "content": "kept"}]
    provider.on_turn_start(1, "hello", author_id="U1", author_name="Ada", author_is_bot=False)
    provider.sync_turn("my token", "set", session_id="s1", messages=m1)
    bot = {"id": "B7", "name": "helper", "is_bot": True, "platform": "discord"}
    provider.sync_turn("and then?", "done", session_id="s1", messages=m2, turn_author=bot)
    provider.sync_turn("delete it", "gone", session_id="s1", messages=m3)
    provider.on_session_switch("s1", parent_session_id="s1", rewound=True, reason="undo")
    provider.sync_turn("keep it", "kept", session_id="s1", messages=m4)
    provider.on_memory_write(
        "add", "memory", "the user keeps [redacted]", {"session_id": "s1", "old_text": "k=***"}
    )
    provider.on_delegation("rotate sk-pro...7890 now", "rotated", child_session_id="c1")
    provider.on_post_tool_call(
        tool_name="terminal",
        args={"command": "export TOKEN=sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789"},
        result="ok",
        session_id="s1",
        tool_call_id="call_1",
        duration_ms=3,
        status="ok",
    )
    provider.on_session_end([*m4, {"role": "user", "content": "bye"}])


def readable_log(home: Path) -> list[tuple[Any, ...]]:
    """Every event with each digest replaced by what it names (the two homes' keys differ)
    and hook times left out (the time an event keeps has its own test above)."""
    store = EventStore.open(archive_dir(home), create=False, readonly=True)

    def resolve(value: Any) -> Any:
        if isinstance(value, str) and len(value) == 64:
            body = store.payload(value)
            return value if body is None else resolve(decode(body))
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items() if k not in ("at", "host")}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value

    try:
        return [
            (
                e.seq,
                e.type,
                e.session,
                resolve(e.key),
                resolve(e.body),
                resolve(e.author_digest) if e.author_digest else None,  # v2: in the envelope
            )
            for e in store.events()
            if e.session == "s1"
        ]
    finally:
        store.close()


def test_a_spilled_session_rebuilds_the_direct_events_with_authors_masks_and_rewinds(
    tmp_path: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    direct, spilled = tmp_path / "direct", tmp_path / "spilled"
    for where in (direct, spilled):
        # the archive exists before the lock, its setup committed whole: under the short drain
        # budget below, a slow first open (a loaded machine) left the setup's jobs and a
        # shutdown_drain record in the spill, ahead of the records this test counts
        save_settings(where, {"drain_timeout_s": 600})
        providers(where, session="setup").shutdown()
        save_settings(where, {"busy_timeout_s": 0.2, "drain_timeout_s": 0.3})
    host_session(providers(direct, session="s1"))
    assert flush(providers(direct, session="after"), 60)

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(archive_dir(spilled) / "events.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:  # nothing can commit: shutdown spills every job, as accepted
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        provider = providers(spilled, session="s1")
        host_session(provider)
        provider.shutdown()
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=10)
    kinds = [
        r.kind
        for p in segment_paths(archive_dir(spilled))
        for r in read_records(p, key=home_spill_key(spilled))
    ]
    assert kinds == ["session_started", *["turn"] * 3, "session_switched", "turn"] + [
        "memory_write",
        "delegation",
        "tool_call",
        "session_ended",
        "shutdown_drain",  # the drain could not finish: its record comes last
    ]
    assert flush(providers(spilled, session="after"), 60)
    assert not segment_paths(archive_dir(spilled))

    log = readable_log(spilled)
    assert log == readable_log(direct)
    turns = [body for _, kind, _, _, body, _ in log if kind == "turn"]
    authors = [author or {} for _, kind, _, _, _, author in log if kind == "turn"]
    assert [a.get("name") for a in authors] == [
        "Ada",
        "helper",  # sync_turn's turn_author is bound to its own turn
        "Ada",  # then on_turn_start's stands again
        "Ada",
        None,  # on_session_end states no author
    ]
    assert authors[1]["is_bot"] is True and authors[1]["platform"] == "discord"
    assert {m["kind"] for m in turns[0]["host_masks"]} == {"head_tail", "stars"}
    (call,) = [body for _, kind, _, _, body, _ in log if kind == "tool_call"]
    assert "sk-proj-" not in str(call["args"]) and call["result"] == "ok"
    assert [(r["path"], r["kind"]) for r in call["redactions"]] == [
        ("/args/command", "secret_assignment")
    ]
    (write,) = [body for _, kind, _, _, body, _ in log if kind == "memory_write"]
    assert write["host_masks"] == [  # (readable_log leaves out every "at")
        {"path": "/content", "kind": "learned_redacted"},
        {"path": "/metadata/old_text", "kind": "stars"},
    ]
    (delegation,) = [body for _, kind, _, _, body, _ in log if kind == "delegation"]
    assert delegation["host_masks"] == [{"path": "/task", "kind": "head_tail"}]
    (rewind,) = [body for _, kind, _, _, body, _ in log if kind == "turns_rewound"]
    assert rewind["from_message"] == 5 and rewind["detected_by"] == "sync_turn"
    assert [m["content"] for m in rewind["messages"]] == ["delete it", "gone"]
    assert verify_home(spilled).ok


def test_a_v2_archive_takes_in_the_spill_with_the_accepted_times(home: Path) -> None:
    with freeze_time("2026-11-30T07:00:00Z"):  # before the spill: its times are kept
        EventStore.open(archive_dir(home)).close()
    with freeze_time("2026-11-30T08:00:00Z"):
        spill_of(home, 3)
    with freeze_time("2026-12-01T09:30:00Z"):
        take_in(home)
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        turns = [e for e in store.events() if e.type == "turn"]
    finally:
        store.close()
    assert len(turns) == 3 and {e.time for e in turns} == {"2026-11-30T08:00:00.000000Z"}
    assert verify_home(home).ok
