"""The standalone verifier under hostile input: a database or bundle built to hang it, or to
make it hold more memory than any other check of the same file.

Each case is what an attacker who controls the file under audit can do; the verifier runs
as the auditor runs it, as a script in a process of its own (ISSUE-29 point 10).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from archive_provider.format import verifier
from archive_provider.format.verifier import MANIFEST, seal_comment
from tests.test_export import seal_file

VECTORS = Path(__file__).parent / "vectors"
STANDALONE = ("verifier.py", "merkle.py", "signed_note.py", "tlog_proof.py")
#: a body claimed by the forged record: far more than the bound the check must keep
CLAIMED = 256 << 20
#: the peak the whole check may reach (the interpreter, blake3 and cryptography included)
BOUND = 160 << 20

#: the child's own peak: VmHWM of its address space (ru_maxrss would also count what the
#: forking test process held before exec: Linux carries that high-water mark across exec)
_PEAK = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as done:
    code = done.code
with open("/proc/self/status") as status:
    kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(kib * 1024, file=sys.stderr)
sys.exit(code)
"""


def standalone(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], int]:
    """(exit code, JSON report, peak resident bytes) of the four standalone files run alone."""
    folder = tmp_path / "standalone"
    folder.mkdir(exist_ok=True)
    for name in STANDALONE:
        shutil.copy(Path(verifier.__file__).with_name(name), folder / name)
    done = subprocess.run(
        [sys.executable, "-I", "-c", _PEAK, str(folder / "verifier.py"), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout), int(done.stderr.split()[-1])


def write_bundle(source: Path, out: Path, big: str, head: bytes, size: int) -> None:
    """``source`` resealed as a forger would, member ``big`` replaced by ``head`` and ``size``
    zero bytes, written as a stream (the bundle stays about a thousandth of what it holds)."""
    with zipfile.ZipFile(source) as archive:
        content = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(content.pop(MANIFEST))
    hasher = blake3(head)
    zeros = bytes(1 << 20)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in content.items():
            if name != big:
                archive.writestr(name, body)
                manifest["members"][name] = {"size": len(body), "blake3": blake3(body).hexdigest()}
                continue
            with archive.open(name, "w", force_zip64=True) as member:
                member.write(head)
                for _ in range(size // len(zeros)):
                    member.write(zeros)
                    hasher.update(zeros)
            manifest["members"][name] = {
                "size": len(head) + size,
                "blake3": hasher.hexdigest(),
            }
        text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        archive.writestr(MANIFEST, text)
        archive.comment = seal_comment(blake3(text).hexdigest())
    seal_file(out)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_body_claiming_a_huge_size_is_hashed_as_a_stream(tmp_path: Path, version: int) -> None:
    """A bundle's first body claims 256 MiB (zeros: the bundle is a fraction of a MiB): the
    check hashes it as it reads it and fails on its digest, never holding it whole."""
    source = VECTORS / ("bundles" if version == 1 else f"bundle_v{version}") / "tiny.zip"
    with zipfile.ZipFile(source) as archive:
        if version == 1:  # payloads/<digest> holds the body alone (keyed digest)
            big = next(n for n in archive.namelist() if n.startswith("payloads/"))
            head = b""
        elif version == 3:
            carried = archive.read("payloads.bin")
            assert carried[0] & 0x7F == 1  # a carried body: kind, digest, salt, length
            big, head = "payloads.bin", carried[:65] + CLAIMED.to_bytes(8, "big")
        else:
            big = next(n for n in archive.namelist() if n.startswith("payloads/"))
            head = archive.read(big)[:32]  # the salt; the body follows
    out = tmp_path / "claim.zip"
    write_bundle(source, out, big, head, CLAIMED)
    assert out.stat().st_size < CLAIMED // 200
    code, report, peak = standalone(tmp_path, "bundle", str(out))
    assert (code, report["ok"]) == (1, False)
    assert "does not match" in report["problem"]
    assert report.get("code") == (None if version == 1 else "payload_mismatch")  # v1: no codes
    assert peak < BOUND, f"the check held {peak >> 20} MiB"


def test_a_meta_view_is_refused_before_any_query(tmp_path: Path) -> None:
    """``meta`` a recursive view that never ends: refused by the schema check, never run."""
    database = tmp_path / "events.db"
    conn = sqlite3.connect(database)
    conn.executescript(
        "CREATE VIEW meta AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
        "SELECT 'format_version' AS name, x AS value FROM r WHERE x < 0;"
        "CREATE TABLE events (seq INTEGER); CREATE TABLE payloads (digest TEXT);"
        "CREATE TABLE head (id INTEGER);"
    )
    conn.close()
    code, report, _ = standalone(tmp_path, str(database))
    assert (code, report["ok"], report["code"]) == (1, False, "unreadable")
    assert "meta is a view, not a table" in report["problem"]
