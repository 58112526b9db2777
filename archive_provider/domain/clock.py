"""The one clock: every timestamp in the archive comes from :func:`utc_now`.

Tests freeze it with freezegun; nothing else in the package reads the time of day.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def format_time(moment: datetime) -> str:
    """Envelope time text: ISO 8601 UTC with microseconds and a ``Z`` (sorts as text)."""
    utc = moment.astimezone(timezone.utc)
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S.%f}Z"  # strftime's %Y does not pad year 999


def parse_time(text: str) -> datetime:
    """Parse envelope time text, or any ISO 8601 time (naive means UTC)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def now_text() -> str:
    return format_time(utc_now())
