"""NVMe swap files must not outlive a run: the C++ store removes its file when the engine
goes, and engines still alive at interpreter exit are destroyed here (objects alive at exit
are not guaranteed to be)."""
from __future__ import annotations

import atexit
import weakref

_LIVE = weakref.WeakSet()


def remove_at_exit(engine) -> None:
    """Destroys `engine` at interpreter exit if it is still alive then."""
    _LIVE.add(engine)


@atexit.register
def _destroy_live_engines() -> None:
    for engine in list(_LIVE):
        engine.destroy()
