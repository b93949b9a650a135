"""zero's environment report: `zero-report` (or `python -m zero.env_report`; DeepSpeed's
`ds_report` is zero.compat.deepspeed.env_report). What torch and zero are installed, how
zero._C was built and whether it fits this torch, what it finds here (CPU Adam's kernel,
NVMe's I/O backend, communication backends, GPUs, /dev/shm), and three training steps on each
device in a process of their own, so an extension that crashes is reported rather than
suffered. Each line ends [OKAY], [INFO], [WARNING] or [FAIL] with what to do; the exit status
is 1 when a line says FAIL.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

OKAY, INFO, WARNING, FAIL = "OKAY", "INFO", "WARNING", "FAIL"
SMOKE_TIMEOUT = 180  # seconds for the smoke test of one device (a first CUDA start is slow)


@dataclass
class Line:
    name: str
    value: str
    status: str = INFO
    fix: str = ""


def installation() -> list[Line]:
    import zero

    return [Line("torch install path", os.path.dirname(torch.__file__)),
            Line("torch version", f"{torch.__version__}, CUDA {torch.version.cuda}"),
            Line("zero install path", os.path.dirname(zero.__file__)),
            Line("zero version", zero.__version__)]


def extension() -> list[Line]:
    """How zero._C was built, checked against the torch and the machine it runs on."""
    try:
        from zero import _C
    except ImportError as error:
        return [Line("zero._C", f"does not import: {error}", FAIL,
                     "rebuild it from clean: rm -rf build zero/_C*.so, then bash scripts/setup.sh")]
    info = _C.build_info()
    running = release(torch.__version__)
    abi = torch.compiled_with_cxx11_abi()
    fits = release(info.torch_version) == running and info.cxx11_abi == abi
    lines = [Line("zero._C built with", f"torch {info.torch_version}, {info.compiler}, "
                  f"C++11 ABI {int(info.cxx11_abi)}", OKAY if fits else FAIL,
                  "" if fits else f"torch {torch.__version__} (C++11 ABI {int(abi)}) runs here: "
                  "rebuild (python setup.py build_ext --inplace)")]
    if info.cuda:
        lines.append(Line("zero._C device code", "CUDA (kernels, copy streams, NCCL)", OKAY))
    elif torch.cuda.is_available():
        lines.append(Line("zero._C device code", "none: a CPU build", WARNING,
                          "a GPU is here: rebuild where torch has CUDA and nvcc is found "
                          "(CUDA_HOME), without ZERO_FORCE_CPU=1"))
    else:
        lines.append(Line("zero._C device code", "none: a CPU build", INFO))
    lines.append(libstdcxx_line(_C.__file__))
    isa = info.cpu_isa + ("" if info.cpu_isa == info.cpu_isa_detected else
                          f" (the CPU has {info.cpu_isa_detected}; ZERO_CPU_ISA caps it)")
    lines.append(Line("CPU Adam kernel", isa, OKAY))
    lines.append(Line("NVMe I/O backend", "io_uring, else a thread pool" if info.io_uring else
                      "a thread pool (liburing-dev was not found at build time)", INFO))
    return lines


def release(version: str) -> str:
    """major.minor.patch of a torch version ("2.5.0a0+git1234", "2.13.0.dev20261101")."""
    found = re.match(r"\d+\.\d+\.\d+", version)
    return found.group(0) if found else version


def libstdcxx_line(library: str) -> Line:
    """Whether `library` uses the process's libstdc++. One that carries its own copy (linked
    with -static-libstdc++, as some toolchains' g++ wrappers do) crashes beside the one torch
    loaded, at its first iostream."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return Line("libstdc++", "not checked (readelf not found)", INFO)
    dynamic = subprocess.run([readelf, "-d", library], capture_output=True, text=True).stdout
    if "libstdc++.so" in dynamic:
        return Line("libstdc++", "the process's shared one", OKAY)
    return Line("libstdc++", f"{os.path.basename(library)} carries its own copy", FAIL,
                "rebuild with the system compiler: CXX=/usr/bin/g++ python setup.py "
                "build_ext --inplace")


