"""benchmarks/gpu_largest.py without a GPU: the tuner's plan per size on the meta device, and
the order in which the search trains the sizes (the runs faked; the GPU half is
scripts/gpu_check.sh's `largest` step)."""
import pytest

from benchmarks import facts, gpu_largest
from zero.models.tiny_gpt import GPTConfig

pytestmark = pytest.mark.timeout(120)

MiB = 2**20
BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2, "overlap_comm": True}}


def gpt(layers: int) -> GPTConfig:
    return GPTConfig(vocab_size=1024, block_size=64, n_layer=layers, n_head=4, n_embd=256)


def test_the_plan_offloads_only_the_size_that_does_not_fit_without_it():
    # 2 layers: ~1.3 M parameters, 16 bytes each without offload (~20 MiB); 8 layers ~6.6 M
    # (~100 MiB). A 48 MiB device fits the first as it is and the second only offloaded.
    small = gpu_largest.plan("small", gpt(2), BASE, 48 * MiB, 1024 * MiB, 0)
    large = gpu_largest.plan("large", gpt(8), BASE, 48 * MiB, 1024 * MiB, 0)

    assert small.configs["no offload"] is not None
    assert "offload_optimizer" not in small.configs["no offload"]["zero_optimization"]
    assert large.configs["no offload"] is None
    assert large.why_not["no offload"].startswith("over by")
    offloaded = large.configs["offload"]["zero_optimization"]
    assert offloaded["offload_optimizer"]["device"] == "cpu"
    assert large.estimates["offload"]["device_bytes"] <= 48 * MiB
    assert large.estimates["offload"]["host_bytes"] > 0
    assert large.activation_bytes > small.activation_bytes > 0


def test_the_plan_says_why_when_the_host_cannot_hold_the_offload():
    large = gpu_largest.plan("large", gpt(8), BASE, 48 * MiB, 16 * MiB, 0)

    assert large.configs["offload"] is None
    assert "host" in large.why_not["offload"]


def _plan(size: str, params: int, fits: bool, offload: bool) -> gpu_largest.Plan:
    configs = {"no offload": {"arm": "no offload"} if fits else None,
               "offload": {"arm": "offload"} if offload else None}
    return gpu_largest.Plan(size, params, 0, configs, {k: None for k in configs},
                            {k: None for k in configs}, {"no offload": "over by 1 GiB",
                                                         "offload": "host RAM over"})


def _search(plans, trains):
    ran = []

    def run(arm, plan, config):
        ran.append((arm, plan.size))
        result = {"arm": arm, "model": plan.size, "params": plan.params, "tuned": arm}
        if not trains(arm, plan):
            result["error"] = "out of memory"
        return result

    results = gpu_largest.search(plans, run, {"arm": "fallback"})
    return ran, results


def test_each_arm_starts_at_its_largest_fitting_size_and_stops_at_the_first_that_trains():
    plans = [_plan("1b", 1, True, True), _plan("2b", 2, True, True),
             _plan("3b", 3, False, True), _plan("4b", 4, False, True),
             _plan("5b", 5, False, True), _plan("6b", 6, False, False)]

    def trains(arm, plan):  # the tuner was right, except for 5b with offload
        return plan.params <= 2 if arm.startswith("no offload") else plan.params <= 4

    ran, results = _search(plans, trains)

    assert ran == [("no offload", "2b"), ("no offload (past the tuner)", "3b"),
                   ("offload", "5b"), ("offload", "4b")]
    assert gpu_largest.verdict(results).endswith("2.00x larger (goal: at least 2x)")


def test_a_size_the_tuner_refused_that_trains_anyway_raises_the_no_offload_floor():
    plans = [_plan("1b", 1, True, True), _plan("2b", 2, False, True),
             _plan("3b", 3, False, True), _plan("4b", 4, False, True)]

    ran, results = _search(plans, lambda arm, plan: plan.params <= 2 or arm == "offload")

    assert ran == [("no offload", "1b"), ("no offload (past the tuner)", "2b"),
                   ("no offload (past the tuner)", "3b"), ("offload", "4b")]
    assert "2.00x" in gpu_largest.verdict(results)


def test_a_size_the_tuner_fitted_that_failed_is_the_no_offload_arms_stop():
    plans = [_plan("1b", 1, True, True), _plan("2b", 2, True, True),
             _plan("3b", 3, False, True)]

    ran, results = _search(plans, lambda arm, plan: plan.params <= 1 or arm == "offload")

    assert ran == [("no offload", "2b"), ("no offload", "1b"), ("offload", "3b")]
    assert "3.00x" in gpu_largest.verdict(results)


def test_each_run_keeps_its_configuration_in_a_file_of_its_own(tmp_path):
    paths = {gpu_largest.write_config(str(tmp_path), arm, "5b", {"arm": arm})
             for arm in ("no offload", "no offload (past the tuner)", "offload")}

    assert len(paths) == 3


def test_the_verdict_names_an_arm_that_trained_nothing():
    plans = [_plan("1b", 1, False, True)]

    _, results = _search(plans, lambda arm, plan: False)

    assert gpu_largest.verdict(results).endswith("no ratio (an arm trained nothing)")


def test_an_nvme_path_lets_the_tuner_use_its_free_space(tmp_path, monkeypatch):
    """--nvme-path: the tuner may put the optimizer or the parameters in swap files there, at
    most the disk's free space less --nvme-reserve-gib (the budget line says so)."""
    seen = []
    tune = gpu_largest.tuner.tune

    def spy(*args, **kwargs):
        seen.append((kwargs["nvme_path"], kwargs["nvme_budget"]))
        return tune(*args, **kwargs)

    monkeypatch.setattr(gpu_largest.tuner, "tune", spy)
    free = gpu_largest.disk_free(str(tmp_path / "swap"))
    assert free > 0 and (tmp_path / "swap").is_dir()
    gpu_largest.plan("small", gpt(2), BASE, 48 * MiB, 1024 * MiB, 0, str(tmp_path), free)
    assert seen == [(str(tmp_path), free)] * 2  # both arms
    extra = {"gpu_budget_bytes": 2**30, "gpu_capped": False, "host_budget_bytes": 2**30,
             "reserve_bytes": 0, "nvme_path": str(tmp_path), "nvme_budget_bytes": 2**31}
    assert f"NVMe 2.0 GiB under {tmp_path}" in gpu_largest.budget_line(extra)
    assert "no NVMe" in gpu_largest.budget_line({**extra, "nvme_path": None})


def test_an_nvme_path_in_memory_or_not_makeable_is_refused_in_one_line(tmp_path):
    import os

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match="cannot make it"):
        gpu_largest.disk_free(str(blocker / "swap"))
    if facts.filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm here")
    path = f"/dev/shm/zero-test-{os.getpid()}"
    try:
        with pytest.raises(SystemExit, match="is on tmpfs, which is memory"):
            gpu_largest.disk_free(path)
    finally:
        os.rmdir(path)
