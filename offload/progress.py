"""Progress bars (tqdm) for the waits a user would otherwise sit through without output:
zero.Init's shards written to NVMe, start-up writes to NVMe swap files, checkpoint loads into
them, and the first step with state on NVMe.

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


class FirstStepProgress:
    """The first optimizer step with state on NVMe reads every unit and all the optimizer state
    from disk (tens of seconds for a billion parameters) before anything else is printed: a
    bar that names each phase of it as it starts (forward, backward, step; every micro-batch
    of the first accumulation window) with the time so far, closed when the first optimizer
    step ends."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar: tqdm | None = None

    def entering(self, phase: str) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            self._bar = tqdm(desc="zero: first step (state on NVMe)", unit=" phases",
                             disable=not interactive(), delay=DELAY_SECONDS, file=sys.stderr)
        self._bar.set_postfix_str(phase)  # redrawn: a phase can take a minute

    def left(self, phase: str, optimizer_stepped: bool) -> None:
        if self._bar is None:
            return
        self._bar.update(1)
        if optimizer_stepped:
            self._bar.close()
            self._bar, self.enabled = None, False
