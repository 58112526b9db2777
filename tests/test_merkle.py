"""The RFC 6962 tree of format v2 (archive_provider/format/merkle.py, docs/FORMAT.md section 14).

Three independent oracles: published known answers (transparency-dev/merkle's reference tree
and proof probes, Go's tlog and rfc6962 tests), a naive recursive implementation of RFC 6962
written here from the RFC's definitions, and the frozen vectors of tests/vectors/merkle.json.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_provider.format import merkle
from archive_provider.format.merkle import (
    EMPTY_ROOT,
    CompactRange,
    ProofError,
    TileAppender,
    TileReader,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    read_edge,
    root,
    tile_path,
    tile_widths,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).parent / "vectors"
REFERENCE = json.loads((VECTORS / "rfc6962_reference.json").read_text())


# -- a naive RFC 6962 (section 2.1), straight from the definitions --------------------------


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def naive_mth(leaves: list[bytes]) -> bytes:
    """MTH over leaf hashes."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = _k(len(leaves))
    return hashlib.sha256(b"\x01" + naive_mth(leaves[:k]) + naive_mth(leaves[k:])).digest()


def naive_path(m: int, leaves: list[bytes]) -> list[bytes]:
    if len(leaves) == 1:
        return []
    k = _k(len(leaves))
    if m < k:
        return naive_path(m, leaves[:k]) + [naive_mth(leaves[k:])]
    return naive_path(m - k, leaves[k:]) + [naive_mth(leaves[:k])]


