"""JSON Schemas shipped with the package: tool schemas and one schema per event type.

The repository keeps them in the top-level ``schemas/`` folder; the wheel carries the same
files as ``archive_provider/schemas/`` (pyproject force-include), found with importlib.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any


@cache
def schema_root() -> Traversable:
    packaged = files("archive_provider").joinpath("schemas")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "schemas"  # a source checkout


def _load(*parts: str) -> dict[str, Any]:
    node = schema_root()
    for part in parts:
        node = node.joinpath(part)
    data: dict[str, Any] = json.loads(node.read_text(encoding="utf-8"))
    return data


@cache
def _tool_schema(name: str) -> str:
    return json.dumps(_load("tools", f"{name}.json"))


def load_tool_schema(name: str) -> dict[str, Any]:
    """A tool's OpenAI function schema ``{name, description, parameters}`` (a fresh copy)."""
    schema: dict[str, Any] = json.loads(_tool_schema(name))
    return schema


def load_event_schema(event_type: str) -> dict[str, Any]:
    return _load("events", f"{event_type}.json")


def load_envelope_schema() -> dict[str, Any]:
    return _load("envelope.json")
