"""Provider settings: defaults, the `hermes memory setup` schema, and where they live.

Settings are read from ``<HERMES_HOME>/config.yaml`` under ``plugins.archive`` (written by
``save_config`` through hermes' own config writer when available, so the rest of the file
is kept), and environment variables override them for deployments (``ARCHIVE_*``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

CONFIG_SECTION = "archive"


@dataclass(frozen=True)
class Settings:
    recall_budget_chars: int = 2000
    recall_limit: int = 6
    checkpoint_timeout_s: float = 30.0
    busy_timeout_s: float = 5.0
    drain_timeout_s: float = 5.0
    redact_secrets: bool = True
    witness_dir: str = ""

    @staticmethod
    def config_schema() -> list[dict[str, Any]]:
        """Fields for `hermes memory setup` (none are secrets; the archive is local)."""
        return [
            {"key": "recall_budget_chars", "description": "Characters of archive recall injected per turn",
             "default": Settings.recall_budget_chars},
            {"key": "recall_limit", "description": "Excerpts recalled per turn at most", "default": Settings.recall_limit},
            {"key": "checkpoint_timeout_s", "description": "Seconds a pre-compress checkpoint may wait for the database",
             "default": Settings.checkpoint_timeout_s},
            {"key": "redact_secrets", "description": "Mask secret-shaped strings before archiving",
             "default": Settings.redact_secrets, "choices": [True, False]},
            {"key": "witness_dir", "description": "Folder outside HERMES_HOME that keeps the chain head (rollback detection)",
             "default": ""},
        ]


def _coerce(settings: Settings, values: dict[str, Any]) -> Settings:
    changes: dict[str, Any] = {}
    for field in fields(Settings):
        if field.name not in values or values[field.name] is None:
            continue
        raw = values[field.name]
        default = getattr(Settings, field.name)
        if isinstance(default, bool):
            value: Any = raw if isinstance(raw, bool) else str(raw).strip().lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int):
            value = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        else:
            value = str(raw)
        changes[field.name] = value
    return replace(settings, **changes)


def _config_file_section(home: Path) -> dict[str, Any]:
    path = home / "config.yaml"
    if not path.exists():
        return {}
    try:
        import yaml  # hermes depends on PyYAML; without hermes there is no config.yaml to read
    except ImportError:
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    section = (data.get("plugins") or {}).get(CONFIG_SECTION) if isinstance(data, dict) else None
    return section if isinstance(section, dict) else {}


def load_settings(home: Path) -> Settings:
    settings = _coerce(Settings(), _config_file_section(home))
    env = {f.name: os.environ[f"ARCHIVE_{f.name.upper()}"] for f in fields(Settings) if f"ARCHIVE_{f.name.upper()}" in os.environ}
    return _coerce(settings, env)


def save_settings(home: Path, values: dict[str, Any]) -> None:
    """Merge ``values`` into ``plugins.archive`` of the profile's config.yaml."""
    import yaml

    checked = _coerce(Settings(), values)
    section = {f.name: getattr(checked, f.name) for f in fields(Settings) if f.name in values}
    path = home / "config.yaml"
    data = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    data.setdefault("plugins", {}).setdefault(CONFIG_SECTION, {}).update(section)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)
