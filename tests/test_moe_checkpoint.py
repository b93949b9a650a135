"""Checkpoints of a model with MoE layers (zero/moe/checkpoint.py): each expert in a file of its
own under its global id, as DeepSpeed writes them; a resume at the same layout continues the
run exactly; the weights, fp32 masters and optimizer states load at another world size,
ep_size, expert layout and stage, each expert's exactly as saved, and the run continues as
before; zero_to_fp32 and save_16bit_model write every expert under its global id, loadable
into a model with ep_size 1. Checkpoints the real DeepSpeed wrote of a DeepSpeed-MoE model
resume the same ways.

Every value here is named as in a model holding every expert (global ids), so runs of any
layout compare name by name."""
import os

import pytest
import torch

from deepspeed_reference import cases_of
from distributed_harness import run_distributed

cases = cases_of("moe")
# stage 3: every parameter partitioned, the whole model gathered for save_16bit_model
STAGE3 = {"stage3_param_persistence_threshold": 0, "stage3_model_persistence_threshold": 0,
          "stage3_gather_16bit_weights_on_model_save": True}


def _engine(rank, ep_size, stage, data_before_expert=False):
    import zero
    from zero.moe import MoE

    net = cases.build(MoE, rank, ep_size, 1)
    zero_block = {"stage": stage, **(STAGE3 if stage == 3 else {})}
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(), config={
        **cases.config(stage), "gradient_clipping": 0.05, "zero_optimization": zero_block,
        "use_data_before_expert_parallelism": data_before_expert})
    return engine


def _steps(engine, rank, steps):
    for step in steps:
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()


def _weights(engine):
    """This rank's parameters by global name."""
    import zero
    from zero.moe.checkpoint import global_names

    name = global_names(engine.module)
    with zero.GatheredParameters(list(engine.module.parameters())):  # (stage 3)
        return {name(n): p.detach().clone() for n, p in engine.module.named_parameters()}


def _optimizer_states(engine):
    """This rank's parameters' whole fp32 master and Adam moments, by global name."""
    from zero.compat.deepspeed.utils import (safe_get_full_fp32_param,
                                             safe_get_full_optimizer_state)
    from zero.moe.checkpoint import global_names

    name = global_names(engine.module)
    return {name(n): [safe_get_full_fp32_param(p)] + [safe_get_full_optimizer_state(p, key)
                                                      for key in ("exp_avg", "exp_avg_sq")]
            for n, p in engine.module.named_parameters() if p.requires_grad}


def _save_then_resume(rank, world, directory, stage):
    straight = _engine(rank, 2, stage)
    _steps(straight, rank, range(4))
    want = _weights(straight)
    straight.destroy()
    first = _engine(rank, 2, stage)
    _steps(first, rank, range(2))
    first.save_checkpoint(directory, tag="half")
    first.save_16bit_model(directory, "whole.bin")
    saved = {"weights": _weights(first), "states": _optimizer_states(first)}
    first.destroy()
    second = _engine(rank, 2, stage)
    second.load_checkpoint(directory, tag="half")
    _steps(second, rank, range(2, 4))
    return want, _weights(second), saved


def _whole(results, key: str) -> dict:
    """Every rank's values of `key` in one dict (ranks holding the same expert agree)."""
    return _merged([found[2][key] for found in results])


def _merged(per_rank: list[dict]) -> dict:
    """Per-rank {global name: value} in one dict, checking that ranks agree."""
    merged = {}
    for rank, found in enumerate(per_rank):
        for name, value in found.items():
            if name in merged:
                for mine, theirs in zip(_listed(value), _listed(merged[name])):
                    torch.testing.assert_close(mine, theirs, rtol=0, atol=0,
                                               msg=f"{name}: rank {rank} and an earlier rank")
            merged[name] = value
    return merged


def _listed(value):
    return value if isinstance(value, list) else [value]


