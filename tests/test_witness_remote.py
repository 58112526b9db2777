"""Remote witnesses (C2SP tlog-witness): real ``hermes-archive witness serve`` processes on
127.0.0.1, a log that grows (trees from merkle.py, notes from signed_note.py), the client and
the background submitter. No mocks: a witness that cannot start fails the test.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from archive_provider.format import merkle
from archive_provider.format.signed_note import (
    ALG_COSIGNATURE_V1,
    Checkpoint,
    Signature,
    Signer,
    Verifier,
    format_add_checkpoint,
    format_note,
    open_checkpoint,
    parse_checkpoint,
    parse_note,
    sign_note,
)
from archive_provider.witnesses.client import (
    BadCosignature,
    WitnessConflict,
    WitnessEndpoint,
    WitnessInconsistent,
    WitnessRefused,
    WitnessSubmitter,
    WitnessUnreachable,
    submit,
)
from archive_provider.witnesses.server import origin_hash

REPO = Path(__file__).resolve().parent.parent
NOTES = json.loads((REPO / "tests" / "vectors" / "notes.json").read_text(encoding="utf-8"))
ORIGIN = "hermes-archive.invalid/0f1e2d3c4b5a69788796a5b4c3d2e1f0"
START_TIMEOUT_S = 60.0  # a liveness bound for a loaded CI box, never a performance claim


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "archive_provider.cli", *args]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        cli(*args), capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO, check=False
    )


def keygen(state: Path, name: str) -> str:
    done = run_cli("--json", "witness", "keygen", "--state", str(state), "--name", name)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["vkey"])


class WitnessProcess:
    """``hermes-archive witness serve`` in a child process; ``url`` once it listens."""

    def __init__(self, state: Path, log_keys: Sequence[str], port: int = 0) -> None:
        self.state, self.log_keys = state, list(log_keys)
        args = ["--json", "witness", "serve", "--listen", f"127.0.0.1:{port}"]
        args += ["--state", str(state)]
        for key in log_keys:
            args += ["--log-key", key]
        self.stderr_path = state.parent / f"{state.name}.{time.monotonic_ns()}.stderr"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                cli(*args), stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=REPO
            )
        lines: queue.Queue[str] = queue.Queue()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put("")

        threading.Thread(target=read, daemon=True).start()
        text, deadline = "", time.monotonic() + START_TIMEOUT_S
        while not text.endswith("}\n"):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if not line:
                self.stop()
                pytest.fail(f"the witness did not start: {self.stderr_path.read_text()}")
            text += line
        self.info = json.loads(text)
        self.url: str = self.info["url"]
        self.port = int(self.url.rsplit(":", 1)[1])
        self.vkey: str = self.info["vkey"]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)


@pytest.fixture
def witnesses() -> Iterator[Callable[..., WitnessProcess]]:
    started: list[WitnessProcess] = []

    def start(state: Path, log_keys: Sequence[str], port: int = 0) -> WitnessProcess:
        process = WitnessProcess(state, log_keys, port)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


class Log:
    """A log that grows: leaves, every perfect-subtree node, signed checkpoints at any size."""

    def __init__(self, signer: Signer, tag: str = "honest") -> None:
        self.signer, self.tag = signer, tag
        self.range = merkle.CompactRange()
        self.nodes: dict[tuple[int, int], bytes] = {}

    @property
    def size(self) -> int:
        return self.range.size

    def grow(self, count: int, tag: str | None = None) -> Log:
        for _ in range(count):
            data = f"{tag or self.tag} event {self.size}".encode()
            for level, index, value in self.range.append(merkle.leaf_hash(data)):
                self.nodes[(level, index)] = value
        return self

    def node(self, level: int, index: int) -> bytes:
        return self.nodes[(level, index)]

    def root(self, size: int) -> bytes:
        return merkle.root(size, self.node)

    def note(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        return sign_note(Checkpoint(ORIGIN, size, self.root(size)).text, [self.signer])

    def proof(self, old: int, new: int) -> list[bytes]:
        return merkle.consistency_proof(old, new, self.node)


def wait_for(what: str, done: Callable[[], bool], timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.02)


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/add-checkpoint", body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


def get(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture
def log_key() -> Signer:
    return Signer.generate(ORIGIN)


# -- the stream: two witnesses, one killed and restarted ------------------------------------


def test_two_witnesses_cosign_a_growing_log_and_one_survives_a_kill(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    vkeys = [keygen(tmp_path / f"w{i}", f"witness.test/w{i}") for i in (1, 2)]
    w1 = witnesses(tmp_path / "w1", [log_key.vkey])
    w2 = witnesses(tmp_path / "w2", [log_key.vkey])
    assert [w1.vkey, w2.vkey] == vkeys
    log = Log(log_key).grow(3)
    lock = threading.Lock()
    got: dict[str, dict[int, Signature]] = {vkeys[0]: {}, vkeys[1]: {}}
    threads: set[int] = set()

    def latest() -> tuple[bytes, Callable[[int, int], Sequence[bytes]]]:
        threads.add(threading.get_ident())
        with lock:
            return log.note(), log.proof

    def on_cosigned(endpoint: WitnessEndpoint, checkpoint: Checkpoint, sig: Signature) -> None:
        got[endpoint.vkey][checkpoint.size] = sig

    endpoints = [WitnessEndpoint(w1.url, w1.vkey), WitnessEndpoint(w2.url, w2.vkey)]
    submitter = WitnessSubmitter(
        endpoints, latest, on_cosigned, backoff_initial=0.05, backoff_max=0.3, timeout=5
    )
    submitter.start()

    def cosigned_by(vkey: str, size: int) -> bool:
        return size in got[vkey]

    try:
        for step in (1, 4, 250, 7):
            with lock:
                log.grow(step)
            submitter.notify()
            wait_for(f"both at {log.size}", lambda: all(cosigned_by(v, log.size) for v in vkeys))
        assert threading.get_ident() not in threads  # the log's side runs on the witness threads
        # every cosignature verifies on the checkpoint, by the spec's note rules
        size = log.size
        note = parse_note(log.note(size))
        full = format_note(note.text, [*note.signatures, got[vkeys[0]][size], got[vkeys[1]][size]])
        _, _, cosigned = open_checkpoint(
            full, log_key.verifier, [Verifier.from_vkey(v) for v in vkeys]
        )
        assert sorted(s.name for s in cosigned) == ["witness.test/w1", "witness.test/w2"]
        assert all(lag.behind == 0 and lag.last_error is None for lag in submitter.status())

        # w2 dies: w1 keeps cosigning, w2's lag and error show
        before_kill = size
        w2.kill()
        with lock:
            log.grow(40)
        submitter.notify()
        wait_for("w1 alone", lambda: cosigned_by(vkeys[0], log.size))
        wait_for("w2's error", lambda: submitter.status()[1].last_error is not None)
        lag2 = submitter.status()[1]
        assert lag2.error_kind == "unreachable" and lag2.error_since is not None
        assert lag2.cosigned_size == before_kill and lag2.behind == 40
        assert not cosigned_by(vkeys[1], log.size)

        # w2 restarts on its port from its state: it remembers the size it cosigned
        w2 = witnesses(tmp_path / "w2", [log_key.vkey], port=w2.port)
        status, kept = get(w2.url, f"/{origin_hash(ORIGIN)}/checkpoint")
        assert status == 200
        kept_checkpoint, _, kept_cosigs = open_checkpoint(
            kept, log_key.verifier, [Verifier.from_vkey(vkeys[1])]
        )
        assert kept_checkpoint.size in (before_kill, log.size) and len(kept_cosigs) == 1
        with lock:
            log.grow(5)
        submitter.notify()
        wait_for("w2 caught up", lambda: cosigned_by(vkeys[1], log.size))
        wait_for("w2 clear", lambda: submitter.status()[1].last_error is None)
        assert submitter.status()[1].error_since is None and submitter.status()[1].behind == 0
        # and across the restart it still checks consistency against what it remembered
        fork = Log(log_key, "forged").grow(log.size + 3)
        with pytest.raises(WitnessInconsistent):
            submit(fork.note(), log.size, fork.proof(log.size, fork.size), w2.url, w2.vkey)
        with pytest.raises(WitnessConflict) as conflict:
            submit(fork.note(), 0, [], w2.url, w2.vkey)
        assert conflict.value.size == log.size
    finally:
        submitter.close(timeout=30)


# -- the attacker who rewrites history ---------------------------------------------------------


def test_a_history_rewritten_after_a_cosignature_is_refused(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    """The attacker can write the archive folder, so holds the log key; not the witness."""
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    honest = Log(log_key).grow(20)
    submit(honest.note(), 0, [], w.url, w.vkey)
    cosigned = honest.size

    # a different tree of the same size: the roots differ
    same = Log(log_key).grow(12).grow(8, tag="rewritten")
    with pytest.raises(WitnessInconsistent, match="422"):
        submit(same.note(), cosigned, [], w.url, w.vkey)
    # a larger rewritten tree, with the proof the attacker can make from its own tree
    larger = Log(log_key).grow(12).grow(30, tag="rewritten")
    with pytest.raises(WitnessInconsistent):
        submit(larger.note(), cosigned, larger.proof(cosigned, larger.size), w.url, w.vkey)
    # ...or with the honest proof material: no proof fits both roots
    with pytest.raises(WitnessInconsistent):
        submit(larger.note(), cosigned, honest.grow(22).proof(cosigned, 42), w.url, w.vkey)
    # pretending the witness is new does not reset it; a rollback (smaller tree) is refused
    with pytest.raises(WitnessConflict) as conflict:
        submit(larger.note(), 0, [], w.url, w.vkey)
    assert conflict.value.size == cosigned
    with pytest.raises(WitnessRefused) as rollback:
        submit(honest.note(10), cosigned, [], w.url, w.vkey)
    assert rollback.value.status == 400

    # the submitter of the rewritten archive says so in its status
    def rewritten() -> tuple[bytes, Callable[[int, int], Sequence[bytes]]]:
        return larger.note(), larger.proof

    def never(*_: object) -> None:
        pytest.fail("a rewritten log was cosigned")

    submitter = WitnessSubmitter(
        [WitnessEndpoint(w.url, w.vkey)], rewritten, never, known_sizes={w.vkey: cosigned}
    )
    submitter.start()
    submitter.notify()
    try:
        wait_for("the refusal", lambda: submitter.status()[0].last_error is not None)
        lag = submitter.status()[0]
        assert lag.error_kind == "inconsistent" and "422" in (lag.last_error or "")
        assert lag.cosigned_size == cosigned and lag.behind == larger.size - cosigned
    finally:
        submitter.close(timeout=30)

    # a restored older copy of the archive: the witness is ahead, the status says rolled back
    restored = Log(log_key).grow(10)
    stale = WitnessSubmitter(
        [WitnessEndpoint(w.url, w.vkey)],
        lambda: (restored.note(), restored.proof),
        never,
    )
    stale.start()
    stale.notify()
    try:
        wait_for("the rollback", lambda: stale.status()[0].last_error is not None)
        assert stale.status()[0].error_kind == "ahead"
        assert "rolled back" in (stale.status()[0].last_error or "")
    finally:
        stale.close(timeout=30)

    # none of it moved the witness: the honest log goes on being cosigned
    sig = submit(honest.note(), cosigned, honest.proof(cosigned, honest.size), w.url, w.vkey)
    assert Verifier.from_vkey(w.vkey).verify(parse_note(honest.note()).text, sig)


# -- what the protocol refuses ----------------------------------------------------------------


def test_signatures_origins_sizes_and_proofs_get_the_spec_status_codes(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    log = Log(log_key).grow(9)
    text = parse_note(log.note()).text

    def answer(old: int, proof: list[bytes], note: bytes) -> tuple[int, str, bytes]:
        return post(w.url, format_add_checkpoint(old, proof, note))

    impostor = Signer.generate(ORIGIN)  # the right name, another key: an unknown key
    assert answer(0, [], sign_note(text, [impostor]))[0] == 403
    real = parse_note(log.note()).signatures[0]
    broken = Signature(real.name, real.key_id, bytes(64))  # a trusted key ID, a bad signature
    assert answer(0, [], format_note(text, [broken]))[0] == 403
    stranger = Signer.generate("other.example/log")
    other = sign_note(Checkpoint("other.example/log", 1, bytes(32)).text, [stranger])
    assert answer(0, [], other)[0] == 404
    assert answer(12, [], log.note())[0] == 400  # old above the size
    assert post(w.url, b"old 0\n" + log.note())[0] == 400  # no blank line
    assert answer(0, [bytes(32)], log.note())[0] == 422  # a proof from 0
    bad_empty = sign_note(Checkpoint(ORIGIN, 0, bytes(32)).text, [log_key])
    assert answer(0, [], bad_empty)[0] == 422
    # none of the refusals moved it; the empty tree is cosigned, then the log
    empty = sign_note(Checkpoint(ORIGIN, 0, merkle.EMPTY_ROOT).text, [log_key])
    assert answer(0, [], empty)[0] == 200
    status, content_type, body = answer(3, [], log.note())
    assert (status, content_type, body) == (409, "text/x.tlog.size", b"0\n")
    status, _, body = answer(0, [], log.note())
    assert status == 200
    # the answer is note signature lines (tlog-witness), one cosignature/v1 (tlog-cosignature)
    lines = body.decode()
    assert lines.startswith("\u2014 witness.test/w ") and lines.count("\n") == 1
    raw = base64.b64decode(lines.split()[-1])
    verifier = Verifier.from_vkey(w.vkey)
    assert verifier.alg == ALG_COSIGNATURE_V1 and raw[:4] == verifier.key_id.to_bytes(4, "big")
    assert len(raw) == 4 + 8 + 64 and int.from_bytes(raw[4:12], "big") > 0
    # the signed message, spelled out as tlog-cosignature's "Ed25519 signed message" says
    message = f"cosignature/v1\ntime {int.from_bytes(raw[4:12], 'big')}\n{text}".encode()
    Ed25519PublicKey.from_public_bytes(verifier.public_key).verify(raw[12:], message)
    # a bad proof between non-empty trees, and equal sizes with another root
    log.grow(5)
    bad = log.proof(9, 14)
    bad[0] = bytes(32)
    assert answer(9, bad, log.note())[0] == 422
    other_root = sign_note(Checkpoint(ORIGIN, 9, bytes(32)).text, [log_key])
    assert answer(9, [], other_root)[0] == 422
    # signatures from unknown keys beside the log's are ignored, and not kept
    text14 = parse_note(log.note()).text
    mixed = format_note(text14, [impostor.sign(text14), log_key.sign(text14)])
    assert answer(9, log.proof(9, 14), mixed)[0] == 200
    # the monitoring endpoint serves it with the log's signature and the cosignature
    status, kept = get(w.url, f"/{origin_hash(ORIGIN)}/checkpoint")
    checkpoint, _, cosigs = open_checkpoint(kept, log_key.verifier, [verifier])
    assert status == 200 and checkpoint.size == 14 and len(cosigs) == 1
    assert [sig.name for sig in parse_note(kept).signatures] == [ORIGIN, "witness.test/w"]
    assert parse_note(kept).signatures[0].key_id == log_key.key_id
    assert get(w.url, f"/{origin_hash('other.example/log')}/checkpoint")[0] == 404


def test_the_c2sp_example_request_parses_and_its_unknown_origin_is_404(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    body = NOTES["copied"]["c2sp_add_checkpoint_example"]["body"].encode()
    assert post(w.url, body)[0] == 404  # parsed as far as its origin, which we do not know
    # the spec's example answer is signature lines too: read, and none is from our witness
    example = (
        "\u2014 witness.example/w1 CMp+6LWBU0anHGH5aNDTJkH/gj79sG+T6+iP2ThYN5krrDJbR1HDnucjL39QsZ"
        "TSvVjyQLrdk3DXDqI5G2HgLatVs0pWh6Up69HVOw==\n"
    )
    from archive_provider.witnesses.client import _cosignature

    text = parse_note(Log(log_key).grow(1).note()).text
    with pytest.raises(BadCosignature, match="no cosignature from"):
        _cosignature(text, example.encode(), Verifier.from_vkey(w.vkey))


def test_concurrent_submissions_from_one_old_size_cosign_exactly_one(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    """tlog-witness: the old-size check and the write are atomic (else a rollback race)."""
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    log = Log(log_key).grow(4)
    submit(log.note(), 0, [], w.url, w.vkey)
    log.grow(40)
    outcomes: list[str] = []

    def one(size: int) -> None:
        try:
            submit(log.note(size), 4, log.proof(4, size), w.url, w.vkey)
            outcomes.append("cosigned")
        except WitnessConflict:
            outcomes.append("409")

    threads = [threading.Thread(target=one, args=(size,)) for size in range(10, 44, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["409"] * (len(threads) - 1) + ["cosigned"]


def test_the_submitter_learns_the_witness_size_from_a_409_and_proves_from_it(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    """A log that does not know what a witness cosigned sends old 0; the 409 tells it."""
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    log = Log(log_key).grow(17)
    submit(log.note(), 0, [], w.url, w.vkey)  # cosigned earlier, e.g. by another process
    log.grow(100)
    asked: list[tuple[int, int]] = []

    def proof(old: int, new: int) -> list[bytes]:
        asked.append((old, new))
        return log.proof(old, new)

    got: list[int] = []
    submitter = WitnessSubmitter(
        [WitnessEndpoint(w.url, w.vkey)],
        lambda: (log.note(), proof),
        lambda endpoint, checkpoint, sig: got.append(checkpoint.size),
    )
    submitter.start()
    submitter.notify()
    try:
        wait_for("the cosignature", lambda: got == [117])
        assert asked == [(17, 117)]
        lag = submitter.status()[0]
        assert (lag.cosigned_size, lag.behind, lag.last_error) == (117, 0, None)
    finally:
        submitter.close(timeout=30)
    status, kept = get(w.url, f"/{origin_hash(ORIGIN)}/checkpoint")
    assert parse_checkpoint(parse_note(kept).text).size == 117


def test_a_witness_that_lost_its_state_is_caught_up_and_reported(
    tmp_path: Path,
    witnesses: Callable[..., WitnessProcess],
    log_key: Signer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    log = Log(log_key).grow(17)
    submit(log.note(), 0, [], w.url, w.vkey)
    w.stop()
    (tmp_path / "w" / "logs" / f"{origin_hash(ORIGIN)}.json").unlink()
    w = witnesses(tmp_path / "w", [log_key.vkey], port=w.port)
    log.grow(13)
    got: list[int] = []
    submitter = WitnessSubmitter(
        [WitnessEndpoint(w.url, w.vkey)],
        lambda: (log.note(), log.proof),
        lambda endpoint, checkpoint, sig: got.append(checkpoint.size),
        known_sizes={w.vkey: 17},
    )
    with caplog.at_level("WARNING", logger="archive_provider.witnesses.client"):
        submitter.start()
        submitter.notify()
        try:
            wait_for("the cosignature", lambda: got == [30])
        finally:
            submitter.close(timeout=30)
    assert "had cosigned size 17 and now has 0" in caplog.text


def test_client_errors_are_typed(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    log = Log(log_key).grow(2)
    wrong = Signer.generate("witness.test/w", ALG_COSIGNATURE_V1).vkey  # same name, other key
    with pytest.raises(BadCosignature, match="no cosignature from"):
        submit(log.note(), 0, [], w.url, wrong)
    w.stop()
    with pytest.raises(WitnessUnreachable):
        submit(log.note(), 2, [], w.url, w.vkey, timeout=5)


# -- bounds and the witness's own files ---------------------------------------------------------


def test_oversize_and_unframed_requests_are_refused_without_reading_them(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    log = Log(log_key).grow(3)
    big = format_add_checkpoint(0, [], log.note()) + b"x" * (64 * 1024)
    assert post(w.url, big)[0] == 413
    # a claimed length is refused before any body is sent
    host, port = w.url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", "/add-checkpoint")
    connection.putheader("Content-Length", str(10**9))
    connection.endheaders()
    assert connection.getresponse().status == 413
    connection.close()
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/add-checkpoint", body=iter([b"old 0\n"]))  # chunked
    assert connection.getresponse().status == 411
    connection.close()
    # and it still serves honest requests
    submit(log.note(), 0, [], w.url, w.vkey)


def test_a_request_that_never_finishes_is_cut_off(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    """A slow sender (half a body, half a header) cannot hold a connection for ever."""
    import socket

    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    stalled = [
        b"POST /add-checkpoint HTTP/1.1\r\nHost: w\r\nContent-Length: 100\r\n\r\nold 0\n",
        b"POST /add-checkpoint HTTP/1.1\r\nHost: w\r\nContent-Le",
    ]
    sockets = [socket.create_connection(("127.0.0.1", w.port), timeout=START_TIMEOUT_S)]
    sockets.append(socket.create_connection(("127.0.0.1", w.port), timeout=START_TIMEOUT_S))
    trickle = socket.create_connection(("127.0.0.1", w.port), timeout=START_TIMEOUT_S)
    sockets.append(trickle)
    stop = threading.Event()

    def drip() -> None:  # a byte a second: each read is quick, the request never ends
        trickle.sendall(b"POST /add-checkpoint HTTP/1.1\r\nX-Slow: ")
        while not stop.wait(1.0):
            try:
                trickle.sendall(b"a")
            except OSError:
                return

    dripping = threading.Thread(target=drip, daemon=True)
    try:
        for sock, data in zip(sockets[:2], stalled, strict=True):
            sock.sendall(data)
        dripping.start()
        for sock in sockets:
            received = b""
            while chunk := sock.recv(4096):  # the witness closes it: recv returns b""
                received += chunk
            assert b"200" not in received.split(b"\r\n", 1)[0]
    finally:
        stop.set()
        for sock in sockets:
            sock.close()
    log = Log(log_key).grow(1)
    submit(log.note(), 0, [], w.url, w.vkey)


def test_a_state_folder_owned_by_another_user_is_refused(tmp_path: Path, log_key: Signer) -> None:
    state = tmp_path / "w"
    keygen(state, "witness.test/w")
    if os.geteuid() == 0:
        os.chown(state, 65534, 65534)
        owner = 65534
    else:  # a user cannot give a folder away; a root-owned one stands in for "another user's"
        state, owner = Path("/var"), 0
    done = run_cli("witness", "serve", "--state", str(state), "--log-key", log_key.vkey)
    assert done.returncode == 1 and f"owned by uid {owner}," in done.stderr


def test_unsafe_witness_folders_and_files_are_refused(tmp_path: Path, log_key: Signer) -> None:
    state = tmp_path / "w"
    keygen(state, "witness.test/w")
    serve = ("witness", "serve", "--listen", "127.0.0.1:0", "--log-key", log_key.vkey)

    def refused(folder: Path, words: str) -> None:
        done = run_cli(*serve, "--state", str(folder), timeout=START_TIMEOUT_S)
        assert done.returncode == 1, done.stderr
        assert words in done.stderr and "Traceback" not in done.stderr

    state.chmod(0o777)
    refused(state, "writable by others")
    state.chmod(0o770)
    refused(state, "writable by others")
    state.chmod(0o700)
    (state / "witness.key").chmod(0o644)
    refused(state, "mode 0600")
    (state / "witness.key").chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(state)
    refused(link, "symlink")
    archive = tmp_path / "home" / "archive"
    archive.mkdir(parents=True, mode=0o700)
    (archive / "events.db").write_bytes(b"")
    keygen_inside = run_cli("witness", "keygen", "--state", str(archive / "w"), "--name", "x/y")
    assert keygen_inside.returncode == 1 and "inside the archive folder" in keygen_inside.stderr
    again = run_cli("witness", "keygen", "--state", str(state), "--name", "witness.test/w")
    assert again.returncode == 1 and "already exists" in again.stderr
    # a state file that is a symlink (to another log's state, say) is never followed
    logs = state / "logs"
    logs.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (logs / f"{origin_hash(ORIGIN)}.json").symlink_to(elsewhere)
    refused(state, "symlink")
    (logs / f"{origin_hash(ORIGIN)}.json").unlink()
    (logs / f"{origin_hash(ORIGIN)}.json").write_text('{"format": 1}')
    (logs / f"{origin_hash(ORIGIN)}.json").chmod(0o600)
    refused(state, "unreadable")


def test_serve_and_keygen_usage_errors_exit_2(tmp_path: Path, log_key: Signer) -> None:
    state = str(tmp_path / "w")
    for args, words in [
        (("witness", "serve", "--log-key", log_key.vkey), "needs --state"),
        (("witness", "keygen"), "needs --state"),
        (("witness", "serve", "--state", state), "at least one --log-key"),
        (("witness", "serve", "--state", state, "--log-key", log_key.vkey, "--listen", "x"), "HOST:PORT"),
    ]:  # fmt: skip
        done = run_cli(*args, timeout=START_TIMEOUT_S)
        assert done.returncode == 2 and words in done.stderr, (args, done.stderr)
    keygen(tmp_path / "w", "witness.test/w")
    bad_key = run_cli("witness", "serve", "--state", state, "--log-key", "not-a-key")
    assert bad_key.returncode == 1 and "verifier key" in bad_key.stderr
    cosigner = Signer.generate("log.example/x", ALG_COSIGNATURE_V1).vkey
    not_a_log = run_cli("witness", "serve", "--state", state, "--log-key", cosigner)
    assert not_a_log.returncode == 1 and "not an Ed25519 key" in not_a_log.stderr


def test_a_second_process_cannot_serve_the_same_state(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    keygen(tmp_path / "w", "witness.test/w")
    witnesses(tmp_path / "w", [log_key.vkey])
    done = run_cli(
        "witness", "serve", "--listen", "127.0.0.1:0", "--state", str(tmp_path / "w"),
        "--log-key", log_key.vkey,
    )  # fmt: skip
    assert done.returncode == 1 and "another witness process" in done.stderr


def test_the_cosigned_state_is_a_private_file_written_before_the_answer(
    tmp_path: Path, witnesses: Callable[..., WitnessProcess], log_key: Signer
) -> None:
    keygen(tmp_path / "w", "witness.test/w")
    w = witnesses(tmp_path / "w", [log_key.vkey])
    log = Log(log_key).grow(6)
    submit(log.note(), 0, [], w.url, w.vkey)
    w.kill()  # no clean shutdown: what was answered must already be on disk
    path = tmp_path / "w" / "logs" / f"{origin_hash(ORIGIN)}.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "w").stat().st_mode & 0o777 == 0o700
    record = json.loads(path.read_text())
    assert (record["origin"], record["size"]) == (ORIGIN, 6)
    assert parse_checkpoint(parse_note(record["checkpoint"]).text).root == log.root(6)
