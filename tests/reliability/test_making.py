"""Making an archive: whole or nothing, and an older version's half-made one set aside.

An older version wrote the signing key, then ``store.key``, then ``events.db``: a fault in
between left a profile no open could use ("the signing key ... already exists and belongs
to another archive", issue 35 point 1). These tests lay out exactly what such a fault left.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from archive_provider.format import digests_v2
from archive_provider.storage.store import DB_NAME, EventStore, StoreError
from archive_provider.storage.store_pieces import MAKING_PREFIX, STORE_KEY_NAME, make_signer


def _old_half(folder: Path, *, store_key: bool, db: bool) -> None:
    """What an older version's making left when a fault cut it short."""
    folder.mkdir(mode=0o700, parents=True)
    make_signer(folder / "signing.key", digests_v2.origin("ab" * 16))
    if store_key:
        (folder / STORE_KEY_NAME).write_text("not hex: torn by the fault\n")
        os.chmod(folder / STORE_KEY_NAME, 0o600)
    if db:
        os.close(os.open(folder / DB_NAME, os.O_WRONLY | os.O_CREAT, 0o600))


@pytest.mark.parametrize(
    ("store_key", "db"), [(False, False), (True, False), (True, True)], ids=str
)
def test_an_older_half_made_archive_is_set_aside_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, store_key: bool, db: bool
) -> None:
    folder = tmp_path / "archive"
    _old_half(folder, store_key=store_key, db=db)
    with caplog.at_level(logging.WARNING):
        store = EventStore.open(folder)
    try:
        assert store.store_id != "ab" * 16
        assert [e.type for e in store.events()] == ["store_created"]
    finally:
        store.close()
    (aside,) = folder.glob("unfinished-*")
    assert (aside / "signing.key").exists()
    lines = [r.getMessage() for r in caplog.records if "making was cut short" in r.getMessage()]
    assert len(lines) == 1 and "RECOVER.md" in lines[0] and aside.name in lines[0]


def test_a_read_only_look_at_an_older_half_made_archive_says_what_it_is(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "archive"
    _old_half(folder, store_key=True, db=True)
    with pytest.raises(StoreError, match="never finished.*Unfinished archive"):
        EventStore.open(folder, readonly=True)


def test_an_interrupted_making_is_removed_and_made_again(tmp_path: Path) -> None:
    """A making folder whose database was not yet whole, and a key it had placed: both go,
    and the archive is made anew."""
    folder = tmp_path / "archive"
    folder.mkdir(mode=0o700)
    making = folder / f"{MAKING_PREFIX}0123456789abcdef"
    making.mkdir(mode=0o700)
    (making / STORE_KEY_NAME).write_text("aa" * 32 + "\n")
    (folder / STORE_KEY_NAME).write_text("aa" * 32 + "\n")  # placed before the fault
    os.close(os.open(making / DB_NAME, os.O_WRONLY | os.O_CREAT, 0o600))
    store = EventStore.open(folder)
    try:
        assert (folder / STORE_KEY_NAME).read_text() != "aa" * 32 + "\n"
        assert [e.type for e in store.events()] == ["store_created"]
    finally:
        store.close()
    assert not list(folder.glob(MAKING_PREFIX + "*"))


def test_a_whole_making_cut_short_before_its_database_was_placed_is_finished(
    tmp_path: Path,
) -> None:
    made = tmp_path / "made"
    EventStore.open(made).close()
    folder = tmp_path / "archive"
    folder.mkdir(mode=0o700)
    making = folder / f"{MAKING_PREFIX}00000000000000aa"
    making.mkdir(mode=0o700)
    for name in ("signing.key", STORE_KEY_NAME, DB_NAME):
        os.link(made / name, making / name)
    os.link(made / "signing.key", folder / "signing.key")  # placed; events.db was not yet
    store = EventStore.open(folder)
    try:
        first = EventStore.open(made, readonly=True)
        assert store.store_id == first.store_id
        first.close()
    finally:
        store.close()


def test_a_making_folder_left_beside_a_whole_archive_is_removed(tmp_path: Path) -> None:
    """Only the making folder's removal was cut short: it holds copies of the keys, so the
    next writing open removes it."""
    folder = tmp_path / "archive"
    EventStore.open(folder).close()
    making = folder / f"{MAKING_PREFIX}00000000000000bb"
    making.mkdir(mode=0o700)
    os.link(folder / "signing.key", making / "signing.key")
    os.link(folder / DB_NAME, making / DB_NAME)
    EventStore.open(folder).close()
    assert not making.exists() and (folder / "signing.key").exists()
