"""Getting cosignatures from C2SP ``tlog-witness`` witnesses (docs/FORMAT.md 16.2).

:func:`submit` makes one ``add-checkpoint`` request and returns the witness's verified
cosignature, or raises a typed :class:`WitnessError`. :class:`WitnessSubmitter` keeps every
configured witness up to date from background threads: the caller only calls
:meth:`WitnessSubmitter.notify` after each new checkpoint (it never blocks, DESIGN
invariant 12), cosignatures arrive through a callback, and :meth:`WitnessSubmitter.status`
says how far behind each witness is and why.

Knows nothing of the store: the log's side comes in as a callable giving the latest signed
checkpoint note and a consistency-proof source ``proof(old_size, new_size)``.
"""

from __future__ import annotations

import http.client
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..domain.clock import now_text
from ..format.signed_note import (
    ALG_COSIGNATURE_V1,
    SIGNATURE_PREFIX,
    Checkpoint,
    NoteError,
    Signature,
    Verifier,
    format_add_checkpoint,
    parse_checkpoint,
    parse_note,
)
from ..storage.threads import ThreadFactory, context_thread

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 10.0

ProofSource = Callable[[int, int], Sequence[bytes]]
Latest = Callable[[], "tuple[bytes, ProofSource] | None"]


class WitnessError(Exception):
    """A witness did not cosign; ``kind`` names why in one word (shown by ``status``)."""

    kind = "error"


class WitnessUnreachable(WitnessError):
    """No answer: connection refused, timeout, a 5xx, or an answer that is not HTTP."""

    kind = "unreachable"


class WitnessRefused(WitnessError):
    """The witness refused the checkpoint (400, 403, 404, 413...); ``status`` is its code."""

    kind = "refused"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"the witness answered {status}: {message}")
        self.status = status


class WitnessInconsistent(WitnessRefused):
    """422: the checkpoint is not consistent with what the witness cosigned before."""

    kind = "inconsistent"


class WitnessConflict(WitnessError):
    """409: the old size sent is not the witness's; ``size`` is the one it has."""

    kind = "conflict"

    def __init__(self, size: int) -> None:
        super().__init__(f"the witness has cosigned size {size}")
        self.size = size


class BadCosignature(WitnessError):
    """200, but no valid cosignature from the expected witness key on this checkpoint."""

    kind = "bad-cosignature"


