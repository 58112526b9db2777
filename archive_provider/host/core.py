"""ArchiveCore: what every provider over one profile's archive shares.

:class:`~archive_provider.host.provider.ArchiveProvider` and hivemind's provider are thin
adapters from host hooks to this object: it owns the profile binding, the settings, the
session state (session, parent, agent context, turn) and the transcript cache of the turn
delta, the writer, the shipper to a central store, the one read-only connection (recall,
the peers block, tools), search and submission. Nothing outside reads its underscored
members; the attributes and methods below are its API (docs/DESIGN.md, "Composition").
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..audit.erasure import RetentionWorker
from ..domain.clock import now_text
from ..domain.evidence import archivable_text, is_set
from ..fleet.ship import BackgroundShipper, shippers
from ..format.events import NewEvent
from ..projections.recall import Hit, ProofCache, Prover, TermCounts, search
from ..projections.registry import default_projections
from ..storage.checkpoint_proof import pinned
from ..storage.spill import Encoder
from ..storage.store import (
    DB_NAME,
    EventStore,
    Projection,
    archive_dir,
    connect,
    file_identity,
)
from ..storage.witness import Witness, WitnessMismatch
from ..storage.writer import Writer, WriterUnavailable, writers
from ..witnesses.remote import start_submitter
from .hermes import spawn_thread
from .known_checkpoints import KnownCheckpoints
from .settings import Settings
from .spill_kinds import RECORD_BUILDERS, spill_entry, spill_kinds

log = logging.getLogger(__name__)

T = TypeVar("T")
#: how long recall waits for the open-time proof (the fast path takes milliseconds)
PROOF_WAIT_S = 2.0
#: how often the reader's opener looks whether the archive closed while it waits
WARM_POLL_S = 0.25
Build = Callable[[EventStore], Sequence[NewEvent]]


def session_text(value: Any) -> str:
    """A session id as the log stores it: text SQLite can hold ('' for none).

    Total, so no hook loses its input to an odd id: an id without a text is described by
    its type, and a lone surrogate is written as its escape (``\\ud800``), which keeps
    two ids that differ there apart (U+FFFD would merge their sessions).
    """
    try:
        text = str(value) if is_set(value) else ""
    except Exception:
        text = f"<{type(value).__name__} without a text>"
    return archivable_text(text).encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class Transcript:
    """The last transcript archived for a session: a cache for the delta, never the truth."""

    turns: int  # the session's turn count once it was archived
    raw: list[Any]  # deep copies of the messages as the host sent them

    def is_prefix_of(self, messages: Sequence[Any]) -> bool:
        """Whether ``messages`` starts with the cached transcript, unchanged.

        A message whose comparison raises or is not a plain truth value (an array, say)
        counts as changed: the full path then decides what is new.
        """
        if len(self.raw) > len(messages):
            return False
        try:
            return all(bool(old == new) for old, new in zip(self.raw, messages, strict=False))
        except Exception:
            return False


class FileNotProven(sqlite3.OperationalError):
    """The database at the path is not the file the open-time proof established (replaced or
    removed while open): nothing is read from it until it is proven like a first open."""


class ArchiveCore:
    """One profile's archive as the providers use it: state, writer, reader, search, submit."""

    def __init__(
        self, projections: Callable[[], Sequence[Projection]] = default_projections
    ) -> None:
        # Cheap and side-effect free: discovery and `hermes memory status` construct us.
        #: the projections this archive's writer keeps (hivemind's provider adds its peers)
        self.projections = projections
        self.home: Path | None = None
        self.writer: Writer | None = None
        #: the background shipper to a central store (the ``ship_to`` setting), if any
        self.shipper: BackgroundShipper | None = None
        self.settings = Settings()
        self.session = ""
        self.parent_session = ""
        self.agent_context = "primary"
        self.turn = 0
        #: the author ``on_turn_start`` named for the turn in progress (domain/authors.py)
        self.turn_author: dict[str, Any] | None = None
        #: what the last prefetch injected: a host ``RecallStatus`` or None (docs/HOST.md §3)
        self.recall_status: Any = None
        #: checkpoints committed in this process, so an identical retry is recognised cheaply
        self.checkpoints = KnownCheckpoints()
        #: writer-thread cache of the last transcript archived per session (the turn delta)
        self.transcripts: dict[str, Transcript] = {}
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        self._reader_file: tuple[int, int] | None = None  # store.file_identity at its open
        #: opens the reader off the hooks' path once the log is proven (see :meth:`_warm`)
        self._warming: threading.Thread | None = None
        self._closing = threading.Event()
        #: what serve-time proofs reuse between queries (used under the reader's lock)
        self._proofs = ProofCache()
        self._counts = TermCounts()  # term frequencies recall reuses (also under the lock)
        #: applies the recorded retention policy at open and daily (primary context only)
        self.retention: RetentionWorker | None = None

    @property
    def primary(self) -> bool:
        """The primary context: the one that applies retention and joins peers."""
        return self.agent_context == "primary"

    @property
    def writes_turns(self) -> bool:
        """Whether this context archives its turns, memory writes, tool calls and recalls:
        the primary context always; a cron job's or a subagent's as the settings say
        (``cron_turns``, ``subagent_turns``: on unless turned off, since an
        unattended job's acts are what an audit asks about first); never a checkpoint-only
        one. Every context archives its checkpoints."""
        if self.agent_context == "cron":
            return self.settings.cron_turns
        if self.agent_context == "subagent":
            return self.settings.subagent_turns
        return self.primary

    @property
    def checkpoint_only(self) -> bool:
        """A checkpoint-only context (docs/HOST.md §5): checkpoints, no recall, no tools."""
        return self.agent_context == "checkpoint_only"

    # -- lifecycle -----------------------------------------------------------------------

    def open_writer(self) -> None:
        """Share the profile's writer (one per database per process); once per core."""
        if self.writer is None and self.home is not None:
            self.writer = writers.acquire(
                archive_dir(self.home),
                projections_factory=self.projections,
                thread_factory=spawn_thread,
                busy_timeout_ms=int(self.settings.busy_timeout_s * 1000),
                witness=Witness.for_home(self.home),
                submitter_factory=start_submitter,  # the log's remote witnesses, if it names any
                kinds=spill_kinds(self.settings.redact_secrets),
                queue_max_events=self.settings.queue_max_events,
                queue_max_bytes=self.settings.queue_max_bytes,
                spill_fsync_s=self.settings.spill_fsync_s,
                journal_every_event=self.settings.journal_every_event,
            )
            if self.writer is not None and self._warming is None:
                self._closing.clear()
                self._warming = spawn_thread(self._warm, name="archive-reader-open")
                self._warming.start()
            if self.primary and self.retention is None:
                self.retention = RetentionWorker(
                    archive_dir(self.home),
                    lambda conn: self.projections(),
                    spawn_thread,
                    ready=self.writer.proven if self.writer is not None else None,
                ).start()

    def open_shipper(self) -> None:
        """Share the profile's shipper when ``ship_to`` is set; its failure never raises.

        Shipping reads the log on its own thread, so no hook waits on the network; the
        local log stays the commit point (DESIGN.md invariant 12).
        """
        if self.shipper is not None or self.home is None or not self.settings.ship_to:
            return
        try:
            self.shipper = shippers.acquire(
                archive_dir(self.home),
                self.settings.ship_to,
                interval=self.settings.ship_interval_s,
                thread_factory=spawn_thread,
            )
        except Exception as exc:  # archiving goes on; only the central copy waits
            log.error("archive: shipping did not start: %s", type(exc).__name__)

    def close(self) -> None:
        """Release the retention worker, the shipper, the writer (drained within the settings'
        budget) and the reader."""
        self._closing.set()
        warming, self._warming = self._warming, None
        if warming is not None:
            warming.join(WARM_POLL_S * 4)
        retention, self.retention = self.retention, None
        if retention is not None:
            retention.close(timeout=self.settings.drain_timeout_s)
        shipper, self.shipper = self.shipper, None
        if shipper is not None:
            shippers.release(shipper)
        writer, self.writer = self.writer, None
        if writer is not None:
            writers.release(writer, timeout=self.settings.drain_timeout_s)  # it says what is lost
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            self._proofs, self._counts = ProofCache(), TermCounts()

    # -- writing -------------------------------------------------------------------------

    def submit(
        self, build: Build, label: str, entry: Encoder | None = None, size: int = 512
    ) -> None:
        """Hand the writer a job and return; a failure is logged and put on the record.

        ``entry`` is the same job as a spill record (a kind of :func:`spill_kinds`): with it
        the writer may spill the job instead of holding it in memory; ``size`` estimates
        the bytes the queue holds for it (its bound counts them).
        """
        writer = self.writer
        if writer is None:
            log.warning("archive: %s not archived: the archive is not initialized", label)
            return

        def report(error: BaseException) -> None:
            log.error("archive: %s could not be archived: %s", label, error)
            if not isinstance(error, WriterUnavailable):  # this input, not the store, failed
                self.record_write_failure(label, error)

        writer.post(build, label=label, on_error=report, entry=entry, size=size)

    def submit_record(self, kind: str, *, size: int = 512, **args: Any) -> None:
        """Hand the writer one simple hook's record (a kind of :data:`RECORD_BUILDERS`).

        The direct path builds its event with the function a take-in from the spill uses,
        so a hook makes the same event whether it was written at once or spilled first.
        """
        build_event = RECORD_BUILDERS[kind]
        self.submit(lambda store: [build_event(store, args)], kind, spill_entry(kind, **args), size)

    def submit_job(self, build: Build, label: str) -> Future[Any]:
        """Hand the writer a job; the caller owns the future (raises when the archive is closed)."""
        writer = self.writer
        if writer is None:
            raise RuntimeError("the archive is closed")
        return writer.submit(build, label=label)

    def record(self, build: Build, label: str, wait_s: float) -> bool:
        """Log an outcome and wait (bounded) until it is committed; False if it is not yet."""
        try:
            self.submit_job(build, label).result(wait_s)
            return True
        except Exception as exc:
            log.error("archive: %s not archived (yet): %s", label, exc)
            return False

    def record_write_failure(self, hook: str, error: BaseException) -> None:
        """Put a hook whose input could not be archived on the record (never twice over)."""
        if hook == "write_failed":
            return
        session, at = self.session, now_text()
        text = f"{type(error).__name__}: {error}"
        self.submit_record("write_failed", session=session, at=at, hook=hook, error=text)

    def record_recall(self, session_id: str, query: str, result: str, sources: list[int]) -> None:
        """Log what prefetch returned for this turn as ``recall_served`` (the host may trim it)."""
        if not result or not self.writes_turns:
            return
        session, turn, at = session_text(session_id) or self.session, self.turn, now_text()
        redact = self.settings.redact_secrets
        self.submit_record(
            "recall_served",
            size=512 + len(query) + len(result),
            session=session,
            turn=turn,
            query=query,
            result=result,
            sources=sources,
            at=at,
            redact=redact,
        )

    # -- reading -------------------------------------------------------------------------

    def read(self, query: Callable[[sqlite3.Connection], T], *, flush_s: float = 0.0) -> T:
        """Run ``query`` on the one read-only connection to the log (committed state).

        The connection opens on first use; with ``flush_s`` a new profile's writer gets
        that long to create the tables first. Raises ``sqlite3.OperationalError`` while
        the archive is not initialized.
        """
        with self._reader_lock:
            return query(self._open_reader(flush_s))

    def _open_reader(self, flush_s: float = 0.0) -> sqlite3.Connection:
        """The reader, opened if it is not, or again if the file at the path is no longer the
        one it opened (replaced or removed: it would read what no one else sees). Once the
        writer has proven the log, only on the file its proof established
        (:class:`FileNotProven` otherwise). Call under the reader's lock."""
        if self.home is None:
            raise sqlite3.OperationalError("the archive is not initialized")
        path = archive_dir(self.home) / DB_NAME
        basis = self.writer.basis if self.writer is not None else None
        if self._reader is not None and (
            file_identity(path) != self._reader_file
            or (basis is not None and basis.file != self._reader_file)
        ):
            self._reader.close()
            self._reader = None
            self._proofs, self._counts = ProofCache(), TermCounts()
        if self._reader is None:
            if flush_s and self.writer is not None:
                self.writer.flush(flush_s)
            self._reader_file = file_identity(path)  # before: a swap after it reopens
            if basis is None or self._reader_file == basis.file:
                self._reader = connect(path, readonly=True)
        if self._reader is None or (basis is not None and file_identity(path) != basis.file):
            raise FileNotProven(  # read nothing from a file the open-time proof did not prove
                f"{path} is not the file the archive's open-time proof established (it was "
                "replaced or removed while the archive was open); nothing is read from it "
                "until it is proven like a first open"
            )
        return self._reader

    def _warm(self) -> None:
        """Open the reader once the writer has proven the log, on this thread of its own.

        A connection's first statement makes SQLite parse the whole schema (69 objects in
        v2: ~0.5 ms, ~1 ms with the open, more under load); whichever read came first paid
        it on the host's thread: the first prefetch, or the first identical checkpoint retry
        (3.6x hashing its evidence at 50 messages). What is read, and what a read proves,
        is unchanged. Best effort: a failure here leaves the open to the first read.
        """
        writer = self.writer
        while writer is not None and not writer.proven.wait(WARM_POLL_S):
            if self._closing.is_set() or writer.refused:
                return
        with self._reader_lock:
            if self._closing.is_set():
                return
            try:
                self._open_reader().execute("SELECT 1 FROM events LIMIT 0").fetchall()
            except sqlite3.Error as exc:
                log.debug("archive: the reader was not opened ahead: %s", exc)

    def search(self, query: str, **kwargs: Any) -> tuple[list[Hit], list[str]]:
        """Ranked hits, each re-proved from the log (invariant 11), and why any was withheld.

        Nothing before the archive exists; refused while its proof has failed.
        """
        if self.home is None:
            return [], []
        writer = self.writer
        if writer is not None and writer.refused:  # a log that failed its proof is not recalled
            raise RuntimeError(f"archive recall is withheld: {writer.refused}")
        if writer is not None and not writer.proven.wait(PROOF_WAIT_S):
            if writer.refused:
                raise RuntimeError(f"archive recall is withheld: {writer.refused}")
            why = f": {writer.last_error}" if writer.last_error else ""  # e.g. a lost key
            raise RuntimeError(  # FORMAT.md 20.4: nothing is served before the log is proven
                "archive recall is withheld: integrity check pending (the open-time proof of "
                f"the archive has not passed yet){why}"
            )
        if writer is None or not (archive_dir(self.home) / DB_NAME).exists():
            return [], []
        basis = writer.basis  # what the open-time proof established (None: withdrawn since)
        if basis is None:
            raise RuntimeError(
                "archive recall is withheld: the archive is being proven again (its database "
                "file was replaced while it was open)"
            )

        try:  # the key and tree the witness pinned, outside the profile (FORMAT.md 20.5)
            anchor = pinned(writer.witness) if writer.witness else None
        except WitnessMismatch as exc:
            raise RuntimeError(f"archive recall is withheld: {exc}") from None
        roots = writer.committed_roots

        def proven(conn: sqlite3.Connection) -> tuple[list[Hit], list[str]]:
            problem = basis.problem(conn)
            if problem:
                raise FileNotProven(f"the archive file is not the one proven: {problem}")
            vkey, checkpoint = anchor if anchor is not None else (basis.vkey, None)
            prover = Prover(conn, vkey, checkpoint, roots, self._proofs)
            hits = search(conn, query, counts=self._counts, **kwargs)
            return prover.proven(hits), prover.withheld

        try:
            hits, withheld = self.read(proven)
        except FileNotProven as exc:
            raise RuntimeError(f"archive recall is withheld: {exc}") from None
        if withheld:
            log.error(
                "archive: %d recalled excerpts withheld, not proven against the log (%s); "
                "run `hermes-archive verify --projections` and `hermes-archive replay`",
                len(withheld),
                withheld[0],
            )
        return hits, withheld
