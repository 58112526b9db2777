"""Generate the frozen format-v2 vectors of this folder (merkle, notes, proofs, chain_v2).

They pin docs/FORMAT.md sections 14 to 16 (the tree, checkpoints, cosignatures) the way
make_vectors.py pins version 1: generated once from the implementation, checked by the
tests, rewritten only with ``--force`` (a format change)::

    python tests/vectors/make_vectors_v2.py            # writes missing files only
    python tests/vectors/make_vectors_v2.py --force    # rewrites them

``notes.json`` also carries examples copied from the specifications, each with its source:
those are the independent oracles; the generated entries pin our own output (Ed25519
signatures are deterministic, so the same keys and texts always give the same bytes).
``rfc6962_reference.json`` is copied data (transparency-dev/merkle) and not written here.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from blake3 import blake3

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from archive_provider.format import merkle  # noqa: E402
from archive_provider.format.signed_note import (  # noqa: E402
    ALG_COSIGNATURE_V1,
    Checkpoint,
    Signer,
    format_add_checkpoint,
    format_checkpoint,
    format_note,
)
from archive_provider.format.tlog_proof import TlogProof, event_extra, payload_digest  # noqa: E402

HERE = Path(__file__).resolve().parent
REFERENCE = json.loads((HERE / "rfc6962_reference.json").read_text())

TEST_STORE_ID = "00112233445566778899aabbccddeeff"
TEST_ORIGIN = f"hermes-archive.invalid/{TEST_STORE_ID}"
TEST_WITNESS = "witness.hermes-archive.invalid/w1"
TEST_TIMESTAMP = 1_700_000_000
TILE_TREE_SIZE = 70_000

C2SP = "github.com/C2SP/C2SP at 5ba5ee830903e91240fc6f9f3a7a9293d49e69c9"
GO_NOTE = (
    "golang.org/x/mod sumdb/note/note_test.go (BSD-3-Clause) at "
    "fe2ec04f7c3c3aa6fad97631aafcff6e49e2d1db"
)
DASH = "\u2014"

PETER_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_SIG = (
    f"{DASH} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXg"
    "KvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    f"{DASH} EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTG"
    "wnWLox33WWd1RvMc+QQ=\n"
)
SOFA = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
SOFA_LOG_SIG = (
    f"{DASH} example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5"
    "/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)
SOFA_COSIG = (
    f"{DASH} witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dl"
    "rDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
)


def _seed(label: str) -> bytes:
    return hashlib.sha256(f"hermes-archive test key: {label}".encode()).digest()


def test_log_signer() -> Signer:
    return Signer(TEST_ORIGIN, _seed("log"))


def test_witness_signer() -> Signer:
    return Signer(TEST_WITNESS, _seed("witness"), ALG_COSIGNATURE_V1)


def leaf_inputs() -> list[bytes]:
    extra = [f"hermes-archive v2 leaf {i}".encode() for i in range(24)]
    return [bytes.fromhex(x) for x in REFERENCE["leaf_inputs"]] + extra


def make_merkle() -> dict[str, Any]:
    inputs = leaf_inputs()
    leaves = [merkle.leaf_hash(x) for x in inputs]
    compact = merkle.CompactRange()
    nodes: dict[tuple[int, int], bytes] = {}
    roots = [merkle.EMPTY_ROOT.hex()]
    for leaf in leaves:
        nodes.update({(lv, ix): h for lv, ix, h in compact.append(leaf)})
        roots.append(compact.root().hex())

    def node(level: int, index: int) -> bytes:
        return nodes[(level, index)]

    inclusion = [
        {"index": i, "size": n, "proof": [h.hex() for h in merkle.inclusion_proof(i, n, node)]}
        for n in range(1, 11)
        for i in range(n)
    ]
    consistency = [
        {"old": m, "new": n, "proof": [h.hex() for h in merkle.consistency_proof(m, n, node)]}
        for n in range(1, 11)
        for m in range(1, n + 1)
    ]
    appender = merkle.TileAppender()
    appender.append(merkle.leaf_hash(i.to_bytes(8, "big")) for i in range(TILE_TREE_SIZE))
    rows = appender.changed()
    edge = []
    for level, (index, width) in sorted(merkle.tile_widths(TILE_TREE_SIZE).items()):
        data = rows[(level, index)]
        edge.append(
            {
                "level": level,
                "index": index,
                "width": width,
                "path": merkle.tile_path(level, index, width),
                "first": data[:32].hex(),
                "last": data[-32:].hex(),
            }
        )
    return {
        "about": "docs/FORMAT.md section 14: RFC 6962 SHA-256 tree. leaf_inputs are the 8 of "
        "transparency-dev/merkle's reference tree, then 24 more; roots[n] is the root at size "
        "n; proofs are RFC 6962 PATH and PROOF; tiles is a 70,000-leaf tree whose leaf i is "
        "leaf_hash(i as 8 big-endian bytes), with its right-edge (partial) tiles.",
        "leaf_inputs": [x.hex() for x in inputs],
        "leaf_hashes": [h.hex() for h in leaves],
        "roots": roots,
        "inclusion": inclusion,
        "consistency": consistency,
        "tiles": {
            "size": TILE_TREE_SIZE,
            "root": appender.root().hex(),
            "full_tiles_per_level": {"0": 273, "1": 1, "2": 0},
            "edge": edge,
        },
    }


def make_notes() -> dict[str, Any]:
    log, witness = test_log_signer(), test_witness_signer()
    leaves = [merkle.leaf_hash(x) for x in leaf_inputs()]
    compact = merkle.CompactRange()
    nodes: dict[tuple[int, int], bytes] = {}
    for leaf in leaves:
        nodes.update({(lv, ix): h for lv, ix, h in compact.append(leaf)})
    checkpoint = format_checkpoint(Checkpoint(TEST_ORIGIN, len(leaves), compact.root()))
    log_signature = log.sign(checkpoint)
    cosignature = witness.cosign(checkpoint, TEST_TIMESTAMP)
    note = format_note(checkpoint, [log_signature, cosignature]).decode()
    proof = merkle.consistency_proof(10, len(leaves), lambda lv, ix: nodes[(lv, ix)])
    request = format_add_checkpoint(10, proof, format_note(checkpoint, [log_signature]))
    return {
        "about": "docs/FORMAT.md sections 15-16: signed notes, checkpoints, cosignatures. "
        "'copied' entries come from the specifications and Go's tests (source given); "
        "'generated' entries pin our output with fixed test keys (seed = SHA-256 of "
        "'hermes-archive test key: <label>').",
        "copied": {
            "c2sp_signed_note_example": {
                "source": f"{C2SP} signed-note.md, 'Verifier keys' example",
                "vkey": "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
                "note": "This is an example message.\n\n"
                f"{DASH} example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTg"
                "K7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n",
                "text": "This is an example message.\n",
            },
            "c2sp_quasimodo_note": {
                "source": f"{C2SP} signed-note.md, first example (its key is not published)",
                "note": "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\n"
                "ed è subito sera.\n\n"
                f"{DASH} quasimodo.example/salvatore NnugSzTjtVAewIS+Z/iJhUPeFDkO/5QQ2i5ddnGIT"
                "LlC+EhfLW9oJKONrMouFSQU0xMcXxj99ihAQwaqP3ZekRwNtIc=\n",
                "text": "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\n"
                "ed è subito sera.\n",
                "signature_name": "quasimodo.example/salvatore",
            },
            "go_peter_neumann": {
                "source": f"{GO_NOTE}, TestSign and TestOpen",
                "private_key": "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz",
                "vkey": "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
                "text": PETER_TEXT,
                "signed": PETER_TEXT + "\n" + PETER_SIG,
                "enoch_vkey": "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop",
                "both_signed": PETER_TEXT + "\n" + PETER_SIG + ENOCH_SIG,
                "must_refuse": [
                    PETER_TEXT,
                    PETER_TEXT + "\n",
                    PETER_TEXT + "\n" + PETER_SIG[:-1],
                    "\x01" + PETER_TEXT + "\n" + PETER_SIG,
                    PETER_TEXT + "\n" + f"{DASH} Bad Name " + PETER_SIG.split(" ")[2],
                    PETER_TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
                    PETER_TEXT + "\n" + PETER_SIG * 101,
                ],
                "bad_signature": PETER_TEXT + "\n" + PETER_SIG[:60] + "ABCD" + PETER_SIG[60:],
            },
            "c2sp_checkpoint_example": {
                "source": f"{C2SP} tlog-checkpoint.md and tlog-cosignature.md (keys not published)",
                "note": SOFA + "\n" + SOFA_LOG_SIG + SOFA_COSIG,
                "origin": "example.com/behind-the-sofa",
                "size": 20852163,
                "root_base64": "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=",
                "cosignature_timestamp": 1679315147,
                "cosigned_message": "cosignature/v1\ntime 1679315147\n" + SOFA,
            },
            "c2sp_tlog_proof_example": {
                "source": f"{C2SP} tlog-proof.md (signatures elided there with [...])",
                "proof": "c2sp.org/tlog-proof@v1\n"
                "extra YWdlLXYxLjIuMS1kYXJ3aW4tYXJtNjQudGFyLmd6kYXJ3aW4tYXJ\n"
                "index 73894\n"
                "gSKyXoYZUgZ6jduWYrkDOARinOMGJveXjgMkBTcdPlQ=\n"
                "B95lDa8R83lS8n0eG+o0buTxRKQTYFi//1U8anccXmA=\n"
                "EKNzoDWG8LGC0Yp9o+sv3qllpMP9uHQ9B20KNL+Q1zs=\n"
                "RoopEkOdqkYqMB4MJXrbt/hMjOxsVn0IrWjpz1ZMMes=\n"
                "AHCioX9nLjsrse6YhjRRmk1WUEirVOLLRoOQ6vfO5vk=\n\n"
                "example.com/fancylog\n109482\nsFodV/vSp5O8n9a8QpW6PRY97tfOSW5bsc2Xl/EQi08=\n\n"
                f"{DASH} example.com/fancylog hI2DJw[...]1roloI=\n"
                f"{DASH} witness1.example mJirIklj[...]qY9v2B/5bg==\n",
                "index": 73894,
                "proof_lines": 5,
                "size": 109482,
            },
            "c2sp_add_checkpoint_example": {
                "source": f"{C2SP} tlog-witness.md, add-checkpoint example request",
                "body": "old 20852014\n"
                "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n"
                "jrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=\n"
                "5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=\n"
                "/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=\n\n" + SOFA + "\n" + SOFA_LOG_SIG,
                "old_size": 20852014,
                "proof_lines": 4,
            },
        },
        "generated": {
            "log_private_key": log.private_key,
            "log_vkey": log.vkey,
            "witness_private_key": witness.private_key,
            "witness_vkey": witness.vkey,
            "checkpoint": checkpoint,
            "tree_size": len(leaves),
            "root_hex": compact.root().hex(),
            "cosignature_timestamp": TEST_TIMESTAMP,
            "note": note,
            "add_checkpoint_body_base64": base64.b64encode(request).decode(),
            "add_checkpoint_old_size": 10,
        },
    }


DOMAIN_IDENTITY = b"hermes-archive/v2/identity\x00"


def _canonical(value: Any) -> str:
    """Canonical text (FORMAT.md 2) of the simple values used here: ASCII-safe texts, ints."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def proof_log() -> list[dict[str, Any]]:
    """Five v2 events: envelope text (13.1) and their payloads (digest, salt, body)."""
    events = []
    for seq in range(1, 6):
        session = "sess-1" if seq < 4 else "sess-2"
        message = _canonical({"content": f"message {seq}: caf\u00e9 \u2603", "role": "user"})
        author = _canonical({"id": "u-42", "is_bot": False, "name": "Ada"})
        parts = [(message.encode(), _seed(f"salt {seq} message"))]
        stored = [(payload_digest(salt, body), salt, body) for body, salt in parts]
        author_salt = _seed("salt author")
        author_digest = payload_digest(author_salt, author.encode())
        part_hex = [d.hex() for d, _, _ in stored]
        body = _canonical({"messages": part_hex, "turn": seq}).encode()
        body_salt = _seed(f"salt {seq} body")
        body_digest = payload_digest(body_salt, body)
        key = {"turn": seq}
        identity = blake3(
            DOMAIN_IDENTITY
            + _canonical(
                {"key": key, "parts": part_hex, "session": session, "type": "turn"}
            ).encode()
        ).hexdigest()
        envelope = _canonical(
            {
                "author": author_digest.hex(),
                "identity": identity,
                "key": key,
                "parts": part_hex,
                "payload": body_digest.hex(),
                "seq": seq,
                "session": session,
                "time": f"2026-12-01T14:0{seq}:00.000000Z",
                "type": "turn",
            }
        )
        events.append(
            {
                "envelope": envelope,
                "payloads": [
                    (body_digest, body_salt, body),
                    *stored,
                    (author_digest, author_salt, author.encode()),
                ],
            }
        )
    return events


