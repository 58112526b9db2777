"""The Merkle tree over the log (docs/FORMAT.md section 14): RFC 6962 hashing, roots, proofs, tiles.

Leaf ``i`` is the envelope bytes of the event with ``seq = i + 1``; hashing is RFC 6962
section 2.1 with SHA-256, as C2SP ``tlog-tiles`` and Go's ``golang.org/x/mod/sumdb/tlog`` use it.

Everything here is pure (no I/O) and imports only the standard library, so the standalone
verifier can use this module as it is. Storage comes in through two callables:

* a **node reader** ``node(level, index) -> bytes``: the hash of the perfect subtree of height
  ``level`` over leaves ``[index * 2**level, (index + 1) * 2**level)``. Roots and proofs ask it
  for O(log n) nodes.
* a **tile reader** ``read_tile(level, index) -> bytes | None``: the C2SP tile ``(L, N)`` as
  stored (``W * 32`` bytes). :class:`TileReader` turns it into a node reader;
  :class:`TileAppender` grows the right edge of the tiles as events are appended.

Verification follows RFC 9162 sections 2.1.3.2 (inclusion) and 2.1.4.2 (consistency).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence

HASH_SIZE = 32
TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
FULL_TILE_BYTES = TILE_WIDTH * HASH_SIZE
#: the height of the inner row kept beside each full leaf tile (FORMAT.md 14.5)
INNER_HEIGHT = 4
INNER_ROW_BYTES = (TILE_WIDTH >> INNER_HEIGHT) * HASH_SIZE
EMPTY_ROOT = hashlib.sha256(b"").digest()

NodeReader = Callable[[int, int], bytes]
TileRead = Callable[[int, int], "bytes | None"]


class ProofError(ValueError):
    """A proof, a size or a stored tile does not hold; the message says which and why."""


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash: SHA-256(0x00 || data)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _largest_power_below(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (n >= 2): RFC 6962's split point."""
    return 1 << ((n - 1).bit_length() - 1)


def _check_size(name: str, value: int) -> None:
    if type(value) is not int or value < 0:
        raise ProofError(f"{name} must be a non-negative integer, got {value!r}")


def _check_hash(name: str, value: bytes) -> None:
    if not isinstance(value, (bytes, bytearray)) or len(value) != HASH_SIZE:
        raise ProofError(f"{name} must be {HASH_SIZE} bytes")


def subtree_hash(start: int, end: int, node: NodeReader) -> bytes:
    """MTH(D[start:end]) for a range whose start is a multiple of its width rounded up to 2**k.

    Every range RFC 6962's recursions visit has that shape; it decomposes into O(log n)
    perfect subtrees, each one node read.
    """
    width = end - start
    if width <= 0:
        raise ProofError(f"empty or reversed range [{start}, {end})")
    if width & (width - 1) == 0:
        level = width.bit_length() - 1
        if start % width:
            raise ProofError(f"range [{start}, {end}) is not aligned")
        return node(level, start >> level)
    k = _largest_power_below(width)
    return node_hash(subtree_hash(start, start + k, node), subtree_hash(start + k, end, node))


def root(size: int, node: NodeReader) -> bytes:
    """The tree hash at ``size`` (the empty root for 0), from at most one node per set bit."""
    _check_size("size", size)
    return EMPTY_ROOT if size == 0 else subtree_hash(0, size, node)


def inclusion_proof(index: int, size: int, node: NodeReader) -> list[bytes]:
    """RFC 6962 PATH(index, D[0:size]): sibling hashes from the leaf's up to the root's child."""
    _check_size("index", index)
    _check_size("size", size)
    if index >= size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}")
    proof: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        k = _largest_power_below(end - start)
        if index < start + k:
            proof.append(subtree_hash(start + k, end, node))
            end = start + k
        else:
            proof.append(subtree_hash(start, start + k, node))
            start += k
    proof.reverse()
    return proof


