"""Export bundles of version 3 (FORMAT.md 21.3): the bodies in one streamed member.

A v3 bundle holds three members whatever the archive's size: ``envelopes.bin`` (one
binary record per envelope), ``payloads.bin`` (every body the selection names, or its tombstone, in the order the
selected events first name them) and ``manifest.json``. These tests read ``payloads.bin``
and ``envelopes.bin`` with parsers written from the text of 21.3, not the package's, and play a forger who
knows the format and reseals every change: each must still be caught, and named.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import struct
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from archive_provider.audit.export import ExportError, Selection, _envelope_record_v3
from archive_provider.format import verifier
from archive_provider.format.verifier import V2_PAYLOAD, seal_comment, verify_bundle
from archive_provider.storage.store import archive_dir
from tests.conftest import verifier_key
from tests.test_export import export, members, reseal, write_sealed

#: one record of payloads.bin: (kind byte, digest, salt or erasure seq, body)
Record = tuple[int, bytes, bytes | int, bytes]
#: the kind byte's "named again later" flag (FORMAT.md 21.3)
AGAIN = 0x80


def records(data: bytes) -> list[Record]:
    """``payloads.bin`` parsed from FORMAT.md 21.3: ``1 ‖ digest ‖ salt ‖ length ‖ body`` or
    ``0 ‖ digest ‖ erasure seq``, lengths and seqs 8-byte big-endian, the kind byte plus
    0x80 when the digest is named again later (kept in the record's first field)."""
    found: list[Record] = []
    at = 0
    while at < len(data):
        kind, digest = data[at], data[at + 1 : at + 33]
        assert kind in (0, 1, AGAIN, AGAIN | 1), f"record kind {kind}"
        if kind & 1:
            salt = data[at + 33 : at + 65]
            length = int.from_bytes(data[at + 65 : at + 73], "big")
            found.append((kind, digest, salt, data[at + 73 : at + 73 + length]))
            at += 73 + length
        else:
            found.append((kind, digest, int.from_bytes(data[at + 33 : at + 41], "big"), b""))
            at += 41
    return found


def pack(items: list[Record]) -> bytes:
    """The inverse of :func:`records`: what a forger writes."""
    out = b""
    for kind, digest, extra, body in items:
        if kind & 1:
            assert isinstance(extra, bytes)
            out += bytes([kind]) + digest + extra + len(body).to_bytes(8, "big") + body
        else:
            assert isinstance(extra, int)
            out += bytes([kind]) + digest + extra.to_bytes(8, "big")
    return out


#: an envelopes.bin record's fixed head (FORMAT.md 21.3)
HEAD = struct.Struct(">Q32s32s32sB32sIIIII")
TEXTS = ("time", "type", "session", "key")


def envelopes(data: bytes) -> list[dict[str, Any]]:
    """``envelopes.bin`` parsed from FORMAT.md 21.3: seq, chain, identity, payload, author flag
    and author, the number of parts, the four texts' lengths; the parts; the texts."""
    found: list[dict[str, Any]] = []
    at = 0
    while at < len(data):
        seq, chain, identity, payload, flag, author, count, *sizes = HEAD.unpack_from(data, at)
        assert flag in (0, 1) and (flag or author == bytes(32)), f"record at {at}"
        at += HEAD.size
        parts = [data[at + 32 * i : at + 32 * i + 32] for i in range(count)]
        at += 32 * count
        value = {"seq": seq, "chain": chain, "identity": identity, "payload": payload}
        value |= {"author": author if flag else None, "parts": parts}
        for name, size in zip(TEXTS, sizes, strict=True):
            value[name] = data[at : at + size].decode("utf-8")
            at += size
        found.append(value)
    return found


def pack_envelopes(items: list[dict[str, Any]]) -> bytes:
    """The inverse of :func:`envelopes`: what a forger writes."""
    out = b""
    for e in items:
        texts = [e[name].encode("utf-8") for name in TEXTS]
        author = e["author"] or bytes(32)
        out += HEAD.pack(
            e["seq"], e["chain"], e["identity"], e["payload"], e["author"] is not None, author,
            len(e["parts"]), *map(len, texts),
        )  # fmt: skip
        out += b"".join(e["parts"]) + b"".join(texts)
    return out


def edit_envelopes(bundle: Path, edit: Any) -> Path:
    """Reseal ``bundle`` after ``edit(envelopes, manifest)`` changed its envelopes.bin."""

    def change(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        items = envelopes(content["envelopes.bin"])
        edit(items, manifest)
        content["envelopes.bin"] = pack_envelopes(items)

    reseal(bundle, change)
    return bundle


def names(data: bytes, session: str | None) -> list[tuple[bytes, int]]:
    """(digest, seq) of every name of the selected events, in the order 21.3 prescribes."""
    found: list[tuple[bytes, int]] = []
    for value in envelopes(data):
        if session is not None and value["session"] != session:
            continue
        author = [value["author"]] if value["author"] else []
        found += [(d, value["seq"]) for d in [value["payload"], *value["parts"], *author]]
    return found


def named_in_order(envelopes: bytes, session: str | None) -> list[tuple[bytes, int]]:
    """(digest, seq of the first selected event naming it), in the order 21.3 prescribes."""
    order: dict[bytes, int] = {}
    for digest, seq in names(envelopes, session):
        order.setdefault(digest, seq)
    return list(order.items())


@pytest.fixture(scope="module")
def home(cli_home_v2: Path) -> Path:
    return cli_home_v2


@pytest.fixture(scope="module")
def vkey(cli_home_v2: Path) -> str:
    return verifier_key(cli_home_v2)


@pytest.fixture
def bundle(home: Path, tmp_path: Path) -> Path:
    return export(home, tmp_path / "all.zip")


def test_a_bundle_is_three_members_with_each_body_once_in_first_use_order(
    home: Path, vkey: str, tmp_path: Path
) -> None:
    for session in (None, "sess-2"):
        bundle = export(home, tmp_path / f"{session}.zip", Selection(session=session))
        content = members(bundle)
        assert sorted(content) == ["envelopes.bin", "manifest.json", "payloads.bin"]
        manifest = json.loads(content["manifest.json"])
        assert manifest["bundle_version"] == 3 and manifest["erased"] == 0
        assert set(manifest["members"]) == {"envelopes.bin", "payloads.bin"}
        found = records(content["payloads.bin"])
        order = named_in_order(content["envelopes.bin"], session)
        assert [r[1] for r in found] == [digest for digest, _ in order]
        counts = Counter(digest for digest, _ in names(content["envelopes.bin"], session))
        for kind, digest, salt, body in found:
            assert kind & 1 and isinstance(salt, bytes)
            assert bool(kind & AGAIN) == (counts[digest] > 1)  # the flag: named again later
            assert blake3(V2_PAYLOAD + salt + body).digest() == digest
        assert manifest["payloads"] == len(found) > 0
        report = verify_bundle(bundle, vkey=vkey)
        assert report.ok and report.authenticity == "verified", report.problem
        assert report.payloads_checked == len(found)


def forged(bundle: Path, edit: Any) -> Path:
    """Reseal ``bundle`` after ``edit(records, manifest)`` changed its payloads.bin."""

    def change(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        items = records(content["payloads.bin"])
        edit(items, manifest)
        content["payloads.bin"] = pack(items)

    reseal(bundle, change)
    return bundle


def first_use(bundle: Path) -> list[tuple[bytes, int]]:
    return named_in_order(members(bundle)["envelopes.bin"], None)


def test_a_changed_body_is_caught_at_the_event_that_first_names_it(bundle: Path, vkey: str) -> None:
    digest, seq = first_use(bundle)[2]

    def change(items: list[Record], manifest: dict[str, Any]) -> None:
        kind, name, salt, body = items[2]
        items[2] = (kind, name, salt, body + b" ")

    report = verify_bundle(forged(bundle, change), vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "payload_mismatch", seq)
    assert digest.hex() in (report.problem or "")


@pytest.mark.parametrize("how", ["dropped", "swapped", "twice"])
def test_a_record_dropped_moved_or_repeated_is_a_missing_payload(
    bundle: Path, vkey: str, how: str
) -> None:
    order = first_use(bundle)

    def change(items: list[Record], manifest: dict[str, Any]) -> None:
        if how == "dropped":
            del items[3]
            manifest["payloads"] -= 1
        elif how == "swapped":
            items[3], items[4] = items[4], items[3]
        else:
            items.insert(4, items[3])
            manifest["payloads"] += 1

    report = verify_bundle(forged(bundle, change), vkey=vkey)
    assert (report.ok, report.code) == (False, "missing_payload"), report.problem
    assert report.first_bad_seq == order[4 if how == "twice" else 3][1]


def test_a_body_no_selected_event_names_is_refused(home: Path, vkey: str, tmp_path: Path) -> None:
    """A session's bundle with a body of another session appended (the count raised too)."""
    whole = records(members(export(home, tmp_path / "all.zip"))["payloads.bin"])
    bundle = export(home, tmp_path / "one.zip", Selection(session="sess-2"))
    own = {r[1] for r in records(members(bundle)["payloads.bin"])}
    stranger = next(r for r in whole if r[1] not in own)

    def change(items: list[Record], manifest: dict[str, Any]) -> None:
        items.append(stranger)
        manifest["payloads"] += 1

    report = verify_bundle(forged(bundle, change), vkey=vkey)
    assert not report.ok and report.code == "bundle_record"
    assert f"({stranger[1].hex()}) is not a payload or part of any selected event" in (
        report.problem or ""
    )


@pytest.mark.parametrize(
    ("cut", "message"),
    [(-1, "ends inside record"), (0, "is missing from the bundle")],
)
def test_a_truncated_payloads_member_is_caught(
    bundle: Path, vkey: str, cut: int, message: str
) -> None:
    def change(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        data = content["payloads.bin"]
        last = len(pack(records(data)[:-1]))
        content["payloads.bin"] = data[: len(data) - 1] if cut else data[:last]

    reseal(bundle, change)
    report = verify_bundle(bundle, vkey=vkey)
    assert (report.ok, report.code) == (False, "missing_payload"), report.problem
    assert message in (report.problem or "")
    assert report.first_bad_seq == first_use(bundle)[-1][1]


def test_a_record_of_an_unknown_kind_and_a_forged_tombstone_are_refused(
    bundle: Path, vkey: str, tmp_path: Path
) -> None:
    order = first_use(bundle)
    copy = tmp_path / "kind.zip"
    copy.write_bytes(bundle.read_bytes())

    def unknown(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        data = bytearray(content["payloads.bin"])
        data[0] = 7
        content["payloads.bin"] = bytes(data)

    reseal(copy, unknown)
    report = verify_bundle(copy, vkey=vkey)
    assert not report.ok and "is of no known kind" in (report.problem or "")

    def tombstone(items: list[Record], manifest: dict[str, Any]) -> None:
        """A body withheld as if erased by a later event that is no erasure."""
        items[1] = (items[1][0] & AGAIN, items[1][1], order[-1][1], b"")
        manifest["payloads"] -= 1
        manifest["erased"] = 1

    report = verify_bundle(forged(bundle, tombstone), vkey=vkey)
    assert (report.ok, report.code) == (False, "erased_without_erasure"), report.problem


def test_the_manifest_counts_and_members_of_a_v3_bundle_are_checked(
    bundle: Path, vkey: str
) -> None:
    def count(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        manifest["erased"] = 1

    reseal(bundle, count)
    report = verify_bundle(bundle, vkey=vkey)
    assert not report.ok and "claims 1 erased payloads, the bundle holds 0" in (
        report.problem or ""
    )

    def extra(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        manifest["erased"] = 0
        content["payloads/" + "0" * 64] = b""

    reseal(bundle, extra)
    report = verify_bundle(bundle, vkey=vkey)
    assert not report.ok and "unexpected member name payloads/" in (report.problem or "")


def test_every_byte_of_the_payloads_member_is_covered(home: Path, tmp_path: Path) -> None:
    """A flipped bit in any byte of payloads.bin's header or compressed bytes (one bit a
    byte, a different one each time: every bit costs seconds) is caught."""
    bundle = export(home, tmp_path / "one.zip", Selection(session="sess-2"))
    original = bundle.read_bytes()
    start = original.index(b"payloads.bin") - 30  # its local header
    end = original.index(b"PK\x03\x04", start + 30)  # the next member's
    damaged = tmp_path / "damaged.zip"
    for bit in range(start * 8, end * 8, 9):
        data = bytearray(original)
        data[bit // 8] ^= 1 << (bit % 8)
        damaged.write_bytes(data)
        report = verify_bundle(damaged)
        assert not report.ok, f"flipping bit {bit} (byte {bit // 8}) went unnoticed"
        assert not (report.problem or "").startswith("cannot read the bundle"), report.problem


def test_a_v2_bundle_envelope_line_naming_a_field_twice_is_refused(tmp_path: Path) -> None:
    """JSON's last-one-wins would let a forger show one value and hash another (bundle
    version 2 keeps its JSON lines; version 3's records have no names to repeat)."""
    vectors = Path(__file__).parent / "vectors" / "bundle_v2"
    bundle = Path(shutil.copy(vectors / "tiny.zip", tmp_path / "v2.zip"))

    def twice(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        lines = content["envelopes.jsonl"].splitlines(keepends=True)
        lines[1] = lines[1].replace(b'{"author"', b'{"type":"turn","author"', 1)
        content["envelopes.jsonl"] = b"".join(lines)

    reseal(bundle, twice)
    vkey = json.loads((vectors / "keys.json").read_text())["log_vkey"]
    report = verify_bundle(bundle, vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "duplicate_key", 2)
    assert report.problem == 'envelopes.jsonl line 2 has the member "type" twice'


def _author_flag_2(data: bytearray, at: int) -> None:
    data[at + 104] = 2


def _author_without_flag(data: bytearray, at: int) -> None:
    assert data[at + 104] == 0
    data[at + 105] = 1


def _cut_short(data: bytearray, at: int) -> None:
    del data[len(data) - 1 :]


def _not_utf8(data: bytearray, at: int) -> None:
    data[at + HEAD.size + 32 * HEAD.unpack_from(data, at)[6]] = 0xFF  # the time's first byte


@pytest.mark.parametrize(
    "damage",
    [_author_flag_2, _author_without_flag, _cut_short, _not_utf8],
    ids=lambda f: f.__name__,
)
def test_a_malformed_envelope_record_is_refused_at_its_number(
    bundle: Path, vkey: str, damage: Any
) -> None:
    """A record that is not one (FORMAT.md 21.3) is ``bundle_envelope`` at its number, though
    the forger resealed it; the last record for a member cut short."""
    data = bytearray(members(bundle)["envelopes.bin"])
    count = len(envelopes(bytes(data)))
    number = count if damage is _cut_short else 2
    at = len(pack_envelopes(envelopes(bytes(data))[: number - 1]))
    damage(data, at)

    def change(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        content["envelopes.bin"] = bytes(data)

    reseal(bundle, change)
    report = verify_bundle(bundle, vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "bundle_envelope", number)
    assert report.problem.startswith(f"envelopes.bin record {number} is not a v2 envelope record")


def test_a_changed_envelope_field_is_caught_at_its_seq(bundle: Path, vkey: str) -> None:
    """The records carry what the chain and identity are recomputed from: a field changed and
    resealed is named at its event."""

    def change(items: list[dict[str, Any]], manifest: dict[str, Any]) -> None:
        items[2]["type"] = "memory_write"

    report = verify_bundle(edit_envelopes(bundle, change), vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "identity", 3)


def test_a_body_gone_without_a_tombstone_stops_the_export(home: Path, tmp_path: Path) -> None:
    """Neither a body nor a tombstone: the export refuses, and leaves no bundle."""
    copy = tmp_path / "home"
    shutil.copytree(home, copy)
    conn = sqlite3.connect(archive_dir(copy) / "events.db")
    conn.execute("DROP TRIGGER payloads_no_delete")
    digest = conn.execute("SELECT payload FROM events WHERE seq = 2").fetchone()[0]
    conn.execute("DELETE FROM payloads WHERE digest = ?", (digest,))
    conn.commit()
    conn.close()
    with pytest.raises(ExportError, match=f"payload {bytes(digest).hex()} is missing"):
        export(copy, tmp_path / "out.zip")
    assert not (tmp_path / "out.zip").exists()


def test_verify_bundle_reads_each_member_of_a_v3_bundle_once(
    bundle: Path, vkey: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both members are inflated once: their BLAKE3 is taken as the checks read them (issue 18:
    each was inflated twice, once for the manifest's digests and once for the checks)."""
    opened: list[str] = []
    real = zipfile.ZipFile.open

    def counted(self: zipfile.ZipFile, name: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(name if isinstance(name, str) else name.filename)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", counted)
    report = verify_bundle(bundle, vkey=vkey)
    assert report.ok, report.problem
    assert opened.count("envelopes.bin") == 1 and opened.count("payloads.bin") == 1


@pytest.mark.parametrize("name", ["envelopes.bin", "payloads.bin"])
def test_a_member_unlike_its_manifest_entry_is_named_whatever_the_checks_met_first(
    bundle: Path, vkey: str, name: str
) -> None:
    """A member changed without its manifest entry is named as changed, as when the digests
    were compared before the checks, although a check on the way fails first (here: the last
    body, or the last envelope's chain, no longer matches)."""
    content = members(bundle)
    data = bytearray(content[name])
    data[-3] ^= 0x01  # inside the last body, or in the last record's key text
    content[name] = bytes(data)
    keep_manifest(bundle, content)
    report = verify_bundle(bundle, vkey=vkey)
    assert not report.ok
    assert report.problem == (
        f"member {name} was changed: its size or BLAKE3 differs from the manifest"
    )


def test_a_changed_record_no_check_expects_is_still_named_as_a_changed_member(
    bundle: Path, vkey: str
) -> None:
    """A text that is not UTF-8 is refused as the member is read: that refusal must not hide
    that the member is unlike its manifest entry."""
    content = members(bundle)
    data = bytearray(content["envelopes.bin"])
    data[HEAD.size + 32 * HEAD.unpack_from(data)[6]] = 0xFF  # the first time's first byte
    content["envelopes.bin"] = bytes(data)
    keep_manifest(bundle, content)
    report = verify_bundle(bundle, vkey=vkey)
    assert report.problem == (
        "member envelopes.bin was changed: its size or BLAKE3 differs from the manifest"
    )


def keep_manifest(bundle: Path, content: dict[str, bytes]) -> None:
    """Rewrite the bundle with changed members but the old manifest (its digest in the seal
    stays right; the seal over the file does not, and is checked last)."""
    text = content.pop("manifest.json")
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, body in content.items():
            archive.writestr(member, body)
        archive.writestr("manifest.json", text)
        archive.comment = seal_comment(blake3(text).hexdigest())


ODD_TEXTS = ["", "a", 'q"uote', "back\\slash", "tab\tnew\nline", "\x00\x1f\x7f", "é€😀"]


def odd_rows(count: int, seed: int) -> list[tuple[Any, ...]]:
    """Envelope rows whose texts hold everything JSON escapes, and more than ASCII."""
    chance = random.Random(seed)

    def text() -> str:
        return "".join(chance.choice(ODD_TEXTS) for _ in range(chance.randint(0, 4)))

    found = []
    for seq in range(1, count + 1):
        parts = b"".join(chance.randbytes(32) for _ in range(chance.randint(0, 3)))
        key = json.dumps(text()) if seq % 2 else json.dumps([text(), seq])
        author = chance.choice([None, chance.randbytes(32)])
        digests = [chance.randbytes(32) for _ in range(3)]
        found.append(
            (seq, text(), text(), text(), key, digests[0], digests[1], parts, author, digests[2])
        )
    return found


class _Bytes:
    """A member read in windows of at most ``most`` bytes (a zip stream may return fewer)."""

    def __init__(self, data: bytes, most: int) -> None:
        self.data, self.at, self.most = data, 0, most

    def read(self, size: int) -> bytes:
        size = min(size, self.most)
        self.at += size
        return self.data[self.at - size : self.at]


@pytest.mark.parametrize("most", [1 << 20, 7])
def test_the_envelope_records_read_back_as_the_rows_and_as_a_v2_line_reads(most: int) -> None:
    """What the exporter writes, 21.3's parser reads back as the rows, and the package's
    reader gives the same fields as a version-2 line of the same envelope (one meaning for
    both bundle versions), whatever windows the member is read in."""
    rows = odd_rows(400, 1)
    data = b"".join(_envelope_record_v3(row) for row in rows)
    fields = ("seq", "time", "type", "session", "key", "identity", "payload")
    for value, row in zip(envelopes(data), rows, strict=True):
        assert [value[name] for name in fields] == list(row[:7])
        assert (b"".join(value["parts"]), value["author"], value["chain"]) == row[7:]
    read = list(verifier._envelope_records_v3(_Bytes(data, most)))  # type: ignore[arg-type]
    lines = [
        {
            "seq": seq,
            "time": time,
            "type": type_,
            "session": session,
            "key": key,
            "identity": identity.hex(),
            "payload": payload.hex(),
            "parts": [parts[i : i + 32].hex() for i in range(0, len(parts), 32)],
            "author": None if author is None else author.hex(),
            "chain": chain.hex(),
        }  # fmt: skip
        for seq, time, type_, session, key, identity, payload, parts, author, chain in rows
    ]
    assert read == [verifier._envelope_v2_of(line) for line in lines]


@pytest.fixture(params=["windows", "tiny windows"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The reader as shipped, and with every window tiny: the flagged digests spill to disk
    at once (2 at hand) and the end check's files split into two, then two again, past one
    digest each, so each verdict below is also reached through the spilling paths."""
    if request.param == "tiny windows":
        monkeypatch.setattr(verifier._Seen, "RECENT", 2)
        monkeypatch.setattr(verifier._Once, "BITS", 1)
        monkeypatch.setattr(verifier._Once, "MOST", 1)
    return str(request.param)


def test_every_record_once_and_its_flag_true_passes_through_any_window(
    bundle: Path, vkey: str, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spreads: list[int] = []
    spread = verifier._Once._spread

    def counted(self: verifier._Once, file: Any, level: int) -> Any:
        spreads.append(level)
        return spread(self, file, level)

    monkeypatch.setattr(verifier._Once, "_spread", counted)
    report = verify_bundle(bundle, vkey=vkey)
    assert report.ok, report.problem
    assert report.payloads_checked == len(records(members(bundle)["payloads.bin"]))
    assert (max(spreads, default=0) >= 2) == (reader == "tiny windows")


def flagged(bundle: Path) -> tuple[int, list[tuple[bytes, int]]]:
    """The index in payloads.bin of the first record flagged "named again", and every name."""
    content = members(bundle)
    found = records(content["payloads.bin"])
    index = next(i for i, record in enumerate(found) if record[0] & AGAIN)
    return index, names(content["envelopes.bin"], None)


def test_a_named_again_flag_left_off_is_refused_where_the_digest_is_named_again(
    bundle: Path, vkey: str, reader: str
) -> None:
    """The reader keeps only flagged digests at hand: a digest named again whose record says
    otherwise finds no record at its second name, and is named for what it is."""
    index, every = flagged(bundle)

    def change(items: list[Record], manifest: dict[str, Any]) -> None:
        kind, digest, salt, body = items[index]
        items[index] = (kind & ~AGAIN, digest, salt, body)

    digest = records(members(bundle)["payloads.bin"])[index][1]
    first, second = [seq for named, seq in every if named == digest][:2]
    report = verify_bundle(forged(bundle, change), vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "bundle_record", second)
    assert (
        f"payload {digest.hex()} is named again, but its record in payloads.bin (read at seq "
        f"{first}) does not say so" in (report.problem or "")
    )


def test_a_body_carried_again_under_a_flag_left_off_is_refused(
    bundle: Path, vkey: str, reader: str
) -> None:
    """A forger clears the flag and carries the body a second time where it is named again:
    every record is read where a name asks for it, so only the exact check at the end
    (every record once) can see it, and does."""
    index, every = flagged(bundle)
    digest = records(members(bundle)["payloads.bin"])[index][1]
    at = [i for i, (named, _) in enumerate(every) if named == digest][1]  # its second name
    before = len({named for named, _ in every[:at]})  # records read before that name

    def change(items: list[Record], manifest: dict[str, Any]) -> None:
        kind, name, salt, body = items[index]
        items[index] = (kind & ~AGAIN, name, salt, body)
        items.insert(before, items[index])
        manifest["payloads"] += 1

    report = verify_bundle(forged(bundle, change), vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "bundle_record", every[at][1])
    assert f"payload {digest.hex()} has a second record in payloads.bin" in (report.problem or "")


def test_a_named_again_flag_on_a_digest_named_once_is_refused(
    bundle: Path, vkey: str, reader: str
) -> None:
    content = members(bundle)
    counts = Counter(named for named, _ in names(content["envelopes.bin"], None))
    found = records(content["payloads.bin"])
    index = next(i for i, record in enumerate(found) if counts[record[1]] == 1)
    digest, seq = found[index][1], first_use(bundle)[index][1]

    def change(items: list[Record], manifest: dict[str, Any]) -> None:
        kind, name, salt, body = items[index]
        items[index] = (kind | AGAIN, name, salt, body)

    report = verify_bundle(forged(bundle, change), vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "bundle_record", seq)
    assert (
        f"the record of payload {digest.hex()} in payloads.bin says it is named again, but no "
        "later name of a selected event names it" in (report.problem or "")
    )


# -- one report shape, a code for every failure (FORMAT.md 20.3, 21.4) ---------------------

REPORT_FIELDS = set(verifier.ReportV2().as_dict())


def write_manifest(bundle: Path, text: bytes) -> None:
    """Reseal ``bundle`` with ``text`` as its manifest, verbatim (a forger's own JSON)."""
    content = members(bundle)
    content.pop("manifest.json", None)
    write_sealed(bundle, content, text)


def test_a_manifest_naming_a_member_twice_is_refused(bundle: Path, vkey: str) -> None:
    """Last-one-wins would let one reader see ``payloads`` 999 and another the true count."""
    text = members(bundle)["manifest.json"]
    write_manifest(bundle, b'{"payloads": 999, ' + text.lstrip()[1:])
    report = verify_bundle(bundle, vkey=vkey)
    assert (report.ok, report.code, report.first_bad_seq) == (False, "duplicate_key", None)
    assert set(report.as_dict()) == REPORT_FIELDS
    assert report.problem == 'manifest.json has the member "payloads" twice'


def _changed_member(bundle: Path) -> None:
    """A member changed, the manifest kept as it is (its digests no longer hold)."""
    content = members(bundle)
    manifest = content.pop("manifest.json")
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in content.items():
            archive.writestr(name, body + b"\0" if name == "envelopes.bin" else body)
    write_manifest(bundle, manifest)


def _edit(change: Any) -> Any:
    return lambda bundle: reseal(bundle, change)


def _extra(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
    content["notes.txt"] = b"extra"


def _version_4(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
    manifest["bundle_version"] = 4


def _not_v2_record(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
    content["envelopes.bin"] = content["envelopes.bin"][:100]  # the first record cut short


def _unlisted(bundle: Path) -> None:
    text = members(bundle)["manifest.json"]
    with zipfile.ZipFile(bundle, "a") as archive:
        archive.writestr("notes.txt", b"unlisted")
    write_manifest(bundle, text)


def _manifest_digest(bundle: Path) -> None:
    with open(bundle, "r+b") as handle:
        size = handle.seek(0, 2)
        handle.seek(size - 64 - len(b"; seal blake3 ") - 64)
        handle.write(b"0" * 64)


@pytest.mark.parametrize(
    ("damage", "code", "store_known"),
    [
        (_changed_member, "bundle_member", True),
        (_manifest_digest, "bundle_manifest", False),
        (_edit(_extra), "bundle_manifest", False),
        (_unlisted, "bundle_member", True),
        (_edit(_version_4), "bundle_manifest", False),
        (_edit(_not_v2_record), "bundle_envelope", True),
    ],
    ids=["changed member", "manifest digest", "extra", "unlisted", "version 4", "not v2"],
)
def test_every_early_bundle_failure_has_the_one_report_shape(
    bundle: Path, vkey: str, damage: Any, code: str, store_known: bool
) -> None:
    """A failure before the envelopes are read is the report of FORMAT.md 20.3 with a code."""
    store_id = json.loads(members(bundle)["manifest.json"])["store_id"]
    damage(bundle)
    report = verify_bundle(bundle, vkey=vkey)
    assert (report.ok, report.code) == (False, code), report.problem
    assert set(report.as_dict()) == REPORT_FIELDS
    assert report.as_dict()["store_id"] == (store_id if store_known else None)


@pytest.mark.parametrize(
    ("edit", "code", "at"),
    [("chain", "head_chain", 0), ("seq up", "truncated", 1), ("seq down", "after_head", 0)],
)
def test_a_changed_manifest_head_is_named_as_a_database_head_is(
    bundle: Path, vkey: str, edit: str, code: str, at: int
) -> None:
    """FORMAT.md 20.2 step 4: the head's chain is `head_chain` at the last seq, a head past
    the envelopes `truncated` after them, one before them `after_head`."""
    last = json.loads(members(bundle)["manifest.json"])["head"]["seq"]

    def change(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        head = manifest["head"]
        if edit == "chain":
            head["chain"] = "0" * 64
        else:
            head["seq"] += 1 if edit == "seq up" else -1

    reseal(bundle, change)
    report = verify_bundle(bundle, vkey=vkey)
    expected = {"head_chain": last, "truncated": last + 1, "after_head": last}[code]
    assert (report.ok, report.code, report.first_bad_seq) == (False, code, expected), report.problem
