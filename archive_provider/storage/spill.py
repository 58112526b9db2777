"""The spill: accepted work the writer has not committed yet, on disk, in order.

What the in-memory queue cannot hold (its bound is reached, the provider is shutting
down, or ``journal_every_event`` asks for it) is appended here instead of being dropped,
and the writer takes it in, in order, before anything accepted after it. The spill lives
in ``<archive>/spill/`` as numbered *segments*, each append-only:

    header  = "HASPILL2" (8 bytes) || segment id (16 random bytes)
    record  = length (u32, big-endian) || check (32 bytes) || body (length bytes)
    check   = BLAKE3-keyed(spill key, "hermes-archive/v2/spill\\0" || segment id || length || body)
    body    = JSON {"accepted": time text, "args": {...}, "kind": text}

The spill key is not in the profile: it is derived from the local witness's own key, in
the witness folder outside ``HERMES_HOME`` (:func:`archive_provider.storage.checkpoint_proof.
spill_key`). Whoever can write ``archive/spill/`` can therefore not write a record the
writer takes in, and the genuine writer never signs such a record into history (docs/
DESIGN.md, "Trust boundary"). Without a witness (a writer made without one) the check is
unkeyed and protects against torn writes only.

A record cut short (a crash mid-write), changed, or not made with the spill key fails its
check; reading stops there and the segment is moved aside into ``spill/damaged/`` (kept,
never deleted) for the writer to report. A segment of the unauthenticated format 1
(``HASPILL1``) is set aside the same way. A record's ``accepted`` time is never earlier
than what the log already holds (:func:`read_records` raises it to ``not_before``). The
writer records how far it has taken a segment in the ``meta`` row
``spill_taken:<segment id>`` inside the transaction that commits it, so a segment taken
in again (a crash after the commit, before its removal) adds nothing twice; the same
transaction appends a ``spill_taken`` event identified by the segment id, which outlives
the row, so a copy put back after the removal adds nothing either. The records' own
identities would not do: a turn's and a memory write's include their ordinal in the
session. docs/FORMAT.md, "Spill file", is the written spec.

This module knows files and records only; what a record means (its ``kind``) is the
provider's business: it hands the writer an encoder per job and a taker per kind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from blake3 import blake3

from ..domain.clock import format_time, parse_time, utc_now
from ..domain.evidence import archivable
from ..errors import ArchiveDamaged
from .safe_files import regular_file_problem, sync_dir

log = logging.getLogger(__name__)

SPILL_DIR = "spill"
DAMAGED_DIR = "damaged"
SUFFIX = ".spill"
MAGIC = b"HASPILL2"
#: the header of a segment written by 0.1 (records checked by an unkeyed hash): refused
MAGIC_UNAUTHENTICATED = b"HASPILL1"
ID_BYTES = 16
HEADER_BYTES = len(MAGIC) + ID_BYTES
CHECK_BYTES = 32
FRAME_BYTES = 4 + CHECK_BYTES
DOMAIN = b"hermes-archive/v2/spill\x00"
MAX_RECORD_BYTES = 1 << 30  # a length beyond this is damage, not a record to allocate for
META_TAKEN = "spill_taken:"  # + segment id (hex): the end offset of the last record taken in
END = 1 << 62  # "every record of the segment" in a position
#: a journal segment that is fully taken in is replaced once it is this big
ROTATE_BYTES = 8 << 20
#: records a hook buffers before it writes them itself (the writer thread writes them
#: sooner: before it reads the spill and after every commit)
BUFFER_BYTES = 1 << 20

#: what a job becomes in the spill: (kind, args) from the encoder's per-segment state
Encoder = Callable[[dict[Any, Any]], tuple[str, dict[str, Any]]]


class SpillDamaged(ArchiveDamaged):
    """A segment stops being readable at ``offset``: a torn tail, a changed record, or an
    entry that is not a regular file (a link, a FIFO) and so is not the archive's own."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path.name} is damaged at byte {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason


@dataclass(frozen=True)
class Record:
    """One accepted job as the spill holds it; ``end`` is the offset just after it."""

    segment: bytes
    end: int
    kind: str
    accepted: str
    args: dict[str, Any]


def check(key: bytes | None, segment: bytes, length: bytes, body: bytes) -> bytes:
    """A record's check: keyed with the spill key (unkeyed only for a writer without one)."""
    data = DOMAIN + segment + length + body
    return (blake3(data, key=key) if key is not None else blake3(data)).digest()


