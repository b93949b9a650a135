"""The environment report (`zero-report`, DeepSpeed's `ds_report` through
deepspeed.env_report): it runs here and says what it finds, its smoke test trains in a process
of its own, and it catches what broke the GPU runs (an extension carrying its own libstdc++, a
process killed by a signal) with a FAIL line that says what to do."""
import shutil
import signal
import subprocess
import sys

import pytest

from zero import env_report

pytestmark = pytest.mark.timeout(240)


def test_the_report_runs_here_and_its_smoke_test_trains():
    done = subprocess.run([sys.executable, "-m", "zero.env_report"], capture_output=True,
                          text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    import torch

    built = [line for line in done.stdout.splitlines() if line.startswith("zero._C built with")]
    assert len(built) == 1 and f"torch {env_report.release(torch.__version__)}, " in built[0]
    assert built[0].endswith("[OKAY]")
    shared = [line for line in done.stdout.splitlines() if line.startswith("libstdc++ ")]
    assert len(shared) == 1 and shared[0].endswith("the process's shared one [OKAY]")
    smoke = [line for line in done.stdout.splitlines() if line.startswith("training on cpu")]
    assert len(smoke) == 1 and smoke[0].endswith("[OKAY]"), done.stdout
    assert "3 steps at stage 3: loss" in smoke[0]
    assert "[FAIL]" not in done.stdout


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("readelf") is None,
                    reason="needs g++ and readelf")
def test_a_library_carrying_its_own_libstdcxx_fails(tmp_path):
    source = tmp_path / "own.cpp"
    source.write_text('#include <sstream>\nextern "C" int f() { std::ostringstream s; '
                      's << 42; return (int)s.str().size(); }\n')
    for name, flags in (("own", ["-static-libstdc++"]), ("shared", [])):
        subprocess.run(["g++", "-shared", "-fPIC", *flags, str(source), "-o",
                        str(tmp_path / f"lib{name}.so")], check=True)
    own = env_report.libstdcxx_line(str(tmp_path / "libown.so"))
    assert own.status == env_report.FAIL and "carries its own copy" in own.value
    assert "CXX=/usr/bin/g++" in own.fix
    assert env_report.libstdcxx_line(str(tmp_path / "libshared.so")).status == env_report.OKAY


def test_a_torch_versions_release_is_what_the_build_is_compared_on():
    assert env_report.release("2.5.0a0+git1234") == "2.5.0"  # NGC
    assert env_report.release("2.13.0.dev20261101") == "2.13.0"  # nightly
    assert env_report.release("2.11.0+cu130") == "2.11.0"


def test_a_smoke_process_killed_by_a_signal_is_a_failure_that_names_it():
    crash = [sys.executable, "-c", f"import os; os.kill(os.getpid(), {int(signal.SIGSEGV)})"]
    line = env_report.smoke("cpu", "gloo", command=crash)
    assert line.status == env_report.FAIL and line.value == "killed by SIGSEGV"
    assert "libstdc++" in line.fix


def test_a_smoke_process_that_raises_reports_its_last_line():
    line = env_report.smoke("cpu", "gloo", command=[
        sys.executable, "-c", "raise RuntimeError('zero: no device here')"])
    assert line.status == env_report.FAIL
    assert line.value == "exit 1: RuntimeError: zero: no device here"


def test_deepspeeds_entry_points_take_its_flags(capsys):
    import zero.compat.deepspeed as deepspeed

    deepspeed.env_report.cli_main(["--hide_operator_status", "--hide_errors_and_warnings"])
    out = capsys.readouterr().out
    assert "zero._C built with" in out and "smoke test" not in out