def consistency_proof(old_size: int, new_size: int, node: NodeReader) -> list[bytes]:
    """RFC 6962 PROOF(old_size, D[0:new_size]); empty when the sizes are equal."""
    _check_size("old size", old_size)
    _check_size("new size", new_size)
    if old_size == 0 or old_size > new_size:
        raise ProofError(
            f"no consistency proof from size {old_size} to size {new_size} "
            "(the old size must be between 1 and the new size)"
        )
    proof: list[bytes] = []
    m, start, end, complete = old_size, 0, new_size, True
    while m != end:
        k = _largest_power_below(end - start)
        if m - start <= k:
            proof.append(subtree_hash(start + k, end, node))
            end = start + k
        else:
            proof.append(subtree_hash(start, start + k, node))
            start, complete = start + k, False
    if not complete:
        proof.append(subtree_hash(start, end, node))
    proof.reverse()
    return proof


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root an inclusion proof leads to (RFC 9162 2.1.3.2); ProofError if it cannot."""
    _check_size("index", index)
    _check_size("size", size)
    _check_hash("leaf hash", leaf)
    if index >= size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}")
    fn, sn, r = index, size - 1, bytes(leaf)
    for position, sibling in enumerate(proof):
        _check_hash(f"proof hash {position}", sibling)
        if sn == 0:
            raise ProofError("the inclusion proof is longer than the tree is high")
        if fn & 1 or fn == sn:
            r = node_hash(sibling, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, sibling)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the inclusion proof is shorter than the tree is high")
    return r


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], expected_root: bytes
) -> None:
    """Raise ProofError unless ``proof`` shows leaf hash ``leaf`` at ``index`` under the root."""
    _check_hash("root", expected_root)
    if root_from_inclusion(index, size, leaf, proof) != expected_root:
        raise ProofError(f"leaf {index} is not included in the tree of size {size} with that root")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Raise ProofError unless ``proof`` shows the tree at old_size is a prefix of new_size's.

    RFC 9162 2.1.4.2. A proof from size 0 is meaningless and refused (the tlog-witness
    protocol handles old size 0 without a proof); between equal sizes the proof is empty.
    """
    _check_size("old size", old_size)
    _check_size("new size", new_size)
    _check_hash("old root", old_root)
    _check_hash("new root", new_root)
    for position, value in enumerate(proof):
        _check_hash(f"proof hash {position}", value)
    if old_size == 0:
        raise ProofError("a consistency proof from the empty tree proves nothing")
    if old_size > new_size:
        raise ProofError(f"the old size {old_size} is larger than the new size {new_size}")
    if old_size == new_size:
        if proof:
            raise ProofError("equal sizes need an empty consistency proof")
        if old_root != new_root:
            raise ProofError(f"two different roots for the same size {old_size}")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, bytes(old_root))
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is longer than the tree is high")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0 or fr != old_root or sr != new_root:
        raise ProofError(
            f"the tree of size {new_size} does not extend the tree of size {old_size} "
            "with those roots"
        )


class CompactRange:
    """The right edge of a tree of ``size`` leaves: one perfect-subtree root per set bit.

    ``append`` returns the perfect-subtree nodes each new leaf completes, lowest first, so a
    node table (or a check against stored tiles) can take them; ``push`` does the same for
    a whole perfect subtree (how :class:`TileAppender` adds a full tile in one step).
    """

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        _check_size("size", size)
        if len(hashes) != bin(size).count("1"):
            raise ProofError(f"a range of size {size} has {bin(size).count('1')} hashes")
        for position, value in enumerate(hashes):
            _check_hash(f"range hash {position}", value)
        self.size = size
        self.hashes = [bytes(h) for h in hashes]  # largest subtree first

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        _check_hash("leaf hash", leaf)
        return self.push(bytes(leaf), 0)

    def push(self, value: bytes, height: int) -> list[tuple[int, int, bytes]]:
        """Add the perfect subtree ``value`` of ``2**height`` leaves (``size`` must be a
        multiple of that) and merge it up the range; returns ``(height, index, hash)`` of
        every node it completes, itself first."""
        size, hashes = self.size, self.hashes
        if size & ((1 << height) - 1):
            raise ProofError(f"a subtree of height {height} cannot start at leaf {size}")
        index = size >> height
        made = [(height, index, value)]
        self.size = size + (1 << height)
        while (size >> height) & 1:
            value = node_hash(hashes.pop(), value)
            height, index = height + 1, index >> 1
            made.append((height, index, value))
        hashes.append(value)
        return made

    def root(self) -> bytes:
        if not self.hashes:
            return EMPTY_ROOT
        value = self.hashes[-1]
        for left in reversed(self.hashes[:-1]):
            value = node_hash(left, value)
        return value


# -- tiles (C2SP tlog-tiles) ------------------------------------------------------------------


