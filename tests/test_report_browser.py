"""The audit report in a real headless browser (Debian's chromium and chromium-driver, driven
by Selenium, offline): the page loads without a console error, the timeline renders and
zooms, a session opens, a link carries the right seq, and a hostile session name, author
and message stay text. Chromium that cannot start fails the test; it never skips."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from archive_provider.cli import main
from tests.test_report import HOSTILE, HOSTILE_SESSION, build_archive

#: how long the page may take to run its script (a readiness wait, never asserted on)
READY_S = 60


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless chromium through Debian's chromedriver (never a downloaded one)."""
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("report-browser")
    seqs = build_archive(root / "home")
    out = root / "report.html"
    with freeze_time("2026-11-04T12:00:00Z"):
        assert main(["--home", str(root / "home"), "report", str(out)]) == 0
    return out, seqs


def opened(browser: Any, path: Path) -> Any:
    browser.get(path.as_uri())
    WebDriverWait(browser, READY_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
    )
    return browser


def test_the_report_loads_renders_and_links_in_a_real_browser(
    browser: Any, page: tuple[Path, dict[str, Any]]
) -> None:
    path, seqs = page
    driver = opened(browser, path)
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    assert "Verified" in driver.find_element(By.ID, "verification").text

    # the timeline: bars for the three days; a click zooms into one day, hour by hour
    bars = driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")
    assert {b.get_attribute("data-from")[:10] for b in bars} == {
        "2026-11-01",
        "2026-11-02",
        "2026-11-03",
    }
    first_day = next(b for b in bars if b.get_attribute("data-from").startswith("2026-11-01"))
    first_day.click()
    assert driver.find_element(By.ID, "range").text.startswith("2026-11-01 00:00 to 2026-11-02")
    hours = driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")
    assert {b.get_attribute("data-from")[:13] for b in hours} == {"2026-11-01T09"}
    listed = driver.find_elements(By.CSS_SELECTOR, "#events a.seq")
    assert seqs["hostile_turn"] in {int(a.get_attribute("data-seq")) for a in listed}
    assert all(
        a.find_element(By.XPATH, "./../../td[2]").text.startswith("2026-11-01") for a in listed
    )
    driver.find_element(By.ID, "zoom-all").click()
    assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")) == len(bars)

    # a session opens: what was recalled into s-quiet, and from where
    quiet = driver.find_element(By.CSS_SELECTOR, 'details[data-session="s-quiet"]')
    quiet.find_element(By.TAG_NAME, "summary").click()
    assert quiet.get_attribute("open") is not None
    source = next(
        a
        for a in quiet.find_elements(By.CSS_SELECTOR, "a.seq")
        if a.get_attribute("data-seq") == str(seqs["hostile_turn"])
    )
    assert HOSTILE_SESSION.split("\u2028")[0] in source.find_element(By.XPATH, "./..").text

    # the link carries its seq to the commands that prove it
    source.click()
    proof = driver.find_element(By.ID, "proof")
    assert proof.is_displayed()
    assert proof.get_attribute("data-seq") == str(seqs["hostile_turn"])
    seq = seqs["hostile_turn"]
    commands = [e.text for e in proof.find_elements(By.CSS_SELECTOR, "[data-command]")]
    assert commands == [
        f"hermes-archive show {seq}",
        f"hermes-archive prove {seq} --out seq-{seq}.proof",
    ]
    assert driver.execute_script("return location.hash") == f"#seq-{seq}"


def test_a_hostile_session_name_author_and_text_stay_text(
    browser: Any, page: tuple[Path, dict[str, Any]]
) -> None:
    path, seqs = page
    driver = opened(browser, path)
    hostile = next(
        d
        for d in driver.find_elements(By.CSS_SELECTOR, "details[data-session]")
        if d.get_attribute("data-session") == HOSTILE_SESSION
    )
    hostile.find_element(By.TAG_NAME, "summary").click()
    assert HOSTILE in hostile.text  # shown as the characters it is
    assert driver.execute_script("return window.__pwned === undefined") is True
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0
    assert driver.execute_script("return document.scripts.length") == 2
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


def test_the_timeline_zooms_from_the_whole_archive_to_one_day(browser: Any, tmp_path: Path) -> None:
    """A year and more of events: by month, a month by week, a week by day, a day by hour."""
    from datetime import datetime, timedelta, timezone

    from archive_provider.audit.report import ReportReducer, fact_of, render_html

    reducer = ReportReducer()
    start = datetime(2025, 10, 1, 6, tzinfo=timezone.utc)
    for seq in range(1, 427):  # a turn every day at 06:00, and one at 18:00 on the last
        at = start + timedelta(days=seq - 1)
        turn = {"turn": seq, "messages": []}
        reducer.add(fact_of(seq, at.isoformat(), "turn", "s", turn, f"turn {seq}"))
    last = (start + timedelta(days=425, hours=12)).isoformat()
    write = {"action": "add"}
    reducer.add(fact_of(427, last, "memory_write", "s", write, "add", memory_content="x"))
    path = tmp_path / "year.html"
    path.write_text(render_html(reducer.model(verification={"ok": True})), "utf-8")
    driver = opened(browser, path)

    def bars() -> list[str]:
        return [
            b.get_attribute("data-from")
            for b in driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")
        ]

    months = sorted(set(bars()))  # a bar per category: one start per bucket
    assert len(months) == 14 and months[0].startswith("2025-10-01")  # Oct 2025 .. Nov 2026
    steps = []
    while not driver.find_element(By.ID, "range").text.startswith("2026-11-30 00:00 to 2026-12-01"):
        assert len(steps) < 4, steps  # month, week, day: each a click on the newest bar
        driver.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")[-1].click()
        steps.append(sorted(set(bars())))
    assert steps[0][0].startswith("2026-11-01") and len(steps[0]) == 5  # November by week
    hours = sorted(h[11:13] for h in bars())
    assert hours == ["06", "18"]  # the last day hour by hour: the turn, the memory change
    links = driver.find_elements(By.CSS_SELECTOR, "#events a.seq")
    assert [int(a.get_attribute("data-seq")) for a in links] == [427, 426]
    before = sorted(set(bars()))
    driver.find_element(By.ID, "zoom-out").click()
    assert sorted(set(bars())) == steps[-2] != before
    driver.find_element(By.ID, "zoom-all").click()
    assert sorted(set(bars())) == months
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
