"""One root for what the archive raises, and one reading of what SQLite's failures mean.

Every error the package raises is an :class:`ArchiveError`; its direct subclasses say what
the caller can do about it (fix the request, retry later, fix access to the files, restore
a damaged archive, reopen). Errors of one subsystem (``StoreError``, ``ExportError``...)
subclass one of these, so a caller catches by what it can do, or by where it happened.

This module is the bottom of the package (docs/DESIGN.md, "Layers"): it imports nothing of
it, and every layer may import it. The standalone verifier is the one exception to the
root: it imports nothing of the package, so its ``BundleError`` stands alone.
"""

from __future__ import annotations

import enum
import errno
import sqlite3


class ArchiveError(Exception):
    """Something the archive could not do; the message says what, and what to do."""


class InvalidRequest(ArchiveError, ValueError):
    """What was asked or given is not valid: change it and ask again (retrying won't help)."""


class UsageError(InvalidRequest):
    """A command was called wrongly (exit code 2)."""


class ArchiveBusy(ArchiveError):
    """Another connection holds the archive: retry later; nothing is damaged."""


class ArchiveNotWritable(ArchiveError):
    """The files cannot be read or written here (permissions, read-only mount, full disk)."""


class ArchiveDamaged(ArchiveError):
    """The archive fails a check: restore it from backup; ``verify`` names the first bad event."""


class ArchiveUnavailable(ArchiveError):
    """The archive cannot take this work now; what it already accepted is kept."""


class Failure(enum.Enum):
    """What an SQLite or OS failure means for the caller."""

    FULL = "full"  # free disk space
    NOT_WRITABLE = "not_writable"  # permissions, read-only mount or file
    BUSY = "busy"  # another connection holds a lock: wait
    CORRUPT = "corrupt"  # the file is not a sound database: restore it


_BY_CODE = {
    "SQLITE_FULL": Failure.FULL,
    "SQLITE_READONLY": Failure.NOT_WRITABLE,
    "SQLITE_CANTOPEN": Failure.NOT_WRITABLE,
    "SQLITE_PERM": Failure.NOT_WRITABLE,
    "SQLITE_AUTH": Failure.NOT_WRITABLE,
    "SQLITE_BUSY": Failure.BUSY,
    "SQLITE_LOCKED": Failure.BUSY,
    "SQLITE_CORRUPT": Failure.CORRUPT,
    "SQLITE_NOTADB": Failure.CORRUPT,
}
_BY_ERRNO = {
    errno.ENOSPC: Failure.FULL,
    errno.EROFS: Failure.NOT_WRITABLE,
    errno.EACCES: Failure.NOT_WRITABLE,
    errno.EPERM: Failure.NOT_WRITABLE,
}
_BY_TEXT = (  # the fallback when SQLite's own code is not there (Python < 3.11, or rebuilt)
    (("disk is full",), Failure.FULL),
    (("readonly", "read-only", "unable to open database file"), Failure.NOT_WRITABLE),
    (("locked", "busy"), Failure.BUSY),
    (("not a database", "malformed", "corrupt"), Failure.CORRUPT),
)


def classify(exc: BaseException) -> Failure | None:
    """What ``exc`` (or the SQLite/OS error it wraps) means; None when it is none of these.

    SQLite's result code (``sqlite_errorname``, Python 3.11+) decides where it is there; the
    message text is read only when it is not. An archive error raised *from* an SQLite
    error is classified by its cause.
    """
    if isinstance(exc, ArchiveError) and exc.__cause__ is not None:
        exc = exc.__cause__
    name = getattr(exc, "sqlite_errorname", None)
    if isinstance(exc, sqlite3.Error) and isinstance(name, str):
        primary = "_".join(name.split("_")[:2])  # SQLITE_READONLY_DBMOVED -> SQLITE_READONLY
        return _BY_CODE.get(primary)
    code = getattr(exc, "errno", None)
    if code in _BY_ERRNO:
        return _BY_ERRNO[code]
    lowered = str(exc).lower()
    for words, failure in _BY_TEXT:
        if any(word in lowered for word in words):
            return failure
    return None