def tile_widths(size: int) -> dict[int, tuple[int, int]]:
    """``{level: (index, width)}`` of the partial tile of each level for a tree of ``size``."""
    _check_size("size", size)
    edges: dict[int, tuple[int, int]] = {}
    level = 0
    while size >> (TILE_HEIGHT * level):
        entries = size >> (TILE_HEIGHT * level)
        if entries % TILE_WIDTH:
            edges[level] = (entries // TILE_WIDTH, entries % TILE_WIDTH)
        level += 1
    return edges


def tile_path(level: int, index: int, width: int = TILE_WIDTH) -> str:
    """The C2SP resource path of a tile: ``tile/<L>/<N>[.p/<W>]``, N in x-prefixed triplets."""
    _check_size("level", level)
    _check_size("index", index)
    if not 1 <= width <= TILE_WIDTH:
        raise ProofError(f"a tile is 1 to {TILE_WIDTH} hashes wide, got {width}")
    groups = [f"{index % 1000:03d}"]
    index //= 1000
    while index:
        groups.append(f"x{index % 1000:03d}")
        index //= 1000
    path = f"tile/{level}/" + "/".join(reversed(groups))
    return path if width == TILE_WIDTH else f"{path}.p/{width}"


def parent_row(row: bytes, start: int = 0) -> bytes:
    """The parents of a row of hashes (each consecutive pair, RFC 6962 interior nodes) from
    parent ``start`` on; an unpaired last hash has none yet."""
    sha256, step = hashlib.sha256, 2 * HASH_SIZE
    return b"".join(
        [
            sha256(b"\x01" + row[i : i + step]).digest()
            for i in range(start * step, len(row) - step + 1, step)
        ]
    )


def inner_row(tile: bytes) -> bytes:
    """The nodes of height :data:`INNER_HEIGHT` of a full tile (16 of them, 240 hashes)."""
    if len(tile) != FULL_TILE_BYTES:
        raise ProofError(f"an inner row is made of a full tile, not {len(tile)} bytes")
    row = bytes(tile)
    for _ in range(INNER_HEIGHT):
        row = parent_row(row)
    return row


def _row_root(row: bytes) -> bytes:
    """The root of a row of ``2**k`` hashes (one perfect subtree)."""
    while len(row) > HASH_SIZE:
        row = parent_row(row)
    return row


InnerRead = Callable[[int], "bytes | None"]
#: a tile row as a reader keeps it: the hashes, or (below a stored inner row) the nodes
#: hashed so far by their position in the row
Row = bytes | dict[int, bytes]


class TileReader:
    """A node reader over stored tiles, for a tree of ``size`` leaves (the size trusted).

    A node at height ``h`` is entry-level ``TILE_HEIGHT * (h // TILE_HEIGHT)`` data of one
    tile, hashed up ``h % TILE_HEIGHT`` levels. A tile is hashed whole, row by row, once
    (254 hashes at most), and every node of it kept: the proofs of many leaves in one tile
    then cost one tile's hashing, not each its own path (up to 247 hashes a proof). The
    nodes of the ``keep`` tiles used last are kept; a perfect subtree never changes as the
    log grows, so :meth:`extend` to a larger trusted size keeps them, and a grown tile is
    re-read and only its new nodes hashed (when what was read before is still its prefix).

    With ``read_inner`` (the stored inner row of a full leaf tile, FORMAT.md 14.5), a cold
    leaf tile costs about 26 hashes instead of 254: the row is hashed up to the tile's root
    and used only when that root is the tile's entry in its level-1 tile (otherwise the tile
    is hashed whole, as without it), and the nodes below it are hashed from the leaves as
    they are asked for. Either way a node read here is the same as the one hashed from the
    stored leaves alone, or the proof using it fails at the trusted root.
    """

    def __init__(
        self,
        read_tile: TileRead,
        size: int,
        keep: int = 256,
        read_inner: InnerRead | None = None,
    ) -> None:
        _check_size("size", size)
        self._read_tile = read_tile
        self._read_inner = read_inner
        self.size = size
        self.keep = max(1, keep)
        #: (tile level, tile index) -> the tile's rows, bottom (as stored) to height 7; a
        #: leaf tile read with its inner row keeps below it only the nodes asked for
        self._rows: dict[tuple[int, int], list[Row]] = {}

    def extend(self, size: int) -> None:
        """Read a larger tree of the same log from now on (the caller trusts its root)."""
        _check_size("size", size)
        if size < self.size:
            raise ProofError(f"a tile reader only grows: {self.size} to {size}")
        self.size = size

    def _tile(self, level: int, index: int, needed: int) -> list[Row]:
        key = (level, index)
        rows = self._rows.pop(key, None)
        if rows is None or len(rows[0]) < needed:
            data = self._read_tile(level, index)
            if data is None or len(data) < needed or len(data) % HASH_SIZE:
                found = "missing" if data is None else f"{len(data or b'')} bytes"
                raise ProofError(
                    f"tile {tile_path(level, index)} is {found}; a tree of size {self.size} "
                    f"needs at least {needed} bytes of it"
                )
            data = bytes(data[:FULL_TILE_BYTES])
            before, rows = rows, self._from_inner(index, data) if level == 0 else None
            if rows is None:
                rows = self._hashed(data, before)
        self._rows[key] = rows  # the most recently used last
        if len(self._rows) > self.keep:
            del self._rows[next(iter(self._rows))]
        return rows

    @staticmethod
    def _hashed(data: bytes, before: list[Row] | None) -> list[Row]:
        """Every row of a tile, hashing only the parents ``before`` (its rows read when it
        was narrower) lacks, when ``data`` still starts with what was read then."""
        kept = [row for row in before or () if isinstance(row, bytes)]
        grown = len(kept) == TILE_HEIGHT and data.startswith(kept[0])
        new = [data]
        for height in range(1, TILE_HEIGHT):
            done = kept[height] if grown else b""
            new.append(done + parent_row(new[-1], len(done) // HASH_SIZE))
        return list(new)

    def _from_inner(self, index: int, data: bytes) -> list[Row] | None:
        """A full leaf tile's rows from its stored inner row, when that row hashes up to the
        tile's entry in level 1 (None otherwise: the tile is then hashed whole)."""
        if (
            self._read_inner is None
            or len(data) != FULL_TILE_BYTES
            or (index + 1) * TILE_WIDTH > self.size  # its root is not in the trusted tree
        ):
            return None
        inner = self._read_inner(index)
        if inner is None or len(inner) != INNER_ROW_BYTES:
            return None
        inner = bytes(inner)
        upper = [inner]
        for _ in range(INNER_HEIGHT, TILE_HEIGHT):
            upper.append(parent_row(upper[-1]))
        top = upper.pop()
        try:
            entry = self(TILE_HEIGHT, index)
        except ProofError:  # the level-1 tile does not hold it: as without the row
            return None
        if top != entry:
            return None
        below: list[Row] = [{} for _ in range(1, INNER_HEIGHT)]
        return [data, *below, *upper]

    def __call__(self, level: int, index: int) -> bytes:
        if (index + 1) << level > self.size:
            raise ProofError(f"node ({level}, {index}) is beyond a tree of size {self.size}")
        tile_level, rise = divmod(level, TILE_HEIGHT)
        first = index << rise  # first entry, in units of height TILE_HEIGHT * tile_level
        tile_index, position = divmod(first, TILE_WIDTH)
        rows = self._tile(tile_level, tile_index, (position + (1 << rise)) * HASH_SIZE)
        row, at = rows[rise], position >> rise
        if isinstance(row, dict):  # below a stored inner row: hashed from the leaves once
            node = row.get(at)
            if node is None:
                bottom = rows[0]
                assert isinstance(bottom, bytes)
                width = HASH_SIZE << rise
                node = row[at] = _row_root(bottom[at * width : (at + 1) * width])
            return node
        return row[at * HASH_SIZE : (at + 1) * HASH_SIZE]


def read_edge(size: int, read_tile: TileRead) -> dict[int, bytes]:
    """The partial tiles of a tree of ``size`` (its right edge), checked for their widths."""
    edge: dict[int, bytes] = {}
    for level, (index, width) in tile_widths(size).items():
        data = read_tile(level, index)
        if data is None or len(data) != width * HASH_SIZE:
            found = "missing" if data is None else f"{len(data) // HASH_SIZE} hashes wide"
            raise ProofError(
                f"tile {tile_path(level, index, width)} is {found}; a tree of size {size} "
                f"has it {width} hashes wide"
            )
        edge[level] = bytes(data)
    return edge


class TileAppender:
    """Grows the tiles' right edge as leaves are appended, and says which rows to write.

    Built from the edge tiles of ``size`` (:func:`read_edge`), and from the compact range of
    ``size`` when the caller kept it (otherwise it is computed from the edge, at most 255
    hashes per level). Each leaf costs its compact-range update (one hash on average): the
    entries of a level-``L`` tile are exactly the nodes of height ``8L`` the range completes.
    :meth:`changed` gives every tile row to upsert (full tiles completed and the new partial
    tiles), :meth:`root` the tree hash at the new size. No I/O.
    """

    def __init__(
        self,
        size: int = 0,
        edge: Mapping[int, bytes] | None = None,
        compact: Sequence[bytes] | None = None,
    ) -> None:
        _check_size("size", size)
        edge = dict(edge or {})
        widths = tile_widths(size)
        if set(edge) != set(widths):
            raise ProofError(f"the right edge of size {size} has tiles at levels {sorted(widths)}")
        for level, (_, width) in widths.items():
            if len(edge[level]) != width * HASH_SIZE:
                raise ProofError(f"the level-{level} edge tile of size {size} is {width} wide")
        if compact is None:
            tiles = {(level, widths[level][0]): data for level, data in edge.items()}
            reader = TileReader(lambda level, index: tiles.get((level, index)), size)
            compact = [
                reader(height, (size >> height) - 1)
                for height in reversed(range(size.bit_length()))
                if (size >> height) & 1
            ]
        self._range = CompactRange(size, compact)
        self._edge = {level: bytearray(data) for level, data in edge.items()}
        self._full: dict[tuple[int, int], bytes] = {}
        self._inner: dict[int, bytes] = {}  # leaf tile index -> its inner row (FORMAT.md 14.5)
        self._touched: set[int] = set()

    @property
    def size(self) -> int:
        return self._range.size

    def append(self, leaves: Iterable[bytes]) -> None:
        """Append leaf hashes; a run of :data:`TILE_WIDTH` leaves that starts a tile is hashed
        up as one perfect subtree (the same hashes, without a range update per leaf)."""
        leaves = list(leaves)
        at, count = 0, len(leaves)
        while at < count:
            size = self._range.size
            if size % TILE_WIDTH == 0 and count - at >= TILE_WIDTH:
                chunk = leaves[at : at + TILE_WIDTH]
                for leaf in chunk:
                    _check_hash("leaf hash", leaf)
                tile = b"".join(chunk)
                self._full[(0, size // TILE_WIDTH)] = tile
                inner = self._inner[size // TILE_WIDTH] = inner_row(tile)
                self._keep(self._range.push(_row_root(inner), TILE_HEIGHT))
                at += TILE_WIDTH
            else:
                _check_hash("leaf hash", leaves[at])
                self._keep(self._range.push(bytes(leaves[at]), 0))
                at += 1

    def _keep(self, made: list[tuple[int, int, bytes]]) -> None:
        """Put each node the compact range completed at a tile level into its tile."""
        for height, index, value in made:
            if height % TILE_HEIGHT:
                continue
            level = height // TILE_HEIGHT
            tile = self._edge.setdefault(level, bytearray())
            tile += value
            if len(tile) == FULL_TILE_BYTES:
                self._full[(level, index // TILE_WIDTH)] = bytes(tile)
                if level == 0:
                    self._inner[index // TILE_WIDTH] = inner_row(bytes(tile))
                del self._edge[level]
                self._touched.discard(level)
            else:
                self._touched.add(level)

    def changed(self) -> dict[tuple[int, int], bytes]:
        """``{(level, index): hashes}`` of every tile row to write since the appender was made."""
        rows = dict(self._full)
        widths = tile_widths(self.size)
        for level in self._touched:
            rows[(level, widths[level][0])] = bytes(self._edge[level])
        return rows

    def inner(self) -> dict[int, bytes]:
        """``{leaf tile index: inner row}`` of each leaf tile completed since it was made."""
        return dict(self._inner)

    def edge(self) -> dict[int, bytes]:
        return {level: bytes(data) for level, data in self._edge.items()}

    def compact(self) -> list[bytes]:
        """The compact range at the current size (keep it to build the next appender cheaply)."""
        return list(self._range.hashes)

    def root(self) -> bytes:
        return self._range.root()