@pytest.fixture(scope="module", params=[0, 2, 3], ids=["stage0", "stage2", "stage3"])
def saved(tmp_path_factory, request):
    """4 ranks, ep_size 2: (directory, per rank (straight run's weights, resumed run's, the
    saved weights and optimizer states), stage)."""
    directory = str(tmp_path_factory.mktemp(f"moe_ckpt{request.param}"))
    return directory, run_distributed(_save_then_resume, 4, args=(directory, request.param),
                                      timeout=240), request.param


def test_a_resume_at_the_same_layout_continues_the_run(saved):
    _, results, _ = saved
    for rank, (want, found, _) in enumerate(results):
        for name, value in want.items():
            torch.testing.assert_close(found[name], value, rtol=0, atol=0,
                                       msg=f"{name} on rank {rank}")


def test_each_expert_has_a_file_of_its_own(saved):
    import zero.checkpoint_files as files
    directory, results, _ = saved
    tag = os.path.join(directory, "half")
    module = files.load_torch(os.path.join(tag, "model_states.pt"))["module"]
    assert not [key for key in module if "deepspeed_experts" in key]
    weights = _whole(results, "weights")
    for expert in range(cases.NUM_EXPERTS):
        state = files.load_torch(os.path.join(tag, f"layer_0_expert_{expert}_mp_rank_00_model_states.pt"))
        assert state and all(f"deepspeed_experts.{expert}." in key for key in state)
        for key, value in state.items():
            torch.testing.assert_close(value, weights[key])


def _load_weights(rank, world, directory, ep_size, stage):
    engine = _engine(rank, ep_size, stage)
    engine.load_checkpoint(directory, tag="half", load_optimizer_states=False)
    return _weights(engine)


def test_the_weights_alone_load_at_another_world_size_and_ep_size(saved):
    directory, results, stage = saved
    weights = _whole(results, "weights")
    for ep_size in (1, 2):
        loaded = run_distributed(_load_weights, 2, args=(directory, ep_size, stage), timeout=120)
        for rank, found in enumerate(loaded):
            for name, value in found.items():
                torch.testing.assert_close(value, weights[name],
                                           msg=f"{name} on rank {rank} (ep_size {ep_size})")


def _load_then_train(rank, world, directory, ep_size, stage, data_before_expert):
    engine = _engine(rank, ep_size, stage, data_before_expert)
    engine.load_checkpoint(directory, tag="half")
    states = _optimizer_states(engine)
    _steps(engine, rank, range(2, 4))
    return states, _weights(engine)


