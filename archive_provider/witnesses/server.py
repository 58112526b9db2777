"""A C2SP ``tlog-witness`` server: cosigns a log's checkpoints after checking their consistency.

``hermes-archive witness serve --listen HOST:PORT --state DIR --log-key VKEY...`` runs it
(docs/FORMAT.md 16.2, docs/OPERATIONS.md "Witnesses"). It protects an archive against
whoever can write the archive's folder (and so read its signing key): once it has cosigned a
checkpoint of size ``m`` it cosigns a later one only with a proof that the tree at ``m`` is a
prefix of it, so a rewritten history can no longer collect cosignatures.

* ``POST /add-checkpoint`` as tlog-witness specifies: 200 with a ``cosignature/v1`` line
  (Ed25519, type 0x04); 400 for a malformed body or ``old`` above the size; 403 when no
  trusted log key signed the checkpoint (or a trusted key's signature fails); 404 for an
  origin it has no key for; 409 (``text/x.tlog.size``, its size) when ``old`` is not the
  size it last cosigned; 422 for a proof that does not verify, a proof sent with ``old 0``,
  two roots for one size, or an empty tree whose root is not the empty root.
* ``GET /<sha256 hex of origin>/checkpoint``: the latest checkpoint it cosigned, with the
  log's signature and its own (the spec's monitoring endpoint).

State: one small JSON file per origin under ``DIR/logs/`` (size, root, the cosigned note),
written atomically (temp file, fsync, rename, fsync of the folder) before the answer, and
the cosigner key in ``DIR/witness.key``. The check and the write happen under one lock, and
one process at a time may serve a folder. ``DIR`` must be owned by the current user, not
writable by anyone else, and not inside an archive folder: the witness is worth nothing if
the party it watches can edit its memory.

Requests are bounded: body size, time to read a request, and concurrent connections.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import signal
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ..domain.clock import now_text, utc_now
from ..format import merkle
from ..format.signed_note import (
    ALG_COSIGNATURE_V1,
    ALG_ED25519,
    NoteError,
    Signer,
    Verifier,
    format_note,
    open_note,
    parse_add_checkpoint,
    parse_checkpoint,
    parse_note,
)
from ..storage.safe_files import write_private_file

log = logging.getLogger(__name__)

KEY_FILE = "witness.key"
LOGS_DIR = "logs"
LOCK_FILE = "lock"
STATE_FORMAT = 1
SIZE_CONTENT_TYPE = "text/x.tlog.size"
#: 63 proof lines (~2.8 KB) and a checkpoint with up to 100 signatures fit many times over
MAX_REQUEST_BYTES = 64 * 1024
MAX_STATE_BYTES = 256 * 1024
#: a whole request (headers and body) must arrive within this many seconds
REQUEST_DEADLINE_S = 10.0
MAX_CONNECTIONS = 64
_ORIGIN_HASH = re.compile(r"/([0-9a-f]{64})/checkpoint")


class WitnessStateError(RuntimeError):
    """The witness's folder, key or state cannot be trusted or read; the message says why."""


# -- private files --------------------------------------------------------------------------


