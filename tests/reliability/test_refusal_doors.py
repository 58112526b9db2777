"""Issue 29 point 5: every door honours a refusal.

The attacker copies a profile (a second ``HERMES_HOME``): the provider refuses the copy
("witness missing"), so no command may append to it and sign a second history of the store.
Each test here failed on the code of the issue's filing.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from archive_provider.host.provider import ArchiveProvider, CheckpointError

from .conftest import events
from .test_attacks import build, cli
from .test_faults import EVIDENCE

#: each command that appends to the log, as an operator would run it on the copy
WRITES = (
    ("forget", "--session", "s1", "--reason", "r", "--yes"),
    ("retention", "set", "--days", "400", "--reason", "r", "--yes"),
    ("retention", "apply", "--yes"),
    ("hold", "add", "--session", "s1", "--reason", "r"),
    ("witness", "add", "https://w.example/", "w+00000000+AAAA", "--reason", "r"),
)


def test_a_refused_copy_takes_no_write_from_any_command(
    tmp_path: Path, home: Path, providers: Callable[..., ArchiveProvider]
) -> None:
    first = providers()
    build(first, "early")
    first.shutdown()
    copy = tmp_path / "copy"
    shutil.copytree(home, copy)
    provider = providers(copy)
    with pytest.raises(CheckpointError, match="witness missing"):
        provider.on_pre_compress(EVIDENCE, require_checkpoint=True)
    assert provider.core.writer is not None
    refused = provider.core.writer.refused
    assert refused is not None and "witness missing" in refused
    provider.shutdown()
    before = [(e.seq, e.type) for e in events(copy)]

    for command in WRITES:
        done = cli(copy, *command)
        assert done.returncode == 1, command
        assert refused in done.stderr + done.stdout, command  # the provider's words
    assert [(e.seq, e.type) for e in events(copy)] == before  # nothing appended, nothing signed

    status = cli(copy, "status")
    assert status.returncode == 1 and "Witness: REFUSED: witness missing" in status.stdout
    assert cli(home, "status").returncode == 0  # the original is not refused
