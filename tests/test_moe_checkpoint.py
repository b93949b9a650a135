"""Checkpoints of a model with MoE layers (zero/moe/checkpoint.py): each expert in a file of its
own under its global id, as DeepSpeed writes them; a resume at the same layout continues the
run exactly; the weights load at another world size and ep_size; optimizer states at another
layout, DeepSpeed's own MoE checkpoints and zero_to_fp32 are refused naming the fix;
save_16bit_model writes every expert, loadable into a model with ep_size 1."""
import os

import pytest
import torch

from deepspeed_reference import cases_of
from distributed_harness import RankFailed, run_distributed

cases = cases_of("moe")
# stage 3: every parameter partitioned, the whole model gathered for save_16bit_model
STAGE3 = {"stage3_param_persistence_threshold": 0, "stage3_model_persistence_threshold": 0,
          "stage3_gather_16bit_weights_on_model_save": True}


def _engine(rank, ep_size, stage, extra=None):
    import zero
    from zero.moe import MoE

    net = cases.build(MoE, rank, ep_size, 1)
    zero_block = {"stage": stage, **(STAGE3 if stage == 3 else {})}
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(), config={
        **cases.config(stage), "gradient_clipping": 0.05, "zero_optimization": zero_block,
        **(extra or {})})
    return engine


def _steps(engine, rank, steps):
    for step in steps:
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()


def _weights(engine):
    import zero
    with zero.GatheredParameters(list(engine.module.parameters())):  # (stage 3)
        return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _save_then_resume(rank, world, directory, stage):
    straight = _engine(rank, 2, stage)
    _steps(straight, rank, range(4))
    want = _weights(straight)
    straight.destroy()
    first = _engine(rank, 2, stage)
    _steps(first, rank, range(2))
    first.save_checkpoint(directory, tag="half")
    first.save_16bit_model(directory, "whole.bin")
    saved = _weights(first)
    first.destroy()
    second = _engine(rank, 2, stage)
    second.load_checkpoint(directory, tag="half")
    _steps(second, rank, range(2, 4))
    return want, _weights(second), saved


def _load_weights(rank, world, directory, ep_size, load_optimizer_states, stage):
    engine = _engine(rank, ep_size, stage)
    engine.load_checkpoint(directory, tag="half", load_optimizer_states=load_optimizer_states)
    return _weights(engine)


@pytest.fixture(scope="module", params=[2, 3], ids=["stage2", "stage3"])
def saved(tmp_path_factory, request):
    """4 ranks, ep_size 2: (directory, per rank (straight run's weights, resumed run's, the
    saved ones), stage)."""
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
    directory, results, stage = saved
    tag = os.path.join(directory, "half")
    module = files.load_torch(os.path.join(tag, "model_states.pt"))["module"]
    assert not [key for key in module if "deepspeed_experts" in key]
    for expert in range(cases.NUM_EXPERTS):
        state = files.load_torch(os.path.join(tag, f"layer_0_expert_{expert}_mp_rank_00_model_states.pt"))
        rank = expert // 2  # ep_size 2: experts 0, 1 on ranks 0, 2; 2, 3 on ranks 1, 3
        for key, value in state.items():
            assert f"deepspeed_experts.{expert}." in key
            local = key.replace(f"deepspeed_experts.{expert}.", f"deepspeed_experts.{expert % 2}.")
            torch.testing.assert_close(value, results[rank][2][local])


def _saved_weight(results, global_name):
    """The saved value of a parameter named as in a model with every expert (ep_size 1):
    global expert g was held by ranks r with r % 2 == g // 2 (ep_size 2), as local g % 2."""
    marker = "deepspeed_experts."
    if marker not in global_name:
        return results[0][2][global_name]
    head, tail = global_name.split(marker)
    expert, rest = tail.split(".", 1)
    return results[int(expert) // 2][2][f"{head}{marker}{int(expert) % 2}.{rest}"]


def test_the_weights_load_at_another_world_size_and_ep_size(saved):
    directory, results, stage = saved
    for ep_size in (1, 2):
        loaded = run_distributed(_load_weights, 2, args=(directory, ep_size, False, stage), timeout=120)
        for rank, found in enumerate(loaded):
            for name, value in found.items():
                torch.testing.assert_close(
                    value, _saved_weight(results, cases.global_name(name, rank, ep_size)),
                    msg=f"{name} on rank {rank} (ep_size {ep_size})")


def test_optimizer_states_at_another_layout_are_refused_on_every_rank(saved):
    directory, _, stage = saved
    with pytest.raises(RankFailed, match="optimizer states load only at that layout"):
        run_distributed(_load_weights, 2, args=(directory, 2, True, stage), timeout=120)


def test_save_16bit_model_writes_every_expert_by_its_global_id(saved):
    from zero.moe import MoE
    directory, results, stage = saved
    whole = torch.load(os.path.join(directory, "whole.bin"), weights_only=True)
    net = cases.build(MoE, 0, 1, 1)
    net.load_state_dict(whole)  # strict: every expert of a model with ep_size 1
    for name, value in whole.items():
        torch.testing.assert_close(value, _saved_weight(results, name), msg=name)


def test_zero_to_fp32_of_split_experts_is_refused(saved):
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint
    directory, _, stage = saved
    with pytest.raises(NotImplementedError, match="save_16bit_model"):
        get_fp32_state_dict_from_zero_checkpoint(directory, tag="half")


def _load_other_layout_flag(rank, world, directory, stage):
    engine = _engine(rank // 2, 2, stage, {"use_data_before_expert_parallelism": True})
    try:
        engine.load_checkpoint(directory, tag="half")
    except Exception as error:  # noqa: BLE001 -- the refusal is the answer
        return str(error)
    return None


def test_optimizer_states_of_the_other_expert_layout_are_refused(saved):
    """Saved "E + D", resumed "D + E" on as many ranks: each rank's shard holds other
    experts' states."""
    directory, _, stage = saved
    errors = run_distributed(_load_other_layout_flag, 4, args=(directory, stage), timeout=120)
    assert all(e and "ep_size 2 and use_data_before_expert_parallelism false;" in e for e in errors), errors
