"""deepspeed.utils' safe_get_full_* / safe_set_full_* and their local forms on zero: each
parameter's whole fp32 master and Adam moments, put together from the ranks' shards at every
stage, equal torch.optim.AdamW's after the same steps on the global batch; its reduced
gradient equals the global batch's, and a gradient set before the step is what it applies."""
import copy

import pytest
import torch

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)
STEPS = 2


def _full_values(rank, world, stage, offload=False):
    import zero
    from zero.compat.deepspeed.utils import (safe_get_full_fp32_param,
                                             safe_get_full_optimizer_state)

    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    if offload:  # the shards in host memory
        extra["offload_optimizer"] = {"device": "cpu"}
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=training.engine_config(
        stage, gas=1, scheduler=False, **extra))
    training.train_engine(engine, rank, world, STEPS, 1)
    values = {}
    for name, param in engine.module.named_parameters():
        values[name] = {"master": safe_get_full_fp32_param(param),
                        "exp_avg": safe_get_full_optimizer_state(param, "exp_avg"),
                        "exp_avg_sq": safe_get_full_optimizer_state(param, "exp_avg_sq")}
    return values


def _reference(world):
    """torch.optim.AdamW on the global batch: each parameter's weights and moments."""
    config = training.engine_config(2, gas=1, scheduler=False)
    model = training.make_model()
    optimizer = training.reference_adamw(model.parameters(), config)
    data = training.batches(world, STEPS, 1)
    for step in range(STEPS):
        optimizer.zero_grad()
        parts = [data[step * world + r] for r in range(world)]
        model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config["gradient_clipping"])
        optimizer.step()
    return {name: {"master": p.detach(), "exp_avg": optimizer.state[p]["exp_avg"],
                   "exp_avg_sq": optimizer.state[p]["exp_avg_sq"]}
            for name, p in model.named_parameters()}


@pytest.mark.parametrize("stage,offload", [(0, False), (1, False), (2, False), (3, False),
                                           (2, True)])
def test_full_master_and_moments_are_adamws(stage, offload):
    results = run_distributed(_full_values, 2, args=(stage, offload))
    reference = _reference(2)
    for values in results:  # every rank gets the whole value
        assert set(values) == set(reference)
        for name, arrays in reference.items():
            for array, expected in arrays.items():
                got = values[name][array]
                assert got.shape == expected.shape and got.dtype == torch.float32, (name, array)
                # to rounding: the engine sums in another order (5e-6 of the largest seen)
                assert training.relative_error(got, expected) < 1e-4, (name, array)


def _set_then_get(rank, world, stage):
    import zero
    from zero.compat.deepspeed.utils import (safe_get_full_fp32_param,
                                             safe_get_full_optimizer_state,
                                             safe_set_full_fp32_param,
                                             safe_set_full_optimizer_state)

    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=training.engine_config(
        stage, gas=1, scheduler=False, **extra))
    training.train_engine(engine, rank, world, 1, 1)
    params = dict(engine.module.named_parameters())
    target = params["blocks.0.attn.qkv.weight"]
    other = params["blocks.1.mlp.0.weight"]
    before = copy.deepcopy(safe_get_full_fp32_param(other))
    shape = safe_get_full_fp32_param(target).shape  # (at stage 3 the module's is a placeholder)
    values = torch.arange(shape.numel(), dtype=torch.float32).view(shape)
    safe_set_full_fp32_param(target, values)
    safe_set_full_optimizer_state(target, values * 2, "exp_avg")
    return (torch.equal(safe_get_full_fp32_param(target), values),
            torch.equal(safe_get_full_optimizer_state(target, "exp_avg"), values * 2),
            torch.equal(safe_get_full_fp32_param(other), before))


@pytest.mark.parametrize("stage", [1, 3])
def test_set_writes_one_parameter_on_every_rank(stage):
    assert run_distributed(_set_then_get, 2, args=(stage,)) == [(True, True, True)] * 2


