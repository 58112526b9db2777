"""Row 10: remote witnesses (C2SP tlog-witness) and the consistency proofs they check.

* cosign round trip on loopback: ``witnesses.client.submit`` of a checkpoint one leaf larger
  than the last, with its consistency proof, to a ``hermes-archive witness serve`` process
  (parse, log signature, proof, state write with fsync, cosignature, and the client's check
  of it); baseline: a bare HTTP POST of the same bytes, on a new connection as ``submit``
  makes, to a stdlib ThreadingHTTPServer process that reads the body and answers 200.
* consistency proof verification at ``witness_leaves`` (1M): ``merkle.verify_consistency``
  of proofs from random old sizes, made from tiles; baseline: the same at 1,024 leaves. The
  ratio shows the O(log n) cost (20 levels against 10: about 2x).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from archive_provider.format import merkle
from archive_provider.format.signed_note import Checkpoint, Signer, format_add_checkpoint, sign_note
from archive_provider.witnesses.client import submit

from .common import Row, Workdir, interleaved, median

Report = Callable[[str], None]
ORIGIN = "hermes-archive.invalid/bench0000000000000000000000000000"
ROOT = Path(__file__).resolve().parent.parent

_BARE_SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"\xe2\x80\x94 bench/w " + b"A" * 96 + b"\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _spawn(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if not first:
        raise RuntimeError(f"{args[2:5]} did not start")
    return proc, first


def _witness(state: Path, log_vkey: str) -> tuple[subprocess.Popen[str], str, str]:
    cli = [sys.executable, "-m", "archive_provider.cli", "--json", "witness"]
    made = subprocess.run(
        [*cli, "keygen", "--state", str(state), "--name", "bench/w"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    vkey = json.loads(made.stdout)["vkey"]
    proc, text = _spawn(
        [*cli, "serve", "--listen", "127.0.0.1:0", "--state", str(state), "--log-key", log_vkey]
    )
    assert proc.stdout is not None
    while not text.endswith("}\n"):
        text += proc.stdout.readline()
    return proc, json.loads(text)["url"], vkey


def cosign_row(work: Workdir, count: int, say: Report) -> Row:
    log = Signer.generate(ORIGIN)
    witness, url, vkey = _witness(work.fresh("witness") / "state", log.vkey)
    bare, port = _spawn([sys.executable, "-c", _BARE_SERVER])
    tree = merkle.CompactRange()
    nodes: dict[tuple[int, int], bytes] = {}

    def grow() -> tuple[bytes, int, list[bytes]]:
        old = tree.size
        for level, index, value in tree.append(merkle.leaf_hash(b"leaf %d" % old)):
            nodes[(level, index)] = value
        note = sign_note(Checkpoint(ORIGIN, tree.size, tree.root()).text, [log])
        proof = (
            []
            if old == 0
            else merkle.consistency_proof(
                old, tree.size, lambda level, index: nodes[(level, index)]
            )
        )
        return note, old, proof

    last_body = b""

    def ours() -> float:
        nonlocal last_body
        note, old, proof = grow()
        last_body = format_add_checkpoint(old, proof, note)
        start = time.perf_counter()
        submit(note, old, proof, url, vkey)
        return time.perf_counter() - start

    def theirs() -> float:
        start = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
        connection.request("POST", "/add-checkpoint", body=last_body)
        connection.getresponse().read()
        connection.close()
        return time.perf_counter() - start

    try:
        ours()  # the first request sends old 0 and starts the witness's record
        mine, base, _, _ = interleaved(ours, theirs, count)
    finally:
        for proc in (witness, bare):
            proc.terminate()
            proc.wait(30)
    say(f"  cosign round trip {mine * 1e3:.2f} ms vs bare POST {base * 1e3:.2f} ms")
    return Row(
        "10",
        "witness cosign round trip, loopback",
        mine * 1e3,
        "ms",
        base * 1e3,
        "bare HTTP POST, same bytes",
        note="info: includes the witness's fsync of its state before it answers",
        extra={"submissions": count},
    )


def _tiles(leaves: int) -> Callable[[int, int], bytes]:
    appender = merkle.TileAppender()
    appender.append(merkle.leaf_hash(i.to_bytes(8, "big")) for i in range(leaves))
    tiles = appender.changed()
    return merkle.TileReader(lambda level, index: tiles.get((level, index)), leaves)


def proof_row(leaves: int, samples: int, say: Report) -> Row:
    rng = random.Random(9)
    results: dict[int, tuple[float, int]] = {}
    for size in (1024, leaves):
        node = _tiles(size)
        new_root = merkle.root(size, node)
        cases = []
        for _ in range(samples):
            old = rng.randrange(1, size)
            cases.append((old, merkle.root(old, node), merkle.consistency_proof(old, size, node)))
        times = []
        for old, old_root, proof in cases:
            start = time.perf_counter()
            merkle.verify_consistency(old, size, old_root, new_root, proof)
            times.append(time.perf_counter() - start)
        results[size] = (median(times), max(len(p) for _, _, p in cases))
    (big, big_len), (small, _) = results[leaves], results[1024]
    say(f"  consistency verify @ {leaves:,}: {big * 1e6:.1f} us ({big_len} hashes at most)")
    return Row(
        "10",
        f"consistency proof verification, {leaves:,} leaves",
        big * 1e6,
        "µs",
        small * 1e6,
        "same at 1,024 leaves",
        target_kind="max",
        target_value=3.0,
        target_text="<= 3x the 1k tree (O(log n))",
        extra={"proof_hashes_max": big_len, "proof_bytes_max": big_len * 32},
    )


def run(work: Workdir, leaves: int, cosigns: int, say: Report) -> list[Row]:
    return [cosign_row(work, cosigns, say), proof_row(leaves, 200, say)]