def make_proofs() -> dict[str, Any]:
    log, witness = test_log_signer(), test_witness_signer()
    events = proof_log()
    leaves = [merkle.leaf_hash(e["envelope"].encode()) for e in events]
    compact = merkle.CompactRange()
    nodes: dict[tuple[int, int], bytes] = {}
    for leaf in leaves:
        nodes.update({(lv, ix): h for lv, ix, h in compact.append(leaf)})
    checkpoint = format_checkpoint(Checkpoint(TEST_ORIGIN, len(leaves), compact.root()))
    note = format_note(
        checkpoint, [log.sign(checkpoint), witness.cosign(checkpoint, TEST_TIMESTAMP)]
    )
    documents = []
    for seq, disclose in ((2, "all"), (5, "message")):
        event = events[seq - 1]
        payloads = event["payloads"] if disclose == "all" else event["payloads"][1:2]
        proof = merkle.inclusion_proof(seq - 1, len(leaves), lambda lv, ix: nodes[(lv, ix)])
        extra = event_extra(event["envelope"], payloads)
        documents.append(TlogProof(seq - 1, tuple(proof), note, extra).encode())
    return {
        "about": "docs/FORMAT.md section 21.1: a prove file for seq 2 (everything disclosed) "
        "and seq 5 (only its message), over five v2 turn envelopes, signed by the test log "
        "key and cosigned by the test witness key of notes.json. Salts are SHA-256 of "
        "'hermes-archive test key: salt ...' so the bytes are reproducible.",
        "log_vkey": log.vkey,
        "witness_vkey": witness.vkey,
        "envelopes": [e["envelope"] for e in events],
        "checkpoint": checkpoint,
        "proof_file": b"".join(documents).decode("utf-8"),
        "proven": [
            {"seq": 2, "disclosed": [d.hex() for d, _, _ in events[1]["payloads"]]},
            {"seq": 5, "disclosed": [events[4]["payloads"][1][0].hex()]},
        ],
    }


