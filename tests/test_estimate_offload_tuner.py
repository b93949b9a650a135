"""zero-mem tune with offload: the tuner recommends offload when only offload fits (NVMe for
the optimizer when the host budget rules the host out, NVMe for the parameters when the host
cannot hold them), and the recommended config runs within its budgets."""
import dataclasses
import json

import torch

from distributed_harness import run_distributed
from estimate_offload_config import DEEP_FACTORY, GAS, PERSISTENCE, _config, train_tuned
from zero.reports import cli, tuner
from zero.reports import estimate as est

# ---- the tuner --------------------------------------------------------------------------------

def _setup(**changes):
    return est.Setup(world_size=2, precision="bf16", reduce_bucket_size=3000,
                     persistence_threshold=PERSISTENCE, **changes)


def _tune_and_run(tmp_path, budget, *extra):
    base = _config(3, "bf16", {}, None)  # two micro-steps, stage-3 defaults
    base_path = tmp_path / "base.json"
    base_path.write_text(json.dumps(base))
    out = tmp_path / "tuned.json"
    code = cli.main(["tune", "--model", DEEP_FACTORY, "--config", str(base_path),
                     "--world-size", "2", "--budget", str(budget), "--out", str(out), *extra])
    assert code == 0
    tuned = json.loads(out.read_text())
    return tuned, run_distributed(train_tuned, 2, args=(str(out),), timeout=120)


def _tune_with_nvme(tmp_path, base: dict, budget: int, host_budget: int):
    """`zero-mem tune` on the model with `base` as its config and an NVMe directory; returns
    the written config's path, the NVMe directory and what the command printed."""
    import contextlib
    import io

    base_path = tmp_path / "base.json"
    base_path.write_text(json.dumps(base))
    out = tmp_path / "tuned.json"
    swap = tmp_path / "nvme"
    swap.mkdir()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["tune", "--model", DEEP_FACTORY, "--config", str(base_path),
                         "--world-size", "2", "--budget", str(budget), "--host-budget",
                         str(host_budget), "--nvme-path", str(swap), "--out", str(out)]) == 0
    return out, swap, printed.getvalue()


def test_the_tuner_recommends_offload_when_only_offload_fits_and_it_runs_within(tmp_path, capsys):
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    setup = _setup()
    # The smallest device footprint without offload (every stage, every bucket and stage-3
    # setting the tuner tries), and with the optimizer on the host.
    no_offload = tuner.tune(shapes, setup, 1, offload=False)
    smallest = min(c.total for c in no_offload.tried if c.estimate.runs)
    host_stage1 = est.estimate(shapes, setup, est.option_for(1, "cpu")).device_bytes
    host_stage2 = est.estimate(shapes, setup, est.option_for(2, "cpu")).device_bytes
    assert host_stage2 < host_stage1 < smallest
    budget = (host_stage2 + host_stage1) // 2  # only stage 2 + optimizer on the host (or more)
    rec = tuner.tune(shapes, setup, budget)
    assert rec.chosen.option == est.option_for(2, "cpu")
    assert all(not c.fits for c in rec.tried if not c.option.offloaded)

    tuned, reports = _tune_and_run(tmp_path, budget)
    text = capsys.readouterr().out
    assert "recommended: stage 2 + optimizer on the host" in text
    zero_block = tuned["zero_optimization"]
    assert zero_block["stage"] == 2 and zero_block["offload_optimizer"]["device"] == "cpu"
    assert "offload_param" not in zero_block and not any(k.startswith("stage3_")
                                                         for k in zero_block)
    for report in reports:
        device = report["by_location"]["device"]
        assert device["peak"] <= budget, (device, budget)
        assert device["peak"] == rec.chosen.total  # exact below stage 3
        assert report["model_state_by_location"]["measured"]["host"] > 0


def _partial_budget(shapes, setup) -> int:
    """A device budget between stage 1 with the whole optimizer on the host and the smallest
    configuration without offload."""
    no_offload = tuner.tune(shapes, setup, 1, offload=False)
    smallest = min(c.total for c in no_offload.tried if c.estimate.runs)
    whole = est.estimate(shapes, setup, est.option_for(1, "cpu")).device_bytes
    assert whole < smallest
    return (whole + smallest) // 2


