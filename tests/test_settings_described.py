"""The settings are described once: the ``Settings`` dataclass (names, types, defaults).

Three other places must say the same, and hermes allows none of them to be generated at
run time from the package (the dashboard loads ``config_schema.py`` by path, and it may
import only ``plugins.memory.config_schema``), so this test holds them to the dataclass:
``Settings.config_schema()`` (``hermes memory setup``), ``archive_provider/config_schema.py``
(the dashboard) and the table in docs/OPERATIONS.md.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import archive_provider
from archive_provider.host.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {f.name: f.default for f in fields(Settings)}
assert all(value is not MISSING for value in DEFAULTS.values())


def as_text(value: Any) -> str:
    """A default as the dashboard and the docs write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_setup_schema_names_settings_with_their_defaults() -> None:
    schema = Settings.config_schema()
    assert {field["key"] for field in schema} <= set(DEFAULTS)
    for field in schema:
        assert field["default"] == DEFAULTS[field["key"]], field["key"]


def test_the_dashboard_schema_says_what_the_setup_schema_says() -> None:
    path = Path(archive_provider.__file__).with_name("config_schema.py")
    spec = importlib.util.spec_from_file_location("archive_dashboard_schema", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # as hermes loads it: by path, alone
    dashboard = {field.key: field.default for field in module.CONFIG_SCHEMA.fields}
    setup = {field["key"]: as_text(field["default"]) for field in Settings.config_schema()}
    assert dashboard == setup


def test_operations_documents_every_setting_with_its_default() -> None:
    text = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text, re.MULTILINE))
    assert set(DEFAULTS) <= set(rows), set(DEFAULTS) - set(rows)
    for name, default in DEFAULTS.items():
        documented = rows[name]
        if default == "":
            assert documented and documented != '`""`', name  # an empty default says what it means
        else:
            assert documented == as_text(default), (name, documented)
