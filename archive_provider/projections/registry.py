"""Which projections an archive keeps: the built-in ones, then those other packages register.

A package built on the archive (``hivemind`` keeps its peers this way) registers a
projection class under the entry point group :data:`GROUP`; core code never imports it.
Its own provider creates it; from then on every open given the connection, catch-up and
``replay`` of that archive applies it (docs/DESIGN.md, "Layers").
"""

from __future__ import annotations

import sqlite3
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


def default_projections(conn: sqlite3.Connection | None = None) -> ProjectionSet:
    """Every projection the archive keeps, in the order they are applied.

    The built-in set; with ``conn``, also each registered projection that archive already
    keeps (its row in projection_state). Only the package that registers one creates it
    (hivemind's provider adds its peers): a plain archive carries no peer tables, and
    replay and ``verify --projections`` keep what an archive has.
    """
    projections = ProjectionSet(
        [
            SessionsProjection(),
            MemoryProjection(),
            RecallProjection(),
            CheckpointsProjection(),
            RecallsServedProjection(),
        ]
    )
    if conn is not None:
        projections.extend(cls() for cls in registered() if _kept(conn, cls.name))
    return projections


def _kept(conn: sqlite3.Connection, name: str) -> bool:
    """Whether the archive holds the projection ``name`` (its row in projection_state)."""
    try:
        row = conn.execute("SELECT 1 FROM projection_state WHERE name = ?", (name,)).fetchone()
    except sqlite3.OperationalError:  # no projection was ever created here
        return False
    return row is not None