def test_the_tuner_offloads_the_least_part_of_the_optimizer_that_fits():
    """Between no offload and the whole optimizer on the host: the least ratio, in hundredths,
    at which stage 1 fits the device (the tail's master and state on the host, the head's on
    the device); partial=False (--no-partial-offload) takes the whole step to the host."""
    shapes, setup = est.shapes_from_factory(DEEP_FACTORY), _setup()
    budget = _partial_budget(shapes, setup)
    rec = tuner.tune(shapes, setup, budget)
    chosen = rec.chosen
    ratio = chosen.offload_ratio
    assert chosen.option == est.option_for(1, "cpu") and 0 < ratio < 1
    assert all(not c.fits for c in rec.tried if not c.option.offloaded)

    def device(r):
        return est.estimate(shapes, dataclasses.replace(setup, offload_ratio=r),
                            est.option_for(1, "cpu")).device_bytes
    assert device(ratio) == chosen.total <= budget < device(round(ratio - 0.01, 2))
    assert any("is zero's (DeepSpeed ignores a ratio below stage 3)" in n for n in rec.notes)
    # The least ratio against every hundredth's bytes, for budgets on and one byte under
    # every fifth hundredth's (the bytes fall in uneven steps: each group's tail is rounded).
    by_hundredth = [device(h / 100) for h in range(1, 100)]
    for usable in [b - d for b in by_hundredth[::5] + [by_hundredth[-1]] for d in (0, 1)]:
        least = next((h / 100 for h, b in zip(range(1, 100), by_hundredth) if b <= usable),
                     None)
        assert tuner.least_ratio(shapes, setup, est.option_for(1, "cpu"), usable) == least
    whole = tuner.tune(shapes, setup, budget, partial=False)
    assert (whole.chosen.option, whole.chosen.offload_ratio) == (est.option_for(1, "cpu"), 1.0)
    assert not any("DeepSpeed ignores a ratio" in note for note in whole.notes)


def test_a_configured_ratio_or_delayed_update_is_tuned_as_configured():
    """A ratio below 1 or the delayed update in the config: no search, every offload tier
    takes them as they are, and the written config says what the estimate used."""
    shapes, setup = est.shapes_from_factory(DEEP_FACTORY), _setup()
    budget = _partial_budget(shapes, setup)
    for fixed in (dict(offload_ratio=0.5), dict(delayed_update=True)):
        rec = tuner.tune(shapes, _setup(**fixed), budget)
        assert rec.chosen.option.offload_optimizer == "cpu"
        offloaded = [c for c in rec.tried if c.option.offloaded]
        assert offloaded and all(c.offload_ratio == fixed.get("offload_ratio", 1.0)
                                 for c in offloaded)
    # Nothing offloaded: ratio 1 whatever the config says, and no note about it.
    roomy = tuner.tune(shapes, _setup(offload_ratio=0.5), 10**12)
    assert roomy.chosen.stage == 0 and roomy.chosen.offload_ratio == 1.0
    assert not any("ratio" in note for note in roomy.notes)
    # delayed_update is written as estimated: off over a base that has it (zero-mem tune
    # --no-delayed-update; with the partial ratio it would not validate), on when estimated.
    partial = tuner.tune(shapes, setup, budget)
    base = _config(3, "bf16", {"offload_optimizer": "cpu", "delayed_update": True}, None)
    config, _ = tuner.recommended_config(partial, setup, base)
    block = config["zero_optimization"]["offload_optimizer"]
    assert block["ratio"] == partial.chosen.offload_ratio and "delayed_update" not in block
    delayed = tuner.tune(shapes, _setup(delayed_update=True), budget)
    config, _ = tuner.recommended_config(delayed, _setup(delayed_update=True), None)
    assert config["zero_optimization"]["offload_optimizer"]["delayed_update"] is True


