"""Progress bars (tqdm) for the waits a user would otherwise sit through without output:
start-up writes to NVMe swap files, checkpoint loads into them.

A bar is shown on rank 0 only, only when its output reaches a terminal (stderr is one, or the
zero launcher says its console is one; a rank's stderr is then a pipe to the launcher, which
passes the bar's redraws through), and only after DELAY_SECONDS, so short waits stay quiet.
"""
from __future__ import annotations

import contextlib
import os
import sys

from tqdm import tqdm

from zero.launcher.env import CONSOLE_IS_TTY

DELAY_SECONDS = 2.0


def interactive() -> bool:
    """Whether this process may draw a bar: rank 0, with a terminal at the end of stderr."""
    if os.environ.get("RANK", "0") != "0":
        return False
    return os.environ.get(CONSOLE_IS_TTY) == "1" or sys.stderr.isatty()


class SwapWriteProgress:
    """Counts the bytes the C++ engine writes to its swap files (its `on_swap_write`
    callback) and draws them while a phase that writes them runs."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar: tqdm | None = None

    def add(self, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.update(nbytes)

    @contextlib.contextmanager
    def shown(self, what: str):
        if not self.enabled:
            yield
            return
        self._bar = tqdm(desc=what, unit="B", unit_scale=True, unit_divisor=1024,
                         disable=not interactive(), delay=DELAY_SECONDS, file=sys.stderr)
        try:
            yield
        finally:
            bar, self._bar = self._bar, None
            bar.close()