def naive_subproof(m: int, leaves: list[bytes], complete: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if complete else [naive_mth(leaves)]
    k = _k(n)
    if m <= k:
        return naive_subproof(m, leaves[:k], complete) + [naive_mth(leaves[k:])]
    return naive_subproof(m - k, leaves[k:], False) + [naive_mth(leaves[:k])]


def naive_nodes(leaves: list[bytes]):
    """A node reader over a list of leaf hashes, by the definition of a perfect subtree."""

    def node(level: int, index: int) -> bytes:
        span = 1 << level
        assert (index + 1) * span <= len(leaves), "asked for a node beyond the tree"
        return naive_mth(leaves[index * span : (index + 1) * span])

    return node


def leaves_of(n: int, seed: int = 0) -> list[bytes]:
    return [leaf_hash(f"event {seed}:{i}".encode()) for i in range(n)]


def unhex(value: str | None) -> bytes:
    return bytes.fromhex(value or "")


# -- published known answers --------------------------------------------------------------


def test_reference_tree_leaf_node_and_root_hashes():
    """transparency-dev/merkle testonly/constants.go: the RFC 6962 reference tree."""
    inputs = [unhex(x) for x in REFERENCE["leaf_inputs"]]
    leaves = [leaf_hash(x) for x in inputs]
    assert [h.hex() for h in leaves] == REFERENCE["node_hashes"][0]
    for level, hashes in enumerate(REFERENCE["node_hashes"]):
        node = naive_nodes(leaves)
        assert [
            merkle.subtree_hash(i << level, (i + 1) << level, node).hex()
            for i in range(len(hashes))
        ] == hashes
    for size, expected in enumerate(REFERENCE["roots"]):
        assert root(size, naive_nodes(leaves[:size])).hex() == expected
        compact = CompactRange()
        for leaf in leaves[:size]:
            compact.append(leaf)
        assert compact.root().hex() == expected
        nodes = REFERENCE["node_hashes"]
        assert [h.hex() for h in compact.hashes] == [
            nodes[level][index] for level, index in REFERENCE["compact_ranges"][size]
        ]


def test_go_and_rfc6962_hasher_known_answers():
    # golang.org/x/mod/sumdb/tlog note_test.go: RecordHash("hello world")
    assert base64.b64encode(leaf_hash(b"hello world")).decode() == (
        "TszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0="
    )
    # transparency-dev/merkle rfc6962/rfc6962_test.go
    assert EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert leaf_hash(b"").hex() == (
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
    )
    assert leaf_hash(b"L123456").hex() == (
        "395aa064aa4c29f7010acfe3f25db9485bbd4b91897b6ad7ad547639252b4d56"
    )
    assert node_hash(b"N123", b"N456").hex() == (
        "aa217fe888e47007fa15edab33c2b492a722cb106c64667fc2b044444de66bbb"
    )


@pytest.mark.parametrize(
    "probe", REFERENCE["inclusion_probes"], ids=lambda p: p["file"].split("testdata/")[1]
)
def test_inclusion_probes(probe):
    """Every happy path verifies; every mutated probe (bit flips, wrong sizes, garbage) fails."""
    args = (
        probe["leaf_index"],
        probe["tree_size"],
        unhex(probe["leaf_hash"]),
        [unhex(p) for p in probe["proof"]],
        unhex(probe["root"]),
    )
    if probe["want_error"]:
        with pytest.raises(ProofError):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize(
    "probe", REFERENCE["consistency_probes"], ids=lambda p: p["file"].split("testdata/")[1]
)
def test_consistency_probes(probe):
    args = (
        probe["size1"],
        probe["size2"],
        unhex(probe["root1"]),
        unhex(probe["root2"]),
        [unhex(p) for p in probe["proof"]],
    )
    # One deliberate difference: the reference accepts equal sizes with equal "roots" that
    # are not hashes at all (12 bytes); a root here is always 32 bytes, anything else refused.
    not_hashes = any(len(root) != 32 for root in args[2:4])
    if probe["want_error"] or not_hashes:
        with pytest.raises(ProofError):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


def test_generated_proofs_equal_the_published_happy_paths():
    """Our proof generation, not only verification, matches the reference on its own tree."""
    leaves = [leaf_hash(unhex(x)) for x in REFERENCE["leaf_inputs"]]
    happy = [p for p in REFERENCE["inclusion_probes"] if p["desc"] == "happy path"]
    for probe in happy:
        size = probe["tree_size"]
        if size > len(leaves) or unhex(probe["leaf_hash"]) != leaves[probe["leaf_index"]]:
            continue
        proof = inclusion_proof(probe["leaf_index"], size, naive_nodes(leaves[:size]))
        assert [h.hex() for h in proof] == probe["proof"]
    checked = 0
    for probe in REFERENCE["consistency_probes"]:
        if probe["desc"] != "happy path" or probe["size1"] == probe["size2"]:
            continue
        proof = consistency_proof(probe["size1"], probe["size2"], naive_nodes(leaves))
        assert [h.hex() for h in proof] == probe["proof"]
        checked += 1
    assert checked == 4


# -- against the naive implementation -------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=140), st.data())
def test_roots_and_proofs_match_the_naive_definitions(size, data):
    leaves = leaves_of(size, seed=size)
    node = naive_nodes(leaves)
    expected_root = naive_mth(leaves)
    assert root(size, node) == expected_root
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    proof = inclusion_proof(index, size, node)
    assert proof == naive_path(index, leaves)
    verify_inclusion(index, size, leaves[index], proof, expected_root)
    old = data.draw(st.integers(min_value=1, max_value=size))
    cproof = consistency_proof(old, size, node)
    assert cproof == naive_subproof(old, leaves, True)
    verify_consistency(old, size, naive_mth(leaves[:old]), expected_root, cproof)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=90), st.data())
