"""Generate the frozen test vectors in this folder from the implementation, once.

The vectors pin the format (docs/FORMAT.md section 8): the tests check both the package and
the standalone verifier against these files, so a later change to the encoding, a digest
domain or the chain rule breaks the tests instead of silently changing every digest.

Run it only when the files are missing or when the format version changes on purpose::

    python tests/vectors/make_vectors.py            # writes missing files only
    python tests/vectors/make_vectors.py --force    # rewrites them (a new format version!)

Values are written in a tagged form so that every implementation reads them the same way
(plain JSON cannot say "this float is 1.0", "this text holds a lone surrogate" or "bytes"):

* ``null``, ``true``, ``false`` as themselves;
* ``{"int": "<decimal>"}``; ``{"float_bits": "<16 hex digits, IEEE 754 binary64>"}``
  (``"approx"`` beside it is for humans only);
* ``{"text": "<JSON string>"}`` when the text holds no surrogate code point, otherwise
  ``{"code_points": [<int>, ...]}`` (JSON parsers disagree about escaped surrogates);
* ``{"bytes": "<hex>"}``; ``{"array": [<tagged>, ...]}``;
  ``{"object": [[<tagged key>, <tagged value>], ...]}`` in the order given (not sorted).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from archive_provider.format.canonical import CanonicalEncodingError, canonical_bytes  # noqa: E402
from archive_provider.format.digests import (  # noqa: E402
    DOMAIN_CHAIN,
    DOMAIN_GENESIS,
    DOMAIN_IDENTITY,
    DOMAIN_PAYLOAD,
    FORMAT_VERSION,
    Envelope,
    chain_hash,
    genesis_chain,
    identity_digest,
    key_text,
    parts_text,
    payload_digest,
)

HERE = Path(__file__).resolve().parent


# -- tagged values ------------------------------------------------------------------------


def tag(value: Any) -> Any:
    """Python value -> tagged JSON value (see the module docstring)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return {"int": str(value)}
    if isinstance(value, float):
        return {"float_bits": struct.pack(">d", value).hex(), "approx": repr(value)}
    if isinstance(value, str):
        if any(0xD800 <= ord(char) <= 0xDFFF for char in value):
            return {"code_points": [ord(char) for char in value]}
        return {"text": value}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list):
        return {"array": [tag(item) for item in value]}
    if isinstance(value, dict):
        return {"object": [[tag(key), tag(item)] for key, item in value.items()]}
    raise TypeError(f"cannot tag {type(value).__name__}")


def nested_arrays(depth: int, inner: Any = 0) -> Any:
    value = inner
    for _ in range(depth):
        value = [value]
    return value


def nested_objects(depth: int, inner: Any = 0) -> Any:
    value = inner
    for _ in range(depth):
        value = {"a": value}
    return value


def float_from_bits(bits: str) -> float:
    return float(struct.unpack(">d", bytes.fromhex(bits))[0])


# RFC 8785 Appendix B: IEEE 754 bit patterns (the expected text is checked independently
# in tests/test_canonical.py against the RFC's own table).
RFC8785_FLOAT_BITS = [
    "0000000000000000",
    "8000000000000000",
    "0000000000000001",
    "8000000000000001",
    "7fefffffffffffff",
    "ffefffffffffffff",
    "4340000000000000",
    "c340000000000000",
    "4430000000000000",
    "44b52d02c7e14af5",
    "44b52d02c7e14af6",
    "44b52d02c7e14af7",
    "444b1ae4d6e2ef4e",
    "444b1ae4d6e2ef4f",
    "444b1ae4d6e2ef50",
    "3eb0c6f7a0b5ed8c",
    "3eb0c6f7a0b5ed8d",
    "41b3de4355555553",
    "41b3de4355555554",
    "41b3de4355555555",
    "41b3de4355555556",
    "41b3de4355555557",
    "becbf647612f3696",
    "43143ff3c1cb0959",
]


