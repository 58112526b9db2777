"""Signed notes, checkpoints and cosignatures of format v2 (archive_provider/format/signed_note.py).

The oracles are the examples of the C2SP specifications and of Go's sumdb/note tests
(tests/vectors/notes.json, "copied", sources given there); the generated entries pin our own
output, and the merkle vectors tie a checkpoint to a real tree.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archive_provider.format import merkle
from archive_provider.format.signed_note import (
    ALG_COSIGNATURE_V1,
    ALG_ED25519,
    Checkpoint,
    NoteError,
    Signature,
    Signer,
    Verifier,
    cosigned_message,
    format_add_checkpoint,
    format_checkpoint,
    format_note,
    key_id,
    open_checkpoint,
    open_note,
    parse_add_checkpoint,
    parse_checkpoint,
    parse_note,
    sign_note,
)

VECTORS = Path(__file__).parent / "vectors"
NOTES = json.loads((VECTORS / "notes.json").read_text(encoding="utf-8"))
COPIED, GENERATED = NOTES["copied"], NOTES["generated"]
DASH = "\u2014"


def test_c2sp_signed_note_example_verifies_with_its_vkey():
    case = COPIED["c2sp_signed_note_example"]
    verifier = Verifier.from_vkey(case["vkey"])
    assert verifier.vkey == case["vkey"]
    assert (verifier.name, f"{verifier.key_id:08x}", verifier.alg) == (
        "example.com/foo",
        "530d903a",
        ALG_ED25519,
    )
    note, verified = open_note(case["note"].encode(), [verifier])
    assert note.text == case["text"] and len(verified) == 1
    changed = case["note"].replace("example message", "example massage")
    with pytest.raises(NoteError, match="does not verify"):
        open_note(changed, [verifier])


def test_a_note_whose_text_holds_blank_lines_splits_at_the_last_one():
    case = COPIED["c2sp_quasimodo_note"]
    note = parse_note(case["note"].encode())
    assert note.text == case["text"]
    assert [s.name for s in note.signatures] == [case["signature_name"]]
    # its key is not published: with no known key the note is refused, never trusted
    with pytest.raises(NoteError, match="no signature from a known key"):
        open_note(case["note"], [Verifier.from_vkey(COPIED["c2sp_signed_note_example"]["vkey"])])


def test_go_private_key_signs_exactly_as_go_does():
    case = COPIED["go_peter_neumann"]
    signer = Signer.from_private_key(case["private_key"])
    assert signer.vkey == case["vkey"]
    assert signer.private_key == case["private_key"]
    assert sign_note(case["text"], [signer]).decode() == case["signed"]
    assert f"{key_id('PeterNeumann', ALG_ED25519, signer.verifier.public_key):08x}" == "c74f20a3"


def test_go_open_rules_unknown_ignored_known_checked_duplicates_once():
    case = COPIED["go_peter_neumann"]
    peter, enoch = Verifier.from_vkey(case["vkey"]), Verifier.from_vkey(case["enoch_vkey"])
    note, verified = open_note(case["both_signed"], [peter])
    assert [s.name for s in verified] == ["PeterNeumann"]
    assert [s.name for s in note.signatures] == ["PeterNeumann", "EnochRoot"]
    _, verified = open_note(case["both_signed"], [peter, enoch])
    assert [s.name for s in verified] == ["PeterNeumann", "EnochRoot"]
    text, sig = case["text"], case["signed"][len(case["text"]) + 1 :]
    _, verified = open_note(text + "\n" + sig + sig, [peter])
    assert len(verified) == 1
    with pytest.raises(NoteError, match="no signature from a known key"):
        open_note(case["both_signed"], [])
    with pytest.raises(NoteError, match="does not verify"):
        open_note(case["bad_signature"], [peter])
    # the same name and ID for two different keys is a configuration error, never a guess
    other = Verifier("PeterNeumann", ALG_ED25519, enoch.public_key)
    assert other.key_id != peter.key_id  # a different key has a different ID...
    with pytest.raises(NoteError, match="share"):
        forged = Verifier("PeterNeumann", ALG_ED25519, enoch.public_key)
        forged.key_id = peter.key_id  # ...unless someone forces a collision
        open_note(case["signed"], [peter, forged])


@pytest.mark.parametrize("index", range(len(COPIED["go_peter_neumann"]["must_refuse"])))
def test_go_malformed_notes_are_refused(index):
    message = COPIED["go_peter_neumann"]["must_refuse"][index]
    peter = Verifier.from_vkey(COPIED["go_peter_neumann"]["vkey"])
    with pytest.raises(NoteError):
        open_note(message.encode(), [peter])


def test_invalid_utf8_and_control_characters_are_refused():
    case = COPIED["go_peter_neumann"]
    with pytest.raises(NoteError, match="UTF-8"):
        parse_note(b"\xff" + case["signed"].encode())
    with pytest.raises(NoteError, match="control"):
        parse_note(case["signed"].replace("problem,", "problem,\r"))
    with pytest.raises(NoteError, match="UTF-8"):
        parse_note("\ud800" + case["signed"])


@pytest.mark.parametrize(
    "vkey",
    [
        "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong ID
        "PeterNeumann+C74F20A3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # ID not lowercase
        "PeterNeumann+c74f20a3+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # unknown type
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # space
        "PeterNeumann+c74f20a3",
        "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10T",  # bad base64
    ],
)
def test_bad_verifier_keys_are_refused(vkey):
    with pytest.raises(NoteError):
        Verifier.from_vkey(vkey)


def test_c2sp_checkpoint_and_cosignature_examples_parse():
    case = COPIED["c2sp_checkpoint_example"]
    note = parse_note(case["note"])
    checkpoint = parse_checkpoint(note.text)
    assert (checkpoint.origin, checkpoint.size) == (case["origin"], case["size"])
    assert base64.b64encode(checkpoint.root).decode() == case["root_base64"]
    assert checkpoint.extensions == ()
    log_sig, cosig = note.signatures
    assert log_sig.name == case["origin"]
    assert cosig.name == "witness.example.com/w1"
    assert cosig.timestamp == case["cosignature_timestamp"]  # the spec's "time" line
    assert cosigned_message(note.text, cosig.timestamp).decode() == case["cosigned_message"]
    assert format_checkpoint(checkpoint) == note.text


@pytest.mark.parametrize(
    "text",
    [
        "example.com/log\n20\n",  # no root line
        "\n20\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # empty origin
        "example.com/log\n020\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # leading zero
        "example.com/log\n-1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
        "example.com/log\n20\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jx\n",  # not 32 bytes
        "example.com/log\n20\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\nextension\n",
        "example.com/log\n20\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=",  # no final newline
    ],
)
def test_checkpoint_rules(text):
    with pytest.raises(NoteError):
        parse_checkpoint(text)


def test_checkpoint_of_the_empty_tree_and_extension_lines():
    empty = parse_checkpoint(f"log.example/a\n0\n{base64.b64encode(merkle.EMPTY_ROOT).decode()}\n")
    assert (empty.size, empty.root) == (0, merkle.EMPTY_ROOT)
    with_ext = Checkpoint("log.example/a", 5, bytes(32), ("ext one",))
    assert parse_checkpoint(format_checkpoint(with_ext)) == with_ext


def test_generated_checkpoint_is_frozen_and_verifies_against_the_merkle_vectors():
    log = Signer.from_private_key(GENERATED["log_private_key"])
    witness = Signer.from_private_key(GENERATED["witness_private_key"])
    assert (log.vkey, witness.vkey) == (GENERATED["log_vkey"], GENERATED["witness_vkey"])
    assert witness.alg == ALG_COSIGNATURE_V1
    roots = json.loads((VECTORS / "merkle.json").read_text())["roots"]
    checkpoint = parse_checkpoint(GENERATED["checkpoint"])
    assert checkpoint.root.hex() == roots[checkpoint.size] == GENERATED["root_hex"]
    # deterministic Ed25519: the same keys and text give the frozen bytes again
    again = format_note(
        GENERATED["checkpoint"],
        [log.sign(GENERATED["checkpoint"]), witness.cosign(GENERATED["checkpoint"], 1_700_000_000)],
    )
    assert again.decode() == GENERATED["note"]
    found, _, cosigned = open_checkpoint(
        GENERATED["note"], log.verifier, [Verifier.from_vkey(GENERATED["witness_vkey"])]
    )
    assert found == checkpoint
    assert [(s.name, s.timestamp) for s in cosigned] == [
        ("witness.hermes-archive.invalid/w1", GENERATED["cosignature_timestamp"])
    ]


def test_a_cosignature_binds_its_timestamp_and_the_checkpoint():
    witness = Signer.from_private_key(GENERATED["witness_private_key"])
    log = Signer.from_private_key(GENERATED["log_private_key"])
    text = GENERATED["checkpoint"]
    cosig = witness.cosign(text, 1_700_000_000)
    moved = Signature(cosig.name, cosig.key_id, (1_700_000_001).to_bytes(8, "big") + cosig.data[8:])
    note = format_note(text, [log.sign(text), moved])
    with pytest.raises(NoteError, match="does not verify"):
        open_checkpoint(note, log.verifier, [witness.verifier])
    other = text.replace(text.split("\n")[1], str(int(text.split("\n")[1]) + 1), 1)
    assert not witness.verifier.verify(other, cosig)
    with pytest.raises(NoteError):
        witness.sign(text)  # a cosigner key does not sign notes
    with pytest.raises(NoteError):
        log.cosign(text, 1)  # nor a log key cosignatures
    with pytest.raises(NoteError):
        witness.cosign(text, 2**63)


def test_open_checkpoint_wants_the_log_signature_and_the_right_origin():
    log = Signer.from_private_key(GENERATED["log_private_key"])
    witness = Signer.from_private_key(GENERATED["witness_private_key"])
    text = GENERATED["checkpoint"]
    only_witness = format_note(text, [witness.cosign(text, 5)])
    with pytest.raises(NoteError, match="not signed by the log key"):
        open_checkpoint(only_witness, log.verifier, [witness.verifier])
    stranger = Signer("hermes-archive.invalid/ffffffffffffffffffffffffffffffff", bytes(32))
    with pytest.raises(NoteError, match="origin"):
        open_checkpoint(sign_note(text, [stranger]), stranger.verifier)


def test_add_checkpoint_bodies_round_trip_and_the_c2sp_example_parses():
    case = COPIED["c2sp_add_checkpoint_example"]
    old, proof, note = parse_add_checkpoint(case["body"].encode())
    assert (old, len(proof)) == (case["old_size"], case["proof_lines"])
    assert parse_checkpoint(parse_note(note).text).size == 20852163
    body = base64.b64decode(GENERATED["add_checkpoint_body_base64"])
    old, proof, note = parse_add_checkpoint(body)
    assert old == GENERATED["add_checkpoint_old_size"]
    assert format_add_checkpoint(old, proof, note) == body
    roots = json.loads((VECTORS / "merkle.json").read_text())["roots"]
    checkpoint = parse_checkpoint(parse_note(note).text)
    merkle.verify_consistency(
        old, checkpoint.size, bytes.fromhex(roots[old]), checkpoint.root, proof
    )
    for bad in (
        b"old 01\n\n" + note,
        b"new 1\n\n" + note,
        b"old 1\n" + note,
        b"old 1\nAAAA\n\n" + note,
        b"old 1\n" + b"A" * 43 + b"=\n" * 64 + b"\n" + note,
    ):
        with pytest.raises(NoteError):
            parse_add_checkpoint(bad)


@settings(max_examples=40, deadline=None)
@given(
    st.text(
        alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
        min_size=1,
    ).filter(lambda t: all(ord(c) >= 0x20 for c in t)),
    st.integers(min_value=0, max_value=2**63 - 1),
)
def test_signing_round_trips_any_text(line, timestamp):
    log = Signer("log.example/x", bytes(range(32)))
    text = line + "\n"
    note, verified = open_note(sign_note(text, [log]), [log.verifier])
    assert note.text == text and len(verified) == 1
    checkpoint = format_checkpoint(Checkpoint("log.example/x", timestamp, bytes(32)))
    witness = Signer("w.example/1", bytes(32), ALG_COSIGNATURE_V1)
    assert witness.verifier.verify(checkpoint, witness.cosign(checkpoint, timestamp))


@pytest.mark.parametrize(
    ("module", "siblings"),
    [
        ("merkle.py", set()),
        ("signed_note.py", set()),
        ("tlog_proof.py", {"merkle", "signed_note"}),
    ],
)
def test_pure_core_imports_only_what_the_standalone_verifier_may(module, siblings):
    """DESIGN invariants 7 and 14: the standard library, blake3 and cryptography, and of the
    package only these pure siblings, so the standalone verifier can use the files as they are."""
    import ast
    import sys

    source = (Path(__file__).parent.parent / "archive_provider" / "format" / module).read_text()
    imported, relative = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            relative.update([node.module] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    # a sibling may also be imported by name: the fallback when copied out beside verifier.py
    allowed = set(sys.stdlib_module_names) | {"blake3", "cryptography"} | siblings
    assert imported <= allowed, imported - allowed
    assert relative <= siblings, relative - siblings