def test_the_tuners_partial_offload_runs_within_its_budget(tmp_path, capsys):
    """zero-mem tune on a config (two micro-steps) writes its least ratio, before NVMe when
    both fit; the engine runs it within the budget, its device peak exactly the estimate's."""
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    budget = _partial_budget(shapes, _setup())
    tuned, reports = _tune_and_run(tmp_path, budget)
    block = tuned["zero_optimization"]["offload_optimizer"]
    assert (block["device"], tuned["zero_optimization"]["stage"]) == ("cpu", 1)
    assert 0 < block["ratio"] < 1
    assert f"recommended: stage 1 + optimizer (ratio {block['ratio']:g}) on the host" in \
        capsys.readouterr().out
    written, _ = est.setup_from_config(tuned, 2)
    expected = est.estimate(shapes, written, est.option_for(1, "cpu")).device_bytes
    for report in reports:
        assert report["by_location"]["device"]["peak"] == expected <= budget
        master = report["categories"]["fp32_master"]["by_location"]
        assert master["device"]["peak"] > 0 and master["host_pageable"]["peak"] > 0
    _, _, printed = _tune_with_nvme(tmp_path, _config(3, "bf16", {}, None), budget, 10**12)
    assert "recommended: stage 1 + optimizer (ratio" in printed
    assert cli.main(["tune", "--model", DEEP_FACTORY, "--world-size", "2", "--precision",
                     "bf16", "--reduce-bucket-size", "3000", "--persistence-threshold",
                     str(PERSISTENCE), "--budget", str(budget),
                     "--no-partial-offload"]) == 0
    assert "recommended: stage 1 + optimizer on the host" in capsys.readouterr().out


def test_the_tuner_takes_nvme_when_the_host_budget_rules_the_host_out(tmp_path, capsys):
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    setup = _setup()
    host_stage2 = est.estimate(shapes, setup, est.option_for(2, "cpu"))
    nvme_stage2 = est.estimate(shapes, setup, est.option_for(2, "nvme"))
    host_stage3 = est.estimate(shapes, setup, est.option_for(3, "cpu"))
    # Device: the stage-2 budget above; host: less than the host pool of optimizer offload,
    # enough for NVMe's staging chunks (sub_group_size 1,000: 2 slots x 3 arrays x 4 KiB).
    setup_chunks = _setup(sub_group_size=1000)
    nvme_chunked = est.estimate(shapes, setup_chunks, est.option_for(2, "nvme"))
    assert nvme_chunked.host_bytes * 2 < host_stage2.host_bytes * 2
    host_budget = (nvme_chunked.host_bytes * 2 + min(host_stage2.host_bytes,
                                                     host_stage3.host_bytes) * 2) // 2
    budget = host_stage2.device_bytes + 1
    assert nvme_stage2.device_bytes == host_stage2.device_bytes
    # Without an NVMe path: nothing fits, and the tuner says NVMe would.
    rec = tuner.tune(shapes, setup_chunks, budget, host_budget=host_budget)
    assert rec.chosen is None
    assert any(e.option.offload_optimizer == "nvme" for e in rec.not_built)
    assert "needs an NVMe path" in tuner.why_not(rec.not_built[0], None)

    out, swap, printed = _tune_with_nvme(tmp_path, _config(3, "bf16", {"sub_group_size": 1000}, None),
                                         budget, host_budget)
    assert "recommended: stage 2 + optimizer on NVMe" in printed
    tuned = json.loads(out.read_text())
    block = tuned["zero_optimization"]["offload_optimizer"]
    assert block["device"] == "nvme" and block["nvme_path"] == str(swap)
    assert tuned["zero_optimization"]["sub_group_size"] == 1000
    for report in run_distributed(train_tuned, 2, args=(str(out),), timeout=120):
        locations = report["by_location"]
        assert locations["device"]["peak"] <= budget
        host = locations["host_pinned"]["peak"] + locations["host_pageable"]["peak"]
        assert 2 * host <= host_budget  # two ranks on this node
        assert locations["nvme"]["current"] == nvme_chunked.nvme_bytes
    assert list(swap.iterdir()) == []


def _within_buckets(chosen, measured_peak: int) -> bool:
    """The estimated device peak adds the categories' peaks: at stage 3 an upper bound by at
    most the reduce-scatter buckets, which live in backward only."""
    bucket = chosen.estimate.categories["bucket"]["bytes"]
    return 0.95 * measured_peak <= chosen.total <= 1.05 * measured_peak + bucket


