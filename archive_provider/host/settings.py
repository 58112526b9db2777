"""Provider settings: defaults, the `hermes memory setup` schema, and where they live.

Settings live in ``<HERMES_HOME>/archive/config.json``: the file hermes' dashboard writes
for a provider whose ``config_schema.py`` declares ``flat_json`` storage, and the file
``save_config`` (``hermes memory setup``) writes. Environment variables ``ARCHIVE_<KEY>``
override it for deployments.

Every value is checked (type and range). A bad one is reported in one line naming the key
and the default is used instead: the defaults are the archive's safe values, so a typo can
never switch a protection off (``redact_secrets: "enabled"`` keeps redaction on).

Whoever can write the profile can write that file (DESIGN.md invariant 13), so nothing that
weakens a protection is read from it: the witness location comes from
``ARCHIVE_WITNESS_DIR`` only, and the shipping requirement (``ship_to``, ``ship_required``,
``ship_max_lag_s``) from ``ARCHIVE_<KEY>`` only. Retention and holds are events in the log.
What the file may still set bounds service, not protection: recall size, timeouts, queue
bounds, the spill's fsync interval and journal (which bound what a crash loses; whoever can
write the profile can delete the spill anyway), and ``redact_secrets``, the one named
exception (DESIGN.md invariant 13).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..storage.outside import InsideProfile, outside_value

log = logging.getLogger(__name__)

CONFIG_SECTION = "archive"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SHIPPING_OUTSIDE = (
    "switching it weakens a protection (required shipping off, another central store, a "
    "longer bound), so it cannot come from inside the folder it protects; set ARCHIVE_{key} "
    "in the environment of the service that starts Hermes instead"
)
#: keys that would weaken protection if read from inside the profile (invariant 13): never
#: read from config.json; the settings among them come from ``ARCHIVE_<KEY>`` only
_OUTSIDE_ONLY = {
    "witness_dir": "the witness location cannot be set from inside the folder it protects; "
    "set ARCHIVE_WITNESS_DIR in the environment of the Hermes process instead",
    **{
        key: _SHIPPING_OUTSIDE.format(key=key.upper())
        for key in ("ship_to", "ship_required", "ship_max_lag_s")
    },
}


class SettingError(ValueError):
    """One setting has a value the archive cannot use; the message names the key."""


@dataclass(frozen=True)
class Settings:
    recall_budget_chars: int = 2000
    recall_limit: int = 6
    checkpoint_timeout_s: float = 30.0
    busy_timeout_s: float = 5.0
    drain_timeout_s: float = 5.0
    redact_secrets: bool = True
    #: central PostgreSQL store to ship to in the background (libpq URL or service name)
    ship_to: str = ""
    ship_interval_s: float = 2.0
    #: shipping is required: the provider is unavailable when it cannot ship by
    #: configuration, and lag beyond ``ship_max_lag_s`` is raised where people look
    ship_required: bool = False
    ship_max_lag_s: float = 300.0
    queue_max_events: int = 2_000
    queue_max_bytes: int = 64 << 20
    spill_fsync_s: float = 1.0
    journal_every_event: bool = False
    #: whether a cron job's turns and a subagent's are archived (agent_context "cron",
    #: "subagent"; their checkpoints always are)
    cron_turns: bool = True
    subagent_turns: bool = True

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
                "key": "cron_turns",
                "description": "Archive what a cron job's agent said and did (its turns, "
                "memory writes and tool calls); its checkpoints are archived either way",
                "default": Settings.cron_turns,
                "choices": [True, False],
            },
            {
                "key": "subagent_turns",
                "description": "Archive a subagent's own turns, memory writes and tool calls "
                "(the parent archives the delegation's task and result either way)",
                "default": Settings.subagent_turns,
                "choices": [True, False],
            },
        ]


_NAMES = frozenset(f.name for f in fields(Settings))

#: (low, high) inclusive bounds of each numeric setting; a low of 0.0 with ``positive``
#: means strictly above zero
_RANGES: dict[str, tuple[float, float, bool]] = {
    "recall_budget_chars": (0, 100_000, False),
    "recall_limit": (0, 50, False),
    "checkpoint_timeout_s": (0.0, 3600.0, True),
    "busy_timeout_s": (0.0, 600.0, False),
    "drain_timeout_s": (0.0, 600.0, False),
    "ship_interval_s": (0.0, 3600.0, True),
    "ship_max_lag_s": (0.0, 7 * 86400.0, True),  # up to a week
    "queue_max_events": (1, 10_000_000, False),
    "queue_max_bytes": (1 << 16, 1 << 36, False),  # 64 KiB to 64 GiB
    "spill_fsync_s": (0.0, 60.0, False),
}


def outside_only(name: str) -> SettingError:
    """The refusal of a key that is never read from inside the profile."""
    return SettingError(f"archive setting {name} is ignored: {_OUTSIDE_ONLY[name]}")


def check_value(name: str, raw: Any) -> Any:
    """``raw`` as the type of setting ``name``, or :class:`SettingError` naming the key."""
    if name not in _NAMES:
        raise outside_only(name)
    default = getattr(Settings, name)
    if isinstance(default, str):
        if not isinstance(raw, str):
            raise SettingError(f"archive setting {name} = {raw!r} is not text; using {default!r}")
        return raw.strip()
    if isinstance(default, bool):
        text = str(raw).strip().lower() if isinstance(raw, (str, int)) else None
        if isinstance(raw, bool):
            return raw
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise SettingError(
            f"archive setting {name} = {raw!r} is not true or false; using {default}"
        )
    low, high, positive = _RANGES[name]
    number: float
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError
        number = int(raw) if isinstance(default, int) and not isinstance(raw, float) else float(raw)
    except ValueError:
        raise SettingError(
            f"archive setting {name} = {raw!r} is not a number; using {default}"
        ) from None
    if isinstance(default, int) and number != int(number):
        number = math.nan  # a fraction where a count is expected
    if not math.isfinite(number) or number < low or number > high or (positive and number <= 0):
        bound = f"{'above' if positive else 'from'} {low:g} {'up ' if positive else ''}to {high:g}"
        raise SettingError(
            f"archive setting {name} = {raw!r} is out of range (must be {bound}); using {default}"
        )
    return int(number) if isinstance(default, int) else float(number)


def _coerce(
    settings: Settings, values: dict[str, Any], problems: list[str], *, inside: bool
) -> Settings:
    """``settings`` with ``values`` applied; from ``inside`` the profile (config.json), a key
    of :data:`_OUTSIDE_ONLY` is refused, named in ``problems``."""
    changes: dict[str, Any] = {}
    for name in sorted((_NAMES | set(_OUTSIDE_ONLY)) & values.keys()):
        if values[name] is None:
            continue
        try:
            if inside and name in _OUTSIDE_ONLY:
                raise outside_only(name)
            changes[name] = check_value(name, values[name])
        except SettingError as exc:
            problems.append(str(exc))
    return replace(settings, **changes)


def config_path(home: Path, provider: str = CONFIG_SECTION) -> Path:
    return home / provider / "config.json"


def _read_config(home: Path, problems: list[str] | None = None) -> dict[str, Any]:
    path = config_path(home)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        if problems is None:
            raise
        problems.append(f"archive settings {path} are not valid JSON ({exc}); using defaults")
        return {}
    if not isinstance(data, dict):
        if problems is not None:
            problems.append(f"archive settings {path} hold no JSON object; using defaults")
        return {}
    return data


def settings_and_problems(home: Path) -> tuple[Settings, list[str]]:
    """The settings of ``home`` (file, then ``ARCHIVE_<KEY>`` env) and one line per bad value."""
    problems: list[str] = []
    settings = _coerce(Settings(), _read_config(home, problems), problems, inside=True)
    prefix = "ARCHIVE_"
    env: dict[str, str | None] = {
        f.name: os.environ[prefix + f.name.upper()]
        for f in fields(Settings)
        if prefix + f.name.upper() in os.environ
    }
    for name in _OUTSIDE_ONLY.keys() & env.keys():
        try:  # Hermes loads the profile's .env over the service's environment
            outside_value(prefix + name.upper(), home)
        except InsideProfile as exc:
            problems.append(str(exc))
            # the service's own value is lost: never weaker than required shipping
            env[name] = None if name != "ship_required" else "true"
    return _coerce(settings, env, problems, inside=False), problems


def load_settings(home: Path) -> Settings:
    """The settings of ``home``; each bad value is logged (one line naming it) and defaulted."""
    settings, problems = settings_and_problems(home)
    for problem in problems:
        log.error("%s", problem)
    return settings


def save_settings(home: Path, values: dict[str, Any]) -> None:
    """Merge ``values`` into the profile's config.json; a bad value or a key that is never
    read from there raises, naming its key."""
    for name in _OUTSIDE_ONLY.keys() & values.keys():
        raise outside_only(name)
    checked = {name: check_value(name, values[name]) for name in _NAMES & values.keys()}
    merged = {**_read_config(home), **checked}
    path = config_path(home)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