def _weights_after_a_set(rank, world, stage):
    """fp32, where the parameters are the master: the module's weights right after a set,
    one large (partitioned at stage 3) and one small (kept whole at stage 3)."""
    import zero
    from zero.compat.deepspeed.utils import safe_set_full_fp32_param

    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=training.engine_config(
        stage, gas=1, scheduler=False, **extra))
    training.train_engine(engine, rank, world, 1, 1)
    params = dict(engine.module.named_parameters())
    seen = {}
    for name in ("blocks.0.attn.qkv.weight", "blocks.0.ln1.bias"):
        shape = engine.full_shapes[name]
        safe_set_full_fp32_param(params[name], torch.linspace(-1, 1, shape.numel()).view(shape))
        with zero.GatheredParameters([params[name]]):
            seen[name] = params[name].detach().clone()
    return seen


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_set_master_is_the_weight_of_every_rank_where_the_weights_are_the_master(stage):
    """Each rank writing only its own elements into weights that are the master left the
    ranks' forward on different weights until the next step."""
    results = run_distributed(_weights_after_a_set, 2, args=(stage,))
    for seen in results:
        for weight in seen.values():
            assert torch.equal(weight.view(-1), torch.linspace(-1, 1, weight.numel()))


def _local_fragments(rank, world, stage):
    import zero
    from zero.compat.deepspeed.utils import (safe_get_full_fp32_param, safe_get_local_fp32_param,
                                             safe_set_full_fp32_param, safe_set_local_fp32_param)

    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    engine, _, _, _ = zero.initialize(model=training.make_model(freeze_position_embedding=True),
                                      config=training.engine_config(stage, gas=1,
                                                                    scheduler=False, **extra))
    training.train_engine(engine, rank, world, 1, 1)
    params = dict(engine.module.named_parameters())
    target, frozen = params["blocks.0.attn.qkv.weight"], params["position_embedding.weight"]
    full = safe_get_full_fp32_param(target)
    local = safe_get_local_fp32_param(target)
    safe_set_local_fp32_param(target, local * 2)
    safe_set_full_fp32_param(frozen, torch.zeros(frozen.shape))  # not trained: nothing happens
    return (local.numel(), torch.equal(safe_get_full_fp32_param(target), full * 2),
            safe_get_full_fp32_param(frozen), safe_get_local_fp32_param(frozen))


@pytest.mark.parametrize("stage", [2, 3])
def test_each_rank_holds_and_writes_its_own_fragment(stage):
    results = run_distributed(_local_fragments, 2, args=(stage,))
    assert sum(numel for numel, *_ in results) == 96 * 32  # the fragments make the whole
    assert [rest for _, *rest in results] == [[True, None, None]] * 2


def _boundary_config(stage, gas, offload, precision="fp32"):
    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    if offload:
        extra["offload_optimizer"] = {"device": "cpu"}
    return training.engine_config(stage, gas=gas, scheduler=False, precision=precision, **extra)


def _grads_after_backward(rank, world, stage, gas, offload, precision):
    """One step's micro-batches through the engine, then every trained parameter's full and
    local gradient read at the boundary; and what a read after the step says."""
    from zero.compat.deepspeed.utils import safe_get_full_grad, safe_get_local_grad

    engine = training.engine_at_boundary(_boundary_config(stage, gas, offload, precision),
                                         rank, world)
    full = {name: safe_get_full_grad(p).cpu() for name, p in engine.module.named_parameters()}
    local = {name: safe_get_local_grad(p).numel() for name, p in engine.module.named_parameters()}
    scale = engine.optimizer.cur_scale  # fp16's is still in the gradients, as DeepSpeed's
    engine.step()
    try:
        safe_get_full_grad(next(engine.module.parameters()))
        after_step = "no error"
    except RuntimeError as error:
        after_step = str(error)
    return {name: grad / scale for name, grad in full.items()}, local, after_step, scale


@pytest.mark.parametrize("stage,gas,offload,precision,tolerance", [
    (0, 1, False, "fp32", 1e-5), (1, 2, False, "fp32", 1e-5), (1, 1, False, "fp32", 1e-5),
    (2, 2, False, "fp32", 1e-5), (2, 1, True, "fp32", 1e-5), (3, 2, False, "fp32", 1e-5),
    (3, 1, True, "fp32", 1e-5), (2, 1, False, "bf16", 3e-2), (2, 1, False, "fp16", 3e-3)])
