"""Peers witnessing each other's archives over the encrypted rooms they share (issue 21.3).

With ``witness_peers`` set (by ``HIVEMIND_WITNESS_PEERS``, outside the profile), the sync
loop (:class:`.link.PeerLink`) hands this module the witness messages of each sync and,
every ``witness_interval_s`` at most, lets it send our newest signed checkpoint to each
chosen peer that has not answered it yet. Both sides are
the archive's witness machinery (``archive_provider.PeerWitness`` and friends: the
tlog-witness rules, consistency proofs, cosignatures); this module only carries them over
Matrix (:data:`.matrix_backend.WITNESS_MSGTYPE`) and records what must be recorded:

* as the log side: a peer's cosignature goes to ``cosignatures`` (like a remote witness's),
  the first one adds the peer to the witness set (``witness_added`` with no URL), and a
  refusal is archived with the peer's evidence (``witness_refused``), which ``status`` and
  ``verify --witnesses`` check against the tree;
* as the witness: a checkpoint inconsistent with the one we cosigned (a rollback or a
  rewrite) is refused and archived with both signed notes (``peer_witness_refused``); the
  ``## Peers`` block then says so.

A refusal is archived only when it carries evidence that checks, at most once per
checkpoint per peer: on the log side a checkpoint this archive signed, cosigned by the key
the log names for that peer, that the tree does not hold (``refusal_checks``); on the
witness side a checkpoint of the peer's log we cosigned before. The rest is counted
(``refusals_counted``), never archived: a chosen peer could otherwise fill the log with
refusals as fast as it can send them.

Only peers listed on both sides take part; messages from anyone else are ignored. Nothing
here raises into the loop for anything a peer sends.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from archive_provider import (
    EventStore,
    NewEvent,
    PeerWitness,
    accept_cosignature,
    archive_dir,
    checkpoint_request,
    cosigned_size,
    format_time,
    refusal_checks,
    witness_added,
    witness_refused,
    witness_set,
)

from . import events
from .events import Submit
from .matrix_backend import MatrixBackend, WitnessMessage

log = logging.getLogger(__name__)

MAX_FIELD_CHARS = 64 * 1024  # a checkpoint note with its proof is a few KB


def witness_key_name(user_id: str) -> str:
    """The cosigner key name of the agent ``user_id`` (a note key name has no '+')."""
    return "hivemind.peer-witness/" + user_id.replace("+", "%2B")


def _field(payload: Mapping[str, Any], name: str) -> str:
    value = payload.get(name)
    return value if isinstance(value, str) and len(value) <= MAX_FIELD_CHARS else ""


class PeerWitnessing:
    """Both sides of the exchange with the chosen peers, for one profile."""

    def __init__(
        self,
        *,
        home: Path,
        user_id: str,
        peers: Sequence[str],
        interval_s: float,
        submit: Submit,
        redact: bool = True,
    ) -> None:
        self._archive = archive_dir(home)
        self._witness = PeerWitness(home, witness_key_name(user_id))
        self._peers = frozenset(p for p in peers if p != user_id)
        self._interval = interval_s
        self._submit = submit
        self._redact = redact  # the archive's redact_secrets, for what we archive of peers
        self._next_round = 0.0
        self._keys: dict[str, str] = {}  # peer -> its cosigner key (from its answers)
        self._from: dict[str, int] = {}  # peer -> the size it asked us to prove from (409)
        self._sent: dict[str, int] = {}  # peer -> the size we sent last
        self._answered: dict[str, int] = {}  # peer -> the size it answered last
        #: (peer, checkpoint) of each refusal archived: at most one per checkpoint per peer
        self._refusals: set[tuple[str, str]] = set()
        #: peer -> refusals it sent or earned that were not archived (no evidence, or again)
        self.refusals_counted: Counter[str] = Counter()

    def close(self) -> None:
        self._witness.close()

    # -- the loop's two calls -------------------------------------------------------------

    def handle(self, backend: MatrixBackend, messages: Sequence[WitnessMessage]) -> None:
        """Answer the checkpoints peers sent and take in their answers to ours."""
        for message in messages:
            if message.sender not in self._peers:
                continue
            kind = message.payload.get("kind")
            if kind == "checkpoint":
                self._judge(backend, message)
            elif kind == "answer":
                self._take_answer(message)

    def send_due(self, backend: MatrixBackend) -> None:
        """Send our newest checkpoint to each peer that has not answered it (rate-bounded)."""
        now = time.monotonic()
        if now < self._next_round:
            return
        self._next_round = now + self._interval
        for peer in sorted(self._peers):
            key = self._keys.get(peer)
            old = self._from.get(peer) or (cosigned_size(self._archive, key) if key else 0)
            request = checkpoint_request(self._archive, old)
            if request is None:
                return  # nothing signed yet
            if self._answered.get(peer) == request.size and peer not in self._from:
                continue
            payload = {
                "kind": "checkpoint",
                "request": request.body.decode("utf-8"),
                "log_vkey": request.log_vkey,
            }
            backend.send_witness(backend.direct_room_for(peer), payload)
            self._sent[peer] = request.size

    # -- as the witness -------------------------------------------------------------------

    def _judge(self, backend: MatrixBackend, message: WitnessMessage) -> None:
        body, log_vkey = _field(message.payload, "request"), _field(message.payload, "log_vkey")
        if not body or not log_vkey:
            return
        sent_at = format_time(datetime.fromtimestamp(message.origin_server_ts / 1000, timezone.utc))
        answer = self._witness.answer(body.encode("utf-8"), log_vkey, message.sender, sent_at)
        if answer.status == "stale":
            return
        offered = body.partition("\n\n")[2]
        if answer.status == "refused" and self._first_refusal(message.sender, answer.checkpoint):
            log.warning("hivemind: refused to cosign %s: %s", message.sender, answer.reason)
            event = events.witness_refused(
                message.sender, answer.reason, answer.checkpoint, offered, redact=self._redact
            )
            self._submit(lambda store: [event], "peer witness refused")
        reply = {
            "kind": "answer",
            "status": answer.status,
            "cosignature": answer.cosignature,
            "checkpoint": answer.checkpoint,
            "size": answer.size,
            "reason": answer.reason,
            "witness_vkey": self._witness.vkey,
        }
        backend.send_witness(message.room_id, reply)

    # -- as the log -----------------------------------------------------------------------

    def _take_answer(self, message: WitnessMessage) -> None:
        peer, payload = message.sender, message.payload
        vkey, status = _field(payload, "witness_vkey"), payload.get("status")
        if not vkey:
            return
        self._keys[peer] = vkey
        if status == "conflict":
            size = payload.get("size")
            if isinstance(size, int) and size > 0:
                self._from[peer] = size
                self._next_round = 0.0  # prove from there at once
            return
        self._from.pop(peer, None)
        if status == "cosigned":
            try:
                kept = accept_cosignature(
                    self._archive,
                    vkey,
                    _field(payload, "checkpoint"),
                    _field(payload, "cosignature"),
                )
            except ValueError as exc:
                log.info("hivemind: an unusable cosignature from %s: %s", peer, exc)
                return
            if kept is not None:
                self._answered[peer] = kept
                self._submit(lambda store: self._added(store, peer, vkey), "peer witness")
        elif status == "refused":
            reason, evidence = _field(payload, "reason"), _field(payload, "checkpoint")
            self._answered[peer] = self._sent.get(peer, 0)
            checks = bool(evidence) and refusal_checks(self._archive, peer, vkey, evidence)
            if self._first_refusal(peer, evidence if checks else ""):
                log.warning("hivemind: %s refuses to cosign this archive: %s", peer, reason)
                event = witness_refused(vkey, peer, reason, evidence)
                self._submit(lambda store: [event], "peer witness refused")

    def _first_refusal(self, peer: str, evidence: str) -> bool:
        """Whether a refusal with ``evidence`` (a checkpoint note that checks; "" when
        there is none) is archived: once per checkpoint per peer. Otherwise it is counted."""
        checkpoint = evidence.partition("\n\n")[0]  # the checkpoint, not its signatures
        if not evidence or (peer, checkpoint) in self._refusals:
            self.refusals_counted[peer] += 1
            return False
        self._refusals.add((peer, checkpoint))
        return True

    @staticmethod
    def _added(store: EventStore, peer: str, vkey: str) -> list[NewEvent]:
        """``witness_added`` the first time ``peer``'s cosigner key cosigns for us."""
        if any(e.vkey == vkey for e in witness_set(store.conn)):
            return []
        who = {"peer": peer, "by": "hivemind"}
        return [witness_added(None, vkey, f"hivemind peer {peer} cosigns this archive", who)]
