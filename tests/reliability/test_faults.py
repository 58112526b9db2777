"""Faults: full disk, read-only files, a corrupt database, a lock held too long, a dying writer.

In each: the required checkpoint raises, so a v2 host (``tests/host/v2_host.py``) fails
closed with ``BLOCKED_MISSING_PREREQUISITE``; every other hook logs and returns; the error
says what is wrong and how to fix it; and once the fault is gone the same provider (no
restart) writes everything that was queued meanwhile and checkpoints again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from archive_provider.format.canonical import decode
from archive_provider.host.provider import ArchiveProvider, CheckpointError
from archive_provider.host.settings import save_settings
from archive_provider.storage import store as store_module
from archive_provider.storage.store import EventStore, archive_dir
from tests.host.v2_host import BLOCKED_PREFIX, CompressionCheckpointUnavailable

from .conftest import home_spill_key, v2_agent, verify_home

EVIDENCE = [
    {"role": "user", "content": "remember the plan"},
    {"role": "assistant", "content": "ok"},
]


def blocked(agent: Any, messages: list[dict[str, Any]]) -> BaseException:
    """The v2 host's gate refuses; return the provider's own error (the chained cause)."""
    from tests.host.v2_host import pre_compress_memory_context

    with pytest.raises(CompressionCheckpointUnavailable) as caught:
        pre_compress_memory_context(agent, messages, True)
    assert str(caught.value).startswith(BLOCKED_PREFIX)
    cause = caught.value.__cause__
    assert isinstance(cause, CheckpointError), repr(cause)
    return cause


def other_hooks_survive(provider: ArchiveProvider, tag: str) -> None:
    """Every hook but the required checkpoint returns normally during the fault."""
    for n in range(3):
        provider.sync_turn(f"{tag} user {n}", f"{tag} reply {n}", session_id="s1")
    provider.on_memory_write("add", "memory", f"{tag} fact", {"session_id": "s1"})
    provider.on_session_switch("s1", parent_session_id="s1", reason="test")
    assert isinstance(provider.prefetch(f"{tag} user"), str)
    assert isinstance(provider.handle_tool_call("archive_search", {"query": tag}), str)
    assert isinstance(provider.on_pre_compress(EVIDENCE, require_checkpoint=False), str)


def landed(home: Path, tag: str) -> None:
    """Everything queued during the fault is in the log, in order, and the log verifies."""
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        texts = []
        memory = []
        for event in store.events():
            if event.type == "turn":
                for digest in event.messages:
                    texts.append(decode(store.payload(digest) or b"null")["content"])
            if event.type == "memory_write":
                memory.append(decode(store.payload(event.body["content"]) or b"null"))
    finally:
        store.close()
    expected = [t for n in range(3) for t in (f"{tag} user {n}", f"{tag} reply {n}")]
    assert [t for t in texts if t.startswith(tag + " ")] == expected
    assert f"{tag} fact" in memory
    assert verify_home(home).ok


def recovers(provider: ArchiveProvider, home: Path, tag: str, timeout: float = 30) -> str:
    agent = v2_agent(provider)
    from tests.host.v2_host import pre_compress_memory_context

    deadline = time.monotonic() + timeout
    while True:
        try:
            receipt = pre_compress_memory_context(
                agent, EVIDENCE + [{"role": "user", "content": tag}], True
            )
            break
        except CompressionCheckpointUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert "Archive checkpoint" in receipt
    assert provider.core.writer is not None and provider.core.writer.flush(timeout)
    landed(home, tag)
    return receipt


# -- full disk ------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(where: Path, size: str = "3m") -> Iterator[bool]:
    """A tmpfs of ``size`` at ``where`` (True), or False where mounting is not allowed."""
    where.mkdir(parents=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(where: Path) -> Path:
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as handle:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    handle.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def test_full_disk_blocks_the_checkpoint_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = tmp_path / "disk"
    with small_disk(disk) as real:
        home = disk / "home"
        monkeypatch.setenv("ARCHIVE_WITNESS_DIR", str(tmp_path / "witness"))
        provider = ArchiveProvider()
        provider.initialize("s1", hermes_home=str(home), platform="cli")
        try:
            provider.sync_turn("before", "the fault", session_id="s1")
            assert provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
            limit: dict[str, int] = {}
            if real:
                filler = fill(disk)
            else:  # no mount here: SQLite's own page limit on every connection to this file
                real_connect = store_module.connect

                def connect(path: Path, **kwargs: Any) -> sqlite3.Connection:
                    conn = real_connect(path, **kwargs)
                    if "pages" in limit:
                        conn.execute(f"PRAGMA max_page_count = {limit['pages']}")
                    return conn

                monkeypatch.setattr(store_module, "connect", connect)
                writer_conn = provider.core.writer._store.conn  # type: ignore[union-attr]
                limit["pages"] = writer_conn.execute("PRAGMA page_count").fetchone()[0]
                writer_conn.execute(f"PRAGMA max_page_count = {limit['pages']}")
            with caplog.at_level(logging.WARNING):
                other_hooks_survive(provider, "diskfull")
                big = EVIDENCE + [{"role": "user", "content": "x" * 200_000}]
                error = blocked(v2_agent(provider), big)
            message = str(error)
            assert "full" in message and "Free space" in message, message
            assert any("full" in r.getMessage() for r in caplog.records)
            if real:
                filler.unlink()
            else:
                limit.clear()
                if provider.core.writer._store is not None:  # type: ignore[union-attr]
                    provider.core.writer._store.conn.execute("PRAGMA max_page_count = 1073741823")  # type: ignore[union-attr]
            recovers(provider, home, "diskfull")
        finally:
            provider.shutdown()
    print(f"\nfull disk: {'real tmpfs' if real else 'max_page_count'}; blocked, recovered")


# -- read-only ------------------------------------------------------------------------------


def _chattr(flag: str, *paths: Path) -> bool:
    return all(
        subprocess.run(["chattr", flag, str(p)], capture_output=True).returncode == 0
        for p in paths
        if p.exists()
    )


def test_read_only_archive_blocks_the_checkpoint_and_recovers(
    home: Path,
    providers: Callable[..., ArchiveProvider],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = providers()
    first.sync_turn("before", "read-only", session_id="s1")
    assert first.on_pre_compress(EVIDENCE, require_checkpoint=True)
    first.shutdown()
    folder = archive_dir(home)
    files = [folder / "events.db", folder / "payload.key", folder]
    immutable = shutil.which("chattr") is not None and _chattr("+i", *files)
    if not immutable:  # the filesystem cannot do it: inject EROFS where the store opens
        _chattr("-i", *files)
        real_open = EventStore.open.__func__  # type: ignore[attr-defined]
        state = {"on": True}

        def failing_open(cls: type, folder_: Any, **kwargs: Any) -> EventStore:
            if state["on"]:
                raise OSError(errno.EROFS, "Read-only file system", str(folder_))
            return real_open(cls, folder_, **kwargs)  # type: ignore[no-any-return]

        monkeypatch.setattr(EventStore, "open", classmethod(failing_open))
    try:
        provider = providers()
        with caplog.at_level(logging.WARNING):
            other_hooks_survive(provider, "readonly")
            message = str(blocked(v2_agent(provider), EVIDENCE))
        assert "cannot be written" in message and "chattr -i" in message, message
    finally:
        if immutable:
            assert _chattr("-i", *files)
        else:
            state["on"] = False
    recovers(provider, home, "readonly")
    print(f"\nread-only: {'chattr +i' if immutable else 'injected EROFS'}; blocked, recovered")


# -- corrupt --------------------------------------------------------------------------------


def test_corrupt_database_blocks_the_checkpoint_and_a_restore_recovers(
    tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    first = providers()
    first.sync_turn("before", "corruption", session_id="s1")
    assert first.on_pre_compress(EVIDENCE, require_checkpoint=True)
    first.shutdown()  # a clean close: the witness holds a fingerprint of this file
    folder = archive_dir(home)
    backup = tmp_path / "backup"
    shutil.copytree(folder, backup)
    with open(folder / "events.db", "r+b") as handle:
        handle.write(b"this is not sqlite" * 8)  # the header and then some
    provider = providers()
    other_hooks_survive(provider, "corrupt")
    message = str(blocked(v2_agent(provider), EVIDENCE))
    assert "corrupt" in message and "restore it from backup" in message, message
    shutil.copy2(backup / "events.db", folder / "events.db")  # the restore
    recovers(provider, home, "corrupt")
    assert (
        provider.core.writer is not None and provider.core.writer.last_proof.path == "fingerprint"
    )  # type: ignore[attr-defined]


# -- locked ---------------------------------------------------------------------------------

LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
print("released", flush=True)
"""


