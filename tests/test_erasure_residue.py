"""Erasure leaves no old image of an erased body in a page's unused area (a B-tree split).

When SQLite splits a full leaf it rewrites the page with the cells it keeps packed at the
end, and the bytes below them (the page's unused area) keep the old cell images:
``secure_delete`` zeroes only freed cells and freed pages. The erasure's own event rows
used to be inserted before the tombstones, so a split they caused copied the bodies about
to be erased, and the tombstones then zeroed only the live copies (test_erasure_in_place
failed about once in seven runs). The seeds below fix every random byte (salts, keys, ids)
so the payloads table is one full leaf whose split would leave a secret's old image
behind (found by running the old order over seeds 0-39: 2, 15, 16, 20, 24, 30 and 36).

The layout is that of archives made by earlier 0.2.0 builds, whose ``payloads`` table is
keyed by the digest itself (``WITHOUT ROWID``: random keys split pages anywhere). Those
archives stay supported. Today's rowid table takes rows in append order, and its splits
keep no erased body in these seeds (0-59 checked with the old order), so on today's layout
this test guards the guarantee without reproducing the split.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from freezegun import freeze_time

from archive_provider.audit import erasure
from archive_provider.audit.erasure import ErasureError, Scope
from archive_provider.domain import builders
from archive_provider.format.verifier import verify_database
from archive_provider.storage import store as store_module
from archive_provider.storage.store import EventStore
from archive_provider.storage.store_pieces import SCHEMA
from tests.conftest import open_v2, seed_randomness
from tests.test_erasure import SECRET, raw_hits, turn
from tests.test_erasure_in_place import SECRET_PLATFORM, rich

#: seeds whose payload key order made the erasure's own split copy the secret (old code)
SPLITTING_SEEDS = [2, 15, 16]

#: the schema of earlier 0.2.0 builds: ``payloads`` keyed by its digest (FORMAT.md 17)
EARLIER_SCHEMA = SCHEMA.replace("    body   BLOB\n);", "    body   BLOB\n) WITHOUT ROWID;", 1)
assert EARLIER_SCHEMA != SCHEMA


@pytest.fixture(params=SPLITTING_SEEDS)
def seeded(request: pytest.FixtureRequest, home: Path) -> Iterator[EventStore]:
    """A rich archive whose every random byte comes from the seed: the same page layout
    on every run (salts and keys decide the payloads' key order, so their pages)."""
    with pytest.MonkeyPatch.context() as patch, freeze_time("2026-12-01T12:00:00Z"):
        seed_randomness(patch, request.param)
        patch.setattr(store_module, "SCHEMA", EARLIER_SCHEMA)
        store = open_v2(home / "archive")
        try:
            rich(store)
            # the bytes v2 turn bodies no longer spend on message digests (FORMAT.md 13.4),
            # kept in the table so the leaf is full again, as the layout this test is about
            store.append([builders.write_failed("s-keep", at="t9", hook="pad", error="x" * 240)])
            yield store
        finally:
            store.close()


def full_single_leaf(store: EventStore) -> bool:
    """The payloads table is one leaf page with too little room for one more payload row."""
    pages = store.conn.execute(
        "SELECT pagetype, unused FROM dbstat WHERE name = 'payloads'"
    ).fetchall()
    return len(pages) == 1 and pages[0][0] == "leaf" and pages[0][1] < 100


def test_the_erasures_own_rows_split_no_leaf_holding_the_erased_bodies(
    home: Path, seeded: EventStore
) -> None:
    """The tombstones come before the erasure event's rows: whatever those split, the
    bodies were zeroed already (the old order left their images in the split page)."""
    made = seeded.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'payloads'")
    assert "WITHOUT ROWID" in made.fetchone()[0]  # the earlier layout this test is about
    assert full_single_leaf(seeded)  # one more row splits it
    erasure.forget(seeded, Scope("session", {"session": "s-secret"}), reason="r")
    for text in (SECRET, SECRET_PLATFORM, "could not store"):
        assert raw_hits(home, text) == [], text


def test_a_second_erasure_of_the_same_scope_at_the_same_instant_is_refused(
    home: Path, store: EventStore
) -> None:
    """Its event has the first one's identity, so the append names the first one's seq;
    the tombstones are made under the seq predicted first, never recorded under an erasure
    that does not list them (the old order did that, and ``verify`` then failed)."""
    with freeze_time("2026-12-01T12:00:00Z"):
        store.append([turn(store, "s1", 1, [SECRET])])
        first = erasure.forget(store, Scope("session", {"session": "s1"}), reason="r")
        store.append([turn(store, "s1", 2, ["the host sent this one again later"], start=1)])
        with pytest.raises(ErasureError, match=f"is seq {first.seq}: retry"):
            erasure.forget(store, Scope("session", {"session": "s1"}), reason="r")
    assert raw_hits(home, "the host sent this one again later")  # rolled back: still stored
    report = verify_database(store.conn, store.key, vkey=store.vkey)
    assert report.ok, report.problem
    second = erasure.forget(store, Scope("session", {"session": "s1"}), reason="r")
    assert second.seq is not None and second.seq > (first.seq or 0) and second.payloads == 1
    assert raw_hits(home, "the host sent this one again later") == []


def test_a_merge_owed_by_a_cut_short_pass_zeroes_what_it_frees_on_a_new_connection(
    home: Path, store: EventStore
) -> None:
    """The merge frees the old segments' pages, which still hold the erased tokens: it sets
    ``secure_delete`` before it, also on a connection no erasure ran on (a new process; off
    here as SQLite leaves it where it is not compiled on). It was set after the merge."""
    term = "quuxblatherskite"
    with freeze_time("2026-01-01T00:00:00Z"):
        store.append([turn(store, "old", 1, [f"{term} was said once"])])
        store.append([turn(store, "old", 2, ["and then something else was said"], 2)])
    with freeze_time("2026-09-01T00:00:00Z"):
        erasure.set_retention(store, 180, "policy", "ops", confirmed=True)
        erasure.apply_retention(store, batch=1, between=lambda: False)  # the merge is owed
    store.close()
    again = open_v2(home / "archive")
    try:
        again.conn.execute("PRAGMA secure_delete = OFF")
        assert erasure.merge_index(again)
    finally:
        again.close()
    assert raw_hits(home, term) == []
