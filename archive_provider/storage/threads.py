"""The threads of the storage layer: one factory type, one fallback factory.

Kept apart from the writer so the remote witnesses' submitter (a layer above) runs on the
same factory without importing the writer.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

ThreadFactory = Callable[..., threading.Thread]


def context_thread(
    target: Callable[[], None], *, name: str, daemon: bool = True
) -> threading.Thread:
    """An unstarted thread that runs ``target`` in a copy of the caller's contextvars.

    The fallback for hosts without ``agent.memory_provider.spawn_context_thread`` (0.19.0).
    """
    context = contextvars.copy_context()
    return threading.Thread(target=context.run, args=(target,), name=name, daemon=daemon)
