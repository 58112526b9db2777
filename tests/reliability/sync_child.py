"""Child process for the folder-fsync tests (run under ``fiu-run -x``, not collected).

``sync_child.py ERRNO FOLDER``: ``sync_dir(FOLDER)`` with every fsync failing with ERRNO.
``sync_child.py ERRNO HOME OUT``: ``export OUT`` of the archive in HOME with the fsync
failing once OUT is in place (only the fsync of its folder comes after the rename).
Prints what came of it as JSON: ``{"error": errno name, export error or null, "exists": OUT
is there}``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import sys
from pathlib import Path

from archive_provider.errors import ArchiveError
from archive_provider.storage.safe_files import sync_dir

POINT = b"posix/io/sync/fsync"
#: libfiu's external callback: (name, failnum*, failinfo*, flags*) -> nonzero to fail
CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_uint),
)


def main(code: str, *paths: str) -> None:
    number = getattr(errno, code)
    libfiu = ctypes.CDLL("libfiu.so.0")
    out = Path(paths[-1])
    # libfiu sets errno to failinfo; the Python binding cannot pass a number as failinfo
    when = CALLBACK(lambda *_: int(len(paths) == 1 or out.exists()))
    libfiu.fiu_enable_external.argtypes = [
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_uint,
        CALLBACK,
    ]
    error = None
    try:
        if len(paths) == 1:
            assert libfiu.fiu_enable_external(POINT, 1, number, 0, when) == 0
            sync_dir(out)
        else:
            from archive_provider.audit.export import Selection, export_bundle
            from archive_provider.storage.store import EventStore

            store = EventStore.open(Path(paths[0]))
            try:
                assert libfiu.fiu_enable_external(POINT, 1, number, 0, when) == 0
                export_bundle(store, out, Selection())
            finally:
                libfiu.fiu_disable(POINT)
                store.close()
    except OSError as exc:
        error = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    except ArchiveError as exc:  # the export's own error, saying what happened
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"error": error, "exists": out.exists()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
