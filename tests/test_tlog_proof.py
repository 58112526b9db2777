"""Proof files of format v2 (archive_provider/format/tlog_proof.py, docs/FORMAT.md section 21.1).

The frozen tests/vectors/proofs.json holds a prove file over five v2 envelopes; every check a
recipient makes is exercised by tampering with one thing at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archive_provider.format import merkle
from archive_provider.format.canonical import canonical_bytes, decode
from archive_provider.format.signed_note import Checkpoint, Signer, Verifier, format_checkpoint
from archive_provider.format.tlog_proof import (
    HEADER,
    ProofFileError,
    TlogProof,
    event_extra,
    parse_tlog_proofs,
    payload_digest,
    strict_json,
    verify_document,
    verify_proof_file,
)

VECTORS = Path(__file__).parent / "vectors"
PROOFS = json.loads((VECTORS / "proofs.json").read_text(encoding="utf-8"))
NOTES = json.loads((VECTORS / "notes.json").read_text(encoding="utf-8"))
LOG = Verifier.from_vkey(PROOFS["log_vkey"])
WITNESS = Verifier.from_vkey(PROOFS["witness_vkey"])
FILE = PROOFS["proof_file"].encode("utf-8")


def test_the_frozen_proof_file_proves_its_events_offline():
    proven = verify_proof_file(FILE, LOG, [WITNESS])
    assert [(p.seq, sorted(p.disclosed)) for p in proven] == [
        (case["seq"], sorted(case["disclosed"])) for case in PROOFS["proven"]
    ]
    assert all(p.cosigners == ("witness.hermes-archive.invalid/w1",) for p in proven)
    assert proven[0].checkpoint.size == 5
    message = json.loads(proven[1].disclosed[PROOFS["proven"][1]["disclosed"][0]])
    assert message == {"content": "message 5: café ☃", "role": "user"}
    # without the witness key the proof still verifies, with no cosigner counted
    assert verify_proof_file(FILE, LOG)[0].cosigners == ()


def test_the_vector_envelopes_are_canonical_v2_envelopes():
    """The leaves are canonical bytes (FORMAT.md 2 and 13.1), as the package encodes them."""
    for text in PROOFS["envelopes"]:
        assert canonical_bytes(decode(text)) == text.encode("utf-8")
        assert sorted(decode(text)) == [
            "author", "identity", "key", "parts", "payload", "seq", "session", "time", "type",
        ]  # fmt: skip


def _first() -> TlogProof:
    return parse_tlog_proofs(FILE)[0]


def _with_extra(document: TlogProof, change) -> TlogProof:
    extra = json.loads(document.extra)
    change(extra)
    raw = json.dumps(extra, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return TlogProof(document.index, document.proof, document.checkpoint, raw.encode())


def _flip_body(extra):
    extra["payloads"][1]["body"] = extra["payloads"][1]["body"].replace("message", "massage")


def _flip_salt(extra):
    salt = extra["payloads"][0]["salt"]
    extra["payloads"][0]["salt"] = ("0" if salt[0] != "0" else "1") + salt[1:]


def _foreign_digest(extra):
    entry = extra["payloads"][0]
    body = entry["body"].encode()
    entry["digest"] = payload_digest(bytes(32), body).hex()
    entry["salt"] = "00" * 32  # a valid commitment, but not one this envelope names


def _edit_envelope(extra):
    extra["envelope"] = extra["envelope"].replace("sess-1", "sess-9")


def _renumber(extra):
    extra["envelope"] = extra["envelope"].replace('"seq":2', '"seq":3')


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_flip_body, "does not match its body and salt"),
        (_flip_salt, "does not match its body and salt"),
        (_foreign_digest, "is not named by the envelope"),
        (_edit_envelope, "not in the signed tree"),
        (_renumber, "the proof is for seq 2"),
    ],
)
def test_a_changed_disclosure_or_envelope_is_refused(change, message):
    with pytest.raises(ProofFileError, match=message):
        verify_document(_with_extra(_first(), change), LOG, [WITNESS])


def test_a_changed_inclusion_proof_or_index_is_refused():
    document = _first()
    bad = list(document.proof)
    bad[0] = bytes(32)
    for changed in (
        TlogProof(document.index, tuple(bad), document.checkpoint, document.extra),
        TlogProof(document.index, document.proof[:-1], document.checkpoint, document.extra),
        TlogProof(document.index + 1, document.proof, document.checkpoint, document.extra),
    ):
        with pytest.raises(ProofFileError):
            verify_document(changed, LOG, [WITNESS])


def test_a_checkpoint_not_signed_by_the_pinned_log_key_is_refused():
    stranger = Signer.from_private_key(NOTES["copied"]["go_peter_neumann"]["private_key"])
    with pytest.raises(ProofFileError, match="checkpoint does not verify"):
        verify_proof_file(FILE, stranger.verifier)
    # a rewritten log re-signed with another key under the same origin: unknown key, refused
    impostor = Signer(LOG.name, bytes(range(32)))
    document = _first()
    text = document.checkpoint.decode().split("\n\n")[0] + "\n"
    forged = TlogProof(
        document.index,
        document.proof,
        (text + "\n" + impostor.sign(text).line).encode(),
        document.extra,
    )
    with pytest.raises(ProofFileError, match="checkpoint does not verify"):
        verify_document(forged, LOG)


def test_documents_naming_different_checkpoints_are_refused():
    """Each document verifies on its own (seq 2 in the tree of 4 and in the tree of 5)."""
    first = _first()
    signer = Signer.from_private_key(NOTES["generated"]["log_private_key"])
    leaves = [merkle.leaf_hash(text.encode()) for text in PROOFS["envelopes"][:4]]
    compact = merkle.CompactRange()
    nodes = {}
    for leaf in leaves:
        nodes.update({(lv, ix): h for lv, ix, h in compact.append(leaf)})
    text = format_checkpoint(Checkpoint(LOG.name, 4, compact.root()))
    proof = merkle.inclusion_proof(1, 4, lambda lv, ix: nodes[(lv, ix)])
    second = TlogProof(
        1, tuple(proof), (text + "\n" + signer.sign(text).line).encode(), first.extra
    )
    assert verify_document(second, LOG).seq == verify_document(first, LOG).seq == 2
    with pytest.raises(ProofFileError, match="different checkpoints"):
        verify_proof_file(first.encode() + second.encode(), LOG)


def test_duplicate_members_and_other_json_are_refused_by_rule():
    with pytest.raises(ProofFileError, match='member "envelope" twice'):
        strict_json('{"envelope":"a","envelope":"b","payloads":[]}')
    with pytest.raises(ProofFileError, match="not a JSON number"):
        strict_json('{"x":NaN}')
    with pytest.raises(ProofFileError, match="not valid JSON"):
        strict_json("{")
    document = _first()
    raw = document.extra.decode()
    doubled = raw.replace('{"envelope":', '{"envelope":"x","envelope":', 1)
    with pytest.raises(ProofFileError, match="twice"):
        verify_document(
            TlogProof(document.index, document.proof, document.checkpoint, doubled.encode()), LOG
        )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"wrong-header\nindex 0\n\ncheckpoint\n", "starts with the line"),
        (HEADER.encode() + b"\nextra !!notbase64!!\nindex 0\n\ncheckpoint\n", "base64"),
        (HEADER.encode() + b"\n\n\ncheckpoint\n", "no 'index' line"),
        (HEADER.encode() + b"\nindex notanumber\n\ncheckpoint\n", "decimal"),
        (HEADER.encode() + b"\nindex -5\n\ncheckpoint\n", "decimal"),
        (HEADER.encode() + b"\nindex 05\n\ncheckpoint\n", "decimal"),
        (HEADER.encode() + b"\nindex 0\n!!notbase64!!\n\ncheckpoint\n", "base64"),
        (HEADER.encode() + b"\nindex 0\nAAAA\n\ncheckpoint\n", "32-byte hash"),
        (HEADER.encode() + b"\nindex 0\n", "no blank line"),
        (b"\xff" + HEADER.encode(), "UTF-8"),
    ],
)
def test_malformed_proof_documents(data, message):
    """The structural cases of transparency-dev/merkle's tlog-proof tests, and a few more."""
    with pytest.raises(ProofFileError, match=message):
        parse_tlog_proofs(data)