def _verifier(vkey: str | Verifier) -> Verifier:
    verifier = Verifier.from_vkey(vkey) if isinstance(vkey, str) else vkey
    if verifier.alg != ALG_COSIGNATURE_V1:
        raise NoteError(f"{verifier.vkey} is not a cosigner key (signature type 0x04)")
    return verifier


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WitnessUnreachable(f"{url!r} is not an http:// or https:// URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout), parts.path.rstrip("/")


def submit(
    checkpoint_note: bytes,
    old_size: int,
    consistency_proof: Sequence[bytes],
    url: str,
    witness_vkey: str | Verifier,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Signature:
    """POST ``add-checkpoint`` to the witness at ``url`` (its submission prefix).

    Returns the witness's cosignature, verified over the checkpoint with ``witness_vkey``;
    other lines of the answer (other keys) are ignored, as the spec says. Raises
    :class:`WitnessConflict` (409, with the witness's size), :class:`WitnessInconsistent`
    (422), :class:`WitnessRefused` (other 4xx), :class:`WitnessUnreachable` (network, 5xx)
    or :class:`BadCosignature`.
    """
    verifier = _verifier(witness_vkey)
    note = parse_note(checkpoint_note)
    body = format_add_checkpoint(old_size, list(consistency_proof), checkpoint_note)
    connection, prefix = _connection(url, timeout)
    try:
        connection.request(
            "POST",
            f"{prefix}/add-checkpoint",
            body=body,
            headers={"Content-Type": "text/plain; charset=utf-8"},
        )
        response = connection.getresponse()
        answer = response.read(MAX_RESPONSE_BYTES + 1)
        status, content_type = response.status, response.getheader("Content-Type", "")
    except (OSError, http.client.HTTPException) as exc:
        raise WitnessUnreachable(f"{url}: {exc or type(exc).__name__}") from None
    finally:
        connection.close()
    if len(answer) > MAX_RESPONSE_BYTES:
        raise WitnessUnreachable(f"{url}: the answer is larger than {MAX_RESPONSE_BYTES} bytes")
    text = answer.decode("utf-8", "replace").strip()
    if status == 409:
        size = text if content_type.split(";")[0].strip() == "text/x.tlog.size" else ""
        if not size.isdigit() or size != str(int(size)):
            raise WitnessRefused(409, f"a conflict without a text/x.tlog.size size: {text[:200]}")
        raise WitnessConflict(int(size))
    if status == 422:
        raise WitnessInconsistent(status, text[:500])
    if 400 <= status < 500:
        raise WitnessRefused(status, text[:500])
    if status != 200:
        raise WitnessUnreachable(f"{url}: HTTP {status}: {text[:200]}")
    return _cosignature(note.text, answer, verifier)


def _cosignature(text: str, answer: bytes, verifier: Verifier) -> Signature:
    """The verified cosignature of ``verifier`` among the answer's signature lines."""
    try:
        lines = answer.decode("utf-8")
    except UnicodeDecodeError:
        raise BadCosignature("the answer is not UTF-8") from None
    if not lines.startswith(SIGNATURE_PREFIX) or not lines.endswith("\n"):
        raise BadCosignature("the answer is not note signature lines")
    try:
        # the spec's way: the lines appended to the checkpoint make a note to parse
        signatures = parse_note(text + "\n" + lines).signatures
    except NoteError as exc:
        raise BadCosignature(f"the answer's signature lines are malformed: {exc}") from None
    for signature in signatures:
        if (signature.name, signature.key_id) != (verifier.name, verifier.key_id):
            continue
        if len(signature.data) != 72 or not verifier.verify(text, signature):
            raise BadCosignature(f"the cosignature of {verifier.name} does not verify")
        if signature.timestamp == 0:
            raise BadCosignature(f"the cosignature of {verifier.name} has no timestamp")
        return signature
    raise BadCosignature(f"the answer holds no cosignature from {verifier.vkey}")


# -- the background submitter -----------------------------------------------------------------


@dataclass(frozen=True)
class WitnessEndpoint:
    """A witness as the log knows it: its submission URL and its cosigner verifier key."""

    url: str | None  # None: a peer witness, asked over its own channel
    vkey: str

    @property
    def verifier(self) -> Verifier:
        return _verifier(self.vkey)


@dataclass(frozen=True)
class WitnessLag:
    """How far one witness is behind, for ``status``; times are envelope time text."""

    url: str
    name: str
    vkey: str
    cosigned_size: int | None  # the largest size it cosigned for us (None: not yet)
    cosigned_at: str | None
    latest_size: int | None  # the latest checkpoint the submitter has seen
    last_error: str | None  # None while it keeps up
    error_kind: str | None  # WitnessError.kind, or "error" for a failure on our side
    error_since: str | None  # when the current run of failures began

    @property
    def behind(self) -> int | None:
        """Sizes the witness lags behind the latest checkpoint (None when unknown)."""
        if self.latest_size is None:
            return None
        return self.latest_size - (self.cosigned_size or 0)


OnCosigned = Callable[[WitnessEndpoint, Checkpoint, Signature], None]


class WitnessSubmitter:
    """Pushes the log's latest checkpoint to every witness, one background thread each.

    ``latest()`` gives the newest signed checkpoint note and a proof source; it is called
    from the witness threads, never from the caller's. ``known_sizes`` (by vkey) are the
    sizes each witness is known to have cosigned (from stored cosignatures): the first
    request uses them as ``old``; without one the first request sends ``old 0`` and a 409
    tells the witness's size, as the spec intends. Failures back off exponentially from
    ``backoff_initial`` to ``backoff_max`` seconds (with jitter); a new checkpoint does not
    cut a backoff short. ``on_cosigned`` gets each verified cosignature; if it raises, the
    failure shows in :meth:`status` and the cosignature is asked for again later.
    ``thread_factory`` is the host's (``host.spawn_thread``) inside the provider.
    """

    def __init__(
        self,
        witnesses: Sequence[WitnessEndpoint],
        latest: Latest,
        on_cosigned: OnCosigned,
        *,
        known_sizes: Mapping[str, int] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        thread_factory: ThreadFactory = context_thread,
    ) -> None:
        self._latest = latest
        self._on_cosigned = on_cosigned
        self._timeout = timeout
        self._backoff = (backoff_initial, backoff_max)
        self._closed = threading.Event()
        self._thread_factory = thread_factory
        self._workers = [
            _Worker(self, endpoint, (known_sizes or {}).get(endpoint.vkey))
            for endpoint in witnesses
        ]

    def start(self) -> None:
        for worker in self._workers:
            worker.thread = self._thread_factory(
                worker.run, name=f"witness-submit {worker.verifier.name}"
            )
            worker.thread.start()

    def notify(self) -> None:
        """A new checkpoint exists: wake every witness thread (returns at once)."""
        for worker in self._workers:
            worker.wake.set()

    def status(self) -> list[WitnessLag]:
        return [worker.lag() for worker in self._workers]

    def close(self, timeout: float | None = None) -> None:
        """Stop the threads (a request in flight ends within its timeout)."""
        self._closed.set()
        self.notify()
        for worker in self._workers:
            if worker.thread is not None:
                worker.thread.join(timeout)


class _Worker:
    """One witness's thread and what ``status`` shows of it."""

    def __init__(self, owner: WitnessSubmitter, endpoint: WitnessEndpoint, known: int | None):
        if endpoint.url is None:
            raise ValueError("a peer witness has no URL to submit to")
        self.owner, self.endpoint, self.url = owner, endpoint, endpoint.url
        self.verifier = endpoint.verifier
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._lag = WitnessLag(
            self.url, self.verifier.name, endpoint.vkey, known, None, None, None, None, None
        )
        self._delay = 0.0
        self.thread: threading.Thread | None = None

    def lag(self) -> WitnessLag:
        with self._lock:
            return self._lag

    def _update(self, **changes: object) -> None:
        with self._lock:
            self._lag = replace(self._lag, **changes)  # type: ignore[arg-type]

    def run(self) -> None:
        closed = self.owner._closed
        retry_at: float | None = None
        while not closed.is_set():
            wait = None if retry_at is None else max(0.0, retry_at - time.monotonic())
            self.wake.wait(wait)
            if closed.is_set():
                return
            if retry_at is not None and time.monotonic() < retry_at:
                self.wake.clear()
                continue  # woken by a new checkpoint during a backoff: keep backing off
            self.wake.clear()
            retry_at = None if self._round() else self._next_backoff()

    def _next_backoff(self) -> float:
        first, most = self.owner._backoff
        self._delay = min(most, self._delay * 2 if self._delay else first)
        return time.monotonic() + self._delay * random.uniform(0.8, 1.2)

    def _fail(self, kind: str, message: str) -> bool:
        with self._lock:
            since = self._lag.error_since or now_text()
            self._lag = replace(self._lag, last_error=message, error_kind=kind, error_since=since)
        log.warning("archive: witness %s: %s", self.url, message)
        return False

    def _round(self) -> bool:
        """Bring the witness to the latest checkpoint; False when it must be retried later."""
        try:
            produced = self.owner._latest()
            if produced is None:
                return True
            note, proofs = produced
            checkpoint = parse_checkpoint(parse_note(note).text)
        except Exception as exc:  # the log's side failed: say so, try again later
            return self._fail("error", f"cannot read the latest checkpoint: {exc}")
        self._update(latest_size=checkpoint.size)
        old = self.lag().cosigned_size or 0
        if self.lag().cosigned_at is not None and old == checkpoint.size:
            return True  # already cosigned this size in this run
        for _ in range(3):  # a 409 names the witness's size: retry from it, a few times
            if old > checkpoint.size:
                return self._fail(
                    "ahead",
                    f"the witness cosigned size {old} but the log's latest checkpoint is "
                    f"size {checkpoint.size}: the log was rolled back or replaced",
                )
            try:
                proof = [] if old in (0, checkpoint.size) else list(proofs(old, checkpoint.size))
                signature = submit(note, old, proof, self.url, self.verifier, self.owner._timeout)
            except WitnessConflict as exc:
                if exc.size < old:
                    log.warning(
                        "archive: witness %s had cosigned size %d and now has %d: it lost or "
                        "restored its state, and protects this archive only from now on",
                        self.endpoint.url,
                        old,
                        exc.size,
                    )
                old = exc.size
                self._update(cosigned_size=exc.size)
                continue
            except WitnessError as exc:
                return self._fail(exc.kind, str(exc))
            except Exception as exc:  # a proof the log could not make
                return self._fail("error", f"cannot prove size {old} to {checkpoint.size}: {exc}")
            try:
                self.owner._on_cosigned(self.endpoint, checkpoint, signature)
            except Exception as exc:
                return self._fail("error", f"recording the cosignature failed: {exc}")
            self._delay = 0.0
            self._update(
                cosigned_size=checkpoint.size,
                cosigned_at=now_text(),
                last_error=None,
                error_kind=None,
                error_since=None,
            )
            return True
        return self._fail("conflict", "the witness kept answering 409 with other sizes")