def canonical_cases() -> list[tuple[str, Any]]:
    cases: list[tuple[str, Any]] = [
        ("null", None),
        ("true", True),
        ("false", False),
        ("booleans are not integers", [True, 1, False, 0]),
        ("empty object", {}),
        ("empty array", []),
        ("empty text", ""),
        # key order: Unicode code point order, not insertion order, not UTF-16 order
        ("keys sorted by code point", {"b": 1, "a": 2, "": 3, "aa": 4, "ab": 5, "B": 6}),
        ("non-ASCII keys", {"z": 1, "é": 2, "e": 3, "ß": 4, "A": 5, "日本": 6}),
        # U+FF01 < U+1F600 by code point; UTF-16 (RFC 8785) would put the emoji first
        ("astral key after BMP key (code point, not UTF-16 order)", {"\U0001f600": 1, "\uff01": 2}),
        ("private-use vs astral key", {"\U00010000": 1, "\ue000": 2, "\uffff": 3}),
        ("lone surrogate keys", {"\udc00": 1, "\ud800": 2, "\ud7ff": 3, "\ue000": 4}),  # noqa: F601
        ("keys are not normalized (NFC vs NFD)", {"e\u0301": 1, "\u00e9": 2}),
        # integers
        ("zero", 0),
        ("minus one", -1),
        ("integer 2**53 + 1 (exact, no float rounding)", 2**53 + 1),
        ("integer max 2**63 - 1", 2**63 - 1),
        ("integer min -2**63", -(2**63)),
        # floats
        ("float 1.0 is written 1", 1.0),
        ("float -0.0 is written 0", -0.0),
        ("float 100.0", 100.0),
        ("float 0.1", 0.1),
        ("float -1.5", -1.5),
        ("float 123.456", 123.456),
        ("float 1e20 (last plain form)", 1e20),
        ("float 1e21 (first exponent form)", 1e21),
        ("float 1e-6 (last plain form)", 1e-6),
        ("float 1e-7 (first exponent form)", 1e-7),
        ("float 5e-324 (smallest subnormal)", 5e-324),
        ("float 2.0**63 (integral, beyond the integer range)", 2.0**63),
        ("float 1.5e300", 1.5e300),
    ]
    cases += [(f"RFC 8785 float {bits}", float_from_bits(bits)) for bits in RFC8785_FLOAT_BITS]
    cases += [
        # text: exactly ", \\ and C0 controls and surrogates are escaped
        ("text quote and backslash", 'say "hi" \\ bye'),
        ("text short escapes", "\b\t\n\f\r"),
        ("text other C0 controls", "\x00\x01\x07\x0b\x0e\x1a\x1f"),
        ("text DEL and C1 raw", "\x7f\x80\x9f"),
        ("text slash raw", "a/b</script>"),
        ("text U+2028 and U+2029 raw", "line\u2028para\u2029end"),
        ("text BOM and U+FFFF raw", "\ufeffx\uffff"),
        ("text non-ASCII", "Grüße, 日本語, Ελληνικά"),
        ("text emoji (astral, 4 UTF-8 bytes)", "hi \U0001f600 \U0001f44d\U0001f3fd"),
        ("text lone high surrogate", "a\ud83db"),
        ("text lone low surrogate", "a\ude00b"),
        ("text low then high surrogate (not a pair)", "\ude00\ud83d"),
        ("text lone high surrogate at end", "end\udbff"),
        ("text surrogateescape bytes", b"caf\xe9 \xff".decode("utf-8", "surrogateescape")),
        ("text NFD not normalized", "e\u0301"),
        # nesting
        (
            "nested",
            {"z": [1, {"b": None, "a": [True, False, 0.5]}], "a": {"d": "x", "c": []}, "m": "\n"},
        ),
        ("arrays nested 64 deep", nested_arrays(64)),
        ("objects nested 64 deep", nested_objects(64)),
    ]
    return cases


def refusal_cases() -> list[tuple[str, Any, str]]:
    return [
        ("NaN", float("nan"), "non_finite_float"),
        ("Infinity", float("inf"), "non_finite_float"),
        ("-Infinity", float("-inf"), "non_finite_float"),
        ("NaN inside an object", {"a": [1, float("nan")]}, "non_finite_float"),
        ("integer 2**63", 2**63, "integer_out_of_range"),
        ("integer -(2**63) - 1", -(2**63) - 1, "integer_out_of_range"),
        ("integer 10**30 nested", [[10**30]], "integer_out_of_range"),
        ("integer key", {1: "x"}, "non_text_key"),
        ("null key", {None: "x"}, "non_text_key"),
        ("float key", {1.5: "x"}, "non_text_key"),
        ("bytes key", {b"k": "x"}, "non_text_key"),
        ("bytes", b"\x00\xff", "no_encoding"),
        ("bytes nested", {"a": [b"x"]}, "no_encoding"),
        ("surrogate pair as two code points", "\ud83d\ude00", "surrogate_pair"),
        ("surrogate pair inside text", "a\udbff\udfffb", "surrogate_pair"),
        ("surrogate pair in a key", {"\ud83d\ude00": 1}, "surrogate_pair"),
        ("arrays nested 65 deep", nested_arrays(65), "too_deep"),
        ("objects nested 65 deep", nested_objects(65), "too_deep"),
        ("empty array at depth 65", nested_arrays(64, []), "too_deep"),
    ]


def make_canonical() -> dict[str, Any]:
    out = []
    for name, value in canonical_cases():
        data = canonical_bytes(value)
        out.append(
            {
                "name": name,
                "value": tag(value),
                "canonical_hex": data.hex(),
                "canonical_text": data.decode(),
            }
        )
    return {
        "format_version": FORMAT_VERSION,
        "description": "value (tagged form, see make_vectors.py) -> canonical bytes (hex); docs/FORMAT.md s2",
        "cases": out,
    }


