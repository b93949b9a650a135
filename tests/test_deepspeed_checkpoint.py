"""A run started under the real DeepSpeed 0.19.8 resumes under zero from DeepSpeed's own
checkpoint (tests/deepspeed_checkpoints/, written by DeepSpeed there with make.py), or from
the universal checkpoint DeepSpeed's ds_to_universal made of it: the fp32 master, the
optimizer's arrays (Adam's moments, DeepSpeed's CPU Lion and Adagrad's) and step, the scheduler and the counters carry over, at DeepSpeed's world size or
another, at its ZeRO stage or another, and the next steps are DeepSpeed's own."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import ds_checkpoint_run as run
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)


def fixture(name: str) -> str:
    return os.path.join(run.FIXTURES, name)


def expected(name: str) -> dict:
    return torch.load(os.path.join(fixture(name), "expected.pt"), weights_only=True)


def tag_dir(name: str) -> str:
    return os.path.join(fixture(name), f"global_step{run.SAVED_AT}")


@pytest.mark.parametrize("name", sorted(run.RUNS))
def test_the_master_read_by_name_is_deepspeeds_own_zero_to_fp32(name):
    from zero.checkpoint_deepspeed import read

    saved = read(tag_dir(name))
    fp32 = expected(name)["fp32_at_save"]  # the tied head.weight too, and the buffer
    buffer = fp32.pop("seen_steps")
    read_back = {**saved.frozen, **{k: v.whole() for k, v in saved.master.items()}}
    # (DeepSpeed's zero_to_fp32 leaves a frozen parameter out at stage 1, which records none)
    assert set(saved.master) <= set(fp32) <= set(read_back)
    for key, value in fp32.items():
        assert torch.equal(read_back[key], value), key
    assert torch.equal(saved.module_state(torch.float32)["seen_steps"], buffer)
    assert saved.step == run.SAVED_AT and saved.world_size == run.WORLD
    assert saved.stage == run.RUNS[name].stage


def _resume(rank, world, name, stage, save_dir, load_optimizer_states=True, universal=False):
    """zero at `world` ranks and `stage` loads run `name`'s checkpoint (with `universal`, the
    one ds_to_universal made of it, through `latest_universal`) and trains on."""
    import zero
    from zero.compat.deepspeed import utils

    spec = run.RUNS[name]
    config = run.config(spec, world, stage)
    if universal:
        config["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = zero.initialize(model=run.make_model(spec), config=config)
    _, client_state = engine.load_checkpoint(fixture(name + ("-universal" if universal else "")),
                                             load_optimizer_states=load_optimizer_states)
    counters = (engine.global_steps, engine.global_samples, engine.applied_steps)
    lr = engine.optimizer.param_groups[0]["lr"]
    losses = run.train(engine, rank, world, run.SAVED_AT, run.MORE)
    engine.save_checkpoint(save_dir)
    if rank != 0:
        return None
    return {"losses": losses, "client_state": client_state, "counters": counters, "lr": lr,
            "fp32": utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(save_dir),
            "seen_steps": engine.module.seen_steps.cpu().clone()}


def _max_difference(a: dict, b: dict) -> float:
    """Over the parameters (not the buffer, a step count)."""
    return max((a[k] - b[k]).abs().max().item() for k in b if k != "seen_steps")


# (DeepSpeed's run, zero's world size, zero's stage); the bf16 runs differ from DeepSpeed's
# in how the bf16 gradients are summed, so they are held to a looser bound.
CASES = [("stage1-fp32", 2, 1), ("stage2-fp32", 1, 2), ("stage3-fp32", 2, 3),
         ("stage3-fp32", 1, 2), ("stage2-bf16", 2, 3), ("stage3-bf16", 2, 3),
         ("stage1-bf16-frozen", 2, 1), ("stage2-fp32-aligned", 1, 3),
         ("stage3-fp32-subgroups-frozen", 2, 2),
         # DeepSpeed's CPU Lion and Adagrad: their arrays under zero's names
         ("stage2-fp32-lion", 1, 3), ("stage3-fp32-adagrad", 2, 1)]


@pytest.mark.parametrize("name,world,stage", CASES)
def test_zero_continues_deepspeeds_run(tmp_path, name, world, stage):
    _assert_continues(run_distributed(_resume, world, args=(name, stage, str(tmp_path)))[0],
                      name)


@pytest.mark.parametrize("name,world,stage", [("stage2-fp32", 1, 2), ("stage3-fp32", 2, 3),
                                              ("stage1-bf16-frozen", 2, 2)])
def test_zero_continues_deepspeeds_run_from_its_universal_checkpoint(tmp_path, name, world,
                                                                     stage):
    _assert_continues(run_distributed(_resume, world, args=(name, stage, str(tmp_path)),
                                      kwargs={"universal": True})[0], name)


def _within_on_the_cpu(bf16: bool, moved: float) -> float:
    """DeepSpeed's last 2 steps moved some weight by `moved` (5.4e-3, about 2 learning rates);
    zero's continuation lands where DeepSpeed's did: in fp32 to a rounding (1.2e-7 seen; the
    bound leaves room for other CPUs' vector widths), in bf16 within a tenth of the move (4%
    seen from DeepSpeed's stage 3)."""
    return 0.1 * moved if bf16 else 1e-5


def _assert_continues(result: dict, name: str, losses_rel=(1e-4, 1e-5),
                      within=_within_on_the_cpu) -> None:
    """The continuation is DeepSpeed's: its losses within losses_rel (bf16, fp32), its fp32
    weights within within(bf16, moved) of DeepSpeed's, its buffer equal."""
    want = expected(name)
    bf16 = run.RUNS[name].precision == "bf16"
    assert result["losses"] == pytest.approx(want["losses"], rel=losses_rel[0 if bf16 else 1])
    difference = _max_difference(result["fp32"], want["fp32_after"])
    moved = _max_difference(want["fp32_after"], want["fp32_at_save"])
    assert difference < within(bf16, moved), (difference, moved)
    assert torch.equal(result["seen_steps"], want["buffers"]["seen_steps"])


@pytest.mark.parametrize("name", ["stage2-fp32", "stage3-fp32", "stage1-bf16-frozen"])
def test_a_universal_checkpoint_reads_as_deepspeeds_own(name):
    from zero.checkpoint_deepspeed import read
    from zero.checkpoint_universal import read as read_universal

    original = read(tag_dir(name))
    universal = read_universal(os.path.join(fixture(name + "-universal"),
                                            f"global_step{run.SAVED_AT}_universal"))
    assert set(universal.master) == set(original.master)
    for array, values in [("master", universal.master), *universal.moments.items()]:
        theirs = original.master if array == "master" else original.moments[array]
        for key, value in values.items():
            assert torch.equal(value.whole(), theirs[key].whole()), (array, key)
    assert set(universal.moments) == {"exp_avg", "exp_avg_sq"}
    assert (universal.step, universal.stage) == (original.step, original.stage)
    assert universal.param_groups == original.param_groups
    assert set(universal.frozen) == set(original.frozen)


def _after_load(rank, world, name, load_optimizer_states, load_module_only):
    """Each trained parameter's whole fp32 master right after the load, and whether any of
    Adam's moments on this rank were loaded (a fresh Adam's are zeros)."""
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_fp32_param

    spec = run.RUNS[name.removesuffix("-universal")]
    config = run.config(spec, world, spec.stage)
    if name.endswith("-universal"):
        config["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = zero.initialize(model=run.make_model(spec), config=config)
    engine.load_checkpoint(fixture(name), load_optimizer_states=load_optimizer_states,
                           load_module_only=load_module_only)
    moments = [value for g in range(engine.core.group_count)
               for key, value in dict(engine.core.group_optimizer_state(g)).items()
               if key in ("exp_avg", "exp_avg_sq")]
    return {"master": {n: safe_get_full_fp32_param(p) for n, p in
                       engine.module.named_parameters() if p.requires_grad},
            "moments_loaded": any(bool(value.any()) for value in moments)}


# DeepSpeed 0.19.8 loads a universal checkpoint's master and moments whatever the flags say;
# zero follows it for the master but leaves the moments out when asked to, and with
# load_module_only takes the master from the module, as from DeepSpeed's own checkpoints.
ZERO_KEEPS_THE_FLAGS = {("stage1-bf16-frozen-universal", (False, False)): "moments",
                        ("stage1-bf16-frozen-universal", (False, True)): "master and moments"}


@pytest.mark.parametrize("flags", [(True, False), (False, False), (False, True)],
                         ids=["optimizer", "no-optimizer", "module-only"])
@pytest.mark.parametrize("name", ["stage2-bf16", "stage3-bf16", "stage1-bf16-frozen-universal"])
def test_the_master_and_moments_after_a_load_are_deepspeeds(name, flags):
    """tests/deepspeed_checkpoints/<name>/loaded.pt: what DeepSpeed's load_checkpoint left in
    its engine. Without the optimizer state DeepSpeed rebuilds the fp32 master from the
    16-bit module (_restore_from_bit16_weights): in bf16 a rounding of the saved master."""
    want = torch.load(os.path.join(fixture(name), "loaded.pt"), weights_only=True)[flags]
    got = run_distributed(_after_load, 2, args=(name, *flags))
    differs = ZERO_KEEPS_THE_FLAGS.get((name, flags), "")
    saved = expected(name.removesuffix("-universal"))["fp32_at_save"]
    for key, value in got[0]["master"].items():
        if "master" in differs:  # the module's bf16 weights
            assert torch.equal(value, saved[key].bfloat16().float()), key
        else:
            assert torch.equal(value, want["master"][key]), key
    assert all(r["moments_loaded"] == (want["moments_loaded"] and "moments" not in differs)
               for r in got)


def test_without_the_moments_the_continuation_is_not_deepspeeds(tmp_path):
    """The check above can fail: a fresh Adam on the loaded master takes other steps."""
    result = run_distributed(_resume, 2, args=("stage2-fp32", 2, str(tmp_path)),
                             kwargs={"load_optimizer_states": False})[0]
    want = expected("stage2-fp32")
    moved = _max_difference(want["fp32_after"], want["fp32_at_save"])
    assert _max_difference(result["fp32"], want["fp32_after"]) > 0.5 * moved  # 1.6x seen


def _load_into_other_optimizer(rank, world, name, optimizer):
    import zero

    spec = run.RUNS[name]
    config = run.config(spec, world)
    config["optimizer"] = {"type": optimizer, "params": dict(run.OPTIMIZERS[optimizer])}
    engine, _, _, _ = zero.initialize(model=run.make_model(spec), config=config)
    try:
        engine.load_checkpoint(fixture(name))
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("name,optimizer", [("stage2-fp32", "Lion"), ("stage2-fp32-lion", "AdamW"),
                                            ("stage3-fp32-adagrad", "AdamW")])
def test_another_optimizers_state_is_refused_on_every_rank(name, optimizer):
    """Adam's and Lion's arrays share the name exp_avg: the hyperparameters tell them apart."""
    for error in run_distributed(_load_into_other_optimizer, 2, args=(name, optimizer)):
        assert error is not None and "holds the optimizer state" in error, error
        assert "load_optimizer_states=False" in error


def _load_with_delayed_update(rank, world, name):
    """zero with the optimizer offloaded and the delayed update (whose own state is not an
    array of the optimizer's) loads DeepSpeed's Adam moments."""
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_optimizer_state

    spec = run.RUNS[name]
    config = run.config(spec, world)
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "delayed_update": True}
    engine, _, _, _ = zero.initialize(model=run.make_model(spec), config=config)
    engine.load_checkpoint(fixture(name))
    first = next(p for p in engine.module.parameters() if p.requires_grad)
    return bool(safe_get_full_optimizer_state(first, "exp_avg_sq").any())


def test_an_engine_with_the_delayed_update_loads_deepspeeds_moments():
    assert all(run_distributed(_load_with_delayed_update, 2, args=("stage2-fp32",)))


def test_counters_scheduler_and_client_state_are_deepspeeds(tmp_path):
    result = run_distributed(_resume, 1, args=("stage2-fp32", 2, str(tmp_path)))[0]
    assert result["counters"] == (run.SAVED_AT, run.SAVED_AT * run.WORLD * run.MICRO_BATCH,
                                  run.SAVED_AT)
    # WarmupCosineLR at step 3 of its 4 warm-up steps, as DeepSpeed saved it
    assert result["lr"] == pytest.approx(0.0023774437510817345)
    client = result["client_state"]
    assert {k: client[k] for k in run.CLIENT_STATE} == run.CLIENT_STATE
    # as DeepSpeed returns it: the model file's keys but the engine's own
    assert "module" not in client and "global_steps" not in client and "ds_version" in client


def _load_into_another_model(rank, world):
    import zero
    from zero.models.tiny_gpt import GPTConfig, TinyGPT

    torch.manual_seed(0)
    other = TinyGPT(GPTConfig(vocab_size=61, block_size=8, n_layer=2, n_head=2, n_embd=16))
    engine, _, _, _ = zero.initialize(model=other, config=run.config(run.RUNS["stage2-fp32"],
                                                                      world))
    try:
        engine.load_checkpoint(fixture("stage2-fp32"))
    except ValueError as error:
        return str(error)
    return None


def test_another_model_is_refused_on_every_rank_naming_a_parameter():
    errors = run_distributed(_load_into_another_model, 2)
    for error in errors:
        assert error is not None and "is of another model" in error
        assert "token_embedding.weight: saved (61, 10), the model has (61, 16)" in error
        assert "(and 22 more)" in error


def test_a_missing_rank_file_is_named(tmp_path):
    from zero.checkpoint_deepspeed import read
    from zero.checkpoint_files import CorruptCheckpoint

    copy = tmp_path / "step"
    shutil.copytree(tag_dir("stage3-fp32"), copy)
    os.remove(copy / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with pytest.raises(CorruptCheckpoint, match=r"saved by 2 ranks but has the optimizer files "
                                                r"of ranks \[0\]"):
        read(str(copy))


def test_read_without_deepspeed_installed():
    code = ("import sys; from zero.checkpoint_deepspeed import read; "
            f"read({tag_dir('stage2-bf16')!r}); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'deepspeed'], 'imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr



def test_a_checkpoint_without_zero_files_says_what_to_do(tmp_path):
    from zero.checkpoint_deepspeed import read

    copy = tmp_path / "step"
    shutil.copytree(tag_dir("stage2-fp32"), copy)
    for rank in range(run.WORLD):
        os.remove(copy / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    with pytest.raises(ValueError, match=r"no ZeRO optimizer files .* stage 0\).*"
                                         r"into the model before zero.initialize"):
        read(str(copy))


def test_an_fp16_loss_scale_carries_deepspeeds_fields():
    """DeepSpeed refuses fp16 on its CPU accelerator, so no fixture has one: the fields are
    DeepSpeed's DynamicLossScaler's own (deepspeed/runtime/fp16/loss_scaler.py, 0.19.8)."""
    import types

    from zero.checkpoint_deepspeed import _restore_loss_scale
    from zero.loss_scaler import DynamicLossScaler

    engine = types.SimpleNamespace(loss_scaler=DynamicLossScaler(init_scale=2**16))
    saved = types.SimpleNamespace(loss_scale={
        "dynamic": True, "cur_scale": 512.0, "cur_iter": 40, "last_overflow_iter": 31,
        "cur_hysteresis": 1, "scale_window": 1000, "min_scale": 1})
    _restore_loss_scale(engine, saved)
    assert engine.loss_scaler.state_dict() == {"dynamic": True, "cur_scale": 512.0,
                                               "cur_iter": 40, "last_overflow_iter": 31,
                                               "cur_hysteresis": 1}


@pytest.mark.parametrize("name", ["stage2-bf16", "stage3-fp32"])
def test_zero_to_fp32_reads_deepspeeds_checkpoint_as_deepspeeds_own_does(tmp_path, name):
    """The script's import switched to zero, its old DeepSpeed checkpoints still export."""
    from zero.compat.deepspeed import utils

    fp32 = utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(fixture(name))
    want = expected(name)["fp32_at_save"]
    assert list(fp32) == list(want)  # DeepSpeed's order, tied and buffer names included
    for key, value in want.items():
        assert torch.equal(fp32[key], value), key
    assert fp32["head.weight"] is fp32["token_embedding.weight"]
    utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(
        fixture(name), str(tmp_path), safe_serialization=True)
    from safetensors.torch import load_file
    written = load_file(str(tmp_path / "model.safetensors"))
    for key, value in written.items():
        assert torch.equal(value, want[key]), key


def test_a_universal_checkpoint_missing_some_moments_is_named(tmp_path):
    from zero.checkpoint_files import CorruptCheckpoint
    from zero.checkpoint_universal import read as read_universal

    copy = tmp_path / "step"
    shutil.copytree(os.path.join(fixture("stage2-fp32-universal"),
                                 f"global_step{run.SAVED_AT}_universal"), copy)
    os.remove(copy / "zero" / "ln_f.bias" / "exp_avg.pt")
    with pytest.raises(CorruptCheckpoint, match=r"has no exp_avg.pt for ln_f.bias; convert"):
        read_universal(str(copy))
