"""Issue 29 point 9: a chosen witness peer cannot flood the log with refusals.

A peer that had cosigned for Alice sent 200 ``refused`` answers in 0.3 s: 200
``witness_refused`` events, 39 MB. A refusal is archived only when it carries evidence that
checks (a checkpoint Alice's key signed, cosigned by the key her log names for that peer,
that her tree does not hold), once per checkpoint per peer; the rest is counted.

Alice's real archive and writer, a real peer witness (its own key and state) answering her
real checkpoint; the answers reach ``PeerWitnessing`` as the sync loop hands them over (no
transport: taking in an answer sends nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from archive_provider.domain.clock import now_text
from archive_provider.format.signed_note import Checkpoint, format_note
from archive_provider.host.provider import ArchiveProvider
from archive_provider.storage.store import EventStore, archive_dir
from archive_provider.storage.store_pieces import read_signer, signing_key_path
from archive_provider.witnesses.peer import PeerWitness, checkpoint_request
from archive_provider.witnesses.server import keygen, load_key
from hivemind.matrix_backend import WitnessMessage
from hivemind.witnessing import PeerWitnessing, witness_key_name

ALICE, MALLORY = "@alice:hs.test", "@mallory:hs.test"
FLOOD = 200


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[ArchiveProvider]:
    provider = ArchiveProvider()
    provider.initialize("s1", hermes_home=str(tmp_path / "alice"), platform="cli")
    provider.sync_turn("what is the capital of France?", "Paris")
    messages = [
        {"role": "user", "content": "and of Italy?"},
        {"role": "assistant", "content": "Rome"},
    ]
    assert provider.on_pre_compress(messages, require_checkpoint=True)  # a signed checkpoint
    yield provider
    provider.shutdown()


def answer(number: int, vkey: str, status: str, checkpoint: str, cosignature: str = "") -> Any:
    payload = {
        "kind": "answer",
        "status": status,
        "cosignature": cosignature,
        "checkpoint": checkpoint,
        "size": 0,
        "reason": "refused",
        "witness_vkey": vkey,
    }
    return WitnessMessage(f"$e{number}", "!room:hs.test", MALLORY, 1_700_000_000_000, payload)


def refusals(home: Path) -> list[Any]:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        return [e for e in store.events() if e.type == "witness_refused"]
    finally:
        store.close()


def test_a_peer_cannot_flood_the_log_with_refusals(alice: ArchiveProvider, tmp_path: Path) -> None:
    home = Path(str(alice.core.home))
    folder = archive_dir(home)
    witnessing = PeerWitnessing(
        home=home, user_id=ALICE, peers=[MALLORY], interval_s=60, submit=alice.core.submit_job
    )
    mallory = PeerWitness(tmp_path / "mallory", witness_key_name(MALLORY))
    try:
        # Mallory cosigns Alice's checkpoint: her log now names Mallory's key
        request = checkpoint_request(folder, 0)
        assert request is not None
        cosigned = mallory.answer(request.body, request.log_vkey, ALICE, now_text())
        assert cosigned.status == "cosigned"
        first = answer(0, mallory.vkey, "cosigned", cosigned.checkpoint, cosigned.cosignature)
        witnessing.handle(None, [first])  # type: ignore[arg-type]
        assert alice.core.writer is not None and alice.core.writer.flush(60)

        # the flood: refusals whose "evidence" proves nothing (junk; and the very note
        # Mallory cosigned, which Alice's tree holds)
        genuine = cosigned.checkpoint + "\n" + cosigned.cosignature
        junk = [answer(n, mallory.vkey, "refused", f"{n} " + "x" * 60_000) for n in range(FLOOD)]
        witnessing.handle(None, [*junk, answer(FLOOD, mallory.vkey, "refused", genuine)])  # type: ignore[arg-type]

        # evidence that checks: a checkpoint Alice's key signed that her tree does not hold
        # (what a rollback leaves behind), cosigned by Mallory's pinned key, sent twice
        head = request.size
        signer = read_signer(signing_key_path(folder), origin(folder))
        forked = Checkpoint(signer.name, head, os.urandom(32)).text
        witness_key = load_key(mallory.folder)
        conflicting = [
            format_note(forked, [signer.sign(forked), witness_key.cosign(forked, stamp)]).decode()
            for stamp in (1, 2)
        ]
        # the same from a key Alice's log does not name for Mallory
        stranger = keygen(tmp_path / "stranger", witness_key_name(MALLORY))
        unpinned = format_note(forked, [signer.sign(forked), stranger.cosign(forked, 3)]).decode()
        witnessing.handle(
            None,  # type: ignore[arg-type]
            [
                *(
                    answer(FLOOD + 1 + n, mallory.vkey, "refused", c)
                    for n, c in enumerate(conflicting)
                ),
                answer(FLOOD + 3, stranger.vkey, "refused", unpinned),
            ],
        )
        assert alice.core.writer.flush(60)
    finally:
        witnessing.close()
        mallory.close()

    [kept] = refusals(home)  # one, with the evidence that checks
    assert kept.body["checkpoint"] == conflicting[0]
    assert witnessing.refusals_counted[MALLORY] == FLOOD + 1 + 1 + 1


def origin(folder: Path) -> str:
    """The log's origin line (its signing key's name)."""
    store = EventStore.open(folder, create=False, readonly=True)
    try:
        return str(store.origin)  # type: ignore[attr-defined]
    finally:
        store.close()
