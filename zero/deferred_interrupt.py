"""Ctrl-C held back across a block that must finish whole (the optimizer step and its counters).

An interrupt landing between the C++ update and the Python counters after it left a checkpoint
saved on Ctrl-C with weights and moments one step ahead of `global_steps` and the scheduler:
its resume was not the training it came from. Inside `deferred()` SIGINT is noted; it is
delivered as the block ends, to whatever handler was installed. Only the main thread can
install a handler; elsewhere the block runs as it is.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading


@contextlib.contextmanager
def deferred():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is None:  # a handler installed outside Python: kept
        yield
        return
    noted = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: noted.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if noted:
            if callable(previous):  # Python's default raises KeyboardInterrupt here
                previous(signal.SIGINT, noted[0])
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)
