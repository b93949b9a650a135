"""deepspeed.utils.safe_get_full_fp32_param / safe_get_full_optimizer_state and their setters
on zero: each parameter's whole fp32 master and Adam moments, put together from the ranks'
shards at every stage, equal torch.optim.AdamW's after the same steps on the global batch."""
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
    hyper = config["optimizer"]["params"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=hyper["lr"], betas=tuple(hyper["betas"]),
                                  eps=hyper["eps"], weight_decay=hyper["weight_decay"],
                                  foreach=False)
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


def test_the_gradient_getter_says_it_is_not_built():
    from zero.compat.deepspeed.utils import safe_get_full_grad

    with pytest.raises(NotImplementedError, match="engine.get_global_grad_norm"):
        safe_get_full_grad(torch.nn.Parameter(torch.zeros(1)))