def test_any_changed_proof_or_claim_is_refused(size, data):
    leaves = leaves_of(size, seed=7)
    node = naive_nodes(leaves)
    the_root = naive_mth(leaves)
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    proof = inclusion_proof(index, size, node)
    if proof:
        at = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
        bit = data.draw(st.integers(min_value=0, max_value=255))
        bad = list(proof)
        bad[at] = bytes(b ^ (1 << (bit % 8)) if i == bit // 8 else b for i, b in enumerate(bad[at]))
        with pytest.raises(ProofError):
            verify_inclusion(index, size, leaves[index], bad, the_root)
        with pytest.raises(ProofError):
            verify_inclusion(index, size, leaves[index], proof[:-1], the_root)
    with pytest.raises(ProofError):
        verify_inclusion(index, size, leaves[index], [*proof, leaves[0]], the_root)
    other = (index + 1) % size
    if leaves[other] != leaves[index]:
        with pytest.raises(ProofError):
            verify_inclusion(index, size, leaves[other], proof, the_root)
    old = data.draw(st.integers(min_value=1, max_value=size - 1))
    cproof = consistency_proof(old, size, node)
    old_root = naive_mth(leaves[:old])
    with pytest.raises(ProofError):  # a rewritten history: the old tree differs
        verify_consistency(old, size, naive_mth(leaves_of(old, seed=8)), the_root, cproof)
    with pytest.raises(ProofError):
        verify_consistency(old, size, old_root, naive_mth(leaves_of(size, seed=9)), cproof)
    with pytest.raises(ProofError):
        verify_consistency(old, size, old_root, the_root, cproof[:-1])


def test_size_limits_are_refused_with_proof_errors():
    node = naive_nodes(leaves_of(4))
    for call in (
        lambda: inclusion_proof(4, 4, node),
        lambda: inclusion_proof(-1, 4, node),
        lambda: consistency_proof(0, 4, node),
        lambda: consistency_proof(5, 4, node),
        lambda: verify_inclusion(0, 0, EMPTY_ROOT, [], EMPTY_ROOT),
        lambda: verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, []),
        lambda: verify_consistency(2, 2, EMPTY_ROOT, EMPTY_ROOT, [EMPTY_ROOT]),
        lambda: root(True, node),  # a bool is not a size
    ):
        with pytest.raises(ProofError):
            call()
    assert root(0, node) == EMPTY_ROOT
    assert consistency_proof(3, 3, node) == []


# -- compact range and tiles -------------------------------------------------------------


def test_compact_range_reports_every_node_it_completes():
    leaves = leaves_of(37)
    compact, made = CompactRange(), {}
    for leaf in leaves:
        for level, index, value in compact.append(leaf):
            assert (level, index) not in made
            made[(level, index)] = value
    node = naive_nodes(leaves)
    expected = {(level, index) for level in range(6) for index in range(len(leaves) >> level)}
    assert set(made) == expected
    assert all(made[key] == node(*key) for key in expected)
    # the range can be rebuilt from its size and hashes alone
    again = CompactRange(compact.size, compact.hashes)
    assert again.root() == naive_mth(leaves)
    with pytest.raises(ProofError):
        CompactRange(5, compact.hashes)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=40), st.integers(min_value=0, max_value=4))
def test_pushing_a_perfect_subtree_is_appending_its_leaves(units, height):
    """``push`` (TileAppender's one step per full tile) merges as the leaves one by one
    would: the same range and root, and the nodes completed at or above its height."""
    width = 1 << height
    leaves = leaves_of((units + 1) * width, seed=height)
    pushed, appended = CompactRange(), CompactRange()
    for start in range(0, len(leaves), width):
        made = pushed.push(naive_mth(leaves[start : start + width]), height)
        one_by_one = [
            node for leaf in leaves[start : start + width] for node in appended.append(leaf)
        ]
        assert made == [node for node in one_by_one if node[0] >= height]
        assert (pushed.size, pushed.hashes) == (appended.size, appended.hashes)
    assert pushed.root() == naive_mth(leaves)
    if height:
        with pytest.raises(ProofError, match="cannot start at leaf"):
            CompactRange(1, leaves[:1]).push(naive_mth(leaves[:width]), height)


def test_tile_widths_and_paths_follow_the_c2sp_examples():
    # tlog-tiles: a tree of 70,000 has a level-0 partial of width 112 (after 273 full tiles),
    # a level-1 partial of width 17 (after 1 full tile) and a level-2 partial of width 1.
    assert tile_widths(70_000) == {0: (273, 112), 1: (1, 17), 2: (0, 1)}
    assert tile_widths(256) == {1: (0, 1)}
    assert tile_widths(0) == {}
    assert tile_path(0, 1_234_067) == "tile/0/x001/x234/067"
    assert tile_path(1, 5, 17) == "tile/1/005.p/17"
    assert tile_path(2, 0, 1) == "tile/2/000.p/1"