def make_refusals() -> dict[str, Any]:
    out = []
    for name, value, error in refusal_cases():
        try:
            canonical_bytes(value)
        except CanonicalEncodingError:
            out.append({"name": name, "value": tag(value), "error": error})
        else:
            raise AssertionError(f"{name} was not refused")
    return {
        "format_version": FORMAT_VERSION,
        "description": "values with no canonical encoding: an encoder must refuse each one",
        "errors": {
            "non_finite_float": "NaN and the infinities have no encoding",
            "integer_out_of_range": "integers outside -2**63 .. 2**63-1",
            "non_text_key": "object keys must be text",
            "no_encoding": "the value's type has no encoding (bytes)",
            "surrogate_pair": "a high surrogate followed by a low surrogate as two code points",
            "too_deep": "more than 64 nested arrays/objects",
        },
        "cases": out,
    }


# -- chain ----------------------------------------------------------------------------------

CHAIN_KEY = bytes(range(32))
CHAIN_STORE_ID = "0123456789abcdef0123456789abcdef"

MSG_USER = {"role": "user", "content": "Remember: Alice's phone is 555-0100 ☎"}
MSG_ASSISTANT = {"role": "assistant", "content": "Noted.\nI will remember that."}


def chain_events() -> list[dict[str, Any]]:
    """Five events covering every envelope field, parts, shared parts and escaped text."""
    d_user = payload_digest(CHAIN_KEY, canonical_bytes(MSG_USER))
    d_assistant = payload_digest(CHAIN_KEY, canonical_bytes(MSG_ASSISTANT))
    note = "Alice prefers tea\u2028(not coffee) \U0001f375"
    d_note = payload_digest(CHAIN_KEY, canonical_bytes(note))
    return [
        {
            "time": "2026-01-02T03:04:05.000006Z",
            "type": "session_started",
            "session": "sess-α",
            "key": {"session": "sess-α"},
            "body": {"platform": "cli", "model": "fake-model", "hermes_version": "0.19.0"},
            "parts": [],
        },
        {
            "time": "2026-01-02T03:04:06.100000Z",
            "type": "turn",
            "session": "sess-α",
            "key": {"session": "sess-α", "turn": 1, "messages": [d_user, d_assistant]},
            "body": {"turn": 1, "messages": [d_user, d_assistant]},
            "parts": [MSG_USER, MSG_ASSISTANT],
        },
        {
            "time": "2026-01-02T03:04:07.000000Z",
            "type": "memory_write",
            "session": "sess-α",
            "key": {"session": "sess-α", "order": 1, "content": d_note},
            "body": {"action": "add", "target": "memory", "content": note, "score": 0.75},
            "parts": [],
        },
        {
            "time": "2026-01-02T03:04:08.250000Z",
            "type": "checkpoint",
            "session": "sess-α",
            "key": {"session": "sess-α", "evidence": [d_user, d_assistant]},
            "body": {"api_version": 2, "evidence": [d_user, d_assistant], "receipt": "2 messages"},
            "parts": [MSG_USER, MSG_ASSISTANT],
        },
        {
            "time": "2026-01-02T03:04:09.999999Z",
            "type": "session_switched",
            "session": 'tab\there "quoted" \\ 日本',
            "key": {"from": "sess-α", "to": 'tab\there "quoted" \\ 日本'},
            "body": {"reason": None, "compressed": False},
            "parts": [],
        },
    ]


def make_chain() -> dict[str, Any]:
    previous = genesis_chain(CHAIN_STORE_ID)
    out = []
    for seq, event in enumerate(chain_events(), start=1):
        body = canonical_bytes(event["body"])
        parts = []
        for part in event["parts"]:
            part_body = canonical_bytes(part)
            parts.append(
                {
                    "value": part,
                    "canonical_hex": part_body.hex(),
                    "digest": payload_digest(CHAIN_KEY, part_body),
                }
            )
        envelope = Envelope(
            seq=seq,
            time=event["time"],
            type=event["type"],
            session=event["session"],
            key=key_text(event["key"]),
            identity=identity_digest(event["type"], event["key"]),
            payload=payload_digest(CHAIN_KEY, body),
            parts=parts_text([part["digest"] for part in parts]),
        )
        chain = chain_hash(previous, envelope)
        out.append(
            {
                "seq": seq,
                "time": envelope.time,
                "type": envelope.type,
                "session": envelope.session,
                "key": event["key"],
                "key_canonical": envelope.key,
                "identity": envelope.identity,
                "body": event["body"],
                "body_canonical_hex": body.hex(),
                "payload": envelope.payload,
                "parts": parts,
                "parts_canonical": envelope.parts,
                "envelope_hex": envelope.canonical().hex(),
                "previous_chain": previous,
                "chain": chain,
            }
        )
        previous = chain
    return {
        "format_version": FORMAT_VERSION,
        "description": "a five-event log from genesis; docs/FORMAT.md s3-s5",
        "domains_hex": {
            "identity": DOMAIN_IDENTITY.hex(),
            "payload": DOMAIN_PAYLOAD.hex(),
            "chain": DOMAIN_CHAIN.hex(),
            "genesis": DOMAIN_GENESIS.hex(),
        },
        "payload_key_hex": CHAIN_KEY.hex(),
        "store_id": CHAIN_STORE_ID,
        "genesis": genesis_chain(CHAIN_STORE_ID),
        "events": out,
        "head": {"seq": len(out), "chain": previous},
    }


