"""scripts/gpu_check.sh where there is no GPU (one line, exit 0, nothing written), and how it
splits its one budget between the steps (scripts/lib/gpu_budget.sh), so that a full run fits
one call of a lent GPU machine."""
import os
import runpy
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script runs")
@pytest.mark.timeout(120)
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    results = tmp_path / "results"
    env = {**os.environ, "ZERO_GPU_RESULTS": str(results)}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True,
                          text=True, timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "gpu_check: no CUDA GPU here (torch.cuda.is_available() is not True for python3); "
        "nothing to check"]
    assert proc.stderr == ""
    assert not results.exists()


def share(step: str, left: int, steps: str = "build tests bench largest", **env) -> int:
    """share STEP with `left` seconds of the budget left and STEPS=steps."""
    script = ('source scripts/lib/gpu_budget.sh; SECONDS=0; DEADLINE=$1; STEPS=$2; '
              'share "$3"')
    proc = subprocess.run(["bash", "-c", script, "share", str(left), steps, step], cwd=ROOT,
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


@pytest.mark.timeout(60)
def test_the_tests_get_half_of_what_is_left_and_at_most_240_s():
    assert share("tests", 415) == 200
    assert share("tests", 815) == 240


@pytest.mark.timeout(60)
def test_the_tests_alone_get_everything_left():
    assert share("tests", 815, steps="build tests") == 800


@pytest.mark.timeout(60)
def test_the_bench_leaves_half_to_the_largest_model_sweep():
    assert share("bench", 315) == 150
    assert share("bench", 315, steps="bench") == 300
    assert share("largest", 315) == 300


@pytest.mark.timeout(60)
def test_a_fixed_share_and_a_spent_budget():
    assert share("bench", 315, BENCH_BUDGET="90") == 90
    assert share("largest", 315, LARGEST_BUDGET="60") == 60
    assert share("largest", 5) == 1  # never 0 s: the bench would read 0 as "no budget"


@pytest.mark.timeout(60)
def test_a_configuration_never_runs_past_the_budget():
    from benchmarks.bench_gpu_offload import config_timeout
    assert config_timeout(240, 300, deadline=1000.0, now=500.0) == (240.0, "its --timeout")
    seconds, why = config_timeout(240, 300, deadline=1000.0, now=900.0)
    assert seconds == 100.0 and "--budget of 300 s" in why
    assert config_timeout(240, 300, deadline=1000.0, now=1001.0)[0] == 1.0


def test_the_cuda_tests_no_gpu_run_saw_pass_go_first(tmp_path):
    """A cut run loses what has passed before, not what never ran (scripts/lib/gpu_test_order.py
    reads the committed -rA summaries)."""
    order = runpy.run_path(os.path.join(ROOT, "scripts", "lib", "gpu_test_order.py"))
    (tmp_path / "2026-11-29-h200-cuda_tests.txt").write_text(
        "PASSED tests/t.py::a\nFAILED tests/t.py::b - boom\nPASSED tests/t.py::c[x]\n")
    (tmp_path / "2026-11-29-h200-gpu_offload.md").write_text("PASSED tests/t.py::d\n")
    seen = order["passed_before"](str(tmp_path))
    assert seen == {"tests/t.py::a", "tests/t.py::c[x]"}
    ids = ["tests/t.py::a", "tests/t.py::b", "tests/t.py::c[x]", "tests/t.py::d"]
    assert order["ordered"](ids, seen) == ["tests/t.py::b", "tests/t.py::d", "tests/t.py::a",
                                        "tests/t.py::c[x]"]
    assert order["ordered"](ids, seen, first=r"c\[") == ["tests/t.py::c[x]", "tests/t.py::b",
                                                     "tests/t.py::d", "tests/t.py::a"]
