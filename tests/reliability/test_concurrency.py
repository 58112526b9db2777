"""Concurrency: a writer process with CLI readers, two profiles in one process, identical checkpoints.

Nothing may be mixed (an event in the wrong profile or session), lost (a receipted
checkpoint or a turn missing) or duplicated (the same turn or checkpoint twice).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from archive_provider.host.provider import ArchiveProvider
from archive_provider.storage.store import archive_dir

from .conftest import RECEIPT, events, part_values, verify_home

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def gateway(home: Path, tag: str, turns: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "gateway_child.py"), str(home), tag, str(turns), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "archive_provider.cli", "--home", str(home), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )


def turn_texts(home: Path) -> dict[str, list[str]]:
    """Every archived message text, per session, in log order."""
    texts: dict[str, list[str]] = collections.defaultdict(list)
    for event in events(home):
        if event.type == "turn":
            for row in part_values(home, event.messages):
                texts[event.session].append(row["content"])
    return texts


def expected_texts(tag: str, turns: int) -> list[str]:
    return [
        t for n in range(turns) for t in (f"{tag} question {n} about zebras", f"{tag} answer {n}")
    ]


def test_gateway_writer_with_cli_readers_in_other_processes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # the writer paces its turns (about 10 s in all) so that CLI readers, each a new Python
    # process, overlap it many times even on a loaded 2-core machine
    turns = 200
    writer = gateway(home, "gw", turns, "--delay", "0.05")
    commands = {
        "status": ["status"],
        "verify": ["verify"],
        "search": ["search", "zebras"],
        "export": ["export", "--force", str(tmp_path / "audit.zip")],
    }
    runs: collections.Counter[str] = collections.Counter()
    failures: list[object] = []
    while not (archive_dir(home) / "events.db").exists():
        time.sleep(0.05)

    def reader(name: str, args: list[str]) -> None:  # each command in a loop, all at once
        while writer.poll() is None:
            result = cli(home, *args)
            runs[name] += 1
            if name == "search" and result.returncode == 1:
                continue  # nothing matched yet
            if result.returncode != 0:
                failures.append((name, result.stdout[-500:], result.stderr[-500:]))
                continue
            data = json.loads(result.stdout)
            if name == "verify" and not data["ok"]:
                failures.append(data)  # every snapshot a reader sees must verify

    readers = [threading.Thread(target=reader, args=item) for item in commands.items()]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join(300)
    assert not failures, failures
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err[-2000:]
    receipts = [RECEIPT.search(line) for line in out.splitlines() if line.startswith("receipt ")]
    assert len(receipts) == turns // 5 and all(receipts)
    logged = {e.seq: e for e in events(home)}
    for match in receipts:
        event = logged[int(match.group(3))]  # type: ignore[union-attr]
        assert event.type == "checkpoint" and event.envelope.identity.startswith(match.group(1))  # type: ignore[union-attr]
    assert turn_texts(home) == {"gw": expected_texts("gw", turns)}  # nothing lost, mixed or twice
    assert verify_home(home).ok
    assert min(runs.values()) >= 1 and sum(runs.values()) >= 6, runs  # all ran during the writes
    print(f"\nCLI runs during the writer: {dict(runs)}")


def test_two_profiles_in_one_process_with_interleaved_threads(
    tmp_path: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    homes = {"alice": tmp_path / "alice", "bob": tmp_path / "bob"}
    made = {name: providers(home, session=name) for name, home in homes.items()}
    turns = 40
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def drive(name: str, part: int) -> None:
        provider = made[name]
        session = f"{name}-{part}"
        messages: list[dict[str, str]] = []
        try:
            barrier.wait()
            for n in range(turns):
                messages += [
                    {"role": "user", "content": f"{session} question {n} about zebras"},
                    {"role": "assistant", "content": f"{session} answer {n}"},
                ]
                provider.sync_turn("", "", session_id=session, messages=list(messages))
                if n % 10 == 9:
                    provider.on_memory_write(
                        "add", "memory", f"{session} fact {n}", {"session_id": session}
                    )
                    assert provider.on_pre_compress(list(messages), require_checkpoint=True)
                time.sleep(0)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=drive, args=(name, part)) for name in homes for part in (1, 2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for provider in made.values():
        assert provider.core.writer is not None and provider.core.writer.flush(30)
    for name, home in homes.items():
        texts = turn_texts(home)
        assert set(texts) == {f"{name}-1", f"{name}-2"}  # nothing from the other profile
        for session, got in texts.items():
            assert got == expected_texts(session, turns)  # all, in order, once
        kinds = collections.Counter(e.type for e in events(home))
        assert kinds["checkpoint"] == 2 * (turns // 10) and kinds["memory_write"] == 2 * (
            turns // 10
        )
        assert verify_home(home).ok


def test_concurrent_identical_checkpoints_threads_and_processes(
    tmp_path: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    home = tmp_path / "home"
    messages = [{"role": "user", "content": f"line {n}"} for n in range(30)]
    # threads in one process, several providers of the same profile (one shared writer)
    made = [providers(home, session="same") for _ in range(4)]
    barrier = threading.Barrier(8)
    receipts: list[str] = []

    def checkpoint(provider: ArchiveProvider) -> None:
        barrier.wait()
        receipts.append(provider.on_pre_compress(list(messages), require_checkpoint=True))

    threads = [threading.Thread(target=checkpoint, args=(made[i % 4],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(receipts) == 8
    identities = {RECEIPT.search(r).group(1) for r in receipts}  # type: ignore[union-attr]
    seqs = {RECEIPT.search(r).group(3) for r in receipts}  # type: ignore[union-attr]
    assert len(identities) == 1 and len(seqs) == 1
    assert sum("messages archived" in r for r in receipts) == 1  # the rest: already archived
    for provider in made:
        provider.shutdown()
    # processes: the same checkpoint from three processes at once, on the same profile
    procs = [gateway(home, "same", 0, json.dumps(messages)) for _ in range(3)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-800:] for _, err in outs]
    lines = [line for out, _ in outs for line in out.splitlines() if line.startswith("receipt ")]
    assert {RECEIPT.search(line).group(3) for line in lines} == seqs  # type: ignore[union-attr]
    checkpoints = [e for e in events(home) if e.type == "checkpoint"]
    assert len(checkpoints) == 1  # one event, however many asked at once
    conn_rows = collections.Counter(d for e in checkpoints for d in e.part_digests)
    assert all(count == 1 for count in conn_rows.values()) and len(conn_rows) == 30
    assert verify_home(home).ok