def dump(document: dict[str, Any]) -> str:
    """JSON with one ``cases`` entry per line (deeply nested cases stay readable as a line)."""
    cases = document.get("cases")
    if cases is None:
        return json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    head = {name: value for name, value in document.items() if name != "cases"}
    lines = [json.dumps(head, indent=1, ensure_ascii=False)[:-2] + ',\n "cases": [']
    lines.append(",\n".join("  " + json.dumps(case, ensure_ascii=False) for case in cases))
    lines.append(" ]\n}\n")
    return "\n".join(lines)


FILES = {"canonical.json": make_canonical, "refusals.json": make_refusals, "chain.json": make_chain}

BUNDLES = HERE / "bundles"


def make_bundles() -> None:
    """``bundles/``: a small export bundle, one with a tampered payload, and their reports.

    The store key and id are random, so the files are made once and kept: a second
    implementation checks that its verification of each zip matches ``*.expected.json``
    (``ok``, ``first_bad_seq``, the counts and ``details``; ``problem`` is this one's words).
    """
    import tempfile
    import zipfile

    from blake3 import blake3
    from freezegun import freeze_time

    from archive_provider.audit.export import Selection, export_bundle
    from archive_provider.domain.builders import session_ended, session_started
    from archive_provider.format.verifier import (
        MANIFEST,
        PAYLOAD_PREFIX,
        seal_comment,
        seal_digest,
        verify_bundle,
    )
    from archive_provider.storage.store import EventStore

    BUNDLES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, freeze_time("2026-01-01T00:00:03Z"):
        store = EventStore.open(Path(scratch) / "archive")
        store.append(
            [
                session_started("a", at="2026-01-01T00:00:00.000000Z", details={"platform": "cli"}),
                session_ended("b", at="2026-01-01T00:00:01.000000Z", message_count=2),
                session_ended("a", at="2026-01-01T00:00:02.000000Z", message_count=4),
            ]
        )
        try:
            export_bundle(store, BUNDLES / "tiny.zip", Selection(session="b"))
        finally:
            store.close()
    # a forger who knows the format changes the selected payload and reseals the bundle
    # (manifest digests and seal recomputed): only the keyed payload digest can tell
    with zipfile.ZipFile(BUNDLES / "tiny.zip") as source:
        content = {name: source.read(name) for name in source.namelist()}
    manifest = json.loads(content.pop(MANIFEST))
    member = next(name for name in content if name.startswith(PAYLOAD_PREFIX))
    content[member] = content[member].replace(b"2", b"3")
    manifest["members"] = {
        name: {"size": len(body), "blake3": blake3(body).hexdigest()}
        for name, body in content.items()
    }
    text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    tampered = BUNDLES / "tampered.zip"
    with zipfile.ZipFile(tampered, "w", zipfile.ZIP_DEFLATED) as target:
        for name, body in content.items():
            target.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 3)), body)
        target.writestr(zipfile.ZipInfo(MANIFEST, date_time=(2026, 1, 1, 0, 0, 3)), text)
        target.comment = seal_comment(blake3(text).hexdigest())
    with open(tampered, "r+b") as handle:
        size = handle.seek(0, 2)
        seal = seal_digest(handle, size)
        handle.seek(size - 64)
        handle.write(seal.encode())
    for name in ("tiny", "tampered"):
        report = verify_bundle(BUNDLES / f"{name}.zip").as_dict()
        (BUNDLES / f"{name}.expected.json").write_text(
            json.dumps(report, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rewrite existing files (new format!)")
    args = parser.parse_args(argv)
    for name, make in FILES.items():
        path = HERE / name
        if path.exists() and not args.force:
            print(f"kept {path.name} (frozen; --force rewrites it)")
            continue
        path.write_text(dump(make()), encoding="utf-8")
        print(f"wrote {path.name}")
    if BUNDLES.exists() and not args.force:
        print(f"kept {BUNDLES.name}/ (frozen; --force rewrites it)")
    else:
        make_bundles()
        print(f"wrote {BUNDLES.name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
