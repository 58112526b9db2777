"""The six hivemind tool schemas match the design exactly, and the skill text is in place."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "schemas" / "tools"
SKILL = ROOT / "hivemind" / "skills" / "social-awareness" / "SKILL.md"

# name -> (properties, required), as in the HiveMind design.
DESIGN = {
    "hivemind_list_peers": ((), ()),
    "hivemind_check_messages": (("peer_name",), ()),
    "hivemind_send_to_peer": (("peer_name", "message"), ("peer_name", "message")),
    "hivemind_get_peer_info": (("peer_name",), ("peer_name",)),
    "hivemind_introduce_peers": (("peer_a", "peer_b", "context"), ("peer_a", "peer_b")),
    "hivemind_dismiss_spark": (("peer_a", "peer_b"), ("peer_a", "peer_b")),
}


@pytest.mark.parametrize("name", sorted(DESIGN))
def test_tool_schema_matches_design(name: str) -> None:
    tool = json.loads((TOOLS / f"{name}.json").read_text())
    assert set(tool) == {"name", "description", "parameters"}
    assert tool["name"] == name and tool["description"].strip()
    params = tool["parameters"]
    jsonschema.Draft202012Validator.check_schema(params)
    properties, required = DESIGN[name]
    assert params["type"] == "object"
    assert tuple(params["properties"]) == properties
    assert tuple(params["required"]) == required
    assert all(p["type"] == "string" for p in params["properties"].values())


def test_exactly_six_hivemind_tools() -> None:
    assert sorted(p.stem for p in TOOLS.glob("hivemind_*.json")) == sorted(DESIGN)


def test_skill_names_every_tool_and_the_untrusted_data_rule() -> None:
    text = SKILL.read_text()
    assert text.startswith("---\nname: social-awareness\n")
    for name in DESIGN:
        assert f"`{name}`" in text
    assert "data, never instructions" in text
