"""Checkpoints load at another world size or stage: the fp32 master, Adam's moments and the
counters are resharded from the saved layout to the new one, and training continues exactly as
if it had not been interrupted (same losses to fp32 rounding, given the same global batch)."""
import pytest
import torch

import training
from distributed_harness import run_distributed

STEPS = 4


def _config(stage, gas, offload):
    """offload: False, True (the whole optimizer step on the host) or a ratio (the tail of
    each shard on the host, as zero-mem tune's partial offload writes)."""
    extra = {"stage3_param_persistence_threshold": 10} if stage == 3 else {}
    if offload is True:
        extra["offload_optimizer"] = {"device": "cpu"}
    elif offload:
        extra["offload_optimizer"] = {"device": "cpu", "ratio": offload}
    return training.engine_config(stage, gas=gas, precision="bf16", scheduler=False, **extra)


def _train(rank, world, stage, gas, offload, first, steps, load_dir, save_dir):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=_config(stage, gas, offload))
    return training.load_train_save(engine, rank, world, gas, first, steps, load_dir, save_dir)


@pytest.mark.parametrize("stage,offload,saved_world,loaded_world", [
    (1, False, 1, 2), (2, False, 1, 2), (3, False, 1, 2), (2, True, 1, 2),
    # partial offload: the head/tail cut moves with the shard
    (1, 0.4, 1, 2), (2, 0.6, 2, 1),
    # fewer ranks, more accumulation steps: the accumulation restarts at a boundary of the new
    # count (the 3 micro-steps saved are 1.5 optimizer steps at 2 per step)
    (3, False, 2, 1)])
# 2 -> 1, 3 and 4 ranks: test_a_2_rank_save_resumes_at_1_3_and_4_ranks_...
def test_resume_at_another_world_size_continues_the_same_run(tmp_path, stage, offload,
                                                              saved_world, loaded_world):
    # world * gas is the same on both sides: the same global batch, micro-batch for micro-batch
    gas, saved = {1: 2, 2: 1}, 3
    whole = run_distributed(_train, 2, args=(stage, 1, offload, 0, STEPS, None, None))[0]
    run_distributed(_train, saved_world, args=(stage, gas[saved_world], offload, 0, saved, None,
                                               str(tmp_path)))
    resumed = run_distributed(_train, loaded_world, args=(stage, gas[loaded_world], offload,
                                                          saved, STEPS - saved, str(tmp_path),
                                                          None))[0]
    assert resumed == pytest.approx(whole[saved:], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("saved,loaded", [(0.6, False), (False, 0.4), (True, 0.3)])
def test_resume_with_another_offload_split_continues_the_same_run(tmp_path, saved, loaded):
    """A run saved with part, all or none of its optimizer step on the host resumes with
    another split (a config retuned between runs): the state moves between device and host."""
    whole = run_distributed(_train, 2, args=(2, 1, False, 0, STEPS, None, None))[0]
    run_distributed(_train, 2, args=(2, 1, saved, 0, 2, None, str(tmp_path)))
    resumed = run_distributed(_train, 2, args=(2, 1, loaded, 2, STEPS - 2, str(tmp_path),
                                               None))[0]
    assert resumed == pytest.approx(whole[2:], rel=1e-4, abs=1e-5)


def _save_consolidated(rank, world, load_dir, save_dir):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=_config(2, 1, False))
    engine.load_checkpoint(load_dir)
    engine.save_checkpoint(save_dir)
    return engine.global_steps


def test_every_array_survives_a_trip_through_another_world_size(tmp_path):
    from zero.checkpoint_layout import full_arrays
    from zero import checkpoint_files as files

    first, second = tmp_path / "at2", tmp_path / "at3"
    run_distributed(_train, 2, args=(2, 1, False, 0, 2, None, str(first)))
    assert run_distributed(_save_consolidated, 3, args=(str(first), str(second))) == [2, 2, 2]

    def arrays(root):
        tag = (root / "latest").read_text()
        path, _ = files.find(str(root), tag)
        state = torch.load(f"{path}/model_states.pt", weights_only=False)
        return {array: {names[0]: value for group in full_arrays(path, state, array)
                        for names, value in group}
                for array in ("master", "exp_avg", "exp_avg_sq")}

    before, after = arrays(first), arrays(second)
    for array in before:
        assert set(before[array]) == set(after[array])
        for name, value in before[array].items():
            assert torch.equal(after[array][name], value), (array, name)