CHAIN_STORE_KEY = bytes(range(32))


def chain_v2_events() -> list[dict[str, Any]]:
    """The inputs of chain_v2.json: five events, one shared part, an author, escaping."""
    hello = {"content": "hello, caf\u00e9", "role": "user"}
    reply = {"content": "hi \u2603", "role": "assistant"}
    again = {"content": "hello again", "role": "user"}
    ada = {"id": "u-42", "is_bot": False, "name": "Ada"}
    return [
        {
            "type": "store_created",
            "session": "archive",
            "key": {},
            "parts": [],
            "author": None,
            "body": {
                "created": "2026-12-01T14:00:00.000000Z",
                "format_version": 2,
                "origin": TEST_ORIGIN,
                "store_id": TEST_STORE_ID,
                "vkey": "(test)",
            },
        },
        {
            "type": "turn",
            "session": "sess-1",
            "key": {"turn": 1},
            "parts": [hello, reply],
            "author": ada,
            "body": {"messages": [0, 1], "turn": 1},
        },
        {
            "type": "turn",
            "session": 'sess "quoted"\n',
            "key": {"turn": 1},
            "parts": [hello],
            "author": ada,
            "body": {"messages": [0], "turn": 1},
        },
        {
            "type": "memory_write",
            "session": "sess-1",
            "key": {"order": 1},
            "parts": [again],
            "author": None,
            "body": {"action": "add", "content": 0, "target": "memory"},
        },
        {
            "type": "checkpoint",
            "session": "sess-1",
            "key": {},
            "parts": [hello, reply, again],
            "author": None,
            "body": {"evidence": [0, 1, 2]},
        },
    ]