def test_database_locked_by_another_process_blocks_and_recovers(
    home: Path, providers: Callable[..., ArchiveProvider], caplog: pytest.LogCaptureFixture
) -> None:
    save_settings(home, {"busy_timeout_s": 0.3, "checkpoint_timeout_s": 10})
    provider = providers()
    provider.sync_turn("before", "the lock", session_id="s1")
    assert provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(archive_dir(home) / "events.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.WARNING):
            other_hooks_survive(provider, "locked")
            started = time.monotonic()
            # new evidence: a retry of EVIDENCE is answered from a read (already durable)
            fresh = EVIDENCE + [{"role": "user", "content": "said while locked"}]
            message = str(blocked(v2_agent(provider), fresh))
            assert time.monotonic() - started < 8
        assert "locked by another process" in message and "fuser" in message, message
    finally:
        assert locker.stdin is not None
        locker.stdin.write("\n")
        locker.stdin.flush()
        locker.wait(timeout=10)
    recovers(provider, home, "locked")


# -- the writer thread dying ----------------------------------------------------------------


class Death(BaseException):
    """Escapes every ``except Exception``: what a dying thread looks like from inside."""


def test_writer_loop_crash_fails_the_checkpoint_and_restarts_itself(
    home: Path, providers: Callable[..., ArchiveProvider], caplog: pytest.LogCaptureFixture
) -> None:
    provider = providers()
    provider.sync_turn("before", "the crash", session_id="s1")
    assert provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    writer = provider.core.writer
    assert writer is not None
    real = writer._write_batch
    armed = {"left": 0}

    def dying(store: EventStore) -> bool:
        if armed["left"] and any(job.durable for job in writer._pending):
            armed["left"] -= 1
            raise Death("injected")
        return real(store)

    writer._write_batch = dying  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        other_hooks_survive(provider, "crash")
        armed["left"] = 1  # the next batch holding a checkpoint dies
        # new evidence: a retry of EVIDENCE is answered without the writer (already durable)
        fresh = EVIDENCE + [{"role": "user", "content": "said during the crash"}]
        message = str(blocked(v2_agent(provider), fresh))
    assert "crashed" in message and "restarted" in message, message
    assert writer.restarts >= 1 and writer._thread.is_alive()
    recovers(provider, home, "crash")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_writer_thread_dead_for_good_is_restarted_by_the_next_call(
    home: Path, providers: Callable[..., ArchiveProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    from archive_provider.storage import writer as writer_module

    provider = providers()
    assert provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    writer = provider.core.writer
    assert writer is not None
    first_thread = writer._thread
    real_collect = writer._collect

    def die(*args: Any, **kwargs: Any) -> None:
        raise Death("the supervisor itself fails")

    def collect() -> bool:
        writer._collect = real_collect  # type: ignore[method-assign]
        raise Death("injected")

    monkeypatch.setattr(writer_module.log, "exception", die)  # the in-thread restart fails too
    writer._collect = collect  # type: ignore[method-assign]
    writer._queue.put(writer_module.Job(lambda s: ()))  # wake it up
    first_thread.join(10)
    assert not first_thread.is_alive()  # dead for good
    monkeypatch.undo()
    other_hooks_survive(provider, "dead")  # submit() notices and starts a new thread
    assert writer._thread is not first_thread and writer._thread.is_alive()
    assert writer.restarts >= 1
    recovers(provider, home, "dead")


def test_a_fault_that_outlasts_shutdown_spills_exactly_what_was_not_written(
    home: Path, providers: Callable[..., ArchiveProvider], caplog: pytest.LogCaptureFixture
) -> None:
    from archive_provider.storage.spill import read_records, segment_paths
    from archive_provider.storage.writer import writers

    first = providers()
    assert first.on_pre_compress(EVIDENCE, require_checkpoint=True)
    first.shutdown()
    with open(archive_dir(home) / "events.db", "r+b") as handle:
        handle.write(b"not a database" * 8)
    provider = providers()
    for n in range(3):
        provider.sync_turn(f"lost user {n}", f"lost reply {n}", session_id="s1")
    provider.on_memory_write("add", "memory", "lost fact", {"session_id": "s1"})
    writer = provider.core.writer
    assert writer is not None
    provider.core.writer = None  # shut down by hand to read the report
    report = writers.release(writer, timeout=2)
    assert report is not None and report.complete  # nothing dropped: it is in the spill
    assert report.error is not None and "corrupt" in report.error
    # the store could not be opened: the writer spilled them then, not at shutdown
    assert (report.pending, report.spilled, report.finished) == (0, 0, False)
    assert writer.spilled == 5
    records = [
        r
        for path in segment_paths(archive_dir(home))
        for r in read_records(path, key=home_spill_key(home))
    ]
    kept = [r.kind for r in records]
    # ...and last, the record of this unfinished drain, for the next open (HOST.md §3)
    assert kept == ["session_started", "turn", "turn", "turn", "memory_write", "shutdown_drain"]
    assert records[-1].args["spilled"] == 0 and "corrupt" in records[-1].args["error"]