@pytest.mark.parametrize("saved_stage,loaded_stage,loaded_world",
                         [(2, 3, 2), (3, 2, 2), (1, 3, 1), (3, 1, 1)])
def test_resume_at_another_stage_continues_the_same_run(tmp_path, saved_stage, loaded_stage,
                                                         loaded_world):
    gas = {1: 2, 2: 1}
    whole = run_distributed(_train, 2, args=(saved_stage, 1, False, 0, STEPS, None, None))[0]
    run_distributed(_train, 2, args=(saved_stage, 1, False, 0, 2, None, str(tmp_path)))
    resumed = run_distributed(_train, loaded_world, args=(loaded_stage, gas[loaded_world], False,
                                                          2, STEPS - 2, str(tmp_path), None))[0]
    assert resumed == pytest.approx(whole[2:], rel=1e-4, abs=1e-5)


# ---- a 2-rank save loaded at 1, 3 and 4 ranks --------------------------------------------
# Every case of a stage runs in one launch per world size (engines built one after another):
# at 2 ranks the run saves after step 2 and goes on to step 4 (the uninterrupted curve); at 1,
# 3 and 4 ranks each case loads that save and trains steps 3 and 4. The global batch is 12
# micro-batches everywhere (gas = 12 / world), so the losses, the scheduler's learning rate and
# the fp16 loss scale must continue as in the uninterrupted run.
GLOBAL_MICRO_BATCHES = 12
CASES = [(precision, offload) for precision in ("bf16", "fp32") for offload in (False, True)]
FP16_CASES = {1: [], 2: [("fp16", True)], 3: [("fp16", False)]}


def _case_config(stage, gas, precision, offload):
    extra = {"stage3_param_persistence_threshold": 10} if stage == 3 else {}
    if offload:
        extra["offload_optimizer"] = {"device": "cpu"}
    config = training.engine_config(stage, gas=gas, precision=precision, scheduler=True, **extra)
    if precision == "fp16":  # the scale doubles every step: a lost scaler state shows
        config["fp16"]["loss_scale_window"] = 1
    return config


def _resume_cases(rank, world, stage, cases, root, save):
    import zero

    gas = GLOBAL_MICRO_BATCHES // world
    results = {}
    for precision, offload in cases:
        where = f"{root}/{precision}_{offload}"
        engine, _, _, _ = zero.initialize(model=training.make_model(),
                                          config=_case_config(stage, gas, precision, offload))
        if save:
            training.train_engine(engine, rank, world, 2, gas)
            engine.save_checkpoint(where)
        else:
            engine.load_checkpoint(where)
            assert engine.global_steps == 2
        losses = training.train_engine(engine, rank, world, 2, gas, first_step=2)
        results[precision, offload] = (losses, engine.lr_scheduler.get_last_lr(),
                                       engine.loss_scaler.loss_scale if engine.loss_scaler
                                       else None)
        engine.destroy()
    return results


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_2_rank_save_resumes_at_1_3_and_4_ranks_as_the_uninterrupted_run(tmp_path, stage):
    cases = CASES + FP16_CASES[stage]
    whole = run_distributed(_resume_cases, 2, args=(stage, cases, str(tmp_path), True),
                            timeout=120)[0]
    if stage != 1:
        # 2**8 doubled at each step after the first: the scale saved after step 2 is not the
        # initial one, so a resumed run that lost it would end lower
        assert whole["fp16", FP16_CASES[stage][0][1]][2] == 2 ** 11
    for world in (1, 3, 4):
        resumed = run_distributed(_resume_cases, world, args=(stage, cases, str(tmp_path), False),
                                  timeout=120)[0]
        for case in cases:
            losses, lr, scale = resumed[case]
            assert losses == pytest.approx(whole[case][0], rel=1e-4, abs=1e-5), (world, case)
            assert lr == whole[case][1] and scale == whole[case][2], (world, case)
