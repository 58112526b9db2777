"""Provider settings: defaults, the `hermes memory setup` schema, and where they live.

Settings live in ``<HERMES_HOME>/archive/config.json``: the file hermes' dashboard writes
for a provider whose ``config_schema.py`` declares ``flat_json`` storage, and the file
``save_config`` (``hermes memory setup``) writes. Environment variables ``ARCHIVE_<KEY>``
override it for deployments.
"""

from __future__ import annotations

import json
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
    queue_max_events: int = 2_000
    queue_max_bytes: int = 64 << 20
    spill_fsync_s: float = 1.0
    journal_every_event: bool = False

    def __post_init__(self) -> None:
        """Refuse values that would break a guarantee rather than bend it silently."""
        if self.queue_max_events < 1:
            raise ValueError(f"queue_max_events must be at least 1, got {self.queue_max_events}")
        if self.queue_max_bytes < 1 << 16:
            raise ValueError(
                f"queue_max_bytes must be at least 65536 (64 KiB), got {self.queue_max_bytes}"
            )
        if not 0 <= self.spill_fsync_s <= 60:
            raise ValueError(
                f"spill_fsync_s must be from 0 to 60 seconds, got {self.spill_fsync_s}"
            )
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must not be negative, got {self.drain_timeout_s}")

    @staticmethod
    def config_schema() -> list[dict[str, Any]]:
        """Fields for `hermes memory setup` (none are secrets; the archive is local)."""
        return [
            {
                "key": "recall_budget_chars",
                "description": "Characters of archive recall injected per turn",
                "default": Settings.recall_budget_chars,
            },
            {
                "key": "recall_limit",
                "description": "Excerpts recalled per turn at most",
                "default": Settings.recall_limit,
            },
            {
                "key": "checkpoint_timeout_s",
                "description": "Seconds a pre-compress checkpoint may wait for the database",
                "default": Settings.checkpoint_timeout_s,
            },
            {
                "key": "redact_secrets",
                "description": "Mask secret-shaped strings before archiving",
                "default": Settings.redact_secrets,
                "choices": [True, False],
            },
            {
                "key": "journal_every_event",
                "description": "Write every accepted event to the spill journal before the hook "
                "returns (a SIGKILL then loses nothing accepted; costs a write per turn)",
                "default": Settings.journal_every_event,
                "choices": [True, False],
            },
            {
                "key": "witness_dir",
                "description": "Folder outside HERMES_HOME that keeps the chain head (rollback detection)",
                "default": "",
            },
        ]


def _coerce(settings: Settings, values: dict[str, Any]) -> Settings:
    changes: dict[str, Any] = {}
    for field in fields(Settings):
        if field.name not in values or values[field.name] is None:
            continue
        raw = values[field.name]
        default = getattr(Settings, field.name)
        if isinstance(default, bool):
            value: Any = (
                raw
                if isinstance(raw, bool)
                else str(raw).strip().lower() in ("1", "true", "yes", "on")
            )
        elif isinstance(default, int):
            value = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        else:
            value = str(raw)
        changes[field.name] = value
    return replace(settings, **changes)


def config_path(home: Path, provider: str = CONFIG_SECTION) -> Path:
    return home / provider / "config.json"


def _read_config(home: Path) -> dict[str, Any]:
    path = config_path(home)
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def load_settings(home: Path) -> Settings:
    settings = _coerce(Settings(), _read_config(home))
    prefix = "ARCHIVE_"
    env = {
        f.name: os.environ[prefix + f.name.upper()]
        for f in fields(Settings)
        if prefix + f.name.upper() in os.environ
    }
    return _coerce(settings, env)


def save_settings(home: Path, values: dict[str, Any]) -> None:
    """Merge ``values`` (checked against the field types) into the profile's config.json."""
    checked = _coerce(Settings(), values)
    merged = {
        **_read_config(home),
        **{f.name: getattr(checked, f.name) for f in fields(Settings) if f.name in values},
    }
    path = config_path(home)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
