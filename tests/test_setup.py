"""scripts/setup.sh as a new machine meets it: zero not installed, a second run that installs
nothing, and failures that name the step, its command, its last lines and the fix."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup.sh"


def run_setup(env=None, timeout=900):
    return subprocess.run(["bash", str(SETUP)], cwd=REPO, env=dict(os.environ, **(env or {})),
                          capture_output=True, text=True, timeout=timeout)


def pip_show_location():
    shown = subprocess.run([sys.executable, "-m", "pip", "show", "zero"], capture_output=True,
                           text=True)
    for line in shown.stdout.splitlines():
        if line.startswith("Editable project location: "):
            return line.split(": ", 1)[1]
    return None


def editable_location():
    """What setup.sh reads for it (scripts/lib/editable_location.py: without pip's 4 s)."""
    shown = subprocess.run([sys.executable, str(REPO / "scripts" / "lib" /
                                                "editable_location.py")],
                           capture_output=True, text=True, check=True)
    return shown.stdout.strip() or None


@pytest.mark.timeout(900)
def test_setup_installs_zero_where_it_is_not_installed_and_reruns_quietly():
    uninstall = subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "zero"],
                               capture_output=True, text=True)
    assert uninstall.returncode == 0, uninstall.stderr
    assert editable_location() is None
    try:
        first = run_setup()
        assert first.returncode == 0, first.stdout + first.stderr
        assert "installing the zero, zero-mem and zero-report commands" in first.stdout
        assert (REPO / "build" / "setup-logs" / "env_report.txt").read_text().count("[FAIL]") == 0
        assert first.stdout.rstrip().endswith("setup: done")
        assert pip_show_location() == str(REPO) == editable_location()
        module = next((REPO / "zero").glob("_C*.so"))
        built = module.stat()
        again = run_setup()
        assert again.returncode == 0, again.stdout + again.stderr
        assert "installing" not in again.stdout, again.stdout   # nothing left to install
        # nothing to rebuild: the module is neither linked nor copied again (processes may
        # have it loaded)
        assert (module.stat().st_ino, module.stat().st_mtime_ns) == \
            (built.st_ino, built.st_mtime_ns)
    finally:
        if pip_show_location() != str(REPO):   # leave the machine as the test found it
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--no-build-isolation", "-e", str(REPO)],
                           env=dict(os.environ, ZERO_SKIP_EXT="1"), capture_output=True)


def test_a_failing_step_names_its_command_its_output_and_the_fix(tmp_path):
    """A Python whose build step fails (everything else is the real interpreter)."""
    python = tmp_path / "python3"
    python.write_text(f"""#!/bin/sh
if [ "$1" = setup.py ]; then echo "csrc/x.cpp:1: error: boom" >&2; exit 1; fi
exec {sys.executable} "$@"
""")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    result = run_setup(env={"PYTHON": str(python)})
    assert result.returncode == 1
    out = result.stdout
    assert f"FAILED: step 'build': {python} setup.py build_ext --inplace" in out
    assert "csrc/x.cpp:1: error: boom" in out
    assert "setup: fix: " in out and "setup: done" not in out


def test_a_missing_interpreter_is_named_with_the_fix():
    result = run_setup(env={"PYTHON": "/nonexistent/python3"})
    assert result.returncode == 1
    assert "FAILED: no '/nonexistent/python3' on PATH" in result.stdout
    assert "fix: install Python 3.10+" in result.stdout