def _store(changed_rows: dict, tiles: dict) -> None:
    for key, data in changed_rows.items():
        old = tiles.get(key)
        # what the tiles_grow_only trigger enforces: a tile only grows; a full tile never changes
        assert old is None or (len(old) < merkle.FULL_TILE_BYTES and data.startswith(old))
        tiles[key] = data


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=6))
def test_tiles_grown_in_batches_give_the_same_rows_roots_and_nodes(batches):
    leaves = leaves_of(sum(batches), seed=len(batches))
    tiles: dict[tuple[int, int], bytes] = {}
    size = 0
    for count in batches:
        appender = TileAppender(size, read_edge(size, lambda lv, ix: tiles.get((lv, ix))))
        appender.append(leaves[size : size + count])
        _store(appender.changed(), tiles)
        size += count
        assert appender.root() == naive_mth(leaves[:size])
    one = TileAppender()
    one.append(leaves)
    assert one.changed() == tiles
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), size)
    node = naive_nodes(leaves)
    for index in sorted({0, size // 2, size - 1}):
        assert inclusion_proof(index, size, reader) == inclusion_proof(index, size, node)
    assert root(size, reader) == naive_mth(leaves)


def test_tiles_of_a_three_level_tree():
    """70,000 leaves: full and partial tiles at levels 0, 1 and 2, checked against CompactRange."""
    leaves = leaves_of(70_000, seed=3)
    appender, compact = TileAppender(), CompactRange()
    stored: dict[tuple[int, int], bytes] = {}
    rng = random.Random(5)
    position = 0
    while position < len(leaves):
        step = rng.randint(1, 5000)
        appender.append(leaves[position : position + step])
        position += step
    for leaf in leaves:
        compact.append(leaf)
    _store(appender.changed(), stored)
    assert appender.root() == compact.root()
    widths = {key: len(data) // 32 for key, data in stored.items()}
    assert widths[(0, 273)] == 112 and widths[(1, 1)] == 17 and widths[(2, 0)] == 1
    assert sum(1 for (level, _), w in widths.items() if level == 0 and w == 256) == 273
    reader = TileReader(lambda lv, ix: stored.get((lv, ix)), len(leaves))
    the_root = compact.root()
    for index in (0, 255, 256, 65_535, 65_536, 69_999):
        proof = inclusion_proof(index, len(leaves), reader)
        verify_inclusion(index, len(leaves), leaves[index], proof, the_root)
    old_root = root(40_000, reader)
    prefix = CompactRange()
    for leaf in leaves[:40_000]:
        prefix.append(leaf)
    assert old_root == prefix.root()
    verify_consistency(
        40_000, 70_000, old_root, the_root, consistency_proof(40_000, 70_000, reader)
    )


def test_tile_reader_refuses_missing_short_or_beyond_the_tree():
    appender = TileAppender()
    appender.append(leaves_of(300))
    tiles = appender.changed()
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 300)
    with pytest.raises(ProofError, match="beyond a tree of size 300"):
        reader(0, 300)
    short = dict(tiles)
    short[(0, 1)] = short[(0, 1)][:-32]
    with pytest.raises(ProofError, match=r"tile tile/0/001"):
        TileReader(lambda lv, ix: short.get((lv, ix)), 300)(0, 299)
    with pytest.raises(ProofError, match="missing"):
        TileReader(lambda lv, ix: None, 300)(8, 0)
    with pytest.raises(ProofError):
        read_edge(300, lambda lv, ix: short.get((lv, ix)))
    with pytest.raises(ProofError):
        TileAppender(300, {0: tiles[(0, 1)]})  # the level-1 edge tile is missing


def test_frozen_vectors_still_hold():
    """tests/vectors/merkle.json (make_vectors_v2.py): roots, proofs and tiles, frozen."""
    vectors = json.loads((VECTORS / "merkle.json").read_text())
    leaves = [leaf_hash(unhex(x)) for x in vectors["leaf_inputs"]]
    assert [h.hex() for h in leaves] == vectors["leaf_hashes"]
    node = naive_nodes(leaves)
    for size, expected in enumerate(vectors["roots"]):
        assert root(size, naive_nodes(leaves[:size])) == unhex(expected)
    for case in vectors["inclusion"]:
        proof = inclusion_proof(case["index"], case["size"], node)
        assert [h.hex() for h in proof] == case["proof"]
        verify_inclusion(
            case["index"],
            case["size"],
            leaves[case["index"]],
            proof,
            unhex(vectors["roots"][case["size"]]),
        )
    for case in vectors["consistency"]:
        proof = consistency_proof(case["old"], case["new"], node)
        assert [h.hex() for h in proof] == case["proof"]
    tiles = vectors["tiles"]
    appender = TileAppender()
    appender.append(leaf_hash(i.to_bytes(8, "big")) for i in range(tiles["size"]))
    rows = appender.changed()
    assert appender.root().hex() == tiles["root"]
    for row in tiles["edge"]:
        data = rows[(row["level"], row["index"])]
        assert (len(data) // 32, data[:32].hex(), data[-32:].hex()) == (
            row["width"],
            row["first"],
            row["last"],
        )


def test_an_appender_from_a_kept_compact_range_equals_one_from_the_edge():
    """The writer keeps (edge, compact range) between commits; both ways give the same rows."""
    leaves = leaves_of(1_000, seed=11)
    first = TileAppender()
    first.append(leaves[:700])
    tiles = first.changed()
    edge = read_edge(700, lambda lv, ix: tiles.get((lv, ix)))
    kept = TileAppender(700, edge, first.compact())
    fresh = TileAppender(700, edge)
    assert kept.compact() == fresh.compact() == first.compact()
    for appender in (kept, fresh):
        appender.append(leaves[700:])
    assert kept.changed() == fresh.changed()
    assert kept.root() == fresh.root() == naive_mth(leaves)
    with pytest.raises(ProofError):
        TileAppender(700, edge, first.compact()[:-1])


def test_a_tile_reader_extended_to_a_larger_trusted_size_rereads_grown_tiles():
    leaves = leaves_of(600, seed=12)
    tiles: dict[tuple[int, int], bytes] = {}
    appender = TileAppender()
    appender.append(leaves[:300])
    _store(appender.changed(), tiles)
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 300)
    assert root(300, reader) == naive_mth(leaves[:300])
    with pytest.raises(ProofError):
        reader(0, 400)  # not trusted yet
    appender = TileAppender(300, appender.edge(), appender.compact())  # the next transaction
    appender.append(leaves[300:])
    _store(appender.changed(), tiles)
    reader.extend(600)
    assert root(600, reader) == naive_mth(leaves)
    proof = inclusion_proof(450, 600, reader)
    verify_inclusion(450, 600, leaves[450], proof, naive_mth(leaves))
    with pytest.raises(ProofError):
        reader.extend(500)


def _counting_sha256(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count every SHA-256 computed from here on (the real function does the hashing)."""
    calls = {"sha256": 0}
    real = hashlib.sha256

    def sha256(*args: bytes) -> object:
        calls["sha256"] += 1
        return real(*args)

    monkeypatch.setattr(hashlib, "sha256", sha256)
    return calls


def test_proofs_of_every_leaf_of_a_tile_hash_the_tile_once(monkeypatch: pytest.MonkeyPatch):
    """A served excerpt's proof is mostly its tile's hashing: leaves of one tile share it.

    A path's siblings in a tile are 247 hashes; hashing them apart for each leaf re-hashed
    the tile's nodes over and over (1,538 hashes for the 256 leaves)."""
    leaves = leaves_of(512, seed=3)
    appender = TileAppender()
    appender.append(leaves)
    tiles = appender.changed()
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 512)
    calls = _counting_sha256(monkeypatch)
    proofs = [inclusion_proof(index, 512, reader) for index in range(256)]
    # the tile's 254 interior nodes below its root, and the level-1 tile's one pair
    assert calls["sha256"] <= 255
    monkeypatch.undo()
    for index, proof in enumerate(proofs):
        verify_inclusion(index, 512, leaves[index], proof, naive_mth(leaves))


def test_a_grown_tile_hashes_only_its_new_nodes(monkeypatch: pytest.MonkeyPatch):
    """The right-edge tile grows with every commit; a reader kept across queries re-reads it
    and hashes what is new, not the whole tile again."""
    leaves = leaves_of(250, seed=4)
    tiles: dict[tuple[int, int], bytes] = {}
    appender = TileAppender()
    appender.append(leaves[:200])
    _store(appender.changed(), tiles)
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 200)
    assert root(200, reader) == naive_mth(leaves[:200])
    appender = TileAppender(200, appender.edge(), appender.compact())
    appender.append(leaves[200:])
    _store(appender.changed(), tiles)
    reader.extend(250)
    calls = _counting_sha256(monkeypatch)
    found = root(250, reader)
    # 25 new parents at height 1, then 12, 6, 3, 1, and 5 to join the root's 6 nodes
    # (hashing the tile again would be 244 + 5)
    assert calls["sha256"] <= 60
    monkeypatch.undo()
    assert found == naive_mth(leaves)


