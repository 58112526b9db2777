"""``python -m bench.hostile``: hostile inputs cost time linear in their size (issue 22).

Each line times one hostile input at two sizes, ten times apart, and prints the ratio of the
times: about 10 means linear, about 100 quadratic. Not part of the main table (no target
for the project to beat); run it after changing the redaction patterns or the verifier.
"""

from __future__ import annotations

import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from archive_provider.domain.redaction import scan_text
from archive_provider.format.verifier import seal_comment, verify_bundle


def _seconds(work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def _duplicates(folder: Path, members: int) -> Callable[[], object]:
    """A bundle of ``members`` distinct names followed by one duplicate (zipfile warns)."""
    path = folder / f"dup-{members}.zip"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(path, "w") as archive:
            for n in range(members):
                archive.writestr(f"payloads/{n:064x}", b"")
            archive.writestr("payloads/" + "0" * 64, b"")
            archive.comment = seal_comment("0" * 64)  # seal-shaped, so the directory is read
    return lambda: verify_bundle(path)


def _redaction(size: int) -> list[Callable[[], object]]:
    shapes = [
        "PASSWORD" * (size // 8),
        "-----BEGIN PRIVATE KEY-----\n" + "A" * size,
        "eyJ" + "a" * size,
        "Authorization: " * (size // 15),
        "redis://" + ":" * size,
        "x" * size + "=",
    ]
    return [lambda text=text: scan_text(text) for text in shapes]


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        small, large = _seconds(_duplicates(folder, 8_000)), _seconds(_duplicates(folder, 80_000))
        print(f"duplicate members 8k -> 80k: {small:.3f}s -> {large:.3f}s, x{large / small:.1f}")
    for small_work, large_work, name in zip(
        _redaction(100_000),
        _redaction(1_000_000),
        ["PASSWORD runs", "cut PEM body", "eyJ run", "header runs", "url colons", "long name="],
        strict=True,
    ):
        small, large = _seconds(small_work), _seconds(large_work)
        print(
            f"redaction {name} 100 kB -> 1 MB: {small:.3f}s -> {large:.3f}s, x{large / small:.1f}"
        )


if __name__ == "__main__":
    main()
