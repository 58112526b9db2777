"""Opening files an attacker may have swapped: regular files only, read with a bound.

The archive's own small files (``payload.key``, the witness) and ``events.db`` sit in folders
someone else may be able to write (issue 22 points 4, 5, 12): a symlink to another
profile's store, ``/dev/zero`` in place of the key, a FIFO in place of the database, a
witness folder another user created world-writable. Each check here says what it found in
one line, so the caller can refuse with that message.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path

#: the largest payload.key / witness file read (a key is 65 bytes, a witness under 2 KiB)
SMALL_FILE_LIMIT = 64 * 1024


class UnsafeFile(OSError):
    """A file or folder is not what the archive may trust; the message says what and why."""


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` may not be opened as an archive file (symlink, FIFO, device), or None.

    A missing file is not a problem here (the caller decides what missing means).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return (
            f"{path} is a symbolic link (to {os.readlink(path)}); the archive opens only its "
            "own regular files, so a link cannot point it at another profile's store. Replace "
            "the link with the file itself"
        )
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file (a FIFO, device or folder); move it aside"
    return None


def check_regular(path: Path) -> None:
    """Raise :class:`UnsafeFile` unless ``path`` is a regular file or missing."""
    problem = regular_file_problem(path)
    if problem:
        raise UnsafeFile(errno.EINVAL, problem)


def read_small(path: Path, limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` (more is an error, not a hang).

    Opened without following a link and without blocking (a FIFO would block the open),
    then checked to be a regular file on the open descriptor.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            check_regular(path)  # names the link
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(errno.EINVAL, f"{path} is not a regular file; move it aside")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise UnsafeFile(
                    errno.EFBIG, f"{path} is larger than {limit} bytes; it is not an archive file"
                )
        return b"".join(chunks)
    finally:
        os.close(fd)


#: what fsync of a folder says where the file system cannot sync one (nothing to make durable)
NO_DIR_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})


def sync_dir(folder: Path) -> None:
    """Make a change to ``folder``'s entries (a new, moved or removed file) durable.

    A file system that cannot fsync a folder (:data:`NO_DIR_FSYNC`) is let pass; any other
    failure (an I/O error) is raised, so no caller says durable what the disk refused.
    """
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in NO_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


def write_private_file(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Put ``data`` at ``path`` whole or not at all, readable by its owner only, and durable:
    a new file fsynced, renamed over ``path``, then the folder fsynced. A witness record, a
    key, a report or a proof is never found half-written after a crash.

    ``exclusive`` refuses to replace an existing file (:class:`FileExistsError`: a key is
    never overwritten).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            os.link(tmp, path)  # fails if the file exists, unlike rename
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_dir(path.parent)


def place_file(source: Path, target: Path) -> None:
    """Give the whole, fsynced file ``source`` the name ``target`` too, atomically, never over
    an existing file (:class:`FileExistsError`): a reader finds all of it or nothing.

    A hard link where both are on one file system; elsewhere (a signing key kept on another
    disk) a copy made under a name no one reads, fsynced, then linked into place.
    """
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        making = target.with_name(f".{target.name}.{os.getpid()}.new")
        with contextlib.suppress(FileNotFoundError):
            making.unlink()
        fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            data = read_small(source)
            if os.write(fd, data) != len(data):
                raise OSError(errno.EIO, f"short write to {making}") from None
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(making, target)
        finally:
            making.unlink()
    sync_dir(target.parent)


def folder_problem(path: Path, uid: int | None = None) -> str | None:
    """Why existing folder ``path`` may not be trusted, or None when it may (or is missing).

    Trusted means: a folder (a link is judged by its target) owned by ``uid`` (the current
    user by default) and writable by nobody else (no group or other write bit): otherwise
    another user could delete or replace what the archive keeps there.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    owner = os.geteuid() if uid is None else uid
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != owner:
        return (
            f"{path} is owned by uid {st.st_uid}, not by this user (uid {owner}): another user "
            "could delete or replace its files. Remove it (or `chown` it to this user) and "
            "let the archive create it again"
        )
    if st.st_mode & 0o022:
        return (
            f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): another user "
            f"could delete or replace its files. Run `chmod 700 {path}`"
        )
    return None
