"""What every benchmark report states about where it ran, and small helpers the benchmark
scripts share (a free port for a single-machine rendezvous, Markdown tables)."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess

import torch


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def commit() -> str:
    """ZERO_COMMIT when set (a checkout copied without .git), else the checkout's HEAD."""
    if os.environ.get("ZERO_COMMIT"):
        return os.environ["ZERO_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return _run(["git", "-C", root, "rev-parse", "--short", "HEAD"]) or "unknown"


def machine_facts() -> dict:
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
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
        facts["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version",
                                "--format=csv,noheader"]) or "unknown"
    return facts


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