def frame(segment: bytes, body: bytes, key: bytes | None) -> bytes:
    """A record: length, check, body (see the module docstring)."""
    length = len(body).to_bytes(4, "big")
    return length + check(key, segment, length, body) + body


_JSON = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=archivable)


def record_body(kind: str, accepted: str, args: dict[str, Any]) -> bytes:
    """JSON (ASCII, so a lone surrogate survives as its escape); an object JSON cannot write
    is written as the archive would store it (:func:`archivable`)."""
    value = {"accepted": accepted, "args": args, "kind": kind}
    try:
        return _JSON.encode(value).encode("ascii")
    except (TypeError, ValueError):  # keys JSON cannot write, a cycle: the archive's form
        return _JSON.encode(archivable(value)).encode("ascii")


def segment_number(path: Path) -> int:
    return int(path.name[: -len(SUFFIX)])


def segment_paths(folder: Path) -> list[Path]:
    """The segments waiting in ``<archive>/spill``, oldest first."""
    where = folder / SPILL_DIR
    try:
        # a link or FIFO named like a segment is listed too: reading it reports and sets it aside
        names = [p for p in where.iterdir() if p.name.endswith(SUFFIX) and _not_a_folder(p)]
    except FileNotFoundError:
        return []
    found = []
    for path in names:
        try:
            segment_number(path)
        except ValueError:
            continue
        found.append(path)
    return sorted(found, key=segment_number)