def test_a_tile_rewritten_under_a_kept_reader_is_hashed_again_from_what_is_stored():
    """A grown tile whose old part changed is not extended from the nodes kept: they are
    hashed again from the stored bytes (the proof then fails against the trusted root)."""
    leaves = leaves_of(300, seed=5)
    tiles: dict[tuple[int, int], bytes] = {}
    appender = TileAppender()
    appender.append(leaves[:100])
    _store(appender.changed(), tiles)
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 100)
    assert root(100, reader) == naive_mth(leaves[:100])
    forged = [leaves[0], leaf_hash(b"forged"), *leaves[2:200]]
    tiles[(0, 0)] = b"".join(forged)
    reader.extend(200)
    assert root(200, reader) == naive_mth(forged)
    with pytest.raises(ProofError):
        verify_inclusion(
            0, 200, leaves[0], inclusion_proof(0, 200, reader), naive_mth(leaves[:200])
        )


def test_a_tile_reader_keeps_the_tiles_used_last_and_reads_the_others_again():
    leaves = leaves_of(1024, seed=6)
    appender = TileAppender()
    appender.append(leaves)
    tiles = appender.changed()
    reads: list[tuple[int, int]] = []

    def read(level: int, index: int) -> bytes | None:
        reads.append((level, index))
        return tiles.get((level, index))

    reader = TileReader(read, 1024, keep=2)
    for index in (0, 256, 0, 512, 0, 256):
        reader(0, index)
    # tile 0 stays (used last each time it is asked); 1 is dropped by 2 and read again
    assert reads == [(0, 0), (0, 1), (0, 2), (0, 1)]
    assert reader(0, 256) == leaves[256] and reader(2, 0) == naive_mth(leaves[:4])