def test_full_gradient_is_the_global_batch_gradient(stage, gas, offload, precision, tolerance):
    results = run_distributed(_grads_after_backward, 2, args=(stage, gas, offload, precision))
    reference = training.reference_grads(2, gas)
    for full, _, after_step, scale in results:
        assert scale == (2 ** 8 if precision == "fp16" else 1.0)  # engine_config's fp16 block
        assert set(full) == set(reference)
        for name, expected in reference.items():
            got = full[name]
            assert got.shape == expected.shape and got.dtype == torch.float32, name
            assert training.relative_error(got, expected) < tolerance, name
        assert "only there between engine.backward(loss)" in after_step
    for name, expected in reference.items():  # the ranks' fragments make the whole
        held = sum(local[name] for _, local, _, _ in results)
        assert held == (expected.numel() if stage else 2 * expected.numel()), name


def _set_grads_then_step(rank, world, stage, gas, offload):
    """Replaces one parameter's whole gradient and negates each rank's fragment of another's
    (Adam's first step follows the gradient's sign), then steps; the fp32 masters after it."""
    from zero.compat.deepspeed.utils import (safe_get_full_fp32_param, safe_get_local_grad,
                                             safe_set_full_grad, safe_set_local_grad)

    engine = training.engine_at_boundary(_boundary_config(stage, gas, offload), rank, world)
    params = dict(engine.module.named_parameters())
    safe_set_full_grad(params[REPLACED], _replacement())
    safe_set_local_grad(params[NEGATED], -safe_get_local_grad(params[NEGATED]))
    engine.step()
    return {name: safe_get_full_fp32_param(p) for name, p in params.items()}


REPLACED, NEGATED = "blocks.0.attn.qkv.weight", "blocks.1.mlp.0.weight"


def _replacement():
    return torch.linspace(-0.05, 0.05, 96 * 32).view(96, 32)


def _reference_step(grads, gas):
    """AdamW's weights after one step on `grads`, clipped as the engine clips."""
    config = training.engine_config(2, gas=gas, scheduler=False)
    model = training.make_model()
    optimizer = training.reference_adamw(model.parameters(), config)
    for name, p in model.named_parameters():
        p.grad = grads[name].clone()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config["gradient_clipping"])
    optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize("stage,gas,offload", [(0, 1, False), (1, 2, False), (2, 1, True),
                                               (3, 2, False)])
def test_set_gradients_are_what_the_step_applies(stage, gas, offload):
    results = run_distributed(_set_grads_then_step, 2, args=(stage, gas, offload))
    grads = training.reference_grads(2, gas)
    unchanged = _reference_step(grads, gas)  # the check can fail: the set values matter
    grads[REPLACED], grads[NEGATED] = _replacement(), -grads[NEGATED]
    expected = _reference_step(grads, gas)
    for masters in results:
        for name, weights in expected.items():  # to rounding (6e-5 seen with gas 2)
            assert training.relative_error(masters[name], weights) < 1e-4, name
        for name in (REPLACED, NEGATED):
            assert training.relative_error(masters[name], unchanged[name]) > 1e-3, name


