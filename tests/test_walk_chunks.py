"""The background walk verifies in chunks and sleeps between them (proof_v2.WALK_CHUNK), so
a host thread is not held off the GIL for a whole slice. Chunking must change nothing the
walk decides: damage inside a chunk is named at its seq, and a walk stopped inside a slice
records only the progress of the last whole slice (what a later walk may resume from).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from archive_provider.format import merkle
from archive_provider.storage import proof_v2
from archive_provider.storage.writer import Writer

from .test_witness_v2 import _archive, _crash_append, _edit_turn_text, _raw, _session


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 4 events in chunks of 2, so a dozen events cross every boundary."""
    monkeypatch.setattr(proof_v2, "WALK_SLICE", 4)
    monkeypatch.setattr(proof_v2, "WALK_CHUNK", 2)
    monkeypatch.setattr(proof_v2, "WALK_PAUSE_S", 0.0)


@pytest.mark.usefixtures("small_slices")
def test_damage_inside_a_chunk_is_named_at_its_seq(tmp_path: Path) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 12))
    _crash_append(folder, range(12, 14))
    _edit_turn_text(folder, 7)  # the second chunk of the second slice
    writer = Writer(folder, witness=witness)
    writer.flush(30)
    walk = writer._walk
    assert walk is not None and walk.wait(60)
    assert walk.state.first_bad_seq == 7
    assert writer.refused is not None and "background walk" in writer.refused
    writer.close()


@pytest.mark.usefixtures("small_slices")
def test_a_walk_stopped_inside_a_slice_keeps_the_last_whole_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, witness = _archive(tmp_path)
    _session(folder, witness, range(1, 12))
    _crash_append(folder, range(12, 14))
    monkeypatch.setattr(proof_v2, "WALK_YIELD_S", 1.0)  # a slice: chunk, 1 s sleep, chunk
    writer = Writer(folder, witness=witness)
    writer.flush(30)
    walk = writer._walk
    assert walk is not None
    deadline = time.monotonic() + 30
    while walk.state.done < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # the first chunk of the second slice is verified, then it sleeps
    writer.close()
    assert walk.wait(5) and not walk.state.complete
    record = witness.read()
    assert record is not None and record.walked is not None
    assert record.walked["size"] == 4 and not record.walked["complete"]
    conn = _raw(folder)
    try:
        tiles = merkle.TileReader(proof_v2.BackgroundWalk._read_tile(None, conn), 4)  # type: ignore[arg-type]
        assert record.walked["root"] == merkle.root(4, tiles).hex()  # resumable as saved
    finally:
        conn.close()
    monkeypatch.setattr(proof_v2, "WALK_YIELD_S", 0.0)
    _crash_append(folder, range(14, 15))
    again = Writer(folder, witness=witness)
    again.flush(30)
    resumed = again._walk
    assert resumed is not None and resumed.wait(60) and resumed.state.complete
    assert again.refused is None
    again.close()
