"""Shipping required by setting (``ship_required``): when it makes the provider
unavailable, and the lag line shown where people look.

Two different failures, two different answers (DESIGN invariant 12, docs/HOST.md §3):

* Shipping **cannot work by configuration** (``ship_to`` empty, or the ``fleet`` extra not
  importable): the provider says it is unavailable. That fails closed at configuration: a
  host with ``compression.checkpoint_required`` then blocks compression instead of
  compressing with an archive that can never reach the system of record, and nothing is
  archived until someone fixes the setting (a wrong setting, not an outage).
* Shipping is **behind at run time** (a central store down, slow or refusing): the
  provider stays available, because the local log is the commit point and central may
  never block a turn or a checkpoint. The lag is said instead, in one line, by
  ``unavailable_reason``, the recall label, ``hermes memory status`` and ``status`` (which
  then exits 3).

The three settings come from the environment only (``ARCHIVE_SHIP_TO``,
``ARCHIVE_SHIP_REQUIRED``, ``ARCHIVE_SHIP_MAX_LAG_S``, host/settings.py): a file inside the
profile could otherwise switch the requirement off. Both read only the settings and
``archive/shipping.json``: no database, no thread, no network. The lag line is asked
every turn (prefetch's recall label), so the state file is read again only when it
changed (:func:`current_state`).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from ..domain.clock import utc_now
from ..fleet.central import fleet_install_hint, fleet_missing
from ..fleet.ship import STATE_NAME, behind, read_state
from .settings import Settings

#: ``hermes-archive status`` exit code when shipping is required and is behind or cannot run
EXIT_SHIPPING_BEHIND = 3
#: the longest a shipping state is reused without reading the file again, even when the
#: file's inode, size and modification time look unchanged (a rewrite of the same size
#: within the file system's timestamp granularity that got the old inode number back)
STATE_RECHECK_S = 5.0
_states: dict[Path, tuple[tuple[int, int, int], datetime, dict[str, Any] | None]] = {}


def unshippable(settings: Settings) -> str:
    """Why required shipping cannot work by configuration, in one line with what to do;
    ``""`` when it can or is not required. Settings and an import lookup only."""
    if not settings.ship_required:
        return ""
    if not settings.ship_to:
        return (
            "shipping is required (ship_required) but ship_to is empty: set ARCHIVE_SHIP_TO "
            "to the central PostgreSQL store, or ARCHIVE_SHIP_REQUIRED to false, in the "
            "environment of the service that starts Hermes"
        )
    missing = fleet_missing()
    if missing:
        return (
            f"shipping is required (ship_required) but {' and '.join(missing)} cannot be "
            f"imported: {fleet_install_hint()} where Hermes runs, or set "
            "ARCHIVE_SHIP_REQUIRED to false"
        )
    return ""


def shipping_alarm(settings: Settings, folder: Path) -> tuple[str, int] | None:
    """(the lag line, events waiting) when shipping is required and behind its bound; the
    state file is read only when shipping is required."""
    if not settings.ship_required:
        return None
    return _alarm(settings, current_state(folder))


def current_state(folder: Path) -> dict[str, Any] | None:
    """``read_state(folder)``, reused while the file is unchanged (treat it as read-only).

    How fast a change is seen: at the next call when it changed the file's inode, size or
    modification time (the shipper replaces the file, so every write does in practice), and
    within :data:`STATE_RECHECK_S` in any case. A ``stat`` a call instead of a read and a
    JSON parse (the lag line is asked every turn).
    """
    try:
        st = (folder / STATE_NAME).stat()
    except OSError:
        _states.pop(folder, None)
        return None
    stamp, now = (st.st_ino, st.st_size, st.st_mtime_ns), utc_now()
    kept = _states.get(folder)
    if (
        kept is not None
        and kept[0] == stamp
        and 0 <= (now - kept[1]).total_seconds() < STATE_RECHECK_S
    ):
        return kept[2]
    state = read_state(folder)
    _states[folder] = (stamp, now, state)
    return state


def _alarm(settings: Settings, state: dict[str, Any] | None) -> tuple[str, int] | None:
    line = behind(state, settings.ship_max_lag_s)
    return None if line is None or state is None else (line, int(state["lag_events"]))


def requirement(settings: Settings, state: dict[str, Any] | None) -> tuple[str, bool] | None:
    """What ``status`` and ``hermes memory status`` say about required shipping, and whether
    it is met, from the shipping state they read already: why it cannot run, the lag line,
    or that no lag beyond the bound is recorded; None when shipping is not required."""
    if not settings.ship_required:
        return None
    problem = unshippable(settings)
    if problem:
        return problem, False
    alarm = _alarm(settings, state)
    if alarm:
        return alarm[0], False
    return f"met (no lag beyond {settings.ship_max_lag_s:g} s recorded)", True
