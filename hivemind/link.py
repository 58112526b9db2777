"""The live Matrix side of hivemind: one backend, one background sync loop, events to the log.

The loop long-polls the homeserver, turns each sync into peer events and hands them to the
archive writer as one job, followed by a job that derives summaries and sparks. The job
appends the sync token (``peer_sync_position``) in the same transaction as the events it
covers, and a restart resumes from that token rather than from the one nio stored: a crash
between a sync and its commit redelivers, it never loses (identities make redelivery a
no-op).

Matrix failures never reach the host: connecting is retried with back-off while the
homeserver is unreachable, a refused token stops the link with an error the tools report,
and the archive keeps working throughout. The access token goes only to the backend, which
scrubs it from every error it raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from archive_provider import (
    AppendResult,
    ArchiveBusy,
    EventStore,
    NewEvent,
    identity_digest,
    spawn_thread,
)

from . import events
from .derive import derived_events
from .events import Submit
from .matrix_backend import (
    MatrixBackend,
    MatrixError,
    MatrixRequestError,
    MatrixUnavailable,
    SyncResult,
)
from .settings import HivemindSettings
from .summarizer import Spent, SummaryWorker, host_model
from .witnessing import PeerWitnessing

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)  # then every 15 s while unreachable
READY_COMMIT_WAIT_S = 5.0

_stores_in_use: set[Path] = set()  # one live Matrix client per crypto store in a process
_stores_lock = threading.Lock()


def backend_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """The backend's ``(target, name)`` thread factory on top of the host's context threads."""
    return spawn_thread(target, name=name)


class LinkRefused(ArchiveBusy):
    """The crypto store is already driven by another live link in this process."""


class PeerLink:
    """Owns the MatrixBackend of one profile and its background sync loop."""

    def __init__(
        self,
        *,
        crypto_dir: Path,
        homeserver: str,
        user_id: str,
        access_token: str,
        device_id: str | None,
        settings: HivemindSettings,
        submit: Submit,
        read_token: Callable[[], str | None],
        spent: Spent,
        witnessing: PeerWitnessing | None = None,
        redact: bool = True,
    ) -> None:
        self.user_id = user_id
        self.redact = redact  # mask secret-shaped spans in peer text (archive redact_secrets)
        self._crypto_dir = crypto_dir
        self._homeserver = homeserver
        self._access_token = access_token
        self._device_id = device_id
        self._settings = settings
        self._submit = submit
        self._read_token = read_token
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._backend: MatrixBackend | None = None
        self._connected = False
        self._thread: threading.Thread | None = None
        self._published: set[str] = set()
        self._fatal = False
        self._resume_from_log = True
        self.error: str | None = None  # why the link is down, for tool results
        self._witnessing = witnessing  # None: peers do not witness this archive
        self._summaries = (  # None: extractive summaries, derived inside the writer job
            SummaryWorker(settings, submit, self._derive, host_model(settings), spent)
            if settings.summary_llm_per_hour
            else None
        )

    def __repr__(self) -> str:
        return f"PeerLink(user_id={self.user_id!r}, connected={self._connected})"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        with _stores_lock:
            if self._crypto_dir in _stores_in_use:
                if self._witnessing is not None:
                    self._witnessing.close()
                raise LinkRefused(
                    f"{self._crypto_dir} is already in use by another hivemind "
                    "provider in this process (one Matrix device per profile)"
                )
            _stores_in_use.add(self._crypto_dir)
        if self._summaries is not None:
            self._summaries.start()
        self._thread = spawn_thread(self._run, name=f"hivemind-sync-{self.user_id}")
        self._thread.start()

    def wait_ready(self, timeout: float) -> bool:
        """Wait (bounded) until the first sync is in the log (or the link gave up)."""
        return self._ready.wait(timeout)

    def close(self, timeout: float) -> None:
        """Stop the loop and the Matrix client within about ``timeout`` seconds."""
        self._stop.set()
        with self._lock:
            backend, self._connected = self._backend, False
        if backend is not None:
            backend.close(timeout=timeout)  # also ends a long poll in flight
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("hivemind: the sync loop did not stop within %.1f s", timeout)
        if self._summaries is not None:
            self._summaries.close(timeout)
        if self._witnessing is not None:
            self._witnessing.close()
        with _stores_lock:
            _stores_in_use.discard(self._crypto_dir)

    @property
    def backend(self) -> MatrixBackend | None:
        """The started backend, or None while not connected (the tools then report why)."""
        with self._lock:
            return self._backend if self._connected else None

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            backend = self.backend or self._connect(failures)
            if backend is None:
                if self._fatal:
                    self._ready.set()
                    return
                failures = self._back_off(failures)
                continue
            try:  # the first sync after connecting returns what start() saw, at once
                result = backend.sync(self._settings.poll_ms if self._ready.is_set() else 0)
            except MatrixError as exc:
                if self._stop.is_set():
                    return
                self._offline(exc, failures)
                failures = self._back_off(failures)
                continue
            except Exception as exc:
                if self._stop.is_set():  # the client was closed under a sync in flight
                    return
                # e.g. nio failing on an event it cannot parse: the same response comes back
                # on every retry, so say so where the tools and status look, not only in logs
                self.error = f"peer sync fails ({type(exc).__name__}: {exc}); retrying"
                log.exception("hivemind: sync failed unexpectedly")
                failures = self._back_off(failures)
                continue
            if failures:
                log.info("hivemind: the homeserver answers again; sync resumes")
                self._log_link_state("online")
                failures = 0
            self.error = None
            try:
                done = self.record_sync(result)
                self._publish_profile(backend)
            except Exception:
                if self._stop.is_set():  # the archive closed under us
                    return
                log.exception("hivemind: a sync could not be recorded")
                continue
            self._witness_round(backend, result)
            if not self._ready.is_set():
                if done is not None:
                    try:
                        done.result(READY_COMMIT_WAIT_S)
                    except Exception as exc:
                        log.warning("hivemind: the first sync was not archived: %s", exc)
                self._ready.set()

    def _connect(self, failures: int) -> MatrixBackend | None:
        """Start a backend (resuming from the log's sync token); None if not now."""
        token = None
        if self._resume_from_log:
            try:
                token = self._read_token()
            except Exception as exc:
                log.warning("hivemind: cannot read the sync position from the log: %s", exc)
        backend = MatrixBackend(
            self._homeserver,
            self.user_id,
            self._crypto_dir,
            access_token=self._access_token,
            device_id=self._device_id,
            allow_users=self._settings.allow_users,
            allow_servers=self._settings.allow_servers,
            thread_factory=backend_thread,
            op_timeout=self._settings.op_timeout_s,
            timeline_limit=self._settings.timeline_limit,
        )
        with self._lock:
            if self._stop.is_set():
                return None
            self._backend = backend
        try:
            backend.start(since=token)
        except MatrixUnavailable as exc:
            self._offline(exc, failures)
            return None
        except MatrixRequestError as exc:
            if token:  # the server may no longer know the logged position: start afresh
                log.warning(
                    "hivemind: resuming from the logged sync position failed (%s); "
                    "starting from the client's own position",
                    exc,
                )
                self._resume_from_log = False
                return None
            self._give_up(f"Matrix refused this agent's credentials: {exc}")
            return None
        except (MatrixError, ValueError) as exc:  # a wrong identity, no E2EE support
            self._give_up(f"the Matrix client cannot start: {exc}")
            return None
        except Exception as exc:
            log.debug("hivemind: start failed", exc_info=True)
            self._give_up(f"the Matrix client failed to start: {type(exc).__name__}: {exc}")
            return None
        with self._lock:
            if self._stop.is_set():
                return None
            self._connected = True
        self.error = None
        log.info("hivemind: connected to %s as %s", self._homeserver, self.user_id)
        return backend

    def _witness_round(self, backend: MatrixBackend, result: SyncResult) -> None:
        """Answer peers' checkpoints, take their answers, send ours when due (never raises)."""
        if self._witnessing is None:
            return
        try:
            self._witnessing.handle(backend, result.witness)
            self._witnessing.send_due(backend)
        except Exception as exc:
            if not self._stop.is_set():
                log.warning("hivemind: peer witnessing failed this round: %s", exc)

    def _give_up(self, error: str) -> None:
        """Retrying cannot help (refused credentials): peers stay off, the archive works."""
        self.error, self._fatal = error, True
        log.error("hivemind: %s; peers are off, the archive keeps working", error)

    def _offline(self, exc: MatrixError, failures: int) -> None:
        self.error = f"the homeserver is unreachable: {exc}"
        if failures == 0:
            log.warning("hivemind: %s; retrying with back-off", self.error)
            self._log_link_state("offline", str(exc))
        else:
            log.debug("hivemind: still unreachable: %s", exc)

    def _log_link_state(self, state: str, error: str = "") -> None:
        """Record a transition, so the peer context says when its state may be stale."""
        try:
            self._submit(lambda store: [events.link_state(state, error=error)], "peer link")
        except Exception as exc:  # the archive is closing: nothing to mark
            log.debug("hivemind: link state not recorded: %s", exc)

    def _back_off(self, failures: int) -> int:
        self._stop.wait(RETRY_BACKOFF_S[min(failures, len(RETRY_BACKOFF_S) - 1)])
        return failures + 1

    # -- events ------------------------------------------------------------------------

    def record_sync(self, result: SyncResult) -> Future[list[AppendResult]] | None:
        """Hand one sync's events (and its position) to the writer; then derive."""
        news = (
            result.messages
            or result.members
            or result.profiles
            or result.introductions
            or result.invites
            or result.undecryptable
            or result.rejected
        )
        if not (news or result.limited_rooms or result.left_rooms):
            return None
        if result.unfilled_rooms:  # the log records it too (peer_sync_position)
            log.warning(
                "hivemind: a sync gap in %s could not be backfilled in full; "
                "messages there may be missing",
                ", ".join(result.unfilled_rooms),
            )

        def build(store: EventStore) -> list[NewEvent]:
            candidates = events.from_sync(store.hasher, result, redact=self.redact)
            fresh = [
                e for e in candidates if store.identity_seq(identity_digest(e.type, e.key)) is None
            ]
            if not fresh and not (result.limited_rooms or result.left_rooms):
                return []
            return [
                *fresh,
                events.sync_position(
                    result.next_batch,
                    limited_rooms=result.limited_rooms,
                    left_rooms=result.left_rooms,
                    unfilled_rooms=result.unfilled_rooms,
                ),
            ]

        done = self._submit(build, "peer sync")
        if news:
            done = self._derive()
        return done

    def _derive(self) -> Future[list[AppendResult]]:
        """Queue the derivations job (stale summaries go to the summarizer, if any)."""
        defer = self._summaries.request if self._summaries is not None else None
        return self._submit(
            lambda store: derived_events(store.conn, store.hasher, defer), "peer derivations"
        )

    def _publish_profile(self, backend: MatrixBackend) -> None:
        """Publish our profile once in every room we joined (Synapse keeps identical state)."""
        profile = self._settings.profile
        if not profile:
            return
        try:
            rooms = [r for r in backend.joined_rooms() if r not in self._published]
            for room in rooms:
                try:
                    backend.publish_profile(room, profile)
                except MatrixRequestError as exc:  # e.g. the room's power levels forbid it
                    log.info("hivemind: not publishing the profile in %s: %s", room, exc)
                self._published.add(room)
        except MatrixError as exc:
            log.debug("hivemind: profile publication postponed: %s", exc)