# -- inner rows of full leaf tiles (FORMAT.md 14.5) -------------------------------------------


def _inner_of(leaves: list[bytes], tile: int) -> bytes:
    node = naive_nodes(leaves)
    first = tile * merkle.TILE_WIDTH >> merkle.INNER_HEIGHT
    return b"".join(node(merkle.INNER_HEIGHT, first + i) for i in range(16))


@pytest.mark.parametrize("batches", [[700], [1] * 700, [100, 300, 1, 299]])
def test_an_appender_gives_the_inner_row_of_each_leaf_tile_it_completes(batches):
    """Leaf by leaf or a whole tile at once: the height-4 nodes of each full leaf tile, once."""
    leaves = leaves_of(700, seed=21)
    tiles: dict[tuple[int, int], bytes] = {}
    inner: dict[int, bytes] = {}
    size = 0
    for count in batches:
        appender = TileAppender(size, read_edge(size, lambda lv, ix: tiles.get((lv, ix))))
        appender.append(leaves[size : size + count])
        _store(appender.changed(), tiles)
        assert not set(appender.inner()) & set(inner)  # each tile's row is written once
        inner.update(appender.inner())
        size += count
        assert appender.root() == naive_mth(leaves[:size])
    assert inner == {0: _inner_of(leaves, 0), 1: _inner_of(leaves, 1)}
    assert merkle.inner_row(tiles[(0, 1)]) == inner[1]


def _tiles_and_inner(count: int, seed: int) -> tuple[list[bytes], dict, dict]:
    leaves = leaves_of(count, seed=seed)
    appender = TileAppender()
    appender.append(leaves)
    return leaves, appender.changed(), appender.inner()