def machine() -> list[Line]:
    backends = [name for name, there in (("gloo", dist.is_gloo_available()),
                                         ("nccl", dist.is_nccl_available()),
                                         ("mpi", dist.is_mpi_available())) if there]
    lines = [Line("communication backends", ", ".join(backends) or "none",
                  OKAY if backends else FAIL, "" if backends else "torch without distributed")]
    if torch.cuda.is_available():
        names = [f"{torch.cuda.get_device_name(i)} (compute "
                 f"{'.'.join(map(str, torch.cuda.get_device_capability(i)))})"
                 for i in range(torch.cuda.device_count())]
        lines.append(Line("GPUs", "; ".join(names), OKAY))
    else:
        lines.append(Line("GPUs", "none that torch sees", INFO))
    lines.append(shm_line())
    return lines


def shm_line() -> Line:
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return Line("shared memory (/dev/shm)", "unknown", INFO)
    size = stats.f_frsize * stats.f_blocks
    small = size < 512 * 1024**2  # DeepSpeed's ds_report warns below this too
    return Line("shared memory (/dev/shm)", f"{size / 1024**3:.2f} GiB", WARNING if small else OKAY,
                "in docker, start with --shm-size=1gb or more" if small else "")


def smoke_tests() -> list[Line]:
    runs = [("cpu", "gloo")] + ([("cuda", "nccl")] if torch.cuda.is_available() else [])
    return [smoke(device, backend) for device, backend in runs]


def smoke(device: str, backend: str, command: list[str] | None = None) -> Line:
    """Three stage-3 steps on `device` in a new process (zero/env_smoke.py); `command`
    replaces that process's command line."""
    from zero.distributed import free_port

    name = f"training on {device} ({backend})"
    command = command or [sys.executable, "-m", "zero.env_smoke", "--device", device,
                          "--backend", backend, "--port", str(free_port())]
    # The engine takes a GPU whenever it sees one: the CPU run must see none.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="") if device == "cpu" else None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SMOKE_TIMEOUT,
                              env=env)
    except subprocess.TimeoutExpired:
        return Line(name, f"no result in {SMOKE_TIMEOUT} s", FAIL,
                    f"run {' '.join(command)} to see where it stops")
    if done.returncode == 0:
        return Line(name, f"3 steps at stage 3: {done.stdout.strip()}", OKAY)
    if done.returncode < 0:
        what = f"killed by {signal.Signals(-done.returncode).name}"
        fix = ("a crash inside the process: check the libstdc++ and `built with` lines; "
               f"run {' '.join(command)} under gdb for where")
    else:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [""]
        what = f"exit {done.returncode}: {last[0]}"
        fix = f"run {' '.join(command)} for the whole error"
    return Line(name, what, FAIL, fix)


def render(sections: list[tuple[str, list[Line]]], fixes: bool = True, out=None) -> None:
    out = out or sys.stdout
    width = max(len(line.name) for _, lines in sections for line in lines) + 3
    for title, lines in sections:
        print(f"{title}\n{'-' * len(title)}", file=out)
        for line in lines:
            status = "" if line.status == INFO else f" [{line.status}]"
            print(f"{line.name} {'.' * (width - len(line.name))} {line.value}{status}", file=out)
            if line.fix and fixes:
                print(f"{' ' * (width + 2)}-> {line.fix}", file=out)
        print(file=out)


def report(smoke_test: bool = True, fixes: bool = True, out=None) -> bool:
    """Prints the report (`fixes`: with what to do under a WARNING or FAIL); True when no
    line says FAIL."""
    sections = [("zero environment", installation()), ("zero._C, the C++ engine", extension()),
                ("this machine", machine())]
    if smoke_test:
        sections.append(("smoke test (a process of its own per device)", smoke_tests()))
    render(sections, fixes, out)
    return all(line.status != FAIL for _, lines in sections for line in lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="zero-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-smoke", action="store_true",
                        help="skip the training steps (the report alone takes a second)")
    args = parser.parse_args(argv)
    return 0 if report(smoke_test=not args.no_smoke) else 1


if __name__ == "__main__":
    sys.exit(main())
