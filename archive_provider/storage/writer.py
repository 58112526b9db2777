"""The writer: one thread per database file per process, an ordered queue, group commit.

Hooks hand the writer *jobs*: a job's ``build`` runs on the writer thread (so delta
computation and hashing never race and never cost the host's thread) and returns the
events to append. Ordinary jobs are group-committed with ``synchronous=NORMAL``; a durable
job (a checkpoint) is committed with ``synchronous=FULL`` before its caller is released.

Failures never drop events silently. A batch that cannot be written stays queued, in order,
and is retried with back-off until it lands; a durable job fails fast instead, so its
caller can raise. On close the writer drains within a bounded time and reports, by type
and identity key, every event it could not write. Every failure is explained by
:func:`diagnose` (what is wrong, how to fix it: disk full, read-only, locked, corrupt).

The writer supervises itself: an exception escaping its loop (a bug, an injected fault)
fails the durable jobs in hand, rolls back, and restarts the loop on the same thread; if
the thread is gone anyway, the next ``submit`` starts a new one. Queued jobs are kept.

Before the first append the writer proves the log is intact (:func:`witness.open_proof`:
the clean-close fingerprint or a full verify, then the external witness), refuses to build
on a log that fails, and verifies rows another process appended before appending after
them. With a witness it records the head after every FULL commit and on close. Handed a
submitter factory (the provider's), it wakes the log's remote witnesses after each commit.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from ..domain import builders
from ..domain.clock import now_text, utc_now
from ..errors import ArchiveUnavailable, Failure, classify
from ..format import digests_v2
from ..format.digests import key_text, parts_text
from ..format.events import AppendResult, NewEvent
from ..format.verifier import verify_database
from .checkpoint_proof import (
    BackgroundWalk,
    WalkState,
    advance,
    open_proof_from_checkpoint,
    spill_key,
)
from .spill import (
    END,
    HEADER_BYTES,
    MAGIC,
    META_TAKEN,
    ROTATE_BYTES,
    SUFFIX,
    Encoder,
    Record,
    Spill,
    SpillDamaged,
    in_use,
    open_segment,
    read_records,
    remove,
    segment_number,
    segment_paths,
    set_aside,
)
from .store import (
    DB_NAME,
    EventStore,
    Head,
    Projection,
    ServeBasis,
    StoreError,
    connect,
    file_identity,
    head_time,
)
from .store_pieces import TamperedPart
from .threads import ThreadFactory, context_thread
from .witness import (
    Proof,
    Witness,
    WitnessMismatch,
    fast_path_ok,
    fingerprint_file,
    first_witness_event,
    open_proof,
)

log = logging.getLogger(__name__)

Build = Callable[[EventStore], Sequence[NewEvent]]
#: turns a spill record back into events (``store`` None: only follow it, it is committed);
#: the dict is per-segment state the taker keeps (transcripts, for deltas)
Taker = Callable[[EventStore | None, Record, dict[Any, Any]], Sequence[NewEvent]]
Position = tuple[int, int]  # (spill segment number, records in it)


class RemoteSubmitter(Protocol):
    """What the writer needs of the background submitter to the log's remote witnesses: a
    wake-up after each commit that returns at once (DESIGN invariant 12), and a bounded stop."""

    def notify(self) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


#: starts submission to a proven log's remote witnesses on threads of the given factory
#: (None: the log names none). The layer that builds the writer hands it in (the provider's
#: is ``witnesses.remote.start_submitter``); storage never imports the witnesses above it.
SubmitterFactory = Callable[[EventStore, ThreadFactory], RemoteSubmitter | None]

MAX_BATCH_JOBS = 512
#: how long a durable append may wait in all while the log is being proved on open (a full
#: verify after an unclean stop: 30 s or more at a million events), inside the host's 120 s
#: compression budget; waiting beats failing a required checkpoint closed
PROOF_WAIT_S = 100.0
RETRY_BACKOFF_S = (0.05, 0.2, 0.5, 1.0, 2.0)
LATE_JOIN_S = 1.0  # how long close() waits for the thread to put down what it was taking
#: how often close() tries each spill write before it says what is lost (a failed try
#: leaves nothing behind: a segment made for it is removed, a record cut back off)
SHUTDOWN_SPILL_ATTEMPTS = 3


class Told:
    """The outcome of a job nobody waits for (:meth:`Writer.post`): a failure is passed on,
    once, on the thread that finds it. It stands in for a Future, whose making (a Condition
    and its lock) was a fifth of a hook's time on the host's thread."""

    __slots__ = ("_done", "_on_error")

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._on_error, self._done = on_error, False

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, result: object) -> None:
        self._done = True

    def set_exception(self, exc: BaseException) -> None:
        if not self._done:
            self._done = True
            self._on_error(exc)


@dataclass(slots=True)
class Job:
    build: Build
    durable: bool = False
    label: str = ""
    future: Future[list[AppendResult]] | Told = field(default_factory=Future)
    events: Sequence[NewEvent] | None = None
    failed: bool = False  # its own input could not be archived; its future holds why
    entry: Encoder | None = None  # how to write it to the spill; None: it cannot be spilled
    accepted: datetime | None = None  # when the provider accepted it (the one clock; it is
    # formatted only if the job is spilled: formatting costs more than the rest of a submit)
    time: str | None = None  # from the spill: the accepted time its events carry
    size: int = 0  # bytes it holds in memory, as the submitter estimated them
    after: Position = (0, 0)  # the spill records accepted before it (taken in first)
    taken: tuple[bytes, int, Position] | None = None  # from the spill: segment id, end, position
    finishes: tuple[Path, bytes] | None = None  # ends this segment (path, id): remove after
    damaged: Path | None = None  # set this damaged segment aside once this job is committed


_WAKE = object()  # in the queue: records were spilled while the writer may be waiting

#: the spill record (and event type) of a shutdown whose drain did not finish
DRAIN_KIND = "shutdown_drain"


@dataclass(frozen=True)
class _DrainFigures:
    """What close() knows of an unfinished drain before it spills (HOST.md §3)."""

    leftover: list[Job]
    timeout_s: float
    error: str | None

    def entry(self, spilled: int, rest: Sequence[Job]) -> Encoder:
        """The ``shutdown_drain`` spill record: counts of hook calls, by label when lost."""
        hooks: dict[str, int] = {}
        for job in rest:
            hooks[job.label or "unlabelled"] = hooks.get(job.label or "unlabelled", 0) + 1
        args = {
            "drain": os.urandom(8).hex(),  # two shutdowns are two events, at any clock
            "pending": len(self.leftover),
            "spilled": spilled,
            "unwritten": len(rest),
            "unwritten_hooks": hooks,
            "finished": False,
            "timeout_s": float(self.timeout_s),
            "error": self.error,
        }
        return lambda state: (DRAIN_KIND, args)


def _take_drain(
    store: EventStore | None, record: Record, state: dict[Any, Any]
) -> Sequence[NewEvent]:
    """A spilled ``shutdown_drain`` record back as its event."""
    if store is None:
        return ()
    a = record.args
    return [
        builders.shutdown_drain(
            at=record.accepted,
            drain=str(a["drain"]),
            pending=int(a["pending"]),
            spilled=int(a["spilled"]),
            unwritten=int(a["unwritten"]),
            unwritten_hooks={str(k): int(v) for k, v in dict(a["unwritten_hooks"]).items()},
            finished=bool(a["finished"]),
            timeout_s=float(a["timeout_s"]),
            error=None if a.get("error") is None else str(a["error"]),
        )
    ]


@dataclass(frozen=True)
class DrainReport:
    """What close() could not write: empty lists mean everything landed.

    ``pending`` hook calls were still queued in memory when the drain's time ran out,
    ``spilled`` of them went to the spill for the next open; ``finished`` says the drain
    committed everything in time (a ``shutdown_drain`` record is spilled when it did not).
    """

    unwritten: list[str]
    error: str | None
    pending: int = 0
    spilled: int = 0
    finished: bool = True

    @property
    def complete(self) -> bool:
        return not self.unwritten


def _same_head(one: Head, other: Head) -> bool:
    """The same log head: seq and chain (a head read back also carries its Merkle root,
    the one the writer kept from its own append does not; both follow from the same envelopes)."""
    return (one.seq, one.chain) == (other.seq, other.chain)


class WriterUnavailable(ArchiveUnavailable):
    """The writer cannot accept or complete work; the message says why and what to do."""


def open_time_proof(store: EventStore, witness: Witness | None, *, fast: bool) -> Proof:
    """The proof every door that appends runs on the store it opened, before its first
    append: the writer and each command that writes (invariant 11). ``fast`` is
    :func:`fast_path_ok`, taken before the store was opened."""
    proof = None
    if witness is not None and not fast:
        proof = open_proof_from_checkpoint(store, witness)
    if proof is None:
        proof = open_proof(store.conn, store.key, store.store_id, fast=fast, witness=witness)
    return proof


def refusal(path: Path, proof: Proof) -> str:
    """The one line every door gives for a log that failed :func:`open_time_proof`."""
    if not proof.witness:
        return (
            f"the archive at {path} failed verification at seq {proof.first_bad_seq}: "
            f"{proof.problem}. Appends are refused so the damage is not built upon; run "
            "`hermes-archive verify` and restore the archive folder from backup "
            "(docs/RECOVER.md, 'Tamper detected')."
        )
    return f"{proof.problem} Appends are refused until then (docs/RECOVER.md, 'Witness mismatch')."


def diagnose(exc: BaseException, folder: Path, busy_timeout_ms: int = 5000) -> str:
    """What went wrong, in words an operator can act on (docs/RECOVER.md has the same list)."""
    text = f"{type(exc).__name__}: {exc}"
    failure = classify(exc)  # a StoreError wrapping an SQLite error: by what SQLite said
    db = folder / DB_NAME
    if failure is Failure.FULL:
        return (
            f"the disk holding the archive {folder} is full ({text}). Free space on that "
            "disk; queued events are kept in memory and written when space returns, "
            "checkpoints fail until then. See docs/RECOVER.md, 'Disk full'."
        )
    if failure is Failure.NOT_WRITABLE:
        return (
            f"the archive folder {folder} or its files cannot be written ({text}). Make them "
            "writable again: check permissions (folder 0700, files 0600, owned by the Hermes "
            "user), `lsattr` for the immutable flag (`chattr -i`), and a read-only mount. "
            "Queued events are kept. See docs/RECOVER.md, 'Read-only archive'."
        )
    if failure is Failure.BUSY:
        return (
            f"the archive database {db} is locked by another process for longer than the "
            f"busy timeout ({busy_timeout_ms / 1000:g}s) ({text}). Find the holder with "
            f"`fuser {db}` (a long `sqlite3` session or a stuck process) and end it, or raise "
            "busy_timeout_s. Queued events are kept. See docs/RECOVER.md, 'Locked database'."
        )
    if failure is Failure.CORRUPT:
        return (
            f"the archive database {db} is corrupt ({text}). Stop Hermes, move the archive "
            "folder aside, restore it from backup, run `hermes-archive verify`, then "
            '`hermes-archive witness accept --reason "restored from backup"` if the witness '
            "objects. See docs/RECOVER.md, 'Corrupt database'."
        )
    if isinstance(exc, StoreError) or "witness mismatch" in str(exc).lower():
        return str(exc)
    return text


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
        witness: Witness | None = None,
        submitter_factory: SubmitterFactory | None = None,
        kinds: Mapping[str, Taker] | None = None,
        queue_max_events: int = 2_000,
        queue_max_bytes: int = 64 << 20,
        spill_fsync_s: float = 1.0,
        journal_every_event: bool = False,
    ) -> None:
        self.folder = folder
        self._projections_factory = projections_factory
        self._busy_timeout_ms = busy_timeout_ms
        self._verify_on_open = verify_on_open
        self.witness = witness
        self._submitter_factory = submitter_factory
        self._thread_factory = thread_factory
        self._thread_lock = threading.Lock()
        self._verified: Head | None = None  # the head known good (proved, or written by us)
        #: the head the witness was last moved to by this writer: a durable commit that
        #: leaves the head there (an identical checkpoint retried) has nothing to witness
        self._witnessed: Head | None = None
        self._opened_file: tuple[int, int] | None = None  # store.file_identity at the open
        self._refused_state: object = None  # file state when refused; recheck when it changes
        self.restarts = 0  # how often the writer loop or thread was restarted after a crash
        self.last_proof: object = None  # the last open-time Proof (path taken, seconds)
        self._queue: queue.SimpleQueue[Job | object | None] = queue.SimpleQueue()
        self._pending: list[Job] = []  # built, not yet written, in order
        # the bounded queue and the spill: the gate (the spill's lock) orders every submit
        self.spill = Spill(folder, fsync_s=spill_fsync_s, key=lambda: spill_key(witness))
        self._gate = self.spill.lock
        self._kinds: Mapping[str, Taker] = kinds or {}
        self._max_events, self._max_bytes = queue_max_events, queue_max_bytes
        self._journal = journal_every_event
        # what is queued in memory: hooks count what they put (under the gate), the writer
        # what it takes, so neither writes the other's counter
        self._submitted_events = self._submitted_bytes = 0
        self._taken_events = self._taken_bytes = 0
        # records an earlier process left wait there: spill what follows (a live one's are its own)
        self._spill_open = self.spill.position() != (0, 0)
        self._woken = False  # a _WAKE is in the queue
        self._held: Job | None = None  # the next job from the queue, waiting for the spill
        self._late: list[Job] = []  # taken from the queue after close() gave up: it spills them
        self._consumed: Position = (0, 0)  # spill records taken into the batch so far
        self._committed: Position = (0, 0)  # spill records committed so far
        self._done = 0  # the last spill segment number fully taken in
        self._removed: list[bytes] = []  # ids of segments removed since the last commit
        self._reading: _Reading | None = None
        self.spill_damage: list[str] = []  # damaged segments set aside (for status)
        self.spilled = 0  # records this writer spilled (for status and tests)
        self._store: EventStore | None = None
        self._closing = False
        # close() and the thread hand the pending batch over under this lock; once close()
        # has reported what is unwritten (abandoned), the thread writes nothing more.
        self._lock = threading.Lock()
        self._abandoned = False
        self.last_error: str | None = None
        self.refused: str | None = None  # set when the log fails verification on open
        self.proving = False  # the open-time proof (maybe a full verify) is running now
        self._first_witness = False  # the next batch records that this store is now witnessed
        self._data_version: int | None = None  # PRAGMA data_version when the log was proved
        # set once the open-time proof passed; cleared on refusal (recall waits for it)
        self.proven = threading.Event()
        #: what the passing open-time proof established: what served excerpts are proven with
        self.basis: ServeBasis | None = None
        self._proven_lock = threading.Lock()  # a walk's refusal and the proof's pass never cross
        self._walk: BackgroundWalk | None = None  # the walk over older history
        self._submitter: RemoteSubmitter | None = None  # remote witnesses of the log
        self._history_proven = False  # every event was verified (a clean close may vouch)
        if not verify_on_open:
            self.proven.set()  # the caller chose not to prove (a checkpoint-only context)
        self._ready = threading.Event()
        self._thread = self._start_thread()

    def _start_thread(self) -> threading.Thread:
        thread = self._thread_factory(
            self._main, name=f"archive-writer-{self.folder.parent.name or 'home'}"
        )
        thread.start()
        return thread

    def _ensure_thread(self) -> None:
        """Restart the writer thread if it died (supervision from the caller's side)."""
        if self._thread.is_alive() or self._closing:
            return
        with self._thread_lock:
            if self._thread.is_alive() or self._closing:
                return
            self.restarts += 1
            log.error(
                "archive writer thread had died (last error: %s); starting a new one, "
                "queued events are kept",
                self.last_error,
            )
            self._thread = self._start_thread()

    # -- API ------------------------------------------------------------------------------

    def submit(
        self,
        build: Build,
        *,
        durable: bool = False,
        label: str = "",
        entry: Encoder | None = None,
        size: int = 0,
    ) -> Future[list[AppendResult]]:
        """Queue a job; returns at once. The future resolves when its events are committed.

        A job with an ``entry`` (how to write it as a spill record) goes to the spill
        instead of memory when the queue is at its bound, when records already wait in the
        spill (nothing in memory may overtake them) or with ``journal_every_event``; its
        future then resolves at once with no results: it is accepted, on disk, and the
        writer takes it in later. Durable jobs always wait in memory (their caller waits).
        """
        future: Future[list[AppendResult]] = Future()
        self._enqueue(Job(build, durable, label, future, entry=entry, size=size))
        return future

    def post(
        self,
        build: Build,
        *,
        label: str,
        on_error: Callable[[BaseException], None],
        entry: Encoder | None = None,
        size: int = 0,
    ) -> None:
        """Queue a job nobody waits for (a hook's): as :meth:`submit`, without a future;
        ``on_error`` is told if it fails (on the thread that finds out, as a future's
        callback would be)."""
        self._enqueue(Job(build, False, label, Told(on_error), entry=entry, size=size))

    def _enqueue(self, job: Job) -> None:
        entry, durable, size = job.entry, job.durable, job.size
        accepted = job.accepted = utc_now() if entry is not None else None
        if self._closing:
            job.future.set_exception(
                WriterUnavailable("the archive writer is closed; this write was rejected")
            )
            return
        with self._gate:
            if (
                accepted is not None
                and entry is not None
                and not durable
                and (  # spill: journal, records waiting there, or the queue is at its bound
                    self._journal
                    or self._spill_open
                    or self._submitted_events - self._taken_events >= self._max_events
                    or self._submitted_bytes - self._taken_bytes + size > self._max_bytes
                )
            ):
                try:
                    self.spill.append(entry, accepted, now=self._journal)
                except Exception as exc:  # disk full, read-only: keep it in memory instead
                    message = f"the archive spill cannot be written ({exc}); kept in memory"
                    if message != self.last_error:
                        log.error("archive: %s", message)
                    self.last_error = message
                else:
                    self._spill_open = True
                    self.spilled += 1
                    wake, self._woken = not self._woken, True
                    if wake:
                        self._queue.put(_WAKE)
                    job.future.set_result([])
                    self._ensure_thread()
                    return
            if self._spill_open:
                job.after = self.spill.position()
            self._submitted_events += 1
            self._submitted_bytes += size
        # outside the gate: the writer, woken by the put, need not wait for it. Calls from one
        # thread stay in order; calls racing from two threads have no order to keep
        self._queue.put(job)
        self._ensure_thread()

    @property
    def queued_events(self) -> int:
        """Jobs in the queue in memory (submitted, not yet taken by the writer)."""
        return self._submitted_events - self._taken_events

    def append_durable(
        self, build: Build, *, timeout: float, label: str = ""
    ) -> list[AppendResult]:
        """Run a durable job and wait (bounded) until it is committed with synchronous=FULL.

        While the open-time proof runs (a full verify after an unclean stop) the wait goes on
        past ``timeout``, up to :data:`PROOF_WAIT_S` in all: the log is being checked, not
        stuck, and the checkpoint lands as soon as it is proved.
        """
        future = self.submit(build, durable=True, label=label)
        start = time.monotonic()
        deadline, proof_deadline = start + timeout, start + max(timeout, PROOF_WAIT_S)
        try:
            while True:  # wake up now and then to restart a writer thread that died
                try:
                    return future.result(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                except TimeoutError:
                    refused = self.refused
                    if refused is not None and self._file_state() == self._refused_state:
                        future.cancel()  # the refusal stands: nothing changed to re-check
                        raise WriterUnavailable(refused) from None
                    now = time.monotonic()
                    if now >= deadline:
                        if not (self.proving and now < proof_deadline):
                            raise
                        deadline = min(now + timeout, proof_deadline)  # its own time after
                    self._ensure_thread()
        except TimeoutError:
            future.cancel()
            waited = time.monotonic() - start
            raise WriterUnavailable(
                f"the archive did not commit within {waited:.1f}s (database locked, disk stalled "
                "or the log still being verified); nothing was reported as archived"
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
        """Stop accepting work, drain for at most ``timeout`` seconds, spill what is left.

        A commit already in flight is waited for (it is bounded by the busy timeout); after
        that nothing more is written to the database. What is still queued goes, in order,
        into the spill (fsynced) for the next open; only what cannot be spilled (durable
        jobs, whose callers were told, and jobs without a spill entry) is reported unwritten.
        """
        self._closing = True
        self._queue.put(None)
        self._thread.join(timeout)
        stopped = not self._thread.is_alive()
        with self._lock:  # a commit in flight ends first (bounded by the busy timeout)
            self._abandoned = True
            # jobs taken from the spill are still in it; the rest were only in memory
            leftover: list[Job] = [job for job in self._pending if job.taken is None]
            self._pending = []
            if self._held is not None:
                leftover.append(self._held)
                self._held = None
        if self._thread.is_alive():
            self._queue.put(None)  # the drain took the stop marker; a blocked thread needs one
            self._thread.join(LATE_JOIN_S)  # it stops at its next look; what it took is _late
        with self._lock:
            leftover += self._late  # taken from the queue while close() was collecting
            self._late = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Job):
                    leftover.append(item)
        # a store that could not be written at the end leaves its record too (HOST.md §3)
        finished = stopped and not leftover and self.last_error is None
        drain = None if finished else _DrainFigures(leftover, timeout, self.last_error)
        rest = self._spill_leftover(leftover, drain)
        unwritten = []
        told = 0  # the spill's loss is said once, loudly, by _spill_leftover
        for job in rest:
            told += job.entry is not None and not job.durable
            described = [f"{e.type}:{e.session}:{e.key}" for e in (job.events or ())] or [
                job.label or "unbuilt job"
            ]
            unwritten.extend(described)
            if not job.future.done():
                job.future.set_exception(
                    WriterUnavailable("the archive writer closed before this write landed")
                )
        report = DrainReport(
            unwritten,
            self.last_error,
            pending=len(leftover),
            spilled=len(leftover) - len(rest),
            finished=finished,
        )
        if len(rest) > told:
            log.error(
                "archive writer closed with %d unwritten events: %s", len(unwritten), unwritten[:20]
            )
        return report

    def _spill_leftover(self, leftover: list[Job], drain: _DrainFigures | None) -> list[Job]:
        """Write what was queued in memory to the spill, in order; return what could not be.

        Jobs queued while the spill was empty precede every segment of this process: they go
        into a segment in front of them. A job kept in memory because the spill could not be
        written goes last, as it was queued. A drain that did not finish (``drain``) ends
        the spill with its ``shutdown_drain`` record, so the next open archives what this
        shutdown left and lost.
        """
        spillable = [job for job in leftover if job.entry is not None and not job.durable]
        rest = [job for job in leftover if job.entry is None or job.durable]
        front = [job for job in spillable if job.after == (0, 0)]
        back = [job for job in spillable if job.after != (0, 0)]
        lost = 0  # accepted records neither the archive nor the spill could take
        errors: list[str] = []
        unsynced = False  # written only by the last try, whose fsync the disk refused

        def attempt(action: Callable[[bool], object], what: str = "") -> bool:
            """Try ``action(sync)`` again after a failure; the last try lets a failed fsync
            pass (the records are on file, if not on the platter)."""
            nonlocal unsynced
            for n in range(SHUTDOWN_SPILL_ATTEMPTS + 1):
                sync = n < SHUTDOWN_SPILL_ATTEMPTS
                try:
                    action(sync)
                except Exception as exc:
                    errors.append(f"{what}{exc}")
                    continue
                unsynced = unsynced or not sync
                return True
            return False

        with self._gate:
            wrote: list[Path | None] = []
            entries = [(job.entry, job.accepted) for job in front if job.entry and job.accepted]
            if attempt(lambda sync: wrote.append(self.spill.prepend(entries, sync=sync))):
                if wrote[-1] is not None:
                    log.warning(
                        "archive: %d queued jobs spilled to %s at shutdown; the next open "
                        "takes them in",
                        len(front),
                        wrote[-1],
                    )
            else:
                rest += front
                spillable = back
            for job in back:
                entry, accepted = job.entry, job.accepted
                assert entry is not None and accepted is not None
                if not attempt(
                    lambda sync, e=entry, a=accepted: self.spill.append(e, a, sync=sync)  # type: ignore[misc]
                ):
                    rest.append(job)
            spillable = [job for job in spillable if job not in rest]
            if drain is not None:
                figures = drain.entry(len(spillable), rest)
                if not attempt(
                    lambda sync: self.spill.append(figures, utc_now(), sync=sync),
                    "the shutdown drain record: ",
                ):
                    drain = None
            if not spillable and drain is None and self._committed >= self.spill.position():
                try:
                    self.spill.drop_active()  # everything in it is committed
                except OSError as exc:
                    log.error("archive: a committed spill segment was not removed: %s", exc)
            elif not attempt(lambda sync: self.spill.release_active(sync=sync)):
                lost = self.spill.abandon_active()
        lost += sum(1 for job in rest if job.entry is not None and not job.durable)
        if lost:
            log.critical(
                "archive: %d accepted events are lost: neither the archive nor its spill could "
                "be written at shutdown (%s). The disk is failing or full: see "
                "docs/OPERATIONS.md, 'Durability'",
                lost,
                "; ".join(dict.fromkeys(errors)) or self.last_error,
            )
        elif unsynced:
            log.critical(
                "archive: accepted events are in the spill, but the disk refused to fsync it "
                "at shutdown (%s): a power loss before the next open may lose them. See "
                "docs/OPERATIONS.md, 'Durability'",
                "; ".join(dict.fromkeys(errors)),
            )
        elif errors:
            log.warning("archive: the spill was written at shutdown after retries: %s", errors)
        for job in spillable:
            if not job.future.done():
                job.future.set_result([])
        return rest

    @property
    def healthy(self) -> bool:
        return self._store is not None and not self._pending and self.refused is None

    @property
    def committed_roots(self) -> Mapping[int, bytes] | None:
        """The tree roots this writer committed: what an unsigned head must be to be served
        from (FORMAT.md 20.5); None when no store is open here."""
        store = self._store
        return store.committed_roots if store is not None else None

    # -- thread ---------------------------------------------------------------------------

    def _file_state(self) -> object:
        """What would make a refusal worth re-checking: the files changed."""
        state: list[tuple[int, int, int] | None] = []
        for name in (DB_NAME, DB_NAME + "-wal"):
            try:
                st = (self.folder / name).stat()
                state.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                state.append(None)
        return (tuple(state), self.witness.state() if self.witness else None)

    @property
    def walk(self) -> WalkState | None:
        """The background walk's progress (None when none ran in this process)."""
        return self._walk.state if self._walk is not None else None

    def _withdraw(self, problem: str) -> None:
        """The background walk found damage: withdraw service at once (recall and appends)."""
        with self._proven_lock:
            self.proven.clear()
            self.basis = None
            self.refused = self.last_error = (
                f"{problem}. Recall and appends are refused; run `hermes-archive verify` and "
                "restore the archive folder from backup (docs/RECOVER.md, 'Tamper detected')."
            )
        log.error("%s", self.refused)

    def _open(self) -> EventStore | None:
        if self._store is not None:
            if self.refused is not None:
                self._close_store()  # the background walk refused the log it had open
                self._refused_state = self._file_state()
                return None
            if file_identity(self.folder / DB_NAME) == self._opened_file:
                return self._store
            log.error(  # appends would go to a file no one will read: prove the new one
                "archive: %s was replaced or removed while it was open; reopening it",
                self.folder / DB_NAME,
            )
            with self._proven_lock:  # nothing is served until the new file is proven
                self.proven.clear()
                self.basis = None
            self._close_store()
        if self.refused is not None and self._file_state() == self._refused_state:
            return None  # nothing changed since the refusal: do not re-read the whole log
        fast = self._verify_on_open and fast_path_ok(self.folder / DB_NAME, self.witness)
        opened = file_identity(self.folder / DB_NAME)  # before: a swap after it reopens
        try:
            store = EventStore.open(
                self.folder,
                projections=self._projections_factory(),
                busy_timeout_ms=self._busy_timeout_ms,
            )
        except Exception as exc:  # corrupt, read-only, missing key...
            message = diagnose(exc, self.folder, self._busy_timeout_ms)
            if message != self.last_error:
                log.error("archive store unavailable: %s", message)
            self.last_error = message
            return None
        walk_from = None
        self._witnessed = None
        if self._verify_on_open:
            self.proving = True
            try:
                if self.witness is not None and not fast:
                    walk_from = store.checkpoint_note()
                proof = open_time_proof(store, self.witness, fast=fast)
                if (
                    proof.ok
                    and self.witness is not None
                    and not self._unwitnessed(store)  # the log first records that it is
                ):
                    store.checkpoint()  # FORMAT.md 15.4 point 3, then the witness advances
                    if advance(self.witness, store):
                        self._witnessed = store.head()
            except WitnessMismatch as exc:
                proof = Proof(False, "checkpoint", str(exc), None, witness=True)
            except Exception as exc:
                store.close()
                self.last_error = diagnose(exc, self.folder, self._busy_timeout_ms)
                log.error("archive store unavailable: %s", self.last_error)
                return None
            finally:
                self.proving = False
            self.last_proof = proof
            if not proof.ok:
                self.refused = refusal(store.path, proof)
                if self.refused != self.last_error:
                    log.error("%s", self.refused)
                self.last_error = self.refused
                store.close()  # opening may have written bookkeeping: take the state after
                self._refused_state = self._file_state()
                return None
        self.refused = None
        self._refused_state = None
        self._history_proven = self._verify_on_open and getattr(proof, "path", "") != "checkpoint"
        if walk_from is not None and getattr(proof, "path", "") == "checkpoint":
            self._start_walk(store, walk_from)  # it pauses between slices: the host goes first
        opened = opened or file_identity(self.folder / DB_NAME)  # made by the open
        with self._proven_lock:
            if self.refused is None:  # the walk may already have found damage
                self.basis = ServeBasis.of(store, opened)
                self.proven.set()
        start = self._submitter_factory
        if start is not None and self._verify_on_open and self._submitter is None:
            self._start_submitter(store, start)
        self._verified = store.head()
        self._first_witness = self._verify_on_open and self._unwitnessed(store)
        self._data_version = _data_version(store)
        self._opened_file = opened
        self._store = store
        return store

    def _start_walk(self, store: EventStore, note: bytes) -> None:
        """Walk the history before the checkpoint the open-time proof started from."""
        from ..format.signed_note import parse_checkpoint, parse_note

        assert self.witness is not None
        if self._walk is not None:
            self._walk.stop()
        path = store.path
        self._walk = BackgroundWalk(
            lambda: connect(path, readonly=True, busy_timeout_ms=self._busy_timeout_ms),
            self.witness,
            store.store_id,
            parse_checkpoint(parse_note(note).text),
            self._withdraw,
            self._thread_factory,
        )
        self._walk.start()

    def _start_submitter(self, store: EventStore, start: SubmitterFactory) -> None:
        """Submit checkpoints to the log's remote witnesses in the background (16.2)."""
        try:
            self._submitter = start(store, self._thread_factory)
        except Exception as exc:  # a witness set that cannot be read never stops archiving
            log.warning("archive: remote witnesses not started: %s", exc)

    def _walk_complete(self) -> bool:
        """Whether every event was verified in this process (so a clean close may vouch)."""
        return self._history_proven or (self._walk is not None and self._walk.state.complete)

    def _unwitnessed(self, store: EventStore) -> bool:
        """Whether this proven store has no witness record yet (its log must be told once)."""
        if self.witness is None:
            return False
        try:
            return self.witness.read_for(store.store_id) is None
        except WitnessMismatch:
            return False

    def _begin_witnessing(self, store: EventStore) -> bool:
        """Write the first witness record; True when the log may now record it.

        The record is at seq 0 (it claims only the store's identity, so it can never lead
        the log) and is written before the ``witness_accepted`` event that says so: a crash
        between the two leaves a witness without the event, and the next commit tries again.
        """
        assert self.witness is not None
        return self.witness.write(store.store_id, 0, digests_v2.genesis(store.store_id).hex())

    def _main(self) -> None:
        """The thread body: the writer loop, restarted in place if anything escapes it."""
        crashes = 0
        while True:
            try:
                self._run()
                return
            except BaseException as exc:  # a bug or an injected fault: keep serving the queue
                crashes += 1
                self.restarts += 1
                self.last_error = (
                    f"the archive writer thread crashed ({type(exc).__name__}: {exc}) and "
                    "restarted; queued events are kept"
                )
                log.exception("archive writer loop crashed; restarting it")
                store = self._store
                if store is not None and store.conn.in_transaction:
                    try:
                        store.conn.execute("ROLLBACK")
                    except Exception:
                        self._close_store()
                with self._lock:
                    self._fail_durable(WriterUnavailable(self.last_error))
                if self._abandoned:
                    self._close_store()
                    return
                time.sleep(RETRY_BACKOFF_S[min(crashes - 1, len(RETRY_BACKOFF_S) - 1)])

    def _run(self) -> None:
        attempt = 0
        if self._verify_on_open and (self.folder / DB_NAME).exists():
            self._open()  # prove the log before anything is served (FORMAT.md 20.4)
        while True:
            if self._abandoned:  # close() gave up waiting and reported the rest
                self._close_store()
                return
            stop = self._gather()
            if self._pending:
                if self._write_pending():
                    attempt = 0
                    self._after_commit()
                else:
                    if stop or self._abandoned:
                        self._close_store()
                        return
                    time.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])
                    attempt += 1
                    continue
            if stop:
                self._close_store(clean=True)
                return

    def _gather(self) -> bool:
        """Fill the batch in acceptance order: queued jobs, and spill records before them."""
        held = self._held
        if held is not None and held.after <= self._consumed:
            self._held = None
            if not self._take(held):
                return False
        stop = False
        if self._held is None:
            stop = self._collect()
        if not stop and (self._held is not None or not self._pending) and self._spill_behind():
            self._fill_from_spill(self._held.after if self._held is not None else None)
        return stop

    def _spill_behind(self) -> bool:
        """Whether the spill holds records not yet taken into a batch."""
        if not self._spill_open:
            return False
        with self._gate:
            return self._spill_open and self._consumed < self.spill.position()

    def _take(self, job: Job) -> bool:
        """Add a queued job to the batch (unless close() has given up); False: it was late."""
        with self._lock:
            if self._abandoned and job.entry is not None and not job.durable:
                self._late.append(job)  # close() spills it with the rest, in order
                return False
            if self._abandoned:  # submitted while close() was draining
                job.future.set_exception(
                    WriterUnavailable("the archive writer closed before this write landed")
                )
                log.error("archive writer closed; a late write was not archived: %s", job.label)
                return False
            self._pending.append(job)
            return True

    def _collect(self) -> bool:
        """Move queued jobs into the pending batch; block only when nothing is waiting.

        A job accepted after records that are still in the spill is held back until they
        are in the batch before it.
        """
        stop = False
        block = not self._pending and not self._spill_behind()
        while len(self._pending) < MAX_BATCH_JOBS:
            try:
                item = (
                    self._queue.get(block=block, timeout=None)
                    if block
                    else self._queue.get_nowait()
                )
            except queue.Empty:
                break
            block = False
            if item is None:
                stop = True
                break
            if item is _WAKE:
                with self._gate:
                    self._woken = False
                break  # look at the spill
            assert isinstance(item, Job)
            self._taken_events += 1
            self._taken_bytes += item.size
            if item.future.cancelled():
                continue
            if item.after > self._consumed:
                self._held = item
                break
            if not self._take(item):
                break  # close() has given up: it collects the rest of the queue itself
            if item.durable:
                break  # commit what precedes it together with it, now
        return stop

    def _fill_from_spill(self, limit: Position | None) -> None:
        """Take spill records into the batch, oldest first, up to ``limit`` (or all there are)."""
        store = self._open()
        if store is None:
            with self._lock:
                self._fail_durable(
                    WriterUnavailable(self.last_error or "archive store unavailable")
                )
                self._spill_from_now()
            time.sleep(RETRY_BACKOFF_S[-1])  # the log cannot be written yet; the spill waits
            return
        while len(self._pending) < MAX_BATCH_JOBS:
            if limit is not None and self._consumed >= limit:
                return
            reading = self._reading
            if reading is None:
                reading = self._reading = self._next_segment(store)
                if reading is None:
                    return
            active = self.spill.active == reading.path
            if active:
                self.spill.write_out()
            size, count = self.spill.readable() if active else (None, END)
            if limit is not None and limit[0] == reading.number:
                count = min(count, limit[1])
            if reading.count >= count:
                return  # caught up with the segment being appended to
            if not self._read_records(store, reading, size, count):
                return

    def _read_records(
        self, store: EventStore, reading: _Reading, size: int | None, count: int
    ) -> bool:
        """Read one run of records into the batch; False when nothing more can be read now."""
        last: Job | None = None
        try:
            records = read_records(
                reading.path,
                key=self.spill.key,
                start=reading.offset,
                limit=size,
                not_before=reading.floor or head_time(store.conn),  # no backdated events
            )
            for record in records:
                reading.floor = record.accepted
                reading.count += 1
                reading.offset = record.end
                position = (reading.number, reading.count)
                if record.end <= reading.skip_until:  # committed before a crash: follow only
                    self._take_in(None, record, reading.state)
                else:
                    last = Job(
                        self._taker(record, reading.state),
                        label=f"spill:{record.kind}",
                        time=record.accepted,
                        taken=(record.segment, record.end, position),
                    )
                    self._pending.append(last)
                self._consumed = position
                if len(self._pending) >= MAX_BATCH_JOBS or reading.count >= count:
                    return True
        except SpillDamaged as exc:
            self._damaged(store, reading, exc)
            return True
        except OSError as exc:
            log.error("archive: the spill segment %s cannot be read: %s", reading.path, exc)
            time.sleep(RETRY_BACKOFF_S[-1])
            return False
        if size is not None:
            return False  # the active segment: everything written so far is taken
        # a finished segment (an earlier process's, or ours released): remove after commit
        if last is None:
            last = Job(lambda store: (), label="spill:end", taken=None)
            self._pending.append(last)
        last.finishes = (reading.path, reading.segment)
        self._consumed = (reading.number, END)
        self._done = reading.number
        self._reading = None
        return True

    def _damaged(self, store: EventStore, reading: _Reading, exc: SpillDamaged) -> None:
        """Stop at a damaged record: report it in the log as an event, set the segment aside."""
        message = (
            f"the archive spill segment {exc.path} is damaged at byte {exc.offset} "
            f"({exc.reason}); {reading.count} records before it are taken in, the segment "
            f"is kept in {exc.path.parent / 'damaged'} for inspection (docs/RECOVER.md, "
            "'Damaged spill')"
        )
        log.error("archive: %s", message)
        at = now_text()
        job = Job(
            lambda store: [builders.write_failed("", at=at, hook="spill", error=message)],
            label="spill:damaged",
        )
        job.damaged = exc.path
        self._pending.append(job)
        with self._gate:
            if self.spill.active == reading.path:
                self.spill.release_active()
        self._consumed = (reading.number, END)
        self._done = reading.number
        self._reading = None

    def _next_segment(self, store: EventStore) -> _Reading | None:
        """The first segment after those taken; where a crash left its take-in, from meta."""
        active = self.spill.active
        path = next(
            (
                p
                for p in segment_paths(self.folder)
                if segment_number(p) > self._done and (p == active or not in_use(p))
            ),
            None,
        )  # a segment another live process appends to is its own to take in
        if path is None:
            return None
        skip = 0
        try:
            with open_segment(path) as handle:
                segment = handle.read(HEADER_BYTES)[len(MAGIC) :]
            row = store.conn.execute(
                "SELECT value FROM meta WHERE name = ?", (META_TAKEN + segment.hex(),)
            ).fetchone()
            # no row, but the log took it in: its row was dropped at its removal, and this
            # is a copy put back (from a backup, or by whoever can write archive/)
            taken = logged_seq(store, builders.spill_taken(segment.hex(), file="")) is not None
            skip = int(row[0]) if row is not None else END if taken else 0
        except (OSError, ValueError, SpillDamaged):
            segment, skip = b"", 0  # unreadable: reading it reports the damage
        return _Reading(path, segment_number(path), segment, skip)

    def _taker(self, record: Record, state: dict[Any, Any]) -> Build:
        return lambda store: self._take_in(store, record, state)

    def _take_in(
        self, store: EventStore | None, record: Record, state: dict[Any, Any]
    ) -> Sequence[NewEvent]:
        """A record's events; a record that cannot be built becomes a ``write_failed`` event."""
        taker = _take_drain if record.kind == DRAIN_KIND else self._kinds.get(record.kind)
        try:
            if taker is None:
                raise ValueError(f"no taker for spill records of kind {record.kind!r}")
            return taker(store, record, state)
        except sqlite3.Error:
            raise
        except Exception as exc:
            if store is None:
                return ()
            log.exception("archive: a spilled %s could not be archived", record.kind)
            session = record.args.get("session")
            return [
                builders.write_failed(
                    session if isinstance(session, str) else "",
                    at=record.accepted,
                    hook=f"spill:{record.kind}",
                    error=f"{type(exc).__name__}: {exc}",
                )
            ]

    def _after_commit(self) -> None:
        """Fsync the spill when due; once all of it is committed, remove it (or keep the
        journal's segment until it is big) and let the queue take jobs again."""
        try:
            self.spill.sync_due()
        except OSError as exc:
            log.error("archive: the spill could not be synced: %s", exc)
        with self._gate:
            if not self._spill_open or self._committed < self.spill.position():
                return
            if self._held is not None or self._consumed < self.spill.position():
                return
            active = self.spill.active
            if active is not None and self._reading is not None:
                if self._journal and self.spill.active_size() < ROTATE_BYTES:
                    return  # keep appending to this journal segment
                try:
                    dropped = self.spill.drop_active()
                except OSError as exc:  # the file stays: its meta row keeps it from doubling
                    log.error("archive: a taken-in spill segment could not be removed: %s", exc)
                    dropped = None
                if dropped is not None:
                    self._removed.append(dropped)
                self._done = self._reading.number
                self._reading = None
            self._spill_open = self._journal

    def _write_pending(self) -> bool:
        store = self._open()
        with self._lock:
            if self._abandoned:
                return False
            if store is None:
                self._fail_durable(
                    WriterUnavailable(self.last_error or "archive store unavailable")
                )
                self._spill_from_now()
                return False
            return self._write_batch(store)

    def _spill_from_now(self) -> None:
        """The log cannot be written now: what waits in memory and what is accepted from now
        on goes to the spill, fsynced, instead of memory (a kill loses none of it). Called
        under ``self._lock``; durable jobs stay (their callers are told)."""
        if self._abandoned:
            return  # close() spills what is left
        try:
            with self._gate:
                if not self._spill_open:
                    self._spill_backlog()
                self._spill_open = True
            self.spill.sync()
        except OSError as exc:
            message = f"the archive spill cannot be written ({exc}); kept in memory"
            if message != self.last_error:
                log.error("archive: %s", message)

    def _spill_backlog(self) -> None:
        """Move the jobs waiting in memory (the batch, then the queue) to the spill, in order
        (under the gate, with the spill empty of unconsumed records: they precede them)."""
        queued: list[Job] = []
        stop = False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stop = True
            elif item is _WAKE:
                self._woken = False
            elif isinstance(item, Job):
                self._taken_events += 1
                self._taken_bytes += item.size
                if not item.future.cancelled():
                    queued.append(item)
        kept: list[Job] = []
        for job in [*self._pending, *queued]:
            if kept or job.taken is not None or job.durable or not job.entry or not job.accepted:
                kept.append(job)  # from here on in memory, in order
                continue
            try:
                self.spill.append(job.entry, job.accepted)
            except Exception:
                kept.append(job)
                continue
            self.spilled += 1
            if not job.future.done():
                job.future.set_result([])
        self._pending = kept
        if stop:
            self._queue.put(None)

    def _write_batch(self, store: EventStore) -> bool:
        batch = self._pending
        durable = any(job.durable for job in batch)
        results: list[list[AppendResult]] = []
        try:
            with store.transaction(durable=durable):
                self._check_foreign_rows(store)
                for job in batch:
                    results.append(self._append_job(job, store))
                self._record_progress(store, batch)
                if durable and self._first_witness and self._begin_witnessing(store):
                    store.append_in_transaction([first_witness_event(store.head())])
                end = store.head()
        except _Redo:
            self._pending = [job for job in batch if not job.failed]
            return self._write_batch(store)
        except _Refused as exc:
            self.refused = self.last_error = str(exc)
            self._refused_state = self._file_state()
            log.error("%s", self.refused)
            self._fail_durable(WriterUnavailable(self.refused))
            self._close_store()
            return False
        except Exception as exc:
            message = diagnose(exc, self.folder, self._busy_timeout_ms)
            if message != self.last_error:
                log.error("archive append of %d jobs failed: %s", len(batch), message)
            self.last_error = message
            self._fail_durable(WriterUnavailable(f"the archive could not commit: {message}"))
            self._reset_store_after(exc)
            self._spill_from_now()
            return False
        self.last_error = None
        self._verified = end
        self._first_witness = self._first_witness and not durable
        witnessed = self._witnessed
        if (  # only after a FULL commit, and only when it moved the head
            durable
            and self.witness is not None
            and (witnessed is None or not _same_head(witnessed, end))
        ):
            try:
                if advance(self.witness, store):
                    self._witnessed = end
            except WitnessMismatch as exc:  # rewritten under us: refuse what follows
                self._withdraw(str(exc))
            except Exception:  # the commit stands; only the witness lags behind it
                log.exception("archive: the local witness did not advance")
        for job, job_results in zip(batch, results, strict=True):
            if not job.future.done():
                job.future.set_result(job_results)
            if job.taken is not None:
                self._committed = max(self._committed, job.taken[2])
            for ended in (job.finishes[0] if job.finishes else None, job.damaged):
                if ended is not None:  # all of that segment is in
                    self._committed = max(self._committed, (segment_number(ended), END))
            self._settle_segment(job)
        self._pending = []
        if self._submitter is not None:
            self._submitter.notify()  # returns at once; the witnesses' threads do the work
        return True

    def _record_progress(self, store: EventStore, batch: list[Job]) -> None:
        """In the batch's transaction: how far each spill segment is taken in (exactly once).

        One meta row per segment, so a segment whose removal failed is still known when a
        later one has been taken in; rows of segments removed since are dropped. The log
        itself gets a ``spill_taken`` per segment (once: its identity is the segment id),
        which outlives the row, so a copy of the segment put back later adds nothing.
        """
        last: dict[bytes, tuple[int, int, str | None]] = {}  # id -> end, number, time
        for job in batch:
            if job.taken is not None:
                segment, end, (number, _) = job.taken
                last[segment] = (end, number, job.time)
        for segment, (end, number, accepted) in last.items():
            store.conn.execute(
                "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT(name) "
                "DO UPDATE SET value = excluded.value",
                (META_TAKEN + segment.hex(), str(end)),
            )
            taken = builders.spill_taken(segment.hex(), file=f"{number:012d}{SUFFIX}")
            store.append_in_transaction([taken], time=accepted)
        for segment in self._removed:
            store.conn.execute("DELETE FROM meta WHERE name = ?", (META_TAKEN + segment.hex(),))
        self._removed = []

    def _settle_segment(self, job: Job) -> None:
        """After the commit: remove a segment taken in whole, set a damaged one aside."""
        try:
            if job.finishes is not None:
                remove(job.finishes[0])
                self._removed.append(job.finishes[1])
            if job.damaged is not None:
                kept = set_aside(job.damaged)
                self.spill_damage.append(str(kept))
        except OSError as exc:
            log.error("archive: spill segment bookkeeping failed: %s", exc)

    def _check_foreign_rows(self, store: EventStore) -> None:
        """Verify what other processes appended since our last commit, before building on it."""
        known = self._verified
        head = store.head()
        if known is None or _same_head(head, known):
            return
        if head.seq < known.seq:
            raise _Refused(
                f"the archive at {store.path} went back from seq {known.seq} to {head.seq} "
                "while it was open (rolled back or replaced underneath the writer). Appends "
                "are refused; see docs/RECOVER.md, 'Witness mismatch'."
            )

        report = verify_database(store.conn, store.key)  # the whole log, until ranged checks land
        if not report.ok:
            raise _Refused(
                f"the archive at {store.path} failed verification at seq "
                f"{report.first_bad_seq} (appended by another process): {report.problem}. "
                "Appends are refused; run `hermes-archive verify` (docs/RECOVER.md, "
                "'Tamper detected')."
            )

    @staticmethod
    def _append_job(job: Job, store: EventStore) -> list[AppendResult]:
        """Build (inside the transaction, so it sees the jobs before it) and append one job.

        A job whose own input cannot be archived fails alone, so it can never wedge the
        queue. Builds only read and ``append_in_transaction`` checks its input before its
        first insert, so such a failure has written nothing and needs no savepoint; should it
        have written anyway, :class:`_Redo` rolls the batch back and it is written again
        without the job. Database errors fail the whole batch, which is retried.
        """
        changes = store.conn.total_changes
        try:
            if job.events is None:
                job.events = list(job.build(store))
            # an event taken in from the spill carries the time it was accepted
            return store.append_in_transaction(job.events, time=job.time)
        except TamperedPart as exc:  # the log was edited under us
            raise _Refused(
                f"{exc}. Appends are refused; run `hermes-archive verify` (docs/RECOVER.md, "
                "'Tamper detected')."
            ) from exc
        except sqlite3.Error:
            raise
        except Exception as exc:
            log.exception("archive job %s could not be archived", job.label or "?")
            job.events, job.failed = [], True
            if not job.future.done():
                job.future.set_exception(exc)
            if store.conn.total_changes != changes:
                raise _Redo from exc
            return []

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
        held = self._held  # waiting for spill records the log cannot take now
        if held is not None and held.durable:
            self._held = None
            if not held.future.done():
                held.future.set_exception(error)

    def _reset_store_after(self, exc: Exception) -> None:
        """After a failed commit, reopen next time (the file may have been fixed or replaced).

        A lock held by another process is waited out on the same connection; anything else
        (disk full, read-only, corrupt, I/O) reopens, which re-runs the open-time proof.
        """
        if classify(exc) is Failure.BUSY:
            return
        if isinstance(exc, (StoreError, OSError, sqlite3.DatabaseError)):
            self._close_store()

    def _close_store(self, *, clean: bool = False) -> None:
        """Close the connection; on a clean stop also record the witness (with fingerprint)."""
        store, self._store = self._store, None
        if store is None:
            return
        if self._walk is not None and (clean or self._abandoned):
            self._walk.stop(timeout=5.0)
        submitter, self._submitter = self._submitter, None
        if submitter is not None:
            submitter.close(timeout=1.0)
        head: Head | None = None
        synced = foreign = False
        if clean and self.witness is not None and self.refused is None:
            try:
                if self._first_witness and self._begin_witnessing(store):
                    store.append([first_witness_event(store.head())], durable=True)
                    self._verified = store.head()
                    self._first_witness = False
                head = store.head()
                store.checkpoint()
                advance(self.witness, store)
                if self._verified is not None and _same_head(head, self._verified):
                    foreign = _data_version(store) != self._data_version
                    busy = store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                    synced = busy == 0  # the checkpoint synced the log and the database
            except Exception:
                log.debug("archive: final checkpoint failed", exc_info=True)
        try:
            store.close()
        except Exception:
            log.debug("closing the archive store failed", exc_info=True)
        if head is None or not synced or self.witness is None:
            return
        fingerprint = None
        if not self._walk_complete():
            self.witness.write(store.store_id, head.seq, head.chain)  # history not yet walked:
            return  # no fingerprint, so the next open does not skip the walk
        if foreign:  # bytes another connection wrote were never proven: no fast path next time
            log.info(
                "archive: another connection wrote to %s; the next open verifies it", store.path
            )
            self.witness.write(store.store_id, head.seq, head.chain)
            return
        try:
            wal = self.folder / (DB_NAME + "-wal")
            if not wal.exists() or wal.stat().st_size == 0:
                fingerprint = fingerprint_file(self.folder / DB_NAME)
                if wal.exists() and wal.stat().st_size > 0:
                    fingerprint = None  # another process wrote meanwhile
        except OSError:
            fingerprint = None
        self.witness.write(store.store_id, head.seq, head.chain, fingerprint=fingerprint)


def _data_version(store: EventStore) -> int:
    """SQLite's count of commits made by *other* connections (ours leave it alone)."""
    return int(store.conn.execute("PRAGMA data_version").fetchone()[0])


def logged_seq(store: EventStore, event: NewEvent) -> int | None:
    """The seq of the event with ``event``'s identity in the log (an event without parts,
    such as ``spill_taken``), or None when none is archived."""
    key, parts = key_text(event.key), parts_text([])
    return store.identity_seq(digests_v2.identity(event.type, event.session, key, parts).hex())


@dataclass
class _Reading:
    """The spill segment being taken in: how far, and the takers' state for it."""

    path: Path
    number: int
    segment: bytes  # its id, from the header
    skip_until: int  # records ending at or before this offset were committed (meta)
    offset: int = 0
    count: int = 0
    state: dict[Any, Any] = field(default_factory=dict)
    floor: str = ""  # the accepted time of the last record read (the next is not earlier)


class _Refused(Exception):
    """The log cannot be built upon (failed verification, went backwards)."""


class _Redo(Exception):
    """A failed job had written rows: roll the batch back and write it again without it."""


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