def check_private_dir(path: Path, *, create: bool = True) -> Path:
    """``path`` as a folder this user owns that nobody else can write; made 0700 if missing.

    Refused: a symlink, another owner, group- or world-writable, or a folder inside an
    archive folder (one holding ``events.db``): whoever controls those could rewrite what
    the witness remembers.
    """
    path = Path(path).expanduser().absolute()
    if create and not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise WitnessStateError(f"the witness folder {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise WitnessStateError(f"the witness folder {path} is not a folder (or is a symlink)")
    if st.st_uid != os.geteuid():
        raise WitnessStateError(
            f"the witness folder {path} is owned by uid {st.st_uid}, not by this user "
            f"({os.geteuid()}); use a folder of your own (mode 0700)"
        )
    if st.st_mode & 0o022:
        raise WitnessStateError(
            f"the witness folder {path} is writable by others (mode {st.st_mode & 0o777:04o}); "
            f"run `chmod 700 {path}` after checking nobody changed it"
        )
    for parent in (path, *path.parents):
        if (parent / "events.db").exists():
            raise WitnessStateError(
                f"the witness folder {path} is inside the archive folder {parent}; keep it "
                "outside any archive (whoever can write the archive must not reach it)"
            )
    return path


def read_private_file(path: Path, limit: int) -> bytes | None:
    """The bytes of a regular file this user owns (None if missing), at most ``limit``.

    Never follows a symlink, never blocks on a FIFO, never reads a device without end.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WitnessStateError(
                f"{path} is a symlink; the witness reads only its own files"
            ) from None
        raise WitnessStateError(f"{path} cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WitnessStateError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise WitnessStateError(
                f"{path} must be owned by this user with mode 0600 "
                f"(it is uid {st.st_uid}, mode {st.st_mode & 0o777:04o})"
            )
        chunks, total = [], 0
        while chunk := os.read(fd, min(65536, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise WitnessStateError(f"{path} is larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


# -- the cosigner key -------------------------------------------------------------------------


def keygen(state_dir: Path, name: str) -> Signer:
    """Make the witness's Ed25519 key in ``state_dir`` (never overwritten) and return it as
    its cosigner (type 0x04). The file holds the type 0x01 form, which Go's note signers
    read too (they refuse 0x04)."""
    folder = check_private_dir(state_dir)
    signer = Signer.generate(name)
    try:
        write_private_file(
            folder / KEY_FILE, (signer.private_key + "\n").encode("ascii"), exclusive=True
        )
    except FileExistsError:
        raise WitnessStateError(
            f"{folder / KEY_FILE} already exists; a witness keeps its key (its verifier key "
            "is pinned by every log it serves)"
        ) from None
    return signer.as_cosigner()


def load_key(state_dir: Path) -> Signer:
    """The cosigner key of ``state_dir`` (its file of type 0x01 or 0x04); refused unless
    private."""
    path = check_private_dir(state_dir, create=False) / KEY_FILE
    data = read_private_file(path, 4096)
    if data is None:
        raise WitnessStateError(
            f"no witness key at {path}; make one with `hermes-archive witness keygen --state "
            f"{state_dir} --name NAME`"
        )
    try:
        signer = Signer.from_private_key(data.decode("ascii"))
    except (NoteError, UnicodeDecodeError) as exc:
        raise WitnessStateError(f"{path} is not a witness key ({exc})") from None
    return signer if signer.alg == ALG_COSIGNATURE_V1 else signer.as_cosigner()


def origin_hash(origin: str) -> str:
    """Lowercase hex SHA-256 of the origin: the monitoring URL's path and the state file name."""
    return hashlib.sha256(origin.encode("utf-8")).hexdigest()


# -- the protocol -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogState:
    """What the witness remembers of one log: the latest checkpoint it cosigned."""

    origin: str
    size: int
    root: bytes
    note: bytes  # the checkpoint with the log's verified signatures and this witness's
    time: str = ""  # when it was cosigned (envelope time text)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def _text(status: int, message: str) -> Answer:
    return Answer(status, (message.rstrip("\n") + "\n").encode("utf-8"))


class Witness:
    """The witness's rules and memory, without HTTP: :meth:`add_checkpoint` takes a request body.

    Holds an exclusive lock on ``state_dir`` for its lifetime (:meth:`close` releases it).
    """

    def __init__(self, state_dir: Path, log_keys: Sequence[str | Verifier]) -> None:
        self.state_dir = check_private_dir(state_dir, create=False)
        self._lock_fd = os.open(
            self.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise WitnessStateError(
                f"another witness process is serving from {self.state_dir}"
            ) from None
        try:
            self.signer = load_key(self.state_dir)
            self.keys: dict[str, list[Verifier]] = {}
            for key in log_keys:
                verifier = Verifier.from_vkey(key) if isinstance(key, str) else key
                if verifier.alg != ALG_ED25519:
                    raise WitnessStateError(f"the log key {verifier.vkey} is not an Ed25519 key")
                self.keys.setdefault(verifier.name, []).append(verifier)
            if not self.keys:
                raise WitnessStateError("a witness needs at least one log key (--log-key VKEY)")
            logs = self.state_dir / LOGS_DIR
            logs.mkdir(mode=0o700, exist_ok=True)
            check_private_dir(logs, create=False)
            self._logs_dir = logs
            self._states = {
                origin: state
                for origin in self.keys
                if (state := self._load_state(origin)) is not None
            }
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._lock = threading.Lock()

    @property
    def vkey(self) -> str:
        return self.signer.vkey

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    def _state_path(self, origin: str) -> Path:
        return self._logs_dir / f"{origin_hash(origin)}.json"

    def _load_state(self, origin: str) -> LogState | None:
        path = self._state_path(origin)
        data = read_private_file(path, MAX_STATE_BYTES)
        if data is None:
            return None
        try:
            record = json.loads(data)
            if record.get("format") != STATE_FORMAT or record.get("origin") != origin:
                raise ValueError("format or origin differs")
            note = record["checkpoint"].encode("utf-8")
            checkpoint = parse_checkpoint(parse_note(note).text)
            size, root = int(record["size"]), base64.b64decode(record["root"], validate=True)
            if (checkpoint.origin, checkpoint.size, checkpoint.root) != (origin, size, root):
                raise ValueError("the stored checkpoint is not the stored size and root")
        except (ValueError, KeyError, TypeError, AttributeError, NoteError) as exc:
            raise WitnessStateError(
                f"the witness state {path} is unreadable ({exc}); it is what lets this witness "
                "refuse a rewritten log, so it is never guessed: restore it or move it aside "
                "on purpose"
            ) from None
        return LogState(origin, size, root, note, str(record.get("time", "")))

    def add_log_key(self, key: str | Verifier) -> None:
        """Witness one more log from now on (a peer's key, pinned by the caller)."""
        verifier = Verifier.from_vkey(key) if isinstance(key, str) else key
        if verifier.alg != ALG_ED25519:
            raise WitnessStateError(f"the log key {verifier.vkey} is not an Ed25519 key")
        with self._lock:
            known = self.keys.setdefault(verifier.name, [])
            if all(k.vkey != verifier.vkey for k in known):
                known.append(verifier)
            if verifier.name not in self._states:
                state = self._load_state(verifier.name)
                if state is not None:
                    self._states[verifier.name] = state

    def cosigned(self, origin: str) -> LogState | None:
        """The latest checkpoint of ``origin`` this witness cosigned, if any."""
        with self._lock:
            return self._states.get(origin)

    def latest(self, hashed_origin: str) -> Answer:
        """The monitoring endpoint: the latest cosigned checkpoint of a log, by origin hash."""
        with self._lock:
            for origin, state in self._states.items():
                if origin_hash(origin) == hashed_origin:
                    return Answer(200, state.note)
        return _text(404, "this witness has cosigned no checkpoint of that log")

    def add_checkpoint(self, body: bytes) -> Answer:
        """Check an ``add-checkpoint`` body by tlog-witness and cosign it, or refuse."""
        try:
            old, proof, note_bytes = parse_add_checkpoint(body)
            note = parse_note(note_bytes)
            checkpoint = parse_checkpoint(note.text)
        except NoteError as exc:
            return _text(400, f"malformed request: {exc}")
        trusted = self.keys.get(checkpoint.origin)
        if trusted is None:
            return _text(404, f"unknown log origin {checkpoint.origin!r}")
        try:
            _, verified = open_note(note_bytes, trusted)
        except NoteError as exc:
            return _text(403, f"the checkpoint is not signed by a trusted log key: {exc}")
        if old > checkpoint.size:
            return _text(400, f"old size {old} is larger than the checkpoint size")
        with self._lock:
            current = self._states.get(checkpoint.origin)
            have = current.size if current else 0
            if old != have:
                return Answer(409, f"{have}\n".encode("ascii"), SIZE_CONTENT_TYPE)
            problem = self._inconsistency(current, old, proof, checkpoint.size, checkpoint.root)
            if problem:
                log.warning(
                    "witness: refused a validly signed checkpoint of %s at size %d: %s",
                    checkpoint.origin,
                    checkpoint.size,
                    problem,
                )
                return _text(422, problem)
            timestamp = int(utc_now().timestamp())
            cosignature = self.signer.cosign(note.text, max(timestamp, 1))
            kept = format_note(note.text, [*verified, cosignature])
            at = now_text()
            record = {
                "format": STATE_FORMAT,
                "origin": checkpoint.origin,
                "size": checkpoint.size,
                "root": base64.b64encode(checkpoint.root).decode("ascii"),
                "checkpoint": kept.decode("utf-8"),
                "time": at,
            }
            try:
                write_private_file(
                    self._state_path(checkpoint.origin),
                    (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"),
                )
            except OSError as exc:
                log.error("witness: cannot persist the state of %s: %s", checkpoint.origin, exc)
                return _text(500, "the witness cannot persist its state; nothing was cosigned")
            self._states[checkpoint.origin] = LogState(
                checkpoint.origin, checkpoint.size, checkpoint.root, kept, at
            )
        return Answer(200, cosignature.line.encode("utf-8"))

    @staticmethod
    def _inconsistency(
        current: LogState | None, old: int, proof: Sequence[bytes], size: int, root: bytes
    ) -> str | None:
        """Why the checkpoint cannot follow the recorded one, or None when it can."""
        if size == 0 and root != merkle.EMPTY_ROOT:
            return "a checkpoint of size 0 must carry the root of the empty tree"
        if old == 0:
            return "a consistency proof from size 0 must be empty" if proof else None
        assert current is not None  # old == the recorded size, which is not 0
        try:
            merkle.verify_consistency(old, size, current.root, root, proof)
        except merkle.ProofError as exc:
            return f"not consistent with the checkpoint of size {old} cosigned before: {exc}"
        return None


# -- HTTP ---------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the spec recommends
    server_version = "hermes-archive-witness"
    sys_version = ""
    server: WitnessHTTPServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_deadline)

    def handle_one_request(self) -> None:
        # a watchdog bounds the whole request (a slow sender cannot hold a thread for ever)
        timer = threading.Timer(self.server.request_deadline, self._expire)
        timer.daemon = True
        timer.start()
        try:
            super().handle_one_request()
        finally:
            timer.cancel()

    def _expire(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(2)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        log.debug("witness: %s " + format, self.client_address[0], *args)

    def _send(self, answer: Answer, *, close: bool = False) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        if close:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer.body)

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path != "/add-checkpoint":
            self._send(_text(404, "not found (POST /add-checkpoint)"), close=True)
            return
        if self.headers.get("Transfer-Encoding"):
            self._send(_text(411, "send the body with a Content-Length"), close=True)
            return
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._send(_text(411, "a Content-Length is required"), close=True)
            return
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            self._send(_text(400, "bad Content-Length"), close=True)
            return
        if length > self.server.max_request:
            self._send(
                _text(413, f"the request is larger than {self.server.max_request} bytes"),
                close=True,
            )
            return
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return
        self._send(self.server.witness.add_checkpoint(body))

    def do_GET(self) -> None:  # noqa: N802
        match = _ORIGIN_HASH.fullmatch(self.path)
        if match is None:
            self._send(_text(404, "not found"), close=False)
            return
        self._send(self.server.witness.latest(match.group(1)))

    def _not_allowed(self) -> None:
        self._send(_text(405, "method not allowed"), close=True)

    do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815


class WitnessHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a bound on concurrent connections; serves one :class:`Witness`."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        witness: Witness,
        *,
        max_request: int = MAX_REQUEST_BYTES,
        request_deadline: float = REQUEST_DEADLINE_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.witness = witness
        self.max_request = max_request
        self.request_deadline = request_deadline
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: the client retries later
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as a bind address."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve(
    state_dir: Path,
    log_keys: Sequence[str | Verifier],
    listen: tuple[str, int],
    *,
    ready: Any = None,
    **limits: Any,
) -> None:
    """Serve until SIGTERM or SIGINT (the CLI's ``witness serve``); ``ready(server)`` once bound."""
    witness = Witness(state_dir, log_keys)
    try:
        server = WitnessHTTPServer(listen, witness, **limits)
    except BaseException:
        witness.close()
        raise

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        if ready is not None:
            ready(server)
        server.serve_forever()
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        witness.close()