def test_the_c2sp_tlog_proof_example_parses():
    case = NOTES["copied"]["c2sp_tlog_proof_example"]
    (document,) = parse_tlog_proofs(case["proof"].encode())
    assert (document.index, len(document.proof)) == (case["index"], case["proof_lines"])
    assert document.extra is not None
    assert document.checkpoint.decode().split("\n")[1] == str(case["size"])
    assert document.encode() == case["proof"].encode()


def test_a_document_without_extra_proves_no_envelope():
    document = _first()
    with pytest.raises(ProofFileError, match="no extra line"):
        verify_document(TlogProof(document.index, document.proof, document.checkpoint), LOG)


def test_event_extra_round_trips_bodies_with_any_text():
    body = canonical_bytes({"content": 'quote " backslash \\ tab \t nul \x00 \ud800', "role": "x"})
    salt = bytes(range(32))
    digest = payload_digest(salt, body)
    extra = strict_json(event_extra("{}", [(digest, salt, body)]))
    assert extra["payloads"][0]["body"].encode() == body
    assert payload_digest(bytes.fromhex(extra["payloads"][0]["salt"]), body).hex() == digest.hex()
    assert merkle.leaf_hash(b"{}") == merkle.leaf_hash(extra["envelope"].encode())


def test_the_three_pure_modules_verify_a_proof_file_copied_out_of_the_package(tmp_path):
    """What the standalone verifier will do: the files alone, the package unimportable."""
    import shutil
    import subprocess
    import sys

    package = tmp_path / "standalone"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("merkle.py", "signed_note.py", "tlog_proof.py"):
        shutil.copy(
            Path(__file__).parent.parent / "archive_provider" / "format" / name, package / name
        )
    script = (
        "import json, sys\n"
        "sys.modules['archive_provider'] = None  # any import of the package now fails\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from standalone.signed_note import Verifier\n"
        "from standalone.tlog_proof import verify_proof_file\n"
        f"v = json.load(open({str(VECTORS / 'proofs.json')!r}, encoding='utf-8'))\n"
        "proven = verify_proof_file(v['proof_file'].encode(), Verifier.from_vkey(v['log_vkey']),"
        " [Verifier.from_vkey(v['witness_vkey'])])\n"
        "print([p.seq for p in proven], proven[0].cosigners)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 5] ('witness.hermes-archive.invalid/w1',)"


# -- the report of a proof file (FORMAT.md 20.3, 21.1): codes, seqs, counts ---------------


def _report(tmp_path: Path, data: bytes):
    """The report ``verify_proof`` (the CLI's and the standalone verifier's) gives ``data``."""
    from archive_provider.format.verifier import verify_proof

    path = tmp_path / "file.proof"
    path.write_bytes(data)
    return verify_proof(path, PROOFS["log_vkey"], [])


def _code(report) -> tuple[bool, str | None, int | None]:
    return report.ok, report.code, report.first_bad_seq


def test_each_proof_failure_has_its_code_and_seq(tmp_path: Path) -> None:
    first = _first()
    bad = list(first.proof)
    bad[0] = bytes(32)
    for data, expected in [
        (_with_extra(first, _flip_body).encode(), ("payload_mismatch", 2)),
        (
            TlogProof(first.index, tuple(bad), first.checkpoint, first.extra).encode(),
            ("inclusion", 2),
        ),
    ]:
        report = _report(tmp_path, data)
        assert _code(report) == (False, *expected), report.problem
    twice = json.loads(first.extra)
    raw = json.dumps(twice, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    raw = raw.replace('{"envelope"', '{"payloads":[],"envelope"', 1)
    doubled = TlogProof(first.index, first.proof, first.checkpoint, raw.encode()).encode()
    assert _code(_report(tmp_path, doubled))[:2] == (False, "duplicate_key")


def test_a_signature_failure_says_authenticity_failed(tmp_path: Path) -> None:
    impostor = Signer(LOG.name, bytes(range(32)))
    document = _first()
    text = document.checkpoint.decode().split("\n\n")[0] + "\n"
    forged = TlogProof(
        document.index, document.proof, (text + "\n" + impostor.sign(text).line).encode(),
        document.extra,
    )  # fmt: skip
    report = _report(tmp_path, forged.encode())
    assert (_code(report), report.authenticity) == (
        (False, "checkpoint_signature", None),
        "failed",
    )


def test_payloads_checked_counts_distinct_digests(tmp_path: Path) -> None:
    """The same disclosure in two documents is one payload checked (20.3: distinct)."""
    once = _report(tmp_path, _first().encode())
    twice = _report(tmp_path, _first().encode() + _first().encode())
    assert once.ok and twice.ok and twice.payloads_checked == once.payloads_checked == 3


def test_a_file_without_its_final_newline_is_refused(tmp_path: Path) -> None:
    """A note's text ends with a newline: the last document's is not made up (notes.json)."""
    assert FILE.endswith(b"\n")
    report = _report(tmp_path, FILE[:-1])
    assert _code(report) == (False, "proof_format", None), report.problem
    assert _report(tmp_path, FILE).ok


def test_a_witness_key_in_its_ed25519_form_counts_its_cosignature(tmp_path: Path) -> None:
    """C2SP allows a witness's Ed25519 key in type 0x01 or 0x04: both check its cosignature."""
    from archive_provider.format.verifier import verify_proof

    path = tmp_path / "file.proof"
    path.write_bytes(FILE)
    ed25519 = Verifier(WITNESS.name, 0x01, WITNESS.public_key).vkey
    for given in (PROOFS["witness_vkey"], ed25519):
        report = verify_proof(path, PROOFS["log_vkey"], [given])
        assert report.ok and report.checkpoint["cosigned_by"] == [WITNESS.name], report.problem
