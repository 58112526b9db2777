"""Export bundles: a self-contained, sealed zip an auditor can check without this package.

A bundle (version 3, FORMAT.md 21.3) holds every envelope from the genesis to the head at
export time (``envelopes.bin``), the bodies with their salts, or tombstones, of the
*selected* events only (``payloads.bin``), and a manifest with a BLAKE3 digest of both and
the signed checkpoint; the zip comment seals it (every check is in
:mod:`archive_provider.format.verifier`, which also reads it). It holds no key, and writing
it keeps nothing per event or payload.

Why a zip: every platform opens one (``unzip -l``, Explorer, Python's ``zipfile``), members
can be read one at a time with ``unzip -p``, deflate shrinks the hex-heavy envelopes by
half, and the archive comment sits at the very end of the file, so a seal over every byte
before it covers the whole container: headers, directory and the comment's own length.
A SQLite bundle would be friendlier to query but has free pages and slack a seal cannot
live inside, and a tar has no place for a trailing seal that tools keep.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import sqlite3
import threading
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

from blake3 import blake3

from ..domain.clock import format_time, utc_now
from ..errors import ArchiveError
from ..format import digests_v2
from ..format.verifier import (
    AGAIN,
    BUNDLE_NAME,
    BUNDLE_VERSION_V3,
    CARRIED,
    ENVELOPE_HEAD_V3,
    ENVELOPES_V3,
    MANIFEST,
    PAYLOADS,
    TOMBSTONE,
    Report,
    seal_comment,
    seal_digest,
    selected,
    verify_bundle,
)
from ..storage.safe_files import sync_dir
from ..storage.store import (
    ENVELOPE_COLUMNS,
    EventStore,
    Head,
    salted_payloads,
)
from ..storage.store_pieces import KeyFileError
from ..storage.threads import context_thread


class ExportError(ArchiveError):
    """The export could not be written (nothing was left at the destination), or its
    folder could not be made durable after it was (the message says so)."""


@dataclass(frozen=True)
class Selection:
    """Which events a bundle carries payloads for; ``since``/``until`` are envelope time text."""

    session: str | None = None
    since: str | None = None
    until: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"session": self.session, "since": self.since, "until": self.until}

    def matches(self, session: str, time: str) -> bool:
        return selected(self.as_dict(), session, time)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    bytes: int
    store_id: str
    head_seq: int
    head_chain: str
    start_seq: int
    start_chain: str
    envelopes: int
    selected_events: int
    payloads: int
    seal: str
    verification: Report


class _Member:
    """Digest and size of a member while it is written."""

    def __init__(self) -> None:
        self.hasher, self.size = blake3(), 0

    def feed(self, data: bytes) -> bytes:
        self.hasher.update(data)
        self.size += len(data)
        return data

    def entry(self) -> dict[str, object]:
        return {"size": self.size, "blake3": self.hasher.hexdigest()}


class _Stream(_Member):
    """A streamed member written in 64 KiB pieces by a second thread.

    ``zipfile`` deflates every ``write`` on its own, and a call per record (two per body) cost
    more than the deflating itself, so records are gathered into pieces. Deflate, CRC-32 and
    BLAKE3 release the GIL, so a second thread hashes, deflates and writes each piece while
    this one reads and formats the next: the export's writing takes about the deflate's time
    on two cores instead of their sum (the same pieces in the same order: the same bytes).
    At most ``QUEUED`` pieces wait, so memory stays flat. Use as a context manager inside the
    member's ``with``: leaving it writes the rest and waits for the thread; an error on
    either side stops both and is raised here.
    """

    PIECE = 1 << 16
    QUEUED = 4

    def __init__(self, member: IO[bytes]) -> None:
        super().__init__()
        self.member, self.pending, self.waiting = member, list[bytes](), 0
        self.pieces: queue.Queue[bytes | None] = queue.Queue(self.QUEUED)
        self.failure: BaseException | None = None
        self.stopped = False  # the reading thread failed: the pieces left are not written
        # the package's one thread factory (only the CLI exports: no host helper to go through)
        self.thread = context_thread(self._deflate, name="export-deflate")

    def __enter__(self) -> _Stream:
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None:
                self._send()
        finally:
            self.stopped = kind is not None
            self.pieces.put(None)  # the thread takes pieces until this, whatever happened
            self.thread.join()
        if self.failure is not None and kind is None:
            raise self.failure

    def _deflate(self) -> None:
        """The second thread: hash, deflate and write each piece until ``None``; after a
        failure (its own or the reader's) it only empties the queue."""
        while (piece := self.pieces.get()) is not None:
            if self.failure is not None or self.stopped:
                continue
            try:
                self.member.write(self.feed(piece))
            except BaseException as exc:  # re-raised in the reading thread
                self.failure = exc

    def write(self, *data: bytes) -> None:
        self.pending.extend(data)
        self.waiting += sum(map(len, data))
        if self.waiting >= self.PIECE:
            self._send()

    def _send(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.pending:
            self.pieces.put(b"".join(self.pending))
        self.pending, self.waiting = [], 0


def export_bundle(
    store: EventStore,
    out: Path,
    selection: Selection,
    *,
    progress: Callable[[int], None] | None = None,
    created_by: str = "hermes-archive",
) -> ExportResult:
    """Write a bundle to ``out`` (atomically, mode 0600) and verify it before it appears.

    Reads one snapshot of the store, so the head and the envelopes agree even while the
    agent keeps writing. The bundle is checked with the standalone verifier before it is
    renamed into place; a bundle that would not verify (a damaged archive) is never left.
    """
    store.checkpoint()  # a writer signs the head first, so the bundle reaches it
    out = Path(out)
    remove_stale_partials(out.parent)
    tmp = out.with_name(f".{out.name}.{os.getpid()}{PARTIAL_SUFFIX}")
    conn = store.conn
    # from here to the rename, SIGTERM/SIGHUP unwind like Ctrl-C, so no copy of the archive
    # (its message texts included) is left under the partial name
    with _signals_unwind():
        try:
            conn.execute("BEGIN")  # one read snapshot: the head and every row agree
            try:
                head = _signed_head(store)
                start_seq, start_chain = 0, digests_v2.genesis(store.store_id).hex()
                try:
                    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                except OSError as exc:  # name the path the user gave, not our temporary file
                    raise type(exc)(exc.errno, exc.strerror, str(out)) from None
                with os.fdopen(fd, "w+b") as handle:
                    envelopes, chosen, payloads = _write_bundle(
                        handle, store, selection, head, created_by, progress
                    )
                    size = handle.seek(0, os.SEEK_END)
                    handle.seek(size - 64)
                    seal = handle.read().decode("ascii")
                    os.fsync(handle.fileno())
            finally:
                conn.execute("COMMIT")
            report = verify_bundle(tmp, vkey=_own_vkey(store))
            if not report.ok:
                where = (
                    f" at seq {report.first_bad_seq}" if report.first_bad_seq is not None else ""
                )
                raise ExportError(
                    f"the export failed its own verification{where}: {report.problem}. "
                    "Run `hermes-archive verify`: the archive itself is probably damaged."
                )
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    try:
        sync_dir(out.parent)
    except OSError as exc:
        raise ExportError(
            f"{out} is written and verified, but its folder could not be made durable "
            f"({exc.strerror}): a power loss may take the bundle; check the disk and export again"
        ) from exc
    return ExportResult(
        out,
        size,
        store.store_id,
        head.seq,
        head.chain,
        start_seq,
        start_chain,
        envelopes,
        chosen,
        payloads,
        seal,
        report,
    )


PARTIAL_SUFFIX = ".partial"
_PARTIAL = re.compile(r"^\..+\.([1-9][0-9]{0,9})" + re.escape(PARTIAL_SUFFIX) + "$")


def remove_stale_partials(folder: Path) -> list[Path]:
    """Remove partial bundles an export here left behind (killed before it could clean up).

    Only files named as :func:`export_bundle` names them (``.<name>.<pid>.partial``), regular,
    owned by this user, whose process is gone: a running export's partial is never touched.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _PARTIAL.match(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            os.kill(int(match.group(1)), 0)
            continue  # the process lives (maybe its PID was reused): leave the file
        except ProcessLookupError:
            pass
        except OSError:  # another user's process, or the file went away
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise :class:`SystemExit` so ``finally`` blocks run.

    Only the main thread can set handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, unwind) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _info(name: str, when: tuple[int, int, int, int, int, int]) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=when)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o600 << 16
    return info


def _own_vkey(store: EventStore) -> str | None:
    """The verifier key the export checks its own bundle with (None: integrity only)."""
    try:
        return store.vkey
    except KeyFileError:
        return None


def _signed_head(store: EventStore) -> Head:
    """The head a bundle reaches: the newest signed checkpoint (the store signs its head
    when it can; a read-only one exports up to the last signature)."""
    row = store.conn.execute(
        "SELECT size, root FROM signed_checkpoints ORDER BY size DESC LIMIT 1"
    ).fetchone()
    if row is None:
        raise ExportError("the archive has no signed checkpoint yet: nothing can be exported")
    size = int(row[0])
    chain = store.conn.execute("SELECT chain FROM events WHERE seq = ?", (size,)).fetchone()
    if chain is None:
        raise ExportError(
            f"the newest checkpoint names size {size}, beyond the log: run `hermes-archive verify`"
        )
    return Head(size, bytes(chain[0]).hex(), bytes(row[1]).hex())


_ROWS_SQL = f"SELECT {ENVELOPE_COLUMNS} FROM events WHERE seq <= ? ORDER BY seq"


def _envelope_record_v3(row: Sequence[Any]) -> bytes:
    """A bundle-3 ``envelopes.bin`` record (FORMAT.md 21.3): the fixed head, the parts, the
    texts as UTF-8."""
    seq, time, type_, session, key, identity, payload, parts, author, chain = row
    texts = [text.encode("utf-8") for text in (time, type_, session, key)]
    parts = bytes(parts)
    return (
        ENVELOPE_HEAD_V3.pack(
            seq,
            bytes(chain),
            bytes(identity),
            bytes(payload),
            author is not None,
            bytes(32) if author is None else bytes(author),
            len(parts) // 32,
            *map(len, texts),
        )
        + parts
        + b"".join(texts)
    )


#: the digests the selected events ``seq <= :head`` name (payload, each part, author), each
#: once, in the order of its first use (FORMAT.md 21.3), with whether a later name names it
#: again (the record's flag): sorted by SQLite, which spills to temporary files past its
#: cache, so the exporter keeps nothing per digest. ``:width`` exceeds any event's count of
#: digests, so ``seq * :width + place`` orders them.
_NAMED_SQL = """
WITH chosen(seq, payload, parts, author) AS (
    SELECT seq, payload, parts, author FROM events
    WHERE seq <= :head AND (:session IS NULL OR session = :session)
      AND (:since IS NULL OR time >= :since) AND (:until IS NULL OR time <= :until)
), part(seq, i, n, parts) AS (
    SELECT seq, 0, length(parts) / 32, parts FROM chosen WHERE length(parts) >= 32
    UNION ALL SELECT seq, i + 1, n, parts FROM part WHERE i + 1 < n
), named(digest, place) AS (
    SELECT payload, seq * :width FROM chosen
    UNION ALL
    SELECT substr(parts, i * 32 + 1, 32), seq * :width + 1 + i FROM part
    UNION ALL
    SELECT author, seq * :width + 1 + length(parts) / 32 FROM chosen WHERE author IS NOT NULL
)
SELECT digest, count(*) > 1 FROM named GROUP BY digest ORDER BY min(place)
"""


def _named(store: EventStore, selection: Selection, head: Head) -> Iterator[tuple[bytes, int]]:
    """The digests the selected events name, each once, in the order of ``payloads.bin``,
    each with what its record's kind adds: :data:`AGAIN` when a later name names it again."""
    widest = store.conn.execute(
        "SELECT max(length(parts)) FROM events WHERE seq <= ?", (head.seq,)
    ).fetchone()[0]
    width = (widest or 0) // 32 + 2
    for digest, again in store.conn.execute(
        _NAMED_SQL, {"head": head.seq, "width": width, **selection.as_dict()}
    ):
        yield bytes(digest), AGAIN if again else 0


def _batches(
    digests: Iterator[tuple[bytes, int]], size: int = 500
) -> Iterator[list[tuple[bytes, int]]]:
    """``digests`` in lists of ``size`` (under SQLite's limit of bound parameters)."""
    batch: list[tuple[bytes, int]] = []
    for digest in digests:
        batch.append(digest)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _tombstones(conn: sqlite3.Connection, digests: Sequence[bytes]) -> dict[bytes, int]:
    """The erasure seq of each of ``digests`` that was erased, in one query."""
    marks = ",".join("?" * len(digests))
    return {
        bytes(digest): int(seq)
        for digest, seq in conn.execute(
            f"SELECT digest, erasure_seq FROM erased WHERE digest IN ({marks})", digests
        )
    }


def _write_bundle(
    handle: BinaryIO,
    store: EventStore,
    selection: Selection,
    head: Head,
    created_by: str,
    progress: Callable[[int], None] | None,
) -> tuple[int, int, int]:
    """Write a version-3 bundle of a format-2 archive (FORMAT.md 21.3): the envelopes, then
    every body the selection names (salt and body) or its tombstone in one streamed member,
    then the signed checkpoint at the bundle's head in the manifest. Nothing is kept per
    event or payload: a zip directory of three members and a manifest of fixed size."""
    created = utc_now()
    when = created.timetuple()[:6]
    members: dict[str, dict[str, object]] = {}
    envelopes = chosen = carried = erased = 0
    with zipfile.ZipFile(handle, "w") as archive:
        with (
            archive.open(_info(ENVELOPES_V3, when), "w", force_zip64=True) as member,
            _Stream(member) as records,
        ):
            for row in store.conn.execute(_ROWS_SQL, (head.seq,)):
                records.write(_envelope_record_v3(row))
                envelopes += 1
                chosen += selection.matches(row[3], row[1])
                if progress and envelopes % 1000 == 0:
                    progress(envelopes)
        members[ENVELOPES_V3] = records.entry()
        with (
            archive.open(_info(PAYLOADS, when), "w", force_zip64=True) as member,
            _Stream(member) as bodies,
        ):
            for batch in _batches(_named(store, selection, head)):
                found = salted_payloads(store.conn, [digest for digest, _ in batch])
                gone = [digest for digest, _ in batch if digest not in found]
                tombstones = _tombstones(store.conn, gone) if gone else {}
                for digest, again in batch:
                    if digest in found:
                        salt, body = found[digest]
                        bodies.write(
                            bytes([CARRIED | again]) + digest + salt + len(body).to_bytes(8, "big"),
                            body,
                        )
                        carried += 1
                        continue
                    if digest not in tombstones:
                        raise ExportError(
                            f"payload {digest.hex()} is missing from the archive; "
                            "`hermes-archive verify` names the event"
                        )
                    at = tombstones[digest].to_bytes(8, "big")
                    bodies.write(bytes([TOMBSTONE | again]) + digest + at)
                    erased += 1
        members[PAYLOADS] = bodies.entry()
        note = store.checkpoint_note(head.seq)
        assert note is not None  # _signed_head read it in this snapshot
        manifest: dict[str, object] = {
            "bundle": BUNDLE_NAME,
            "bundle_version": BUNDLE_VERSION_V3,
            "format_version": digests_v2.FORMAT_VERSION,
            "store_id": store.store_id,
            "created": format_time(created),
            "created_by": created_by,
            "head": {"seq": head.seq, "chain": head.chain, "root": head.root},
            "selection": selection.as_dict(),
            "envelopes": envelopes,
            "selected_events": chosen,
            "payloads": carried,
            "erased": erased,
            "checkpoint": note.decode("utf-8"),
            "consistency": [],  # the bundle's head is the checkpoint's size
            "members": members,
        }
        _write_manifest(archive, manifest, when)
    if progress:
        progress(envelopes)
    _seal(handle)
    return envelopes, chosen, carried


def _write_manifest(
    archive: zipfile.ZipFile,
    manifest: dict[str, object],
    when: tuple[int, int, int, int, int, int],
) -> None:
    """The manifest is the last member; the zip comment names its digest and holds a seal of
    zeros until :func:`_seal` fills it in."""
    text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("ascii")
    archive.writestr(_info(MANIFEST, when), text)
    archive.comment = seal_comment(blake3(text).hexdigest())


def _seal(handle: BinaryIO) -> None:
    """Overwrite the comment's last 64 bytes with the seal digest of the finished zip."""
    size = handle.seek(0, os.SEEK_END)
    seal = seal_digest(handle, size)
    handle.seek(size - 64)
    handle.write(seal.encode("ascii"))
    handle.flush()
