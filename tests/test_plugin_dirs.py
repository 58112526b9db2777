"""Both entry-point package folders carry what hermes loads from them by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("name", "package"), [("archive", "archive_provider"), ("hivemind", "hivemind")]
)
def test_cli_and_plugin_yaml_load_by_path_as_hermes_loads_them(name: str, package: str) -> None:
    folder = REPO / package
    # hermes recognises a provider folder by this text in the first 8 KB of __init__.py
    assert "register_memory_provider" in (folder / "__init__.py").read_text()[:8192]
    spec = importlib.util.spec_from_file_location(f"_hermes_plugin_cli_{name}", folder / "cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.register_cli)
    assert callable(getattr(module, f"{name}_command"))
    assert f"name: {name}" in (folder / "plugin.yaml").read_text()