# (world, ep_size, stage: None for the saved one, use_data_before_expert_parallelism)
LAYOUTS = {"2-ranks-ep1": (2, 1, None, False), "2-ranks-ep2-other-stage": (2, 2, "other", False),
           "4-ranks-ep4": (4, 4, None, False), "4-ranks-data-before-expert": (4, 2, None, True)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_optimizer_states_load_at_another_layout(saved, layout):
    """Each parameter's fp32 master and Adam moments are the saved ones, bit for bit, whatever
    ranks now hold the expert; on 4 ranks (the saved run's data) the run then continues as
    the straight one, to fp32 rounding (another ep_size splits the same sums otherwise)."""
    directory, results, stage = saved
    world, ep_size, load_stage, data_before_expert = LAYOUTS[layout]
    load_stage = stage if load_stage is None else (1 if stage == 3 else 3)
    loaded = run_distributed(_load_then_train, world,
                             args=(directory, ep_size, load_stage, data_before_expert),
                             timeout=120)
    states = _whole(results, "states")
    _merged([found for found, _ in loaded])
    for rank, (found, _) in enumerate(loaded):
        assert found.keys() <= states.keys() and len(found) == 5 + 4 * cases.NUM_EXPERTS // ep_size
        for name, arrays in found.items():
            for array, value, want in zip(("master", "exp_avg", "exp_avg_sq"), arrays, states[name]):
                torch.testing.assert_close(value, want, rtol=0, atol=0,
                                           msg=f"{array} of {name} on rank {rank}")
    if world == 4:
        straight = _merged([found[0] for found in results])
        for rank, (_, weights) in enumerate(loaded):
            for name, value in weights.items():
                torch.testing.assert_close(value, straight[name], rtol=1e-5, atol=1e-6,
                                           msg=f"{name} on rank {rank}")


def test_save_16bit_model_writes_every_expert_by_its_global_id(saved):
    from zero.moe import MoE
    directory, results, _ = saved
    whole = torch.load(os.path.join(directory, "whole.bin"), weights_only=True)
    net = cases.build(MoE, 0, 1, 1)
    net.load_state_dict(whole)  # strict: every expert of a model with ep_size 1
    weights = _whole(results, "weights")
    for name, value in whole.items():
        torch.testing.assert_close(value, weights[name], msg=name)


def test_zero_to_fp32_writes_every_expert_by_its_global_id(saved):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint
    from zero.moe import MoE
    directory, results, _ = saved
    state = get_fp32_state_dict_from_zero_checkpoint(directory, tag="half")
    cases.build(MoE, 0, 1, 1).load_state_dict(state)  # strict: every expert, ep_size 1
    for name, (master, *_) in _whole(results, "states").items():
        torch.testing.assert_close(state[name], master, rtol=0, atol=0, msg=name)


# ---- layers of different ep_size, a frozen expert, expert buffers ---------------------------
def _pyramid_engine(rank, eps, stage, buffers: bool):
    """cases.PyramidNet on this rank: each expert with a buffer `id` (100 * layer + its global
    id, or -1 without `buffers`), the first layer's local expert 1 with its fc2.bias frozen
    (every rank freezes the same local parameters)."""
    import zero
    from zero.moe import MoE

    net = cases.pyramid(MoE, rank, eps)
    for index, (layer, ep) in enumerate(((net.first, eps[0]), (net.second, eps[1]))):
        local = layer.deepspeed_moe.experts.deepspeed_experts
        for i, expert in enumerate(local):
            global_id = (rank % ep) * len(local) + i
            expert.register_buffer("id", torch.tensor([100. * index + global_id if buffers
                                                       else -1.]))
            if index == 0 and i == 1:
                expert.fc2.bias.requires_grad_(False)
    zero_block = {"stage": stage, **(STAGE3 if stage == 3 else {})}
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(), config={
        **cases.config(stage), "gradient_clipping": 0.05, "zero_optimization": zero_block})
    return engine


def _buffers(engine):
    from zero.moe.checkpoint import global_names
    name = global_names(engine.module)
    return {name(n): b.clone() for n, b in engine.module.named_buffers() if n.endswith(".id")}


def _save_pyramid(rank, world, directory):
    engine = _pyramid_engine(rank, (2, 4), 2, buffers=True)
    _steps(engine, rank, range(2))
    engine.save_checkpoint(directory, tag="pyramid")
    return _optimizer_states(engine)


def _load_pyramid(rank, world, directory, eps, stage):
    engine = _pyramid_engine(rank, eps, stage, buffers=False)
    try:
        engine.load_checkpoint(directory, tag="pyramid")
    except ValueError as error:
        return str(error)
    return _optimizer_states(engine), _buffers(engine)


@pytest.fixture(scope="module")
def pyramid(tmp_path_factory):
    """4 ranks, the layers at ep_size 2 and 4 (the second's experts each on one rank: no
    expert data parallelism), stage 2, global experts 1 and 3 of the first layer with a
    frozen fc2.bias: (directory, the saved states)."""
    directory = str(tmp_path_factory.mktemp("moe_pyramid"))
    return directory, _merged(run_distributed(_save_pyramid, 4, args=(directory,), timeout=120))


