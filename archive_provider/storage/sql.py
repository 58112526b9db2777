"""Binding a long ``IN (...)`` list: the one way every layer slices one into statements.

SQLite caps the parameters one statement binds (999 before 3.32), and an erasure or a
projection's ``forget`` may name any number of seqs or digests.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

#: values bound in one statement at most
IN_CHUNK = 500


def in_chunks(values: Iterable[Any]) -> Iterator[tuple[str, list[Any]]]:
    """``values`` sorted, in slices small enough to bind in one statement, each with its
    placeholders (``"?, ?, ?"``) to put between the parentheses of ``IN (...)``."""
    items = sorted(values)
    for start in range(0, len(items), IN_CHUNK):
        chunk = items[start : start + IN_CHUNK]
        yield ", ".join("?" * len(chunk)), chunk


def select_in(
    conn: sqlite3.Connection | sqlite3.Cursor, sql: str, values: Iterable[Any]
) -> Iterator[Any]:
    """The rows of ``sql`` for every slice of ``values``, its ``{}`` standing for the
    placeholders (``... WHERE seq IN ({})``); read lazily, a slice at a time (on a cursor
    of its own when given one, beside another statement still being read)."""
    for marks, chunk in in_chunks(values):
        yield from conn.execute(sql.format(marks), chunk)
