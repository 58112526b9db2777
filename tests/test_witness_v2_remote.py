"""Remote witnesses wired into a v2 archive (docs/FORMAT.md 16.2): the set is log content
(`witness add` / `witness remove --yes`), the writer submits checkpoints in the background
through the submitter the provider hands it, cosignatures are stored, lag and refusals show
in `status` and `verify --witnesses`. Real `hermes-archive witness serve` processes on
127.0.0.1, one killed and restarted.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from archive_provider.cli import main
from archive_provider.format.events import NewEvent
from archive_provider.format.signed_note import Verifier
from archive_provider.host.provider import ArchiveProvider
from archive_provider.storage.store import DB_NAME, EventStore, archive_dir
from archive_provider.storage.threads import ThreadFactory
from archive_provider.storage.witness import Witness
from archive_provider.storage.writer import Writer
from archive_provider.witnesses.client import WitnessLag, WitnessSubmitter
from archive_provider.witnesses.remote import start_submitter
from tests.test_witness_remote import WitnessProcess, keygen

LIVENESS_S = 90.0  # a bound for a loaded CI box, never a performance claim


@pytest.fixture
def witnesses() -> Iterator[Callable[..., WitnessProcess]]:
    started: list[WitnessProcess] = []

    def start(state: Path, log_keys: Sequence[str], port: int = 0) -> WitnessProcess:
        process = WitnessProcess(state, log_keys, port)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def _turn(store: EventStore, turn: int, text: str) -> NewEvent:
    part = store.hasher.part({"content": text, "role": "user"})
    body = {"turn": turn, "messages": [part.digest]}
    return NewEvent("turn", "s1", {"turn": turn}, body, (part,))


def _cli(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main(["--home", str(home), "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIVENESS_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within the liveness bound: {what}")
        time.sleep(0.05)


def _name_and_key(vkey: str) -> tuple[str, int, bytes]:
    """(name, type 0x01, public key) of a cosigner verifier key: its Ed25519 form."""
    key = Verifier.from_vkey(vkey)
    return key.name, 0x01, key.public_key


class Submission:
    """The submitter factory the provider hands its writer, keeping what it started: the
    lag of the latest submitter is what each witness shows."""

    def __init__(self) -> None:
        self.started: list[WitnessSubmitter] = []

    def __call__(self, store: EventStore, threads: ThreadFactory) -> WitnessSubmitter | None:
        submitter = start_submitter(store, threads)
        if submitter is not None:
            self.started.append(submitter)
        return submitter

    def writer(self, home: Path) -> Writer:
        return Writer(archive_dir(home), witness=Witness.for_home(home), submitter_factory=self)

    def lag(self, vkey: str) -> WitnessLag:
        (lag,) = [row for row in self.started[-1].status() if row.vkey == vkey]
        return lag


def _cosigned(folder: Path, name: str) -> int | None:
    """The largest checkpoint size the witness ``name`` cosigned, as the log stores it."""
    conn = sqlite3.connect(f"file:{folder / DB_NAME}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT max(size) FROM cosignatures WHERE name = ?", (name,)
        ).fetchone()[0]
    finally:
        conn.close()


def _append(writer: Writer, turns: range) -> None:
    for turn in turns:
        writer.append_durable(lambda s, t=turn: [_turn(s, t, f"turn {t}")], timeout=30)


def test_remote_witnesses_cosign_in_the_background_and_refuse_a_rewrite(
    tmp_path: Path,
    witnesses: Callable[..., WitnessProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    folder = archive_dir(home)
    store = EventStore.open(folder)
    vkey = store.vkey
    store.close()
    keygen(tmp_path / "w1", "w1.example/witness")
    keygen(tmp_path / "w2", "w2.example/witness")
    w1 = witnesses(tmp_path / "w1", [vkey])
    w2 = witnesses(tmp_path / "w2", [vkey])
    # w2 is given in the Ed25519 form (type 0x01) Go's tools print: the same key, recorded
    # as its cosigner key (type 0x04), whose cosignatures it makes
    w2_ed25519 = Verifier(*_name_and_key(w2.vkey)).vkey
    assert w2_ed25519 != w2.vkey
    for w, given in ((w1, w1.vkey), (w2, w2_ed25519)):
        code, answer = _cli(home, capsys, "witness", "add", w.url, given, "--reason", "offsite")
        assert code == 0 and answer["ok"], answer
    assert sorted(row["vkey"] for row in answer["witnesses"]) == sorted([w1.vkey, w2.vkey])
    code, refused = _cli(home, capsys, "witness", "add", w1.url, vkey, "--reason", "log key")
    assert code == 1 and "own log key" in refused["problem"]  # never the log's own key

    # a removal needs the explicit acceptance; without it nothing is recorded
    code, refused = _cli(home, capsys, "witness", "remove", w2.vkey, "--reason", "test")
    assert code == 2 and "--yes" in refused["error"]

    submission = Submission()
    writer = submission.writer(home)
    _append(writer, range(1, 4))
    head = lambda: writer._verified.seq if writer._verified else 0  # noqa: E731
    for w in (w1, w2):
        _until(lambda w=w: submission.lag(w.vkey).cosigned_size == head(), "both cosign the head")

    w2.kill()  # w1 keeps up; w2's lag and error show, turns and checkpoints go on
    _append(writer, range(4, 7))
    _until(lambda: submission.lag(w1.vkey).cosigned_size == head(), "w1 cosigns the head")
    _until(lambda: submission.lag(w2.vkey).last_error is not None, "w2's failure shows")
    assert submission.lag(w2.vkey).behind
    w2 = witnesses(tmp_path / "w2", [vkey], port=w2.port)  # restarted from its state
    _append(writer, range(7, 8))
    _until(lambda: submission.lag(w2.vkey).cosigned_size == head(), "w2 catches up")
    assert writer.close().complete
    stored = EventStore.open(folder)
    names = {row[0] for row in stored.conn.execute("SELECT name FROM cosignatures")}
    assert {"w1.example/witness", "w2.example/witness"} <= names  # and the local witness
    stored.close()
    code, status = _cli(home, capsys, "status")
    assert all(row["consistent"] for row in status["remote_witnesses"]), status
    shutil.copytree(folder, tmp_path / "before")

    submission = Submission()
    writer = submission.writer(home)
    _append(writer, range(8, 12))  # cosigned by both
    for w in (w1, w2):
        _until(lambda w=w: submission.lag(w.vkey).cosigned_size == head(), "cosigned again")
    assert writer.close().complete

    # the attacker: an older copy, rewritten with the archive's own key, accepted locally
    shutil.rmtree(folder)
    shutil.copytree(tmp_path / "before", folder)
    fork = EventStore.open(folder)
    for turn in range(8, 20):
        fork.append([_turn(fork, turn, f"rewritten {turn}")], durable=True)
    fork.close()
    code, _ = _cli(home, capsys, "witness", "accept", "--reason", "tricked into it")
    assert code == 0
    submission = Submission()
    writer = submission.writer(home)
    _append(writer, range(20, 21))
    for w in (w1, w2):
        _until(lambda w=w: submission.lag(w.vkey).last_error is not None, "the witness refuses")
        lag = submission.lag(w.vkey)
        assert lag.error_kind in ("inconsistent", "conflict", "refused"), lag
        assert lag.cosigned_size is not None and lag.cosigned_size < head()
    writer.close()
    code, status = _cli(home, capsys, "status")
    assert [row["consistent"] for row in status["remote_witnesses"]] == [False, False]
    code, verified = _cli(home, capsys, "verify", "--witnesses")
    assert code == 1 and not verified["ok"]
    assert any("REFUSES" in line for line in verified["witness_lines"])

    # an explicit, accepted removal is an event; the set is read from the log
    code, answer = _cli(
        home, capsys, "witness", "remove", w2.vkey, "--yes", "--reason", "decommissioned"
    )
    assert code == 0 and [w["vkey"] for w in answer["witnesses"]] == [w1.vkey]


def test_the_provider_hands_its_writer_the_remote_submitter(
    tmp_path: Path,
    witnesses: Callable[..., WitnessProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Storage never imports the witnesses: the writer submits only through the factory it
    is handed, and the provider hands it one, so a log that names a remote witness gets the
    provider's checkpoints cosigned in the background."""
    home = tmp_path / "home"
    folder = archive_dir(home)
    store = EventStore.open(folder)
    vkey = store.vkey
    store.close()
    keygen(tmp_path / "w1", "w1.example/witness")
    w1 = witnesses(tmp_path / "w1", [vkey])
    code, answer = _cli(home, capsys, "witness", "add", w1.url, w1.vkey, "--reason", "offsite")
    assert code == 0 and answer["ok"], answer

    provider = ArchiveProvider()
    provider.initialize("s1", hermes_home=str(home), platform="cli", agent_context="primary")
    try:
        messages = [
            {"role": "user", "content": "a heron by the river"},
            {"role": "assistant", "content": "a patient bird"},
        ]
        provider.sync_turn(messages[0]["content"], messages[1]["content"], messages=messages)
        provider.on_pre_compress(messages)  # a checkpoint, committed before it returns
        reader = EventStore.open(folder, create=False, readonly=True)
        try:
            size = reader.conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()[0]
        finally:
            reader.close()
        assert size > 1  # past the store's own first events: the turn and the checkpoint
        _until(
            lambda: (_cosigned(folder, "w1.example/witness") or 0) >= size,
            "the provider's checkpoint is cosigned",
        )
    finally:
        provider.shutdown()