@pytest.mark.parametrize("world, eps, stage", [(2, (2, 2), 3), (4, (2, 1), 2)],
                         ids=["2-ranks-ep2-ep2-stage3", "4-ranks-ep2-ep1"])
def test_layers_of_other_ep_sizes_load_with_frozen_experts_and_buffers(pyramid, world, eps,
                                                                       stage):
    directory, saved = pyramid
    # inp, the gates and the residual's MLP and coefficient; 4 parameters per expert, 2 frozen
    assert len(saved) == 2 + 2 + 4 + 2 + 2 * 16 - 2
    loaded = run_distributed(_load_pyramid, world, args=(directory, eps, stage), timeout=120)
    states = _merged([found for found, _ in loaded])
    assert states.keys() == saved.keys()
    for name, arrays in states.items():
        for value, want in zip(arrays, saved[name]):
            torch.testing.assert_close(value, want, rtol=0, atol=0, msg=name)
    buffers = _merged([found for _, found in loaded])
    assert {name: float(value) for name, value in buffers.items()} == {
        f"{layer}.deepspeed_moe.experts.deepspeed_experts.{e}.id": 100. * index + e
        for index, layer in enumerate(("first", "second")) for e in range(4)}


def test_an_expert_frozen_when_saved_and_trainable_now_is_named_on_every_rank(pyramid):
    """At ep_size 1 the first layer's local expert 1 is global expert 1 alone: global expert
    3's fc2.bias, frozen when saved, is trainable now."""
    directory, _ = pyramid
    errors = run_distributed(_load_pyramid, 2, args=(directory, (1, 2), 2), timeout=120)
    assert all(isinstance(e, str) and "trainable here, not in the checkpoint: "
               "first.deepspeed_moe.experts.deepspeed_experts.3.fc2.bias" in e for e in errors), errors


# ---- checkpoints the real DeepSpeed wrote (tests/deepspeed_moe/make_checkpoints.py) -------------
DEEPSPEED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deepspeed_moe", "checkpoints")


def _resume_deepspeed(rank, world, run, ep_size, stage, data_before_expert):
    """DeepSpeed's checkpoint resumed at this layout and trained on as DeepSpeed did: (the fp32
    masters as loaded, the losses, the weights after), by global name."""
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_fp32_param
    from zero.moe import MoE
    from zero.moe.checkpoint import global_names

    net = cases.build(MoE, rank, ep_size, 1)
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(), config={
        **cases.config(stage, run.split("-")[1]),
        "use_data_before_expert_parallelism": data_before_expert})
    engine.load_checkpoint(os.path.join(DEEPSPEED, run))  # (latest: global_step2)
    name = global_names(engine.module)
    masters = {name(n): safe_get_full_fp32_param(p) for n, p in engine.module.named_parameters()}
    losses = []
    for step in range(2, 4):
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return masters, losses, _weights(engine)


# (world, ep_size, stage: None for DeepSpeed's, use_data_before_expert_parallelism: None for
# DeepSpeed's, "other" for the other)
DEEPSPEED_LAYOUTS = {"as-saved": (4, 2, None, None), "4-ranks-ep4-stage3": (4, 4, 3, False),
                     "other-expert-layout-other-stage": (4, 2, "other", "other"),
                     "2-ranks-ep1": (2, 1, 2, False)}
DEEPSPEED_RUNS = ["stage1-fp32", "stage2-fp32", "stage1-bf16", "stage2-fp32-data-before-expert"]


def _as_saved(master: torch.Tensor, run: str) -> torch.Tensor:
    """An fp32 master as DeepSpeed's module held it at the save (bf16: rounded)."""
    return master.to(torch.bfloat16).float() if run.endswith("bf16") else master


