"""Run a set of processes as one job: fail fast, lose nothing.

Each worker runs in its own session (``start_new_session=True``), so its pid
is also its process-group id and ``killpg`` reaches everything it spawned.
Processes are only ever signalled by the ids we started; nothing is killed by
name or pattern.

* Every line a worker prints goes to the console (optionally prefixed, e.g.
  ``[rank 3] ``) and to the worker's log file; a line ended by a carriage
  return (a progress bar's redraw) is passed on at once.
* When a worker exits non-zero or dies from a signal, every other worker gets
  SIGTERM, then SIGKILL after ``grace`` seconds; the supervisor reports the
  worker, its exit code or signal, and the last lines of its log.
* When the supervisor itself gets SIGINT/SIGTERM/SIGHUP it forwards the
  signal to every worker (SIGKILL after ``grace``) and returns 128 + signal.
* When the supervisor is killed outright (SIGKILL, OOM killer), the kernel
  SIGKILLs every worker (Linux's parent-death signal, ``die_with_parent``).
  What a worker itself started is reached only through the worker.
"""

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque

FAILURE_MARKER = "[zero.launch] FAILED:"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_SECONDS = 0.05
TAIL_LINES = 20
PR_SET_PDEATHSIG = 1   # <linux/prctl.h>
_LINE_ENDS = re.compile(rb"[\r\n]")

_console_lock = threading.Lock()


class LaunchError(RuntimeError):
    """A worker could not be started at all."""


class Worker:
    """One process to run: a label for messages, its argv, env and log file."""

    def __init__(self, label, argv, env, log_path, prefix="", stdin=None):
        self.label, self.argv, self.env = label, list(argv), env
        self.log_path, self.prefix, self.stdin = log_path, prefix.encode(), stdin
        self.proc = None
        self._pumps, self._log, self._log_lock = [], None, threading.Lock()

    def start(self, on_line):
        self._log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=self.stdin,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True,
                                         preexec_fn=die_with_parent())
        except OSError as e:
            self._log.close()
            raise LaunchError(f"cannot start {self.label}: {self.argv[0]}: {e.strerror}") from e
        for stream, console in ((self.proc.stdout, sys.stdout), (self.proc.stderr, sys.stderr)):
            pump = threading.Thread(target=self._pump, args=(stream, console, on_line), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def _pump(self, stream, console, on_line):
        at_line_start = True
        for piece in _pieces(stream):
            with self._log_lock:
                self._log.write(piece)
                self._log.flush()
            _write_console(console, (self.prefix if at_line_start else b"") + piece)
            at_line_start = piece.endswith((b"\n", b"\r"))
            if piece.endswith(b"\n"):
                on_line(self, piece)
        stream.close()

    def signal_group(self, signum):
        """Signal this worker's whole process group; quiet if it is gone."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self, timeout=5.0):
        """Wait for the output pumps, then close the log."""
        for pump in self._pumps:
            pump.join(timeout)
        if self._log:
            with self._log_lock:
                self._log.close()


def _pieces(stream, size=65536):
    """What a process writes, cut after every \\n and \\r: whole lines, and a progress bar's
    redraw (which ends in \\r) passed on at once instead of when its line ends. Whatever
    follows the last of them comes at EOF."""
    pending = b""
    while data := stream.read1(size):
        pending += data
        start = 0
        for end in _LINE_ENDS.finditer(pending):
            yield pending[start:end.end()]
            start = end.end()
        pending = pending[start:]
    if pending:
        yield pending


def die_with_parent():
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies, however
    it dies (SIGKILL included): ranks never outlive their launcher. Linux only (prctl
    PR_SET_PDEATHSIG, kept across exec); elsewhere None. The libc call is looked up here, in
    the parent, so the forked child runs no import."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:   # the launcher died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)
    return arm


def _write_console(console, data):
    """Best effort: a closed console (``zero ... | head``) must not stop the
    pumps, or a rank would block on a full pipe; the log file still gets it all."""
    with _console_lock:
        try:
            buffer = getattr(console, "buffer", None)
            if buffer is not None:
                buffer.write(data)
            else:
                console.write(data.decode(errors="replace"))
            console.flush()
        except (OSError, ValueError):
            pass


def describe_exit(returncode):
    """``'exited with code 3'`` or ``'was killed by signal SIGSEGV'``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by signal {name}"
    return f"exited with code {returncode}"


def exit_code_for(returncode):
    """Shell convention: a signal-killed process maps to 128 + signal."""
    return 128 - returncode if returncode < 0 else returncode


def tail_lines(path, count=TAIL_LINES, max_bytes=65536):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - max_bytes))
            data = f.read()
    except OSError:
        return []
    return [line.decode(errors="replace") for line in deque(data.splitlines(), maxlen=count)]