def test_the_tuner_offloads_parameters_when_the_optimizer_alone_is_not_enough(tmp_path,
                                                                              capsys):
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    setup = _setup()

    def smallest(*option):  # the least device bytes an option can run in (live bound: the
        # root + one block, one bucket)
        least = dataclasses.replace(setup, overlap_comm=False,
                                    max_live_parameters=3_616 + 12_416)
        return min(est.estimate(shapes, s, est.option_for(*option)).device_bytes
                   for s in (setup, least))

    optimizer_only = min(smallest(1, "cpu"), smallest(2, "cpu"), smallest(3, "cpu"))
    params_only = smallest(3, "none", "cpu")
    with_params = smallest(3, "cpu", "cpu")
    assert with_params < optimizer_only < params_only
    budget = (with_params + optimizer_only) // 2
    tuned, reports = _tune_and_run(tmp_path, budget)
    text = capsys.readouterr().out
    assert "recommended: stage 3 + optimizer on the host + params on the host" in text
    zero_block = tuned["zero_optimization"]
    assert zero_block["offload_param"]["device"] == "cpu"
    assert zero_block["offload_optimizer"]["device"] == "cpu"
    rec = tuner.tune(shapes, setup, budget)
    for report in reports:
        peak = report["by_location"]["device"]["peak"]
        assert peak <= budget, (peak, budget)
        assert _within_buckets(rec.chosen, peak), (rec.chosen.total, peak)
        assert report["categories"]["staging"]["by_location"]["device"]["peak"] > 0


def test_the_tuner_puts_parameters_on_nvme_when_the_host_cannot_hold_them(tmp_path, capsys):
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    # sub_group_size 1,000 and 2 parameter buffers (from the base config): small host staging
    setup = _setup(sub_group_size=1000, param_buffer_count=2)

    def estimate(*option):
        return est.estimate(shapes, setup, est.option_for(*option))

    def smallest(*option):  # the least device bytes an option can run in (see above)
        least = dataclasses.replace(setup, overlap_comm=False,
                                    max_live_parameters=3_616 + 12_416)
        return min(est.estimate(shapes, s, est.option_for(*option)).device_bytes
                   for s in (setup, least))

    # Device: only parameter offload fits (as in the test above). Host: less than any option
    # with the parameter shard in host memory, enough for 2 buffers of one block's shard.
    optimizer_only = min(smallest(1, "cpu"), smallest(2, "cpu"), smallest(3, "cpu"))
    budget = (smallest(3, "cpu", "cpu") + optimizer_only) // 2
    both = estimate(3, "nvme", "nvme")
    assert both.device_bytes == estimate(3, "nvme", "cpu").device_bytes  # the same device side
    host_params = min(estimate(3, "nvme", "cpu").host_bytes, estimate(3, "cpu", "cpu").host_bytes,
                      estimate(3, "cpu", "nvme").host_bytes)
    assert both.host_bytes < host_params
    host_budget = 2 * (both.host_bytes + host_params) // 2  # two ranks on this node
    # Without an NVMe path: nothing fits, and the tuner says that NVMe would.
    rec = tuner.tune(shapes, setup, budget, host_budget=host_budget)
    assert rec.chosen is None
    assert both.name in [e.name for e in rec.not_built]
    assert all(tuner.why_not(e, None).startswith("needs an NVMe path") for e in rec.not_built)
    # A buffer_size below the blocks' shards, where the engine would refuse: the tuner raises
    # it to the largest unit on NVMe (the host's buffers are of that unit either way).
    raised = tuner.tune(shapes, dataclasses.replace(setup, param_buffer_size=1_000), budget,
                        host_budget=host_budget, nvme_path=str(tmp_path))
    largest = max(both.offload["param_nvme"]["largest_nvme_unit_shards"])
    assert raised.chosen.option == both.option and largest > 1_000
    assert raised.chosen.estimate.setup.param_buffer_size == largest
    assert both.host_bytes <= raised.chosen.host_bytes <= host_budget // 2
    written, notes = tuner.recommended_config(raised, dataclasses.replace(
        setup, param_buffer_size=1_000), None)
    assert written["zero_optimization"]["offload_param"]["buffer_size"] == largest
    assert f"offload_param.buffer_size: 1000 -> {largest}" in " ".join(notes)
    # Without an NVMe path the tuner says NVMe would fit, the raised buffers included.
    hint = tuner.tune(shapes, dataclasses.replace(setup, param_buffer_size=1_000), budget,
                      host_budget=host_budget)
    assert both.name in [e.name for e in hint.not_built]

    base = _config(3, "bf16", {"sub_group_size": 1000}, None)
    base["zero_optimization"]["offload_param"] = {"device": "none", "buffer_count": 2}
    out, swap, printed = _tune_with_nvme(tmp_path, base, budget, host_budget)
    assert "recommended: stage 3 + optimizer on NVMe + params on NVMe" in printed
    zero_block = json.loads(out.read_text())["zero_optimization"]
    kept = zero_block["offload_param"].pop("max_in_cpu")  # what the host budget leaves
    assert zero_block["offload_param"] == {"device": "nvme", "pin_memory": True,
                                           "nvme_path": str(swap), "buffer_count": 2}
    assert kept > 0
    assert zero_block["offload_optimizer"]["device"] == "nvme"
    rec = tuner.tune(shapes, setup, budget, host_budget=host_budget, nvme_path=str(swap))
    # The tuner priced a GPU run; these ranks train on the CPU, whose offloaded step stages no
    # gradients or parameters: the chosen option's estimate for a CPU run is what they hold.
    chosen = rec.chosen
    on_cpu = est.estimate(shapes, dataclasses.replace(chosen.estimate.setup, cpu_only=True),
                          chosen.option, reduce_bucket_size=chosen.reduce_bucket_size,
                          overlap_comm=chosen.overlap_comm)
    assert on_cpu.host_bytes < chosen.host_bytes
    for report in run_distributed(train_tuned, 2, args=(str(out),), timeout=120):
        locations = report["by_location"]
        assert locations["device"]["peak"] <= budget
        assert _within_buckets(chosen, locations["device"]["peak"])
        host = locations["host_pinned"]["peak"] + locations["host_pageable"]["peak"]
        assert host == on_cpu.host_bytes and 2 * host <= host_budget
        assert locations["nvme"]["current"] == rec.chosen.nvme_bytes
        assert report["offload"]["param"] == "nvme"
    assert list(swap.iterdir()) == []