def in_use(path: Path) -> bool:
    """Whether a live process appends to this segment: it holds the segment's lock.

    Such a segment is that process's to take in; another process (a second gateway,
    ``forget`` or ``migrate`` from the CLI) taking it would commit its records twice and
    remove the file under its writer. The lock goes with the process, so a crash leaves an
    unlocked segment for the next open. Anything that cannot be probed is not in use:
    reading it reports what is wrong.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also lets go of the probe's shared lock


def damaged_paths(folder: Path) -> list[Path]:
    where = folder / SPILL_DIR / DAMAGED_DIR
    try:
        return sorted(p for p in where.iterdir() if _not_a_folder(p))
    except FileNotFoundError:
        return []


def _not_a_folder(path: Path) -> bool:
    try:
        return not stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:  # taken in and removed meanwhile
        return False


def open_segment(path: Path) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file of its own.

    Opened without following a link and without blocking (a FIFO would hang the writer),
    then checked on the descriptor: a link would take in another profile's spill, so
    anything but a regular file is :class:`SpillDamaged` (set aside and reported).
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpillDamaged(path, 0, regular_file_problem(path) or str(exc)) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SpillDamaged(path, 0, regular_file_problem(path) or "not a regular file")
    return os.fdopen(fd, "rb")


@dataclass(frozen=True)
class Pending:
    """What waits in the spill, for status: segments, records (when counted), bytes, damage."""

    segments: int
    bytes: int
    damaged: list[str]


def pending(folder: Path) -> Pending:
    paths = segment_paths(folder)
    size = 0
    for path in paths:
        with contextlib.suppress(OSError):  # taken in and removed meanwhile
            size += path.stat().st_size
    return Pending(len(paths), size, [p.name for p in damaged_paths(folder)])


def read_records(
    path: Path,
    *,
    key: bytes | None,
    start: int = 0,
    limit: int | None = None,
    not_before: str = "",
) -> Iterator[Record]:
    """The records of a segment from offset ``start`` (0: the first) up to ``limit`` bytes,
    each checked with the spill ``key``; an ``accepted`` time before ``not_before`` (the
    time of the log's last event) or before the record's predecessor is raised to it.

    Raises :class:`SpillDamaged` where a record is cut short or fails its check, after
    yielding every good record before it.
    """
    with open_segment(path) as handle:
        header = handle.read(HEADER_BYTES)
        if header.startswith(MAGIC_UNAUTHENTICATED):
            raise SpillDamaged(
                path, 0, "a format-1 segment, whose records nothing authenticates (not taken in)"
            )
        if len(header) < HEADER_BYTES or not header.startswith(MAGIC):
            raise SpillDamaged(path, 0, "no spill header (cut short or not a spill file)")
        segment = header[len(MAGIC) :]
        offset = max(start, HEADER_BYTES)
        handle.seek(offset)
        end = os.fstat(handle.fileno()).st_size if limit is None else limit
        while offset < end:
            head = handle.read(FRAME_BYTES)
            if len(head) < FRAME_BYTES or offset + FRAME_BYTES > end:
                raise SpillDamaged(path, offset, "a record cut short (torn tail)")
            length = int.from_bytes(head[:4], "big")
            if length > MAX_RECORD_BYTES or offset + FRAME_BYTES + length > end:
                raise SpillDamaged(path, offset, "a record cut short (torn tail)")
            body = handle.read(length)
            if len(body) < length:
                raise SpillDamaged(path, offset, "a record cut short (torn tail)")
            if check(key, segment, head[:4], body) != head[4:]:
                raise SpillDamaged(
                    path,
                    offset,
                    "a record fails its check (changed, or not made with the spill key)",
                )
            try:
                value = json.loads(body)
                kind, accepted, args = value["kind"], value["accepted"], value["args"]
                if not (isinstance(kind, str) and isinstance(accepted, str)):
                    raise TypeError("kind and accepted must be text")
                if not isinstance(args, dict):
                    raise TypeError("args must be an object")
                accepted = max(format_time(parse_time(accepted)), not_before)
            except Exception as exc:
                raise SpillDamaged(
                    path, offset, f"a record that is not a spill entry ({exc})"
                ) from exc
            record = Record(segment, offset + FRAME_BYTES + length, kind, accepted, args)
            not_before = accepted
            offset = record.end
            yield record


def set_aside(path: Path) -> Path:
    """Move a damaged segment into ``spill/damaged/`` (never deleted) and return where."""
    where = path.parent / DAMAGED_DIR
    where.mkdir(mode=0o700, exist_ok=True)
    stamp = utc_now().strftime("%Y%m%dT%H%M%S%fZ")
    target = where / f"{path.stem}-{stamp}{SUFFIX}"
    os.replace(path, target)
    sync_dir(path.parent)
    return target


class _Segment:
    """The segment this process appends to: its descriptor, what is on file, what is not yet."""

    def __init__(self, path: Path, *, sync: bool = True, segment_id: bytes | None = None) -> None:
        self.path = path
        self.number = segment_number(path)
        self.id = segment_id or os.urandom(ID_BYTES)
        # made under a name no reader lists, locked, then linked into place: another process
        # never finds a segment of ours without its header or without our lock (in_use)
        making = path.with_name(path.name + ".new")
        with contextlib.suppress(FileNotFoundError):
            making.unlink()  # left by a crash between the link and the unlink below
        self.fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the fd is closed
            os.write(self.fd, MAGIC + self.id)
            synced(os.fsync, self.fd, sync)
            os.link(making, path)  # fails if the name is taken: a segment is never overwritten
            making.unlink()
            synced(sync_dir, path.parent, sync)
        except BaseException:
            os.close(self.fd)
            with contextlib.suppress(OSError):
                making.unlink()
            raise
        self.size = HEADER_BYTES  # bytes on file
        self.records = 0  # records accepted into it
        self.written = 0  # records on file
        self.chunks: list[bytes] = []  # framed records not yet written
        self.buffered = 0
        #: records a failed write took from the buffer: the next write (under io) goes first
        self.unwritten: list[bytes] = []
        self.dirty = False  # written, not yet fsynced

    def take(self) -> list[bytes]:
        chunks, self.chunks, self.buffered = self.chunks, [], 0
        return chunks

    def write(self, chunks: list[bytes]) -> None:
        """Write records (after any a failed write kept), whole or not at all: a failed or
        short write is cut back off the file and its records are kept for the next write."""
        chunks = self.unwritten + chunks
        self.unwritten = []
        data = b"".join(chunks)
        try:
            written = os.write(self.fd, data)
            if written != len(data):  # a short write (disk full): the record would be torn
                raise OSError(
                    errno.ENOSPC, f"short write to {self.path} ({written} of {len(data)} bytes)"
                )
        except BaseException:
            self.unwritten = chunks
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
            raise
        self.size += written
        self.written += len(chunks)
        self.dirty = True

    @property
    def waiting(self) -> int:
        """Records accepted into this segment that are not on file."""
        return len(self.unwritten) + len(self.chunks)


class Spill:
    """The spill of one archive folder in this process; thread-safe.

    ``append`` runs on the caller's thread (a hook) under :attr:`lock`: it encodes one job
    into a framed record and adds it to a small buffer, so a hook does no system call (which
    would hand the GIL to the busy writer thread, for up to the switch interval). The writer
    thread writes the buffer out (``write_out``) before it reads the spill and after every
    commit; a hook writes it itself when it passes :data:`BUFFER_BYTES`, or at once with
    ``now`` (``journal_every_event``). Writes are whole records, so a reader that stops at
    the size it was told never sees half of one. Written records are fsynced by
    ``sync_due`` once ``fsync_s`` has passed since the last fsync, and always on ``sync``
    and at shutdown. Lock order: :attr:`lock`, then :attr:`io` (held while writing).
    """

    def __init__(
        self,
        folder: Path,
        *,
        fsync_s: float = 1.0,
        key: Callable[[], bytes | None] | None = None,
    ) -> None:
        self.folder = folder
        self._key_source = key
        self._key: tuple[bytes | None] | None = None  # (key,) once read
        self._key_lock = threading.Lock()
        self.dir = folder / SPILL_DIR
        self.fsync_s = fsync_s
        self.lock = threading.Lock()
        self.io = threading.Lock()
        self._active: _Segment | None = None
        self._state: dict[Any, Any] = {}  # encoders' per-segment state (transcript deltas)
        self._synced_at = time.monotonic()
        self._write_error = ""  # the last failed write a hook met (said once)
        # left by an earlier process: taken in first (a live process's are its own)
        inherited = [p for p in segment_paths(folder) if not in_use(p)]
        self._floor = (segment_number(inherited[-1]), END) if inherited else (0, 0)
        self._last_number = self._floor[0]  # ours only grow, so positions compare

    @property
    def key(self) -> bytes | None:
        """What records are authenticated with (module docstring), read on first use: the
        witness folder that holds it is made only when something is spilled or read."""
        with self._key_lock:
            if self._key is None:
                self._key = (self._key_source() if self._key_source is not None else None,)
            return self._key[0]

    # -- appending (under self.lock, held by the caller) ---------------------------------

    @property
    def active(self) -> Path | None:
        return self._active.path if self._active is not None else None

    def position(self) -> tuple[int, int]:
        """Where the spill ends now: (segment number, records accepted into it).

        Without a segment of ours it is the end of the segments an earlier process left.
        """
        active = self._active
        return (active.number, active.records) if active is not None else self._floor

    def active_size(self) -> int:
        active = self._active
        return active.size + active.buffered if active is not None else 0

    def readable(self) -> tuple[int, int]:
        """What of the active segment is on file: (bytes, records)."""
        with self.io:
            active = self._active
            return (active.size, active.written) if active is not None else (0, 0)

    def _new_segment(self, number: int | None = None, *, sync: bool = True) -> _Segment:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        if number is None:
            existing = segment_paths(self.folder)
            # a gap of one, so what was queued in memory before this segment can be written
            # in front of it at shutdown (see prepend)
            last = max(segment_number(existing[-1]) if existing else 0, self._last_number)
            number = self._last_number = last + 2
        return _Segment(self.dir / f"{number:012d}{SUFFIX}", sync=sync)

    def append(
        self, encode: Encoder, accepted: datetime, *, now: bool = False, sync: bool = True
    ) -> None:
        """Encode a job into a record of the active segment (made on first use)."""
        if self._active is None:
            self._active = self._new_segment(sync=sync)
            self._state = {}
        active = self._active
        kind, args = encode(self._state)
        data = frame(active.id, record_body(kind, format_time(accepted), args), self.key)
        active.chunks.append(data)
        active.buffered += len(data)
        active.records += 1
        if now or active.buffered >= BUFFER_BYTES:
            with self.io:
                try:
                    active.write(active.take())
                except OSError as exc:  # kept (the encoders' state counts on them): retried
                    if str(exc) != self._write_error:  # by the next write; said once
                        log.error("archive spill: a write failed, records kept: %s", exc)
                    self._write_error = str(exc)

    def write_out(self) -> None:
        """Write the buffered records (writer thread; the hooks wait only for the swap)."""
        with self.lock:
            active = self._active
            if active is None or not active.chunks:
                return
            chunks = active.take()
            self.io.acquire()  # before the lock is let go: writes stay in order
        try:
            active.write(chunks)
        finally:
            self.io.release()

    def sync_due(self) -> None:
        """fsync the active segment if ``fsync_s`` has passed since the last fsync."""
        if time.monotonic() - self._synced_at >= self.fsync_s:
            self.sync()

    def sync(self) -> None:
        """Write out and fsync what the active segment holds."""
        self.write_out()
        with self.io:
            active = self._active
            if active is not None and active.dirty:
                os.fdatasync(active.fd)
                active.dirty = False
        self._synced_at = time.monotonic()

    def release_active(self, *, sync: bool = True) -> None:
        """Write out, fsync and forget the active segment (its file stays for the next open).

        Called under :attr:`lock`. A write or fsync that fails keeps the segment active (and
        its records), so the caller may try again; :meth:`abandon_active` lets go of it.
        """
        active = self._active
        if active is None:
            return
        with self.io:  # forgotten before its descriptor is closed: no sync() meets it closed
            if active.chunks or active.unwritten:
                active.write(active.take())
            synced(os.fdatasync, active.fd, sync)
            self._active = None
            os.close(active.fd)

    def abandon_active(self) -> int:
        """Close the active segment whatever is not on file (the disk refuses it); return how
        many records that leaves unwritten (under :attr:`lock`)."""
        active, self._active = self._active, None
        if active is None:
            return 0
        with self.io:
            os.close(active.fd)
        return active.waiting

    def drop_active(self) -> bytes | None:
        """Remove the active segment: everything in it is committed (caller checked, under
        :attr:`lock`)."""
        active, self._active = self._active, None
        if active is None:
            return None
        with self.io:
            os.close(active.fd)
        remove(active.path)
        return active.id

    def prepend(
        self, encoders: list[tuple[Encoder, datetime]], *, sync: bool = True
    ) -> Path | None:
        """Write jobs that were queued in memory *before* every segment of this process into a
        segment that sorts in front of them, fsynced (shutdown)."""
        if not encoders:
            return None
        existing = segment_paths(self.folder)
        number = segment_number(existing[0]) - 1 if existing else 1
        if number < 1 or (self.dir / f"{number:012d}{SUFFIX}").exists():
            # cannot happen (segments are made with a gap); never overwrite: go last instead
            log.error("archive spill: no slot in front of %s; the queued jobs go last", existing)
            number = segment_number(existing[-1]) + 1
        segment = self._new_segment(number, sync=sync)
        state: dict[Any, Any] = {}
        try:
            chunks = []
            for encode, accepted in encoders:
                kind, args = encode(state)
                body = record_body(kind, format_time(accepted), args)
                chunks.append(frame(segment.id, body, self.key))
                if len(chunks) >= 256:
                    segment.write(chunks)
                    chunks = []
            if chunks:
                segment.write(chunks)
            synced(os.fsync, segment.fd, sync)
        except BaseException:
            with contextlib.suppress(OSError):  # never half of them: the caller tries again
                remove(segment.path)
            raise
        finally:
            os.close(segment.fd)
        return segment.path


def write_accepted(folder: Path, segment_id: bytes, records: list[Record], key: bytes) -> Path:
    """A segment, after every one waiting, of records an operator accepted from a segment
    kept in ``spill/damaged/`` (``hermes-archive spill accept``), each checked with ``key``.

    It carries the kept segment's own id, so the log's ``spill_taken`` for that id makes a
    second acceptance of the same segment add nothing."""
    existing = segment_paths(folder)
    number = (segment_number(existing[-1]) if existing else 0) + 2
    segment = _Segment(folder / SPILL_DIR / f"{number:012d}{SUFFIX}", segment_id=segment_id)
    try:
        segment.write(
            [frame(segment_id, record_body(r.kind, r.accepted, r.args), key) for r in records]
        )
        os.fsync(segment.fd)
    except BaseException:
        with contextlib.suppress(OSError):
            remove(segment.path)
        raise
    finally:
        os.close(segment.fd)
    return segment.path


def synced(how: Callable[[Any], None], what: Any, sync: bool) -> None:
    """fsync ``what``; with ``sync`` False (the disk refuses every fsync: shutdown's last
    resort), a failed fsync is let pass so the records are at least on file."""
    try:
        how(what)
    except OSError:
        if sync:
            raise


def remove(path: Path) -> None:
    """Remove a fully committed segment and make the removal durable."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    sync_dir(path.parent)
