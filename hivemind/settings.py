"""hivemind settings: who may invite us, whom we know from the start, what we publish.

They live in ``<HERMES_HOME>/hivemind/config.json`` (the file hermes' dashboard writes for
this provider's ``flat_json`` schema); ``HIVEMIND_<KEY>`` environment variables override
them. The archive's own settings still come from ``<HERMES_HOME>/archive/config.json``.

``witness_peers`` (who witnesses the archive) is a protection: whoever can write the profile
could drop the peers that would catch a rollback, or name their own. It comes from the
protection variable ``HIVEMIND_WITNESS_PEERS`` only, refused when the profile's ``.env``
sets it; in ``config.json`` it is ignored with one line (docs/DESIGN.md invariant 13).

The Matrix credentials are not settings: ``MATRIX_HOMESERVER``, ``MATRIX_USER_ID`` and
``MATRIX_ACCESS_TOKEN`` (optionally ``MATRIX_DEVICE_ID``) are read through the host's secret
scope, so the token never lands in a config file or the log.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from archive_provider import (
    WITNESS_PEERS_ENV,
    InsideProfile,
    config_path,
    ignored_in_profile,
    outside_value,
)

log = logging.getLogger(__name__)

CONFIG_SECTION = "hivemind"
CREDENTIALS = ("MATRIX_HOMESERVER", "MATRIX_USER_ID", "MATRIX_ACCESS_TOKEN")
OPTIONAL_CREDENTIALS = ("MATRIX_DEVICE_ID",)


@dataclass(frozen=True)
class HivemindSettings:
    allow_users: tuple[str, ...] = ()  # may invite us, whatever their server
    allow_servers: tuple[str, ...] | None = None  # None: our own homeserver only
    contacts: tuple[str, ...] = ()  # peers known from the start (user ids)
    about: str = ""  # published in our profile, in rooms we share
    interests: tuple[str, ...] = ()  # published too; sparks match on them
    poll_ms: int = 5000  # background long-poll length
    op_timeout_s: float = 10.0  # bound of one Matrix request from a tool call
    connect_wait_s: float = 3.0  # initialize() waits this long for the first sync
    close_timeout_s: float = 5.0
    timeline_limit: int = 100  # events per room per sync; a longer gap is backfilled
    # Summaries through the host's auxiliary LLM (extractive when 0, on failure, over budget)
    summary_llm_per_hour: int = 20  # at most this many model calls in any hour
    summary_input_chars: int = 4000  # peer text sent per call (newest messages first)
    summary_timeout_s: float = 30.0
    # Peers witnessing each other's archives (FORMAT.md 16.3): off while empty
    witness_peers: tuple[str, ...] = ()  # from HIVEMIND_WITNESS_PEERS only (module docstring)
    witness_interval_s: float = 60.0  # how often our newest checkpoint is sent, at most

    @property
    def profile(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.about:
            out["about"] = self.about
        if self.interests:
            out["interests"] = list(self.interests)
        return out


# field -> (lowest, highest) accepted value: a typo must not make a summary cost unbounded
LIMITS: dict[str, tuple[float, float]] = {
    "poll_ms": (0, 60_000),
    "op_timeout_s": (0.1, 600),
    "connect_wait_s": (0, 600),
    "close_timeout_s": (0, 600),
    "timeline_limit": (1, 1000),
    "summary_llm_per_hour": (0, 3600),
    "summary_input_chars": (200, 100_000),
    "summary_timeout_s": (1, 600),
    "witness_interval_s": (0.5, 86_400),
}


def _items(raw: Any) -> tuple[str, ...]:
    """A list, or comma/newline separated text (what a dashboard text field holds)."""
    if isinstance(raw, str):
        raw = raw.replace("\n", ",").split(",")
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"expected a list or comma-separated text, got {type(raw).__name__}")
    return tuple(s for s in (str(item).strip() for item in raw) if s)


def _coerce(settings: HivemindSettings, values: dict[str, Any]) -> HivemindSettings:
    changes: dict[str, Any] = {}
    for f in fields(HivemindSettings):
        if f.name not in values or values[f.name] is None:
            continue
        raw, default = values[f.name], getattr(HivemindSettings, f.name)
        if f.name == "allow_servers":
            # "" or absent: own server only; "none" or []: only allow_users
            text = raw.strip().lower() if isinstance(raw, str) else None
            changes[f.name] = None if text == "" else () if text == "none" else _items(raw)
        elif isinstance(default, tuple):
            changes[f.name] = _items(raw)
        elif isinstance(default, int):
            changes[f.name] = int(raw)
        elif isinstance(default, float):
            changes[f.name] = float(raw)
        else:
            changes[f.name] = str(raw)
        if f.name in LIMITS:
            low, high = LIMITS[f.name]
            if isinstance(raw, bool) or not low <= changes[f.name] <= high:
                raise ValueError(f"{f.name} must be between {low:g} and {high:g}, got {raw!r}")
    return replace(settings, **changes)


#: settings read from outside the profile only, and the protection variable of each
OUTSIDE_ONLY = {"witness_peers": WITNESS_PEERS_ENV}


def load_settings(home: Path) -> HivemindSettings:
    path = config_path(home, CONFIG_SECTION)
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data = data if isinstance(data, dict) else {}
    for line in ignored_in_profile(home):
        log.error("hivemind: %s", line)
    settings = _coerce(HivemindSettings(), {k: v for k, v in data.items() if k not in OUTSIDE_ONLY})
    env = {
        f.name: os.environ[f"HIVEMIND_{f.name.upper()}"]
        for f in fields(HivemindSettings)
        if f"HIVEMIND_{f.name.upper()}" in os.environ and f.name not in OUTSIDE_ONLY
    }
    for key, name in OUTSIDE_ONLY.items():
        try:
            env[key] = outside_value(name, home) or ""
        except InsideProfile as exc:  # the service's own value is lost: said, and in status
            log.error("hivemind: %s is not used: %s", key, exc)
    return _coerce(settings, env)


def save_settings(home: Path, values: dict[str, Any]) -> None:
    """Merge ``values`` (checked against the field types) into the profile's config.json;
    a setting read from outside the profile only raises, naming the variable to use."""
    for key in OUTSIDE_ONLY.keys() & values.keys():
        raise ValueError(
            f"hivemind setting {key} is not kept in the profile: set {OUTSIDE_ONLY[key]} "
            "in the environment of the service that starts Hermes"
        )
    checked = _coerce(HivemindSettings(), values)
    path = config_path(home, CONFIG_SECTION)
    current = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    for f in fields(HivemindSettings):
        if f.name in values:
            value = getattr(checked, f.name)
            current[f.name] = list(value) if isinstance(value, tuple) else value
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