class Supervisor:
    """Start ``workers``, watch them, stop all of them when one fails.

    ``watch_stdin``: treat EOF on our stdin like SIGHUP (an ssh session that
    closed). ``watch_marker``: treat a worker output line containing
    ``FAILURE_MARKER`` as a failure (pdsh, where one process hides many
    nodes). ``on_started`` runs once all workers are started, ``on_stop``
    before the workers are signalled.
    """

    def __init__(self, workers, grace=5.0, watch_stdin=False, watch_marker=False,
                 on_started=None, on_stop=None, what="rank"):
        self.workers, self.grace, self.what = workers, grace, what
        self.on_started, self.on_stop = on_started, on_stop
        self.watch_stdin, self.watch_marker = watch_stdin, watch_marker
        self._signal, self._signals_seen, self._marker_line = None, 0, None
        self._exited = []   # workers in the order they exited (appended by waiter threads)

    # -- public -----------------------------------------------------------
    def run(self):
        """Run to completion; returns the exit code for the launcher."""
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            self._start_all()
            outcome = self._watch()
            if outcome is not None:
                self._stop(outcome[1])
            for w in self.workers:
                w.finish()
            return self._report(outcome)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    # -- steps ------------------------------------------------------------
    def _start_all(self):
        if self.watch_stdin:
            threading.Thread(target=self._wait_for_stdin_eof, daemon=True).start()
        for w in self.workers:
            try:
                w.start(self._on_line)
            except LaunchError:
                self._stop(signal.SIGTERM)
                raise
            threading.Thread(target=self._wait_for, args=(w,), daemon=True).start()
        if self.on_started is not None:
            self.on_started()

    def _watch(self):
        """Block until all exit 0 (returns None) or something must stop the job:
        returns ``(reason, signal_to_forward, worker_or_None)``."""
        while True:
            if self._signal is not None:
                return ("signal", self._signal, None)
            if self._marker_line is not None:
                return ("marker", signal.SIGTERM, self._marker_line[0])
            exited = list(self._exited)
            for w in exited:   # the first to die is the one to blame
                if w.proc.returncode != 0:
                    return ("failed", signal.SIGTERM, w)
            if len(exited) == len(self.workers):
                return None
            time.sleep(POLL_SECONDS)

    def _stop(self, signum):
        if self.on_stop is not None:
            self.on_stop()
        for w in self._started():
            w.signal_group(signum)
        deadline, seen = time.monotonic() + self.grace, self._signals_seen
        while (time.monotonic() < deadline and self._signals_seen == seen  # 2nd Ctrl-C: no grace
               and any(w.proc.poll() is None for w in self._started())):
            time.sleep(POLL_SECONDS)
        for w in self._started():
            w.signal_group(signal.SIGKILL)  # also reaches leftovers of exited leaders
            w.proc.wait()

    def _report(self, outcome):
        if outcome is None:
            return 0
        reason, signum, worker = outcome
        others = len(self.workers) - 1
        if reason == "signal":
            name = signal.Signals(signum).name
            _say(f"received {name}; stopped all {len(self.workers)} {self.what}(s)")
            return 128 + signum
        if reason == "marker":
            _say(f"{worker.label} reported a failure; stopped the job")
            return 1
        code = worker.proc.returncode
        stopped = f"; stopped the other {others} {self.what}(s)" if others else ""
        _say(f"FAILED: {worker.label} {describe_exit(code)}{stopped}")
        lines = tail_lines(worker.log_path)
        _say(f"last {len(lines)} line(s) of {worker.label}'s log ({worker.log_path}):")
        for line in lines:
            _say(f"    {line}", prefix="")
        return exit_code_for(code)

    # -- callbacks --------------------------------------------------------
    def _wait_for(self, worker):
        worker.proc.wait()
        self._exited.append(worker)

    def _on_signal(self, signum, frame):
        self._signals_seen += 1
        if self._signal is None:
            self._signal = signum

    def _on_line(self, worker, line):
        if self.watch_marker and self._marker_line is None and FAILURE_MARKER.encode() in line:
            self._marker_line = (worker, line)

    def _wait_for_stdin_eof(self):
        # os.read on the fd, not sys.stdin: a daemon thread blocked inside a
        # buffered reader aborts the interpreter at exit.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        if self._signal is None:
            self._signal = signal.SIGHUP

    def _started(self):
        return [w for w in self.workers if w.proc is not None]


def _say(message, prefix="[zero.launch] "):
    _write_console(sys.stderr, f"{prefix}{message}\n".encode())
