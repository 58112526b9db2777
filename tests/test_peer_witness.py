"""A peer witness over a channel that is not HTTP (witnesses/peer.py): the tlog-witness
rules of the remote witness with the state in the agent's witness folder, plus what a
redelivering channel needs (a smaller checkpoint is a rollback at once, a message sent before
the last cosignature is stale). Real v2 archives and writers; no Matrix (the hivemind tests
carry the same exchange over Synapse).
"""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

from archive_provider.domain.clock import format_time, utc_now
from archive_provider.format.events import NewEvent
from archive_provider.format.signed_note import Verifier, open_checkpoint
from archive_provider.storage.store import EventStore
from archive_provider.storage.witness import Witness
from archive_provider.storage.writer import Writer
from archive_provider.witnesses.peer import (
    PeerWitness,
    accept_cosignature,
    checkpoint_request,
    cosigned_size,
)

PEER = "@alice:localhost"


def _turns(home: Path, turns: range) -> None:
    """A writer session whose every turn is durable (each signs a checkpoint)."""
    folder = home / "archive"
    writer = Writer(folder, witness=Witness.for_home(home))
    for turn in turns:

        def build(store: EventStore, t: int = turn) -> list[NewEvent]:
            part = store.hasher.part({"content": f"turn {t}", "role": "user"})
            return [
                NewEvent("turn", "s1", {"turn": t}, {"turn": t, "messages": [part.digest]}, (part,))
            ]

        writer.append_durable(build, timeout=30)
    assert writer.close().complete


def _later() -> str:
    return format_time(utc_now() + timedelta(seconds=1))


def test_a_peer_cosigns_consistent_checkpoints_and_refuses_a_rollback(tmp_path: Path) -> None:
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    folder = alice / "archive"
    EventStore.open(folder).close()
    _turns(alice, range(1, 4))
    witness = PeerWitness(bob, "bob.example/peer-witness")

    first = checkpoint_request(folder, 0)
    assert first is not None
    answer = witness.answer(first.body, first.log_vkey, PEER, _later())
    assert answer.status == "cosigned", answer
    assert (
        accept_cosignature(folder, witness.vkey, answer.checkpoint, answer.cosignature)
        == first.size
    )
    assert cosigned_size(folder, witness.vkey) == first.size
    # a cosignature of a checkpoint this archive never signed is not kept
    assert (
        accept_cosignature(
            folder,
            witness.vkey,
            answer.checkpoint.replace(str(first.size), "1", 1),
            answer.cosignature,
        )
        is None
    )

    shutil.copytree(folder, tmp_path / "alice-before")
    _turns(alice, range(4, 8))
    second = checkpoint_request(folder, cosigned_size(folder, witness.vkey))
    assert second is not None and second.size > first.size
    sent_at = _later()
    assert witness.answer(second.body, second.log_vkey, PEER, sent_at).status == "cosigned"
    # the same message redelivered (a restart resumes from an older sync position)
    witness.close()
    witness = PeerWitness(bob, "bob.example/peer-witness")  # state and pins survive a restart
    assert (
        witness.answer(
            first.body, first.log_vkey, PEER, format_time(utc_now() - timedelta(hours=1))
        ).status
        == "stale"
    )

    # another archive under the same peer: its key is not the pinned one
    other = tmp_path / "mallory"
    EventStore.open(other / "archive").close()
    _turns(other, range(1, 2))
    replaced = checkpoint_request(other / "archive", 0)
    assert replaced is not None
    answer = witness.answer(replaced.body, replaced.log_vkey, PEER, _later())
    assert answer.status == "refused" and "log key changed" in answer.reason

    # the rollback: the older copy restored; smaller than what was cosigned
    shutil.rmtree(folder)
    shutil.copytree(tmp_path / "alice-before", folder)
    rolled = checkpoint_request(folder, 0)
    assert rolled is not None and rolled.size < second.size
    answer = witness.answer(rolled.body, rolled.log_vkey, PEER, _later())
    assert answer.status == "refused" and "rolled back" in answer.reason
    evidence, _, cosigned = open_checkpoint(
        answer.checkpoint, Verifier.from_vkey(rolled.log_vkey), [Verifier.from_vkey(witness.vkey)]
    )
    assert evidence.size == second.size and cosigned  # signed by Alice's log, cosigned by Bob

    # a fork as long as what was cosigned: asked to prove from there, and the proof fails
    witness_record = Witness.for_home(alice)
    witness_record.write(*_head(folder), force=True)  # accepted locally, as a tricked operator
    _turns(alice, range(100, 110))
    forked = checkpoint_request(folder, 0)
    assert forked is not None and forked.size >= second.size
    answer = witness.answer(forked.body, forked.log_vkey, PEER, _later())
    assert answer.status == "conflict" and answer.size == second.size
    proved = checkpoint_request(folder, answer.size)
    assert proved is not None
    answer = witness.answer(proved.body, proved.log_vkey, PEER, _later())
    assert answer.status == "refused" and "not consistent" in answer.reason
    witness.close()


def _head(folder: Path) -> tuple[str, int, str]:
    store = EventStore.open(folder, create=False, readonly=True)
    try:
        head = store.head()
        return store.store_id, head.seq, head.chain
    finally:
        store.close()
