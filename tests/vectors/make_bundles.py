"""Generate the frozen bundle-v3 and proof-v2 vectors (FORMAT.md 22: ``bundle_v3/``, ``proof_v2/``).

A real v2 archive is built by the provider (the demo's first two turns and a memory write),
exported and proven, then frozen with the reports the package gives; a second verifier must
give the same reports. Rewritten only with ``--force`` (a format change)::

    python tests/vectors/make_bundles.py [--force]
    python tests/vectors/make_bundles.py --derived   # only the failures made from tiny.zip

``bundle_v2/`` was written the same way by 0.1's exporter (bundle version 2) and stays frozen:
the exporter writes version 3 now, and old bundles must keep their verdicts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from archive_provider.audit.export import Selection, export_bundle  # noqa: E402
from archive_provider.audit.prove import prove  # noqa: E402
from archive_provider.format.verifier import verify_bundle, verify_proof  # noqa: E402
from archive_provider.storage.store import EventStore, archive_dir  # noqa: E402
from tests.test_cli import build_archive  # noqa: E402
from tests.test_export import reseal  # noqa: E402

HERE = Path(__file__).parent
BUNDLES, PROOFS = HERE / "bundle_v3", HERE / "proof_v2"


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


#: failures made from tiny.zip and turn.proof as a forger would, one per rule a second
#: implementation must name alike (FORMAT.md 20.1, 20.2 step 4, 21.1, 21.4)
DERIVED_BUNDLES = ("duplicate-member", "head-chain", "changed-member")
DERIVED_PROOFS = ("no-final-newline",)


def write_derived(vkey: str) -> None:
    """The derived failures and their reports, from the frozen tiny.zip and turn.proof."""
    manifest_text = zipfile.ZipFile(BUNDLES / "tiny.zip").read("manifest.json")
    duplicate = b'{"payloads": 999, ' + manifest_text.lstrip()[1:]
    reseal_text(BUNDLES / "tiny.zip", BUNDLES / "duplicate-member.zip", duplicate)
    shutil.copy(BUNDLES / "tiny.zip", BUNDLES / "head-chain.zip")

    def change_the_head_chain(content: dict[str, bytes], manifest: dict[str, object]) -> None:
        head = manifest["head"]
        assert isinstance(head, dict)
        head["chain"] = "0" * 64

    reseal(BUNDLES / "head-chain.zip", change_the_head_chain)
    with zipfile.ZipFile(BUNDLES / "tiny.zip") as archive:  # a member changed, not resealed
        content = {name: archive.read(name) for name in archive.namelist()}
    content["envelopes.bin"] += b"\0"
    reseal_text(BUNDLES / "tiny.zip", BUNDLES / "changed-member.zip", manifest_text, content)
    for name in DERIVED_BUNDLES:
        for keyed, suffix in ((True, ""), (False, ".unkeyed")):
            report = verify_bundle(BUNDLES / f"{name}.zip", vkey=vkey if keyed else None)
            write_json(BUNDLES / f"{name}{suffix}.expected.json", report.as_dict())
    proof = (PROOFS / "turn.proof").read_bytes()
    (PROOFS / "no-final-newline.proof").write_bytes(proof[:-1])
    for name in DERIVED_PROOFS:
        report = verify_proof(PROOFS / f"{name}.proof", vkey)
        write_json(PROOFS / f"{name}.expected.json", report.as_dict())


def reseal_text(
    source: Path, out: Path, manifest: bytes, content: dict[str, bytes] | None = None
) -> None:
    """``source``'s members (or ``content``) with ``manifest`` verbatim, sealed again."""
    from blake3 import blake3

    from archive_provider.format.verifier import MANIFEST, seal_comment, seal_digest

    if content is None:
        with zipfile.ZipFile(source) as archive:
            content = {name: archive.read(name) for name in archive.namelist()}
    content.pop(MANIFEST, None)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in content.items():
            archive.writestr(name, body)
        archive.writestr(MANIFEST, manifest)
        archive.comment = seal_comment(blake3(manifest).hexdigest())
    with open(out, "r+b") as handle:
        size = handle.seek(0, 2)
        seal = seal_digest(handle, size)
        handle.seek(size - 64)
        handle.write(seal.encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--derived", action="store_true", help="only the derived failures")
    args = parser.parse_args()
    if args.derived:
        write_derived(json.loads((BUNDLES / "keys.json").read_text())["log_vkey"])
        return
    if (BUNDLES.exists() or PROOFS.exists()) and not args.force:
        print("bundle_v3/ and proof_v2/ exist; --force rewrites them")
        return
    shutil.rmtree(BUNDLES, ignore_errors=True)
    shutil.rmtree(PROOFS, ignore_errors=True)
    BUNDLES.mkdir()
    PROOFS.mkdir()
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        build_archive(home)
        store = EventStore.open(archive_dir(home), create=False, readonly=True)
        vkey = store.vkey
        export_bundle(store, BUNDLES / "tiny.zip", Selection(session="sess-2"))
        (PROOFS / "turn.proof").write_bytes(prove(store, [3])[3])
        store.close()
    write_json(BUNDLES / "keys.json", {"log_vkey": vkey})
    write_json(PROOFS / "keys.json", {"log_vkey": vkey})
    shutil.copy(BUNDLES / "tiny.zip", BUNDLES / "tampered.zip")

    def change_a_body(content: dict[str, bytes], manifest: dict[str, object]) -> None:
        assert b"heron" in content["payloads.bin"]
        content["payloads.bin"] = content["payloads.bin"].replace(b"heron", b"HERON")

    reseal(BUNDLES / "tampered.zip", change_a_body)
    for name in ("tiny", "tampered"):
        for keyed, suffix in ((True, ""), (False, ".unkeyed")):
            report = verify_bundle(BUNDLES / f"{name}.zip", vkey=vkey if keyed else None)
            write_json(BUNDLES / f"{name}{suffix}.expected.json", report.as_dict())
    write_json(PROOFS / "turn.expected.json", verify_proof(PROOFS / "turn.proof", vkey).as_dict())
    write_derived(vkey)
    with zipfile.ZipFile(BUNDLES / "tiny.zip") as archive:
        print(sorted(archive.namelist()))


if __name__ == "__main__":
    main()