def _fill(value: Any, digests: list[str]) -> Any:
    """Bodies name parts by position in the inputs; the vectors hold the digests."""
    if isinstance(value, dict):
        return {
            k: (_fill(v, digests) if k in ("messages", "evidence", "content") else v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [digests[i] for i in value]
    if type(value) is int:
        return digests[value]
    return value


def make_chain_v2() -> dict[str, Any]:
    from archive_provider.format import digests_v2
    from archive_provider.format.canonical import canonical_bytes, canonical_text
    from archive_provider.format.digests import Envelope

    log = test_log_signer()
    stored: dict[bytes, dict[str, Any]] = {}  # canonical bytes -> payload entry (dedup)

    def part(value: Any) -> dict[str, Any]:
        data = canonical_bytes(value)
        if data not in stored:
            salt = _seed(f"chain_v2 salt {len(stored)}")
            stored[data] = {
                "value": value,
                "canonical_hex": data.hex(),
                "salt": salt.hex(),
                "lookup": digests_v2.lookup(CHAIN_STORE_KEY, data).hex(),
                "digest": digests_v2.payload_digest(salt, data).hex(),
            }
        return stored[data]

    genesis = digests_v2.genesis(TEST_STORE_ID)
    chain, appender, out = genesis, merkle.TileAppender(), []
    for seq, spec in enumerate(chain_v2_events(), start=1):
        parts = [part(p) for p in spec["parts"]]
        author = part(spec["author"]) if spec["author"] is not None else None
        digests = [p["digest"] for p in parts]
        body = _fill(spec["body"], digests) if parts else spec["body"]
        body_bytes = canonical_bytes(body)
        body_salt = _seed(f"chain_v2 body salt {seq}")
        key = canonical_text(spec["key"])
        parts_canonical = canonical_text(digests)
        identity = digests_v2.identity(spec["type"], spec["session"], key, parts_canonical)
        envelope = Envelope(
            seq,
            f"2026-12-01T14:00:0{seq}.000000Z",
            spec["type"],
            spec["session"],
            key,
            identity.hex(),
            digests_v2.payload_digest(body_salt, body_bytes).hex(),
            parts_canonical,
            author["digest"] if author else None,
            2,
        )
        previous, chain = chain, digests_v2.chain_hash(chain, envelope)
        leaf = merkle.leaf_hash(envelope.canonical())
        appender.append([leaf])
        out.append(
            {
                "seq": seq,
                "time": envelope.time,
                "type": spec["type"],
                "session": spec["session"],
                "key": spec["key"],
                "key_canonical": key,
                "identity_input": canonical_text(
                    {
                        "key": spec["key"],
                        "parts": digests,
                        "session": spec["session"],
                        "type": spec["type"],
                    }
                ),
                "identity": identity.hex(),
                "body": body,
                "body_canonical_hex": body_bytes.hex(),
                "body_salt": body_salt.hex(),
                "payload": envelope.payload,
                "parts": parts,
                "parts_canonical": parts_canonical,
                "parts_blob_hex": digests_v2.parts_blob(parts_canonical).hex(),
                "author": author,
                "envelope_text": envelope.canonical().decode("utf-8"),
                "previous_chain": previous.hex(),
                "chain": chain.hex(),
                "leaf_hash": leaf.hex(),
            }
        )
    root = appender.root()
    checkpoint = format_checkpoint(Checkpoint(TEST_ORIGIN, appender.size, root))
    return {
        "about": "docs/FORMAT.md sections 11 and 13 to 15: five v2 events (a shared part, an "
        "author, a session that needs escaping) with salts, lookups, envelopes, chain, leaf "
        "hashes, the tiles, the head and a checkpoint signed by the test log key of "
        "notes.json. Salts are SHA-256 of 'hermes-archive test key: chain_v2 ...'.",
        "store_id": TEST_STORE_ID,
        "store_key_hex": CHAIN_STORE_KEY.hex(),
        "domains_hex": {
            "identity": digests_v2.DOMAIN_IDENTITY.hex(),
            "payload": digests_v2.DOMAIN_PAYLOAD.hex(),
            "lookup": digests_v2.DOMAIN_LOOKUP.hex(),
            "chain": digests_v2.DOMAIN_CHAIN.hex(),
            "genesis": digests_v2.DOMAIN_GENESIS.hex(),
        },
        "genesis": genesis.hex(),
        "events": out,
        "tiles": [
            {"level": lv, "index": ix, "hashes_hex": h.hex()}
            for (lv, ix), h in sorted(appender.changed().items())
        ],
        "head": {"seq": appender.size, "chain": chain.hex(), "root": root.hex()},
        "log_vkey": log.vkey,
        "checkpoint": format_note(checkpoint, [log.sign(checkpoint)]).decode("utf-8"),
    }


def _sql_value(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _insert(table: str, *values: Any) -> str:
    return f"INSERT INTO {table} VALUES ({', '.join(_sql_value(v) for v in values)})"


def report_archive_sql(erasure_body: bytes | None = None) -> list[str]:
    """SQL that builds the chain_v2.json archive plus seq 6, an erasure of the memory text.

    ``erasure_body`` replaces the erasure's canonical body (for the duplicate-member case);
    its digest, the envelope, chain, tiles, head and the signed checkpoint follow it.
    """
    from archive_provider.format import digests_v2
    from archive_provider.format.canonical import canonical_bytes
    from archive_provider.format.digests import Envelope
    from archive_provider.storage.store_pieces import SCHEMA

    vectors = make_chain_v2()
    log = test_log_signer()
    sql = [s.strip() for s in SCHEMA.split(";\n") if s.strip()]
    sql += [
        _insert("meta", "format_version", "2"),
        _insert("meta", "store_id", TEST_STORE_ID),
        _insert("meta", "origin", TEST_ORIGIN),
        _insert("meta", "vkey", log.vkey),
        _insert("meta", "created", "2026-12-01T14:00:01.000000Z"),
    ]
    payloads: dict[bytes, tuple[bytes, bytes | None, bytes]] = {}
    rows = []
    for event in vectors["events"]:
        for entry in [*event["parts"], *([event["author"]] if event["author"] else [])]:
            payloads[bytes.fromhex(entry["digest"])] = (
                bytes.fromhex(entry["salt"]),
                bytes.fromhex(entry["lookup"]),
                bytes.fromhex(entry["canonical_hex"]),
            )
        payloads[bytes.fromhex(event["payload"])] = (
            bytes.fromhex(event["body_salt"]),
            None,
            bytes.fromhex(event["body_canonical_hex"]),
        )
        rows.append(
            Envelope(
                event["seq"],
                event["time"],
                event["type"],
                event["session"],
                event["key_canonical"],
                event["identity"],
                event["payload"],
                event["parts_canonical"],
                event["author"]["digest"] if event["author"] else None,
                2,
            )
        )
    erased = vectors["events"][3]["parts"][0]["digest"]  # "hello again", named by seq 4 and 5
    body = erasure_body or canonical_bytes(
        {
            "digests": [erased],
            "dangling": [],
            "events": 2,
            "legal_basis": "test",
            "payloads": 1,
            "reason": "vector",
            "scope": {"seq": [4, 5]},
            "who": "test",
        }
    )
    salt = _seed("reports erasure salt")
    key = canonical_bytes({"at": "2026-12-01T14:00:06.000000Z", "scope": {"seq": [4, 5]}})
    identity = digests_v2.identity("erasure", "archive", key.decode(), "[]")
    payloads[digests_v2.payload_digest(salt, body)] = (salt, None, body)
    rows.append(
        Envelope(
            6,
            "2026-12-01T14:00:06.000000Z",
            "erasure",
            "archive",
            key.decode(),
            identity.hex(),
            digests_v2.payload_digest(salt, body).hex(),
            "[]",
            None,
            2,
        )
    )
    chain = digests_v2.genesis(TEST_STORE_ID)
    tree = merkle.TileAppender()
    for envelope in rows:
        chain = digests_v2.chain_hash(chain, envelope)
        tree.append([merkle.leaf_hash(envelope.canonical())])
        sql.append(
            _insert(
                "events",
                envelope.seq,
                envelope.time,
                envelope.type,
                envelope.session,
                envelope.key,
                bytes.fromhex(envelope.identity),
                bytes.fromhex(envelope.payload),
                digests_v2.parts_blob(envelope.parts),
                bytes.fromhex(envelope.author) if envelope.author else None,
                chain,
            )
        )
    for digest, (salt, lookup, data) in payloads.items():
        sql.append(_insert("payloads", digest, salt, lookup, data))
    for (level, index), hashes in sorted(tree.changed().items()):
        sql.append(_insert("tiles", level, index, hashes))
    root = tree.root()
    sql.append(_insert("head", 1, len(rows), chain, root))
    text = format_checkpoint(Checkpoint(TEST_ORIGIN, len(rows), root))
    sql.append(_insert("signed_checkpoints", len(rows), root, rows[-1].time, log.sign(text).data))
    return sql


def make_reports() -> dict[str, Any]:
    """Small v2 databases, one per rule of FORMAT.md 20.1/20.2, with the expected verdict."""
    from archive_provider.format.verifier import verify_database

    events = make_chain_v2()["events"]
    part2 = events[1]["parts"][0]["digest"]  # "hello, café": named by seq 2, 3 and 5
    again = events[3]["parts"][0]["digest"]  # erased by seq 6
    drop = "DROP TRIGGER {}"
    cases: list[dict[str, Any]] = [
        ("intact", [], True, (True, None, None)),
        ("intact without a pinned key", [], False, (True, None, None)),
        (
            "store_id missing",
            ["DELETE FROM meta WHERE name = 'store_id'"],
            True,
            (False, None, "store_id_missing"),
        ),
        (
            "store_id uppercase",
            ["UPDATE meta SET value = upper(value) WHERE name = 'store_id'"],
            True,
            (False, None, "store_id_malformed"),
        ),
        (
            "store_id short",
            ["UPDATE meta SET value = substr(value, 2) WHERE name = 'store_id'"],
            True,
            (False, None, "store_id_malformed"),
        ),
        (
            "erased and covered by a later erasure",
            [
                f"INSERT INTO erased VALUES (X'{again}', 6)",
                f"UPDATE payloads SET salt = NULL, lookup = NULL, body = NULL WHERE digest = X'{again}'",
            ],
            True,
            (True, None, None),
        ),
        (
            "tombstone without erasure",
            [
                drop.format("payloads_erase_only"),
                f"UPDATE payloads SET salt = NULL, lookup = NULL, body = NULL WHERE digest = X'{part2}'",
            ],
            True,
            (False, 2, "erased_without_erasure"),
        ),
        (
            "TEXT body",
            [
                drop.format("payloads_erase_only"),
                f"UPDATE payloads SET body = CAST(body AS TEXT) WHERE digest = X'{part2}'",
            ],
            True,
            (False, 2, "payload_type"),
        ),
        (
            "one byte of a body changed",
            [
                drop.format("payloads_erase_only"),
                f"UPDATE payloads SET body = CAST(replace(CAST(body AS TEXT), 'hello', 'hellO') AS BLOB)"
                f" WHERE digest = X'{part2}'",
            ],
            True,
            (False, 2, "payload_mismatch"),
        ),
        (
            "invalid UTF-8 in session",
            [
                drop.format("events_no_update"),
                "UPDATE events SET session = CAST(X'73ff' AS TEXT) WHERE seq = 3",
            ],
            True,
            (False, 3, "invalid_utf8"),
        ),
        (
            "time changed",
            [
                drop.format("events_no_update"),
                "UPDATE events SET time = '2026-12-01T15:00:00.000000Z' WHERE seq = 4",
            ],
            True,
            (False, 4, "chain"),
        ),
        (
            "session changed",
            [drop.format("events_no_update"), "UPDATE events SET session = 'other' WHERE seq = 2"],
            True,
            (False, 2, "identity"),
        ),
        (
            "event deleted",
            [drop.format("events_no_delete"), "DELETE FROM events WHERE seq = 3"],
            True,
            (False, 3, "sequence_gap"),
        ),
        (
            "tail deleted",
            [drop.format("events_no_delete"), "DELETE FROM events WHERE seq = 6"],
            True,
            (False, 6, "truncated"),
        ),
        ("head moved back", ["UPDATE head SET seq = 5"], True, (False, 6, "after_head")),
        (
            "head root changed",
            ["UPDATE head SET root = zeroblob(32)"],
            True,
            (False, 6, "head_root"),
        ),
        (
            "tile changed",
            [drop.format("tiles_grow_only"), "UPDATE tiles SET hashes = zeroblob(length(hashes))"],
            True,
            (False, 1, "tiles"),
        ),
        (
            "checkpoint signature changed",
            [
                drop.format("signed_checkpoints_no_update"),
                "UPDATE signed_checkpoints SET signature = zeroblob(64)",
            ],
            True,
            (False, None, "checkpoint_signature"),
        ),
        (
            "checkpoint signature changed, no key given",
            [
                drop.format("signed_checkpoints_no_update"),
                "UPDATE signed_checkpoints SET signature = zeroblob(64)",
            ],
            False,
            (True, None, None),
        ),
        (
            "checkpoint root changed",
            [
                drop.format("signed_checkpoints_no_update"),
                "UPDATE signed_checkpoints SET root = zeroblob(32)",
            ],
            True,
            (False, 6, "checkpoint_root"),
        ),
    ]
    cases += [
        ("format_version missing", ["DELETE FROM meta WHERE name = 'format_version'"], True,
         (False, None, "format_version")),
        ("format_version 3", ["UPDATE meta SET value = '3' WHERE name = 'format_version'"], True,
         (False, None, "format_version")),
        ("events is a view", ["ALTER TABLE events RENAME TO events_t",
                              "CREATE VIEW events AS SELECT * FROM events_t"], True,
         (False, None, "unreadable")),
        ("head is a view", ["ALTER TABLE head RENAME TO head_t",
                            "CREATE VIEW head AS SELECT * FROM head_t"], True,
         (False, None, "unreadable")),
        ("tile stored as TEXT", [drop.format("tiles_grow_only"),
                                 "UPDATE tiles SET hashes = CAST(hashes AS TEXT)"], True,
         (False, 1, "tiles")),
        ("meta.origin changed", ["UPDATE meta SET value = 'hermes-archive.invalid/"
                                 "ffeeddccbbaa99887766554433221100' WHERE name = 'origin'"],
         False, (False, None, "origin")),
        ("meta.origin missing", ["DELETE FROM meta WHERE name = 'origin'"], False,
         (False, None, "origin")),
        ("head row missing", ["DELETE FROM head"], True, (False, 1, "after_head")),
    ]  # fmt: skip
    log = test_log_signer()
    out = []
    base = report_archive_sql()
    for name, extra, pinned, (ok, seq, code) in cases:
        out.append(
            {
                "name": name,
                "sql": extra,
                "vkey": pinned,
                "expected": {"ok": ok, "first_bad_seq": seq, "code": code},
            }
        )
    duplicate = (
        b'{"dangling":[],"digests":["' + again.encode() + b'"],"digests":[],"events":2,'
        b'"legal_basis":"test","payloads":1,"reason":"vector","scope":{"seq":[4,5]},"who":"test"}'
    )
    out.append(
        {
            "name": "erasure body with a member twice",
            "base": "duplicate",
            "sql": [],
            "vkey": True,
            "expected": {"ok": False, "first_bad_seq": 6, "code": "duplicate_key"},
        }
    )
    bases = {"standard": base, "duplicate": report_archive_sql(duplicate)}
    for case in out:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        for statement in [*bases[case.get("base", "standard")], *case["sql"]]:
            conn.execute(statement)
        report = verify_database(conn, b"", vkey=log.vkey if case["vkey"] else None)
        got = {"ok": report.ok, "first_bad_seq": report.first_bad_seq, "code": report.code}
        if got != case["expected"]:
            raise SystemExit(
                f"reports.json case {case['name']!r}: expected "
                f"{case['expected']}, the verifier says {got}: {report.problem}"
            )
    return {
        "about": "docs/FORMAT.md 20.1-20.3: one small v2 database per rule. Build each with "
        "the statements of bases[case.base or 'standard'] then the case's sql (an attacker "
        "drops a trigger first), verify it (with the test log key of notes.json when vkey is "
        "true) and compare ok, first_bad_seq and code. The base is chain_v2.json's five "
        "events plus seq 6, an erasure listing the memory text's digest. Expected verdicts "
        "are written by hand; the generator checks the reference verifier agrees.",
        "log_vkey": log.vkey,
        "bases": bases,
        "cases": out,
    }


def make_echoes() -> dict[str, Any]:
    """FORMAT.md 13.4: turns whose messages hand a served recall back, each with the messages
    as sent, as stored (the recall cut out), the turn body's ``echoes``, and the rendering
    once the recall is erased."""
    from archive_provider.domain.echoes import cut_echoes, render_echoes
    from archive_provider.projections.recall import FENCE_OPEN

    first = f"{FENCE_OPEN}\n- (turn, 2026-11-30) user: My codename is BLUE HERON.\n[end of archive recall]"
    second = f"{FENCE_OPEN}\n- (memory) user: prefers tea, 🍵 green\n[end of archive recall]"
    block = "<memory-context>\n[System note: recalled memory context.]\n\n{}\n</memory-context>"
    recalls = [(14, first), (20, second)]
    turns = [
        [
            {
                "role": "user",
                "content": "What was it?",
                "api_content": "What was it?\n\n" + block.format(first),
            }
        ],
        [
            {
                "role": "user",
                "content": "Both, again?",
                "api_content": "Both, again?\n\n" + block.format(second + "\n" + first),
            },
            {"role": "assistant", "content": "Sure."},
        ],
        [{"role": "user", "content": "Trimmed: " + first[:40], "api_content": first[:-5]}],
    ]
    cases = []
    for sent in turns:
        stored, echoes = cut_echoes(sent, sorted(recalls, reverse=True), FENCE_OPEN)
        results = dict(recalls)
        cases.append(
            {
                "sent": sent,
                "stored": stored,
                "echoes": echoes,
                "rendered": [
                    render_echoes(m, i, echoes, results.get) for i, m in enumerate(stored)
                ],
                "rendered_erased": [
                    render_echoes(m, i, echoes, lambda seq: None) for i, m in enumerate(stored)
                ],
            }
        )
    return {
        "marker": FENCE_OPEN,
        "recalls": [{"seq": s, "result": r} for s, r in recalls],
        "erased": "[erased]",
        "cases": cases,
    }


FILES = {
    "merkle.json": make_merkle,
    "echoes.json": make_echoes,
    "notes.json": make_notes,
    "proofs.json": make_proofs,
    "chain_v2.json": make_chain_v2,
    "reports.json": make_reports,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rewrite existing files (new format!)")
    args = parser.parse_args(argv)
    for name, make in FILES.items():
        path = HERE / name
        if path.exists() and not args.force:
            print(f"kept {name} (frozen; --force rewrites it)")
            continue
        path.write_text(json.dumps(make(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
