"""The ``ship_to`` and ``ship_interval_s`` settings go through the one settings check.

A text setting has no numeric range: before the check knew text, reading ``ship_to`` from
``archive/config.json`` raised and the provider fell back to the defaults, so it never shipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archive_provider.host.settings import Settings, config_path, settings_and_problems


def write_config(home: Path, values: dict[str, object]) -> None:
    config_path(home).parent.mkdir(parents=True, exist_ok=True)
    config_path(home).write_text(json.dumps(values), encoding="utf-8")


def test_ship_to_is_read_as_text_from_the_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, {"ship_to": " archive ", "ship_interval_s": "0.5"})
    settings, problems = settings_and_problems(tmp_path)
    assert (settings.ship_to, settings.ship_interval_s, problems) == ("archive", 0.5, [])

    monkeypatch.setenv("ARCHIVE_SHIP_TO", "postgresql://host_a@db.example/archive")
    settings, problems = settings_and_problems(tmp_path)
    assert settings.ship_to == "postgresql://host_a@db.example/archive" and problems == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ship_to", 5432),
        ("ship_to", ["archive"]),
        ("ship_interval_s", 0),
        ("ship_interval_s", "x"),
        ("ship_required", "sometimes"),
        ("ship_max_lag_s", 0),
        ("ship_max_lag_s", 30 * 86400),
    ],
)
def test_a_bad_shipping_setting_keeps_its_default_with_a_line_naming_it(
    key: str, value: object, tmp_path: Path
) -> None:
    write_config(tmp_path, {key: value, "recall_limit": 3})
    settings, problems = settings_and_problems(tmp_path)
    assert getattr(settings, key) == getattr(Settings, key)
    assert settings.recall_limit == 3  # the other settings are still read
    assert len(problems) == 1 and key in problems[0]