def _ranges_against_whole_shards(rank, world, stage, precision, offload, nvme_dir):
    """Every trained parameter's fragment of the master and of each optimizer-state array,
    read by range, equals the same elements of the group's whole shard (copied out of the
    engine); a fragment written by range changes those elements and nothing else."""
    import zero
    from zero.checkpoint_pieces import RankPieces
    from zero.param_values import find
    from zero.compat.deepspeed.utils import (safe_get_local_fp32_param,
                                             safe_get_local_optimizer_state,
                                             safe_set_local_fp32_param,
                                             safe_set_local_optimizer_state)

    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    if offload:
        extra["offload_optimizer"] = {"device": offload, "ratio": 0.5} if offload == "cpu" \
            else {"device": "nvme", "nvme_path": nvme_dir}
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=training.engine_config(
        stage, gas=1, scheduler=False, precision=precision, **extra))
    training.train_engine(engine, rank, world, 1, 1)
    core, checked = engine.core, 0

    def whole(g):
        return {"master": core.group_master_shard(g), **dict(core.group_optimizer_state(g))}

    for g, group in enumerate(engine.groups):
        layout, before = core.group_layout(g), whole(g)
        for i, param in enumerate(group.params):
            runs = RankPieces(layout, rank).of(layout.param_offset(i), find(param)[3].numel())
            positions = torch.cat([torch.arange(p, p + stop - start) for start, stop, p in runs]) \
                if runs else torch.zeros(0, dtype=torch.long)
            for array in before:
                got = safe_get_local_fp32_param(param) if array == "master" else \
                    safe_get_local_optimizer_state(param, array)
                assert torch.equal(got.cpu(), before[array][positions].cpu()), (g, i, array)
                checked += 1
        if len(group.params) > 1 and before["master"].numel():
            param = group.params[1]
            fragment = safe_get_local_optimizer_state(param, "exp_avg")
            safe_set_local_optimizer_state(param, torch.full_like(fragment, 7.0), "exp_avg")
            safe_set_local_fp32_param(param, safe_get_local_fp32_param(param) + 1)
            after = whole(g)
            changed = {a: (after[a] != before[a]).nonzero().flatten().tolist() for a in after}
            runs = RankPieces(layout, rank).of(layout.param_offset(1), find(param)[3].numel())
            mine = sorted(p + k for start, stop, p in runs for k in range(stop - start))
            assert changed["exp_avg"] == mine and changed["master"] == mine, g
            assert all(not v for a, v in changed.items() if a not in ("master", "exp_avg")), g
    training.train_engine(engine, rank, world, 1, 1, first_step=1)  # and it trains on
    return checked


@pytest.mark.parametrize("stage,precision,offload", [
    (1, "fp32", None), (2, "bf16", None), (2, "bf16", "cpu"), (3, "bf16", "cpu"),
    (3, "fp32", None), (2, "fp32", "nvme")])
def test_ranges_read_and_write_the_elements_of_the_whole_shards(tmp_path, stage, precision,
                                                                offload):
    checked = run_distributed(_ranges_against_whole_shards, 2,
                              args=(stage, precision, offload, str(tmp_path)))
    assert min(checked) > 20


def _empty_group(rank, world, save_dir):
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_fp32_param

    model = training.make_model()
    model.register_parameter("nothing", torch.nn.Parameter(torch.empty(0)))
    config = training.engine_config(2, gas=1, scheduler=False)
    del config["optimizer"]
    others = [p for n, p in model.named_parameters() if n != "nothing"]
    optimizer = torch.optim.AdamW([{"params": others}, {"params": [model.nothing]}], lr=1e-3)
    engine, _, _, _ = zero.initialize(model=model, config=config, optimizer=optimizer)
    training.train_engine(engine, rank, world, 1, 1)
    engine.save_checkpoint(save_dir)  # every group's optimizer state, the empty one's too
    return safe_get_full_fp32_param(model.nothing), \
        tuple(safe_get_full_fp32_param(others[0]).shape)


def test_a_group_of_no_elements_trains_and_saves(tmp_path):
    """An optimizer group holding only a parameter of no elements: the engine leaves it out,
    as a frozen one (it crashed the step, and a read of its empty shard the process)."""
    for empty, other in run_distributed(_empty_group, 2, args=(str(tmp_path),)):
        assert empty is None and other == tuple(training.make_model().token_embedding
                                                .weight.shape)


def _doubled_gradients(rank, world, stage, gas):
    from zero.compat.deepspeed.utils import (safe_get_full_grad,
                                             safe_update_full_grad_vectorized)

    engine = training.engine_at_boundary(_boundary_config(stage, gas, False), rank, world)
    params = list(engine.module.parameters())
    before = [safe_get_full_grad(p) for p in params]
    safe_update_full_grad_vectorized(params, lambda grad, param: grad * 2)
    return all(torch.allclose(safe_get_full_grad(p), 2 * b) for p, b in zip(params, before))


@pytest.mark.parametrize("stage,gas", [(0, 1), (1, 2), (2, 1), (3, 1)])
def test_a_vectorized_gradient_update_is_what_the_step_sees(stage, gas):
    """DeepSpeed's safe_update_full_grad_vectorized: param.grad in place at stage 0, the
    engine's sharded gradients otherwise."""
    assert run_distributed(_doubled_gradients, 2, args=(stage, gas)) == [True, True]
