"""``hermes-archive demo --peers``: its own Synapse, three agents, two meet through the third."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from archive_provider.demo.demo import DemoRefused
from hivemind.demo import ANSWER, QUESTION, run_peers_demo

pytestmark = pytest.mark.synapse


def test_the_peers_demo_runs_end_to_end_and_verifies_every_log(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_peers_demo(tmp_path / "demo", say=lines.append)
    assert result.ok, result
    assert result.spark == [result.agents["alice"], result.agents["bob"]]
    assert [m["text"] for m in result.exchanged] == [QUESTION, ANSWER]
    for name, other in (("alice", "bob"), ("bob", "alice")):
        assert (
            f"- hermes-of-{other} ({result.agents[other]}, introduced by hermes-of-carol)"
            in (result.blocks[name])
        )
    assert any(line.startswith("Carol introduces them in !") for line in lines)
    assert not (tmp_path / "demo" / "synapse").exists()  # the homeserver is gone
    assert [t.name for t in threading.enumerate() if t.name.startswith("hivemind-")] == []
    with pytest.raises(DemoRefused):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "keep.txt").write_text("not the demo's")
        run_peers_demo(tmp_path / "other")
