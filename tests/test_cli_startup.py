"""Every ``hermes-archive`` call (and hermes building ``hermes archive``) builds the whole
parser, so building it must not load the store, the verifier, the projections or the
libraries behind them: those load when a command runs (bench row 9 times the difference).
"""

from __future__ import annotations

import json
import subprocess
import sys

#: what the parser must not need: each costs milliseconds of every call
HEAVY = (
    "archive_provider.storage.store",
    "archive_provider.format.verifier",
    "archive_provider.format.signed_note",
    "archive_provider.projections.registry",
    "archive_provider.audit.erasure",
    "archive_provider.fleet.central",
    "cryptography",
    "zipfile",
    "importlib.metadata",
)

PROBE = """
import json, sys
from archive_provider.cli import build_parser, register_cli
import argparse
build_parser().format_help()
register_cli(argparse.ArgumentParser(prog="hermes").add_subparsers().add_parser("archive"))
print(json.dumps(sorted(sys.modules)))
"""


def test_building_the_parser_loads_no_heavy_module() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = set(json.loads(done.stdout))
    assert "archive_provider.commands.status" in loaded  # the probe did build every command
    assert sorted(name for name in HEAVY if name in loaded) == []