def test_the_tuner_puts_parameters_on_nvme_beside_part_of_the_optimizer(tmp_path):
    """One rank whose device holds neither the parameters nor, at any ratio, stage 1's
    optimizer head, and whose host holds part of the optimizer but not it and the parameters
    too: stage 3 with the parameters on NVMe and the least part of the optimizer on the host
    (a 16.6B GPT on an H200 with 115 GiB of host memory is such a case). The written config
    trains within the budgets."""
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    setup = est.Setup(world_size=1, precision="bf16", reduce_bucket_size=3000,
                      persistence_threshold=PERSISTENCE, overlap_comm=False,
                      max_live_parameters=3_616 + 12_416, max_reuse_distance=0,
                      gradient_accumulation_steps=GAS)  # (the base config's, below)

    def estimate(option, ratio=1.0):
        return est.estimate(shapes, dataclasses.replace(setup, offload_ratio=ratio), option)

    on_nvme, on_host = est.option_for(3, "cpu", "nvme"), est.option_for(3, "cpu", "cpu")
    stage1 = est.option_for(1, "cpu")
    assert estimate(on_nvme, 0.99).device_bytes < estimate(stage1, 0.99).device_bytes
    budget = (estimate(on_nvme, 0.99).device_bytes + estimate(stage1, 0.99).device_bytes) // 2
    ratio = tuner.least_ratio(shapes, setup, on_nvme, budget)
    assert ratio == tuner.least_ratio(shapes, setup, on_host, budget) and 0 < ratio < 1
    part, with_params = estimate(on_nvme, ratio), estimate(on_host, ratio)
    host_budget = (part.host_bytes + with_params.host_bytes) // 2
    assert part.host_bytes < host_budget < with_params.host_bytes
    assert estimate(est.option_for(3, "none", "nvme")).device_bytes > budget
    rec = tuner.tune(shapes, setup, budget, host_budget=host_budget, nvme_path=str(tmp_path),
                     nvme_budget=part.nvme_bytes)
    chosen = rec.chosen
    assert (chosen.option, chosen.offload_ratio) == (on_nvme, ratio)
    assert chosen.total == part.device_bytes
    # What the host budget leaves beside the optimizer's tail keeps the first units in host
    # memory (max_in_cpu), off the disk.
    kept = chosen.estimate.setup.param_max_in_cpu
    assert kept > 0 and part.host_bytes < chosen.host_bytes <= host_budget
    assert chosen.nvme_bytes < part.nvme_bytes
    assert not any("DeepSpeed ignores a ratio" in note for note in rec.notes)  # (stage 3)
    whole = tuner.tune(shapes, setup, budget, host_budget=host_budget, nvme_path=str(tmp_path),
                       nvme_budget=part.nvme_bytes, partial=False)
    assert whole.chosen is None  # only the partial member fits these budgets

    config, _ = tuner.recommended_config(rec, setup, _config(3, "bf16", {}, None))
    zero_block = config["zero_optimization"]
    assert zero_block["offload_optimizer"] == {"device": "cpu", "pin_memory": True,
                                               "ratio": ratio}
    assert zero_block["offload_param"]["device"] == "nvme"
    assert zero_block["offload_param"]["max_in_cpu"] == kept
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(config))
    [report] = run_distributed(train_tuned, 1, args=(str(path),), timeout=120)
    assert report["by_location"]["device"]["peak"] <= budget
    assert report["offload"] == {"optimizer": "cpu", "param": "nvme"}
    master = report["categories"]["fp32_master"]["by_location"]
    host = sum(master.get(where, {"peak": 0})["peak"] for where in ("host_pinned",
                                                                     "host_pageable"))
    assert master["device"]["peak"] > 0 and host > 0  # the head's and the tail's
    assert list(tmp_path.iterdir()) == [path]


