"""The shipping settings go through the one settings check, and those that weaken a
protection when switched (``ship_to``, ``ship_required``, ``ship_max_lag_s``) are read from
the environment only, never from ``archive/config.json`` inside the profile (issue 29).

A text setting has no numeric range: before the check knew text, reading ``ship_to`` raised
and the provider fell back to the defaults, so it never shipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archive_provider.host.settings import (
    SettingError,
    Settings,
    config_path,
    save_settings,
    settings_and_problems,
)


def write_config(home: Path, values: dict[str, object]) -> None:
    config_path(home).parent.mkdir(parents=True, exist_ok=True)
    config_path(home).write_text(json.dumps(values), encoding="utf-8")


def test_ship_to_is_read_as_text_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, {"ship_interval_s": "0.5"})
    monkeypatch.setenv("ARCHIVE_SHIP_TO", " postgresql://host_a@db.example/archive ")
    settings, problems = settings_and_problems(tmp_path)
    assert settings.ship_to == "postgresql://host_a@db.example/archive"
    assert (settings.ship_interval_s, problems) == (0.5, [])


def test_the_profile_folder_cannot_switch_required_shipping_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 point 6: whoever can write the profile wrote these into config.json: no
    requirement, a server of their own, a week of lag unseen. None of it is read."""
    write_config(
        tmp_path,
        {
            "ship_required": False,
            "ship_to": "postgresql://attacker@evil.example/db",
            "ship_max_lag_s": 7 * 86400,
            "recall_limit": 3,
        },
    )
    monkeypatch.setenv("ARCHIVE_SHIP_REQUIRED", "true")
    monkeypatch.setenv("ARCHIVE_SHIP_TO", "postgresql://host_a@db.example/archive")
    settings, problems = settings_and_problems(tmp_path)
    assert settings.ship_required is True
    assert settings.ship_to == "postgresql://host_a@db.example/archive"
    assert settings.ship_max_lag_s == Settings.ship_max_lag_s
    assert settings.recall_limit == 3  # what bounds service is still read from the file
    assert [p.split(" is ignored")[0] for p in problems] == [
        f"archive setting {key}" for key in ("ship_max_lag_s", "ship_required", "ship_to")
    ]
    # and neither `hermes memory setup` nor the dashboard writes them there
    for key in ("ship_required", "ship_to", "ship_max_lag_s"):
        with pytest.raises(SettingError, match=f"ARCHIVE_{key.upper()}"):
            save_settings(tmp_path, {key: Settings().__getattribute__(key)})
    assert not {"ship_required", "ship_to", "ship_max_lag_s"} & {
        field["key"] for field in Settings.config_schema()
    }


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
    key: str, value: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if key in ("ship_required", "ship_max_lag_s"):  # read from the environment only
        write_config(tmp_path, {"recall_limit": 3})
        monkeypatch.setenv(f"ARCHIVE_{key.upper()}", str(value))
    else:  # ship_to from the file is refused whatever it holds
        write_config(tmp_path, {key: value, "recall_limit": 3})
    settings, problems = settings_and_problems(tmp_path)
    assert getattr(settings, key) == getattr(Settings, key)
    assert settings.recall_limit == 3  # the other settings are still read
    assert len(problems) == 1 and key in problems[0]
