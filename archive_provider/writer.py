"""The writer: one thread per database file per process, an ordered queue, group commit.

Hooks hand the writer *jobs*: a job's ``build`` runs on the writer thread (so delta
computation and hashing never race and never cost the host's thread) and returns the
events to append. Ordinary jobs are group-committed with ``synchronous=NORMAL``; a durable
job (a checkpoint) is committed with ``synchronous=FULL`` before its caller is released.

Failures never drop events silently. A batch that cannot be written stays queued, in order,
and is retried with back-off until it lands; a durable job fails fast instead, so its
caller can raise. On close the writer drains within a bounded time and reports, by type
and identity key, every event it could not write.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from .events import AppendResult, NewEvent
from .store import EventStore, Projection, StoreError
from .verifier import verify_database

log = logging.getLogger(__name__)

ThreadFactory = Callable[..., threading.Thread]
Build = Callable[[EventStore], Sequence[NewEvent]]

MAX_BATCH_JOBS = 512
RETRY_BACKOFF_S = (0.05, 0.2, 0.5, 1.0, 2.0)


def context_thread(target: Callable[[], None], *, name: str, daemon: bool = True) -> threading.Thread:
    """An unstarted thread that runs ``target`` in a copy of the caller's contextvars.

    The fallback for hosts without ``agent.memory_provider.spawn_context_thread`` (0.19.0).
    """
    context = contextvars.copy_context()
    return threading.Thread(target=context.run, args=(target,), name=name, daemon=daemon)


@dataclass
class Job:
    build: Build
    durable: bool = False
    label: str = ""
    future: Future[list[AppendResult]] = field(default_factory=Future)
    events: Sequence[NewEvent] | None = None


@dataclass(frozen=True)
class DrainReport:
    """What close() could not write: empty lists mean everything landed."""

    unwritten: list[str]
    error: str | None

    @property
    def complete(self) -> bool:
        return not self.unwritten


class WriterUnavailable(RuntimeError):
    """The writer cannot accept or complete work; the message says why and what to do."""


class Writer:
    """Owns the write connection of one store; every append goes through here."""

    def __init__(
        self,
        folder: Path,
        *,
        projections_factory: Callable[[], Sequence[Projection]] = tuple,
        thread_factory: ThreadFactory = context_thread,
        busy_timeout_ms: int = 5000,
        verify_on_open: bool = True,
    ) -> None:
        self.folder = folder
        self._projections_factory = projections_factory
        self._busy_timeout_ms = busy_timeout_ms
        self._verify_on_open = verify_on_open
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._pending: list[Job] = []  # built, not yet written, in order
        self._store: EventStore | None = None
        self._closing = False
        # close() and the thread hand the pending batch over under this lock; once close()
        # has reported what is unwritten (abandoned), the thread writes nothing more.
        self._lock = threading.Lock()
        self._abandoned = False
        self.last_error: str | None = None
        self.refused: str | None = None  # set when the log fails verification on open
        self._ready = threading.Event()
        self._thread = thread_factory(self._run, name=f"archive-writer-{folder.parent.name or 'home'}")
        self._thread.start()

    # -- API ------------------------------------------------------------------------------

    def submit(self, build: Build, *, durable: bool = False, label: str = "") -> Future[list[AppendResult]]:
        """Queue a job; returns at once. The future resolves when its events are committed."""
        job = Job(build, durable, label)
        if self._closing:
            job.future.set_exception(WriterUnavailable("the archive writer is closed; this write was rejected"))
            return job.future
        self._queue.put(job)
        return job.future

    def append_durable(self, build: Build, *, timeout: float, label: str = "") -> list[AppendResult]:
        """Run a durable job and wait (bounded) until it is committed with synchronous=FULL."""
        future = self.submit(build, durable=True, label=label)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()
            raise WriterUnavailable(
                f"the archive did not commit within {timeout:.1f}s (database locked or disk stalled); "
                "nothing was reported as archived"
            ) from None

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued before this call is committed (or failed)."""
        marker = self.submit(lambda store: ())
        try:
            marker.result(timeout=timeout)
            return True
        except Exception:
            return False

    def close(self, timeout: float = 5.0) -> DrainReport:
        """Stop accepting work, drain for at most ``timeout`` seconds, report what was left.

        A commit already in flight is waited for (it is bounded by the busy timeout); after
        the report nothing more is written, so what it lists as unwritten stays unwritten.
        """
        self._closing = True
        self._queue.put(None)
        self._thread.join(timeout)
        with self._lock:  # a commit in flight ends first (bounded by the busy timeout)
            self._abandoned = True
            leftover: list[Job] = list(self._pending)
            self._pending = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    leftover.append(item)
        if self._thread.is_alive():
            self._queue.put(None)  # the drain took the stop marker; a blocked thread needs one
        unwritten = []
        for job in leftover:
            described = [f"{e.type}:{e.session}:{e.key}" for e in (job.events or ())] or [job.label or "unbuilt job"]
            unwritten.extend(described)
            if not job.future.done():
                job.future.set_exception(WriterUnavailable("the archive writer closed before this write landed"))
        report = DrainReport(unwritten, self.last_error)
        if unwritten:
            log.error("archive writer closed with %d unwritten events: %s", len(unwritten), unwritten[:20])
        return report

    @property
    def healthy(self) -> bool:
        return self._store is not None and not self._pending and self.refused is None

    # -- thread ---------------------------------------------------------------------------

    def _open(self) -> EventStore | None:
        if self._store is not None:
            return self._store
        try:
            store = EventStore.open(
                self.folder, projections=self._projections_factory(), busy_timeout_ms=self._busy_timeout_ms
            )
        except Exception as exc:  # corrupt, read-only, missing key...
            self.last_error = str(exc)
            log.error("archive store unavailable: %s", exc)
            return None
        if self._verify_on_open:
            report = verify_database(store.conn, store.key)
            if not report.ok:
                self.refused = (
                    f"the archive at {store.path} failed verification at seq {report.first_bad_seq}: "
                    f"{report.problem}. Appends are refused so the damage is not built upon; run "
                    "`hermes-archive verify` and restore the archive folder from backup."
                )
                self.last_error = self.refused
                log.error("%s", self.refused)
                store.close()
                return None
        self.refused = None
        self._store = store
        return store

    def _run(self) -> None:
        attempt = 0
        while True:
            if self._abandoned:  # close() gave up waiting and reported the rest
                self._close_store()
                return
            stop = self._collect()
            if self._pending:
                if self._write_pending():
                    attempt = 0
                else:
                    if stop or self._abandoned:
                        self._close_store()
                        return
                    time.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])
                    attempt += 1
                    continue
            if stop:
                self._close_store()
                return

    def _collect(self) -> bool:
        """Move queued jobs into the pending batch; block only when nothing is pending."""
        stop = False
        block = not self._pending
        while len(self._pending) < MAX_BATCH_JOBS:
            try:
                item = self._queue.get(block=block, timeout=None) if block else self._queue.get_nowait()
            except queue.Empty:
                break
            block = False
            if item is None:
                stop = True
                break
            if item.future.cancelled():
                continue
            with self._lock:
                if self._abandoned:  # submitted while close() was draining
                    item.future.set_exception(
                        WriterUnavailable("the archive writer closed before this write landed")
                    )
                    log.error("archive writer closed; a late write was not archived: %s", item.label)
                    continue
                self._pending.append(item)
            if item.durable:
                break  # commit what precedes it together with it, now
        return stop

    def _write_pending(self) -> bool:
        store = self._open()
        with self._lock:
            if self._abandoned:
                return False
            if store is None:
                self._fail_durable(WriterUnavailable(self.last_error or "archive store unavailable"))
                return False
            return self._write_batch(store)

    def _write_batch(self, store: EventStore) -> bool:
        batch = self._pending
        durable = any(job.durable for job in batch)
        results: list[list[AppendResult]] = []
        try:
            with store.transaction(durable=durable):
                for job in batch:
                    results.append(self._append_job(job, store))
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error("archive append of %d jobs failed: %s", len(batch), self.last_error)
            self._fail_durable(WriterUnavailable(f"the archive could not commit: {self.last_error}"))
            self._reset_store_after(exc)
            return False
        self.last_error = None
        for job, job_results in zip(batch, results):
            if not job.future.done():
                job.future.set_result(job_results)
        self._pending = []
        return True

    @staticmethod
    def _append_job(job: Job, store: EventStore) -> list[AppendResult]:
        """Build (inside the transaction, so it sees the jobs before it) and append one job.

        A job whose own input cannot be archived fails alone, under a savepoint, so it can
        never wedge the queue; database errors fail the whole batch, which is retried.
        """
        store.conn.execute("SAVEPOINT job")
        try:
            if job.events is None:
                job.events = list(job.build(store))
            results = store.append_in_transaction(job.events)
        except sqlite3.Error:
            raise
        except Exception as exc:
            store.conn.execute("ROLLBACK TO job")
            store.conn.execute("RELEASE job")
            log.exception("archive job %s could not be archived", job.label or "?")
            job.events = []
            if not job.future.done():
                job.future.set_exception(exc)
            return []
        store.conn.execute("RELEASE job")
        return results

    def _fail_durable(self, error: Exception) -> None:
        """Durable jobs fail fast (their caller raises); ordinary jobs stay queued."""
        kept = []
        for job in self._pending:
            if job.durable:
                if not job.future.done():
                    job.future.set_exception(error)
            else:
                kept.append(job)
        self._pending = kept

    def _reset_store_after(self, exc: Exception) -> None:
        """After a failed commit, reopen next time (the file may have been fixed or replaced)."""
        if isinstance(exc, (StoreError, OSError)) or "disk" in str(exc).lower() or "readonly" in str(exc).lower():
            self._close_store()

    def _close_store(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:
                log.debug("closing the archive store failed", exc_info=True)
            self._store = None


class _Registry:
    """One writer per database file per process, shared by every provider of that profile."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[Path, tuple[Writer, int]] = {}

    def acquire(self, folder: Path, **kwargs: object) -> Writer:
        folder = Path(os.path.realpath(folder))
        with self._lock:
            writer, count = self._writers.get(folder, (None, 0))
            if writer is None:
                writer = Writer(folder, **kwargs)  # type: ignore[arg-type]
            self._writers[folder] = (writer, count + 1)
            return writer

    def release(self, writer: Writer, timeout: float = 5.0) -> DrainReport | None:
        with self._lock:
            entry = self._writers.get(writer.folder)
            if entry is None or entry[0] is not writer:
                return None
            if entry[1] > 1:
                self._writers[writer.folder] = (writer, entry[1] - 1)
                return None
            del self._writers[writer.folder]
        return writer.close(timeout)


writers = _Registry()
