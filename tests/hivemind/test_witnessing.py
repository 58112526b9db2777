"""Peers witnessing each other's archives over the encrypted rooms they share (issue 21.3),
three agents on the real Synapse: all cosign each other, then one agent's archive is rolled
back (an older copy restored and accepted locally, as a tricked operator would) and both
others refuse, archive the evidence and say so; the victim's status and
``verify --witnesses`` show the refusals.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from archive_provider.cli import main
from archive_provider.format.signed_note import Verifier, open_checkpoint
from archive_provider.host.schemas import load_event_schema
from archive_provider.storage.store import EventStore, archive_dir

from .agents import call, home_of, logged, wait_for

WITNESS_WAIT_S = 90.0  # a liveness bound for a loaded 2-core box, never a performance claim


def cli(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main(["--home", str(home), "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def cosigned(home: Path) -> dict[str, int]:
    """By cosigner key name: the largest size each peer witness cosigned (from the log's
    witness set and the cosignatures table)."""
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        names = {
            e.body["name"]
            for e in store.events()
            if e.type == "witness_added" and e.body["url"] is None
        }
        return {
            name: size
            for name, size in store.conn.execute(
                "SELECT name, max(size) FROM cosignatures GROUP BY name"
            )
            if name in names
        }
    finally:
        store.close()


def cosigned_by_both(home: Path, above: int = 0) -> dict[str, int] | None:
    found = cosigned(home)
    return found if len(found) == 2 and min(found.values()) > above else None


@pytest.mark.synapse
def test_three_peers_cosign_each_other_and_catch_a_rollback(
    make_user: Any, make_agent: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    everyone = [alice.user_id, bob.user_id, carol.user_id]

    def start(user: Any, home: Path | None = None) -> Any:
        others = [u for u in everyone if u != user.user_id]
        return make_agent(
            user, home=home, contacts=others, witness_peers=others, witness_interval_s=1
        )

    a, b, c = start(alice), start(bob), start(carol)
    homes = {name: home_of(agent) for name, agent in (("a", a), ("b", b), ("c", c))}

    # all cosign each other: each log names both peers as witnesses, with cosignatures
    for name, home in homes.items():
        wait_for(lambda h=home: cosigned_by_both(h), WITNESS_WAIT_S, f"{name} cosigned")
        code, status = cli(home, capsys, "status")
        rows = status["remote_witnesses"]
        assert code == 0 and len(rows) == 2, status
        assert all(r["url"] is None and r["consistent"] for r in rows), rows

    # the copy the attacker will restore: Alice's archive as it is now
    a.shutdown()
    shutil.copytree(archive_dir(homes["a"]), tmp_path / "alice-before")
    restored_size = max(cosigned(homes["a"]).values())
    store = EventStore.open(archive_dir(homes["a"]), create=False, readonly=True)
    log_key = Verifier.from_vkey(store.vkey)  # type: ignore[attr-defined]
    store.close()

    # Alice goes on; Bob and Carol cosign her newer checkpoints
    a = start(alice, homes["a"])
    for text in ("one", "two", "three"):
        assert call(a, "hivemind_send_to_peer", peer_name=bob.user_id, message=text)["sent"]
    wait_for(
        lambda: cosigned_by_both(homes["a"], above=restored_size),
        WITNESS_WAIT_S,
        "newer checkpoints cosigned",
    )
    a.shutdown()

    # the rollback: the older copy put back and accepted locally (the local witness alone
    # cannot tell a deliberate restore from a rollback)
    shutil.rmtree(archive_dir(homes["a"]))
    shutil.copytree(tmp_path / "alice-before", archive_dir(homes["a"]))
    code, accepted = cli(homes["a"], capsys, "witness", "accept", "--reason", "tricked into it")
    assert code == 0, accepted
    a = start(alice, homes["a"])

    # both peers refuse, archive the evidence and say so in their context
    for name in ("b", "c"):
        [refusal] = wait_for(
            lambda n=name: logged(homes[n], "peer_witness_refused"),
            WITNESS_WAIT_S,
            f"{name} refuses",
        )
        body = refusal.body
        jsonschema.validate(body, load_event_schema("peer_witness_refused"))
        assert body["peer"] == alice.user_id
        block = (b if name == "b" else c).prefetch("who are my peers?")
        assert "WITNESS ALERT" in block and "rolled back or rewritten" in block
        # the evidence: two checkpoints signed by Alice's log key that cannot both be true
        cosigned_before, _, _ = open_checkpoint(body["evidence"], log_key)
        offered, _, _ = open_checkpoint(body["offered"], log_key)
        assert cosigned_before.size > restored_size
        assert offered.size < cosigned_before.size or offered.root != cosigned_before.root

    # the victim: both refusals archived; status and verify --witnesses show them
    wait_for(
        lambda: len(logged(homes["a"], "witness_refused")) == 2,
        WITNESS_WAIT_S,
        "alice records the refusals",
    )
    for event in logged(homes["a"], "witness_refused"):
        jsonschema.validate(event.body, load_event_schema("witness_refused"))
    a.shutdown()
    code, status = cli(homes["a"], capsys, "status")
    assert [r["consistent"] for r in status["remote_witnesses"]] == [False, False], status
    code, verified = cli(homes["a"], capsys, "verify", "--witnesses")
    assert code == 1 and not verified["ok"]
    refusing = [line for line in verified["witness_lines"] if "REFUSES" in line]
    assert len(refusing) == 2 and all("rolled back or rewritten" in line for line in refusing)
