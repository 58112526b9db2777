"""Which projections an archive keeps: the built-in ones, then those other packages register.

A package built on the archive (``hivemind`` keeps its peers this way) registers a
projection class under the entry point group :data:`GROUP`; core code never imports it,
yet every open, catch-up and ``replay`` applies it (docs/DESIGN.md, "Layers").
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from .base import TableProjection
from .builtin import (
    CheckpointsProjection,
    MemoryProjection,
    RecallProjection,
    RecallsServedProjection,
    SessionsProjection,
)
from .runner import ProjectionSet

GROUP = "hermes_archive.projections"


@cache
def registered() -> tuple[type[TableProjection], ...]:
    """The projection classes other installed packages register, by entry point name."""
    found = sorted(entry_points(group=GROUP), key=lambda point: point.name)
    classes = tuple(point.load() for point in found)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, TableProjection)):
            raise TypeError(f"{GROUP} entry point {cls!r} is not a TableProjection subclass")
    return classes


def default_projections() -> ProjectionSet:
    """Every projection the archive keeps, in the order they are applied."""
    return ProjectionSet(
        [
            SessionsProjection(),
            MemoryProjection(),
            RecallProjection(),
            CheckpointsProjection(),
            RecallsServedProjection(),
            *(cls() for cls in registered()),
        ]
    )