def test_a_cold_leaf_tile_with_its_inner_row_costs_a_tenth_of_its_hashing(
    monkeypatch: pytest.MonkeyPatch,
):
    """An excerpt in a leaf tile no proof read before hashed the whole tile (254 hashes);
    with the stored inner row: the row up to the tile's root, and the path's four siblings
    below it from the leaves."""
    leaves, tiles, inner = _tiles_and_inner(1024, seed=22)
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 1024, read_inner=inner.get)
    inclusion_proof(5, 1024, reader)  # the level-1 tile, read and hashed once
    calls = _counting_sha256(monkeypatch)
    proof = inclusion_proof(700, 1024, reader)  # leaf tile 2, cold
    assert calls["sha256"] <= 30  # 15 up from the inner row, 11 below it (254 whole)
    calls["sha256"] = 0
    assert inclusion_proof(700, 1024, reader) == proof  # the nodes hashed below it are kept
    assert calls["sha256"] == 0
    monkeypatch.undo()
    assert proof == inclusion_proof(700, 1024, naive_nodes(leaves))
    verify_inclusion(700, 1024, leaves[700], proof, naive_mth(leaves))


def test_an_inner_row_that_does_not_hash_to_its_tiles_entry_is_not_used():
    """A forged or damaged inner row: the tile is hashed whole, as without one, and every
    node read is the one its leaves give (the excerpt is still proven)."""
    leaves, tiles, inner = _tiles_and_inner(1024, seed=23)
    forged = dict(inner)
    forged[1] = bytes(32) + inner[1][32:]
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 1024, read_inner=forged.get)
    node = naive_nodes(leaves)
    for level in range(merkle.TILE_HEIGHT + 1):
        assert reader(level, (300 >> level)) == node(level, 300 >> level)
    verify_inclusion(300, 1024, leaves[300], inclusion_proof(300, 1024, reader), naive_mth(leaves))


def test_an_inner_row_agreeing_with_forged_tiles_still_ends_at_the_trusted_root():
    """Whoever writes the folder can forge a leaf, its tile, the tile's inner row and its
    level-1 entry so that they agree: the proof then fails at the trusted root."""
    leaves, tiles, inner = _tiles_and_inner(1024, seed=24)
    trusted = naive_mth(leaves)
    forged_leaves = list(leaves)
    forged_leaves[300] = leaf_hash(b"forged")
    forged_tile = b"".join(forged_leaves[256:512])
    forged_inner = merkle.inner_row(forged_tile)
    level1 = bytearray(tiles[(1, 0)])
    level1[32:64] = naive_mth(forged_leaves[256:512])
    forged = {**tiles, (0, 1): forged_tile, (1, 0): bytes(level1)}
    reader = TileReader(lambda lv, ix: forged.get((lv, ix)), 1024, read_inner={1: forged_inner}.get)
    assert reader(merkle.INNER_HEIGHT, 300 >> merkle.INNER_HEIGHT) == forged_inner[64:96]
    with pytest.raises(ProofError):
        verify_inclusion(300, 1024, forged_leaves[300], inclusion_proof(300, 1024, reader), trusted)


def test_an_inner_row_is_not_used_for_a_tile_beyond_the_trusted_size():
    """A stored tile may be full while the trusted tree ends inside it: its root is not in
    that tree, so the inner row is not checked against it (the tile is hashed as stored)."""
    leaves, tiles, inner = _tiles_and_inner(512, seed=25)
    reader = TileReader(lambda lv, ix: tiles.get((lv, ix)), 300, read_inner=inner.get)
    assert root(300, reader) == naive_mth(leaves[:300])
    reader.extend(512)
    assert root(512, reader) == naive_mth(leaves)


def test_an_inner_row_is_not_used_when_the_level_1_tile_cannot_be_read():
    """The row is checked against the level-1 entry; without that tile the leaf tile is
    hashed whole, and the nodes below height 8 are read as they were without rows."""
    leaves, tiles, inner = _tiles_and_inner(1024, seed=26)
    without_level_1 = {key: data for key, data in tiles.items() if key[0] == 0}
    reader = TileReader(lambda lv, ix: without_level_1.get((lv, ix)), 1024, read_inner=inner.get)
    node = naive_nodes(leaves)
    assert reader(7, 5) == node(7, 5) and reader(4, 40) == node(4, 40)
