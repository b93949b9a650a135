"""What every benchmark report states about where it ran: the machine (CPU, memory, torch,
GPU), the engine's tree and commit, and the load on the machine while it ran. Numbers are only
comparable between reports whose facts match."""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import statistics
import subprocess
import threading


def sh(command: str, timeout: float = 30) -> str:
    """A shell command's stdout, stripped ("(reason)" when it could not run)."""
    try:
        return subprocess.run(command, shell=True, capture_output=True, text=True,
                              timeout=timeout).stdout.strip()
    except Exception as exc:  # noqa: BLE001 -- a fact we could not read is still reported
        return f"({exc})"


# Filesystems whose files live in memory: swap files there take the host memory they offload.
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def filesystem_type(path: str) -> str:
    """The type of the filesystem `path` is on (findmnt's FSTYPE; "" where unknown). With
    filesystems mounted over each other findmnt lists each, the visible one last."""
    lines = sh(f"findmnt -n -T {shlex.quote(path)} -o FSTYPE").splitlines()
    return lines[-1].strip() if lines else ""


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---- the CPU machines: what the reports' "Machine" section quotes ----------------------------
def host_facts(lscpu: str = "lscpu | head -20") -> dict:
    """nproc, `lscpu | head`, `free -g`, torch, Python and the platform."""
    import torch

    return {"lscpu_head": sh(lscpu), "nproc": sh("nproc"), "free_g": sh("free -g"),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def git_commit(tree: str, short: bool = False) -> str:
    """ZERO_COMMIT when set (a tree copied without .git), else the tree's HEAD."""
    return (os.environ.get("ZERO_COMMIT")
            or sh(f"git -C {shlex.quote(tree)} rev-parse {'--short ' if short else ''}HEAD "
                  "2>/dev/null") or "unknown")


def tree_dirty(tree: str) -> str:
    """`git status --porcelain` of the engine's sources (zero/, csrc/) in that tree."""
    return sh(f"git -C {shlex.quote(tree)} status --porcelain -- zero csrc 2>/dev/null "
              "| head -c 2000")


def extension_sha256(tree: str) -> str:
    return sh(f"sha256sum {shlex.quote(tree)}/zero/_C*.so 2>/dev/null | cut -c1-16")


def checkout_facts(root: str, short: bool = False) -> dict:
    """The checkout's own commit and status (it differs from the engine's under ZERO_ROOT)."""
    return {"checkout_commit": sh(f"git -C {shlex.quote(root)} rev-parse "
                                  f"{'--short ' if short else ''}HEAD 2>/dev/null"),
            "checkout_dirty": sh(f"git -C {shlex.quote(root)} status --porcelain 2>/dev/null "
                                 "| head -c 2000")}


class LoadSampler(threading.Thread):
    """The 1-minute load average every `every` seconds while a run lasts: above the core
    count, other processes shared the cores."""

    def __init__(self, every=5.0):
        super().__init__(daemon=True)
        self.every, self.samples, self._stop_event = every, [], threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            with open("/proc/loadavg") as f:
                self.samples.append(float(f.read().split()[0]))
            self._stop_event.wait(self.every)

    def stop(self):
        self._stop_event.set()
        self.join()


def load_range(samples: list[float]) -> str:
    return (f"min {min(samples):.2f}, median {statistics.median(samples):.2f}, max "
            f"{max(samples):.2f} over {len(samples)} samples")


# ---- the GPU machine: the one-line facts at the top of its reports ---------------------------
def machine_facts() -> dict:
    import torch

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(root, short=True),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        # CPU-side work (CPU Adam, torch's CPU optimizers) runs on this many threads
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
    }
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        facts["cuda"] = torch.version.cuda
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts["driver"] = sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader") \
            or "unknown"
    return facts


def cpu_and_load() -> dict:
    """The date, the CPU's model name and the load average, for a short results header."""
    return {"date": utc_now(), "cpu": sh("lscpu | grep 'Model name'"), "load": loadavg()}
