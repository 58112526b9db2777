"""Required shipping's lag line reads ``shipping.json`` only when it changed.

The line is asked every turn (prefetch's recall label) and by ``unavailable_reason``; the
state file was read and parsed on every call. ``host/shipping.current_state`` keeps the last
state while the file's inode, size and modification time are unchanged, and reads it again
after ``STATE_RECHECK_S`` in any case. Real files, the one clock frozen.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from freezegun import freeze_time

from archive_provider.domain.clock import format_time
from archive_provider.fleet.ship import STATE_NAME, ShipState, _write_state
from archive_provider.host.settings import Settings
from archive_provider.host.shipping import STATE_RECHECK_S, current_state, shipping_alarm

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
REQUIRED = Settings(
    ship_to="postgresql://x@127.0.0.1:9/none", ship_required=True, ship_max_lag_s=60
)


def _state(lag_events: int, error: str) -> ShipState:
    return ShipState(
        target="host=127.0.0.1 dbname=none",
        lag_events=lag_events,
        oldest_unshipped_time=format_time(NOW - timedelta(seconds=600)) if lag_events else None,
        last_error=error,
    )


def test_a_change_the_shipper_writes_is_seen_at_the_next_call(tmp_path: Path) -> None:
    with freeze_time(NOW):
        _write_state(tmp_path, _state(0, ""))
        assert shipping_alarm(REQUIRED, tmp_path) is None
        assert current_state(tmp_path) is current_state(tmp_path)  # unchanged: not read again
        _write_state(tmp_path, _state(7, "connection refused"))  # the shipper replaces it
        alarm = shipping_alarm(REQUIRED, tmp_path)
        assert alarm is not None and alarm[1] == 7 and "connection refused" in alarm[0]
        (tmp_path / STATE_NAME).unlink()
        assert shipping_alarm(REQUIRED, tmp_path) is None


def test_a_rewrite_that_looks_unchanged_is_seen_within_the_bound(tmp_path: Path) -> None:
    """Same size, same inode, the old modification time put back: only the bound finds it."""
    path = tmp_path / STATE_NAME
    with freeze_time(NOW) as clock:
        _write_state(tmp_path, _state(3, "refused A"))
        before = path.stat()
        assert shipping_alarm(REQUIRED, tmp_path) is not None
        text = path.read_text("utf-8")
        with open(path, "r+", encoding="utf-8") as handle:  # in place, same length
            handle.write(text.replace('"lag_events": 3', '"lag_events": 0'))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_ino == before.st_ino and path.stat().st_size == before.st_size
        clock.tick(timedelta(seconds=STATE_RECHECK_S))
        assert shipping_alarm(REQUIRED, tmp_path) is None  # lag 0: nothing to say