def test_on_a_cpu_only_machine_host_offload_saves_no_ram(tmp_path, capsys):
    """--cpu-only: the device is the host's RAM, so a rank's device and host bytes together
    must fit the budget. A 200M-parameter model in bf16 at 2 ranks with a budget that two pools
    meet with the optimizer on the host (its device bytes fit, its host bytes unchecked) fits no
    host offload in one pool: the tuner takes NVMe, whose recommendation fits RAM as a whole."""
    shapes = est.shapes_from_count(200_000_000)
    setup = est.Setup(world_size=2, precision="bf16")
    on_host = est.estimate(shapes, setup, est.option_for(1, "cpu"))
    budget = on_host.device_bytes + on_host.host_bytes // 4  # host offload: the device fits
    two_pools = tuner.tune(shapes, setup, budget)
    assert two_pools.chosen.option.offload_optimizer == "cpu"
    one_pool = tuner.tune(shapes, dataclasses.replace(setup, cpu_only=True),
                          nvme_path=str(tmp_path), budget=budget)
    chosen = one_pool.chosen
    assert chosen is not None and chosen.option.offload_optimizer == "nvme"
    assert chosen.estimate.device_bytes + chosen.estimate.host_bytes <= budget
    refused = [c for c in one_pool.tried if c.option.offload_optimizer == "cpu"]
    assert refused and all(not c.fits and "RAM (device and host bytes: CPU only)" in c.verdict
                           for c in refused)
    assert not any("host RAM was not checked" in note for note in one_pool.notes)
    # The command line: --cpu-only; without it, on a machine without CUDA, a note names it.
    common = ["tune", "--params", "200M", "--world-size", "2", "--precision", "bf16",
              "--budget", str(budget), "--nvme-path", str(tmp_path)]
    assert cli.main(common + ["--cpu-only"]) == 0
    assert "recommended: stage 1 + optimizer on NVMe" in capsys.readouterr().out
    assert cli.main(common) == 0
    printed = capsys.readouterr().out
    # (with a GPU, part of the optimizer on the host fits the device: partial offload first)
    assert "recommended: stage 1 + optimizer (ratio 0.75) on the host" in printed
    assert ("pass --cpu-only" in printed) == (not torch.cuda.is_available())


def test_the_tuner_says_when_the_gradient_shard_could_stay_on_the_gpu():
    """Stage 2 with the optimizer on the host keeps the gradient shard in host memory; when
    grads_on_device fits the budget too, a note gives its device cost and the host copies it
    saves (2k-1 a step at k micro-steps), without choosing it. Not on a CPU-only machine."""
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    setup = _setup(gradient_accumulation_steps=2)
    option = est.option_for(2, "cpu")
    host = est.estimate(shapes, setup, option).device_bytes
    kept = est.estimate(shapes, dataclasses.replace(setup, grads_on_device=True), option)
    assert kept.device_bytes > host
    roomy = tuner.tune(shapes, setup, kept.device_bytes, gradient_accumulation_steps=2)
    assert roomy.chosen.option == option and not roomy.chosen.estimate.setup.grads_on_device
    [note] = [n for n in roomy.notes if "grads_on_device" in n]
    assert "3 shard-sized copies" in note and "2 micro-steps" in note
    tight = tuner.tune(shapes, setup, kept.device_bytes - 1, gradient_accumulation_steps=2)
    assert tight.chosen.option == option
    assert not [n for n in tight.notes if "grads_on_device" in n]
    on_cpu = dataclasses.replace(roomy.chosen, estimate=dataclasses.replace(
        roomy.chosen.estimate, setup=dataclasses.replace(setup, cpu_only=True)))
    assert tuner.grads_on_device_note(shapes, on_cpu, kept.device_bytes, 2) == ""