@pytest.mark.parametrize("layout", DEEPSPEED_LAYOUTS)
@pytest.mark.parametrize("run", DEEPSPEED_RUNS)
def test_a_deepspeed_moe_checkpoint_resumes_at_any_layout(run, layout):
    """DeepSpeed saved 4 ranks at ep_size 2 after 2 steps (each rank's optimizer file holds its
    piece of the experts' group over its expert data-parallel group). Loaded into zero: every
    fp32 master is DeepSpeed's bit for bit (bf16: rounds to its weight); on 4 ranks
    (DeepSpeed's data) the next 2 steps give DeepSpeed's losses and weights, to rounding (no
    clipping: the two engines' MoE norms differ), which needs its Adam moments too."""
    expected = torch.load(os.path.join(DEEPSPEED, run, "expected.pt"), weights_only=True)
    world, ep_size, stage, data_before_expert = DEEPSPEED_LAYOUTS[layout]
    saved_stage, saved_layout = int(run[5]), run.endswith("data-before-expert")
    stage = saved_stage if stage is None else (3 - saved_stage if stage == "other" else stage)
    data_before_expert = {None: saved_layout, "other": not saved_layout}.get(
        data_before_expert, data_before_expert)
    results = run_distributed(_resume_deepspeed, world,
                              args=(run, ep_size, stage, data_before_expert), timeout=120)
    bf16 = run.endswith("bf16")
    for rank, (masters, losses, weights) in enumerate(results):
        assert len(masters) == 5 + 4 * cases.NUM_EXPERTS // ep_size
        for name, value in masters.items():
            torch.testing.assert_close(_as_saved(value, run), expected["at_save"][name],
                                       rtol=0, atol=0, msg=f"{name} on rank {rank}")
        if world == 4:
            # (bf16: within 2e-3 of DeepSpeed's here; fp32 without the moments: 3e-2 off)
            assert losses == pytest.approx(expected["losses"][rank], abs=1e-3 if bf16 else 1e-6)
            for name, value in weights.items():
                torch.testing.assert_close(value.float(), expected["after"][name],
                                           rtol=1e-2 if bf16 else 1e-5,
                                           atol=2e-3 if bf16 else 1e-6,
                                           msg=f"{name} on rank {rank}")


@pytest.mark.parametrize("run", DEEPSPEED_RUNS)
def test_zero_to_fp32_of_a_deepspeed_moe_checkpoint(run):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint
    from zero.moe import MoE
    expected = torch.load(os.path.join(DEEPSPEED, run, "expected.pt"), weights_only=True)
    state = get_fp32_state_dict_from_zero_checkpoint(os.path.join(DEEPSPEED, run))
    cases.build(MoE, 0, 1, 1).load_state_dict(state)  # strict: every expert, ep_size 1
    for name, value in expected["at_save"].items():
        torch.testing.assert_close(_as_saved(state[name], run), value, rtol=0, atol=0, msg=name)


def test_a_group_over_fewer_ranks_that_is_no_moe_layers_is_refused(tmp_path):
    """Without the MoE layers' record (num_experts), the experts' group partitioned over 2 of
    the 4 ranks reads as MiCS's: refused naming the partition counts."""
    import shutil

    from zero.checkpoint_deepspeed import load_file, read
    copy = str(tmp_path / "step")
    shutil.copytree(os.path.join(DEEPSPEED, "stage2-fp32", "global_step2"), copy)
    model_file = os.path.join(copy, "mp_rank_00_model_states.pt")
    model_state = load_file(model_file)
    model_state["num_experts"] = None
    torch.save(model_state, model_file)
    with pytest.raises(ValueError, match=r"partitions its groups over \[4, 2\] ranks of the 4"):
        read(copy)


def test_ds_to_universal_of_a_deepspeed_moe_checkpoint_is_refused(tmp_path):
    """(its per-parameter files would hold rank 0's experts' states only)"""
    from zero.checkpoint_to_universal import convert
    with pytest.raises(NotImplementedError, match="ds_to_universal of checkpoint .* MoE layers"):
        convert(os.path.join(DEEPSPEED, "stage2-fp32", "global_step2"), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")
