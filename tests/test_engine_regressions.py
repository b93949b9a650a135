"""Regression tests for engine bugs found in review: each names the behaviour it protects."""
import gc

import pytest
import torch

import training
from distributed_harness import run_distributed


def _load_module_only_keeps_loaded_weights(rank, world, save_dir):
    import zero

    config = training.engine_config(2, gas=1, precision="bf16", scheduler=False)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(save_dir)
    saved = training.parameters_of(engine.module)
    engine.destroy()

    config["optimizer"]["params"]["lr"] = 0.0  # a step at lr 0 must not move anything
    config["optimizer"]["params"]["weight_decay"] = 0.0
    fresh, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    fresh.load_checkpoint(save_dir, load_module_only=True)
    training.train_engine(fresh, rank, world, 1, 1)
    after = training.parameters_of(fresh.module)
    return max((after[k] - saved[k]).abs().max().item() for k in saved)


def test_bf16_weights_loaded_without_optimizer_state_survive_the_next_step(tmp_path):
    for drift in run_distributed(_load_module_only_keeps_loaded_weights, 2, args=(str(tmp_path),)):
        assert drift == 0.0


def _weights_into_another_recipe(rank, world, save_dir, load_stage):
    import zero

    config = training.engine_config(2, gas=1, scheduler=False)  # fp32, AdamW
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(save_dir)
    saved = training.parameters_of(engine.module)
    engine.destroy()

    other = training.engine_config(load_stage, gas=1, precision="bf16", scheduler=False)
    other["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    model = training.make_model(freeze_position_embedding=True)
    fresh, _, _, _ = zero.initialize(model=model, config=other)
    fresh.load_checkpoint(save_dir, load_module_only=True)
    with zero.GatheredParameters(list(fresh.module.parameters())):
        loaded = training.parameters_of(fresh.module)
    losses = training.train_engine(fresh, rank, world, 1, 1, first_step=2)
    return max((loaded[k] - saved[k].bfloat16().float()).abs().max().item() for k in saved), \
        losses


@pytest.mark.parametrize("load_stage", [2, 3])
def test_load_module_only_takes_the_weights_into_another_dtype_optimizer_and_frozen_set(
        tmp_path, load_stage):
    """Pretrained weights, then a different recipe (bf16, SGD, a frozen embedding): only the
    module's weights are loaded, cast as a state dict is; it was refused for the dtype."""
    for difference, losses in run_distributed(_weights_into_another_recipe, 2,
                                              args=(str(tmp_path), load_stage)):
        assert difference == 0.0
        assert all(loss == loss and loss < 20 for loss in losses)


def _master_after_own_load(rank, world, stage, save_dir, load_optimizer_states):
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_fp32_param

    config = training.engine_config(stage, gas=1, precision="bf16", scheduler=False)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(save_dir)
    saved = {n: safe_get_full_fp32_param(p) for n, p in engine.module.named_parameters()}
    engine.destroy()
    fresh, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    fresh.load_checkpoint(save_dir, load_optimizer_states=load_optimizer_states)
    master = {n: safe_get_full_fp32_param(p) for n, p in fresh.module.named_parameters()}
    moments = [v for g in range(fresh.core.group_count)
               for k, v in dict(fresh.core.group_optimizer_state(g)).items() if k == "exp_avg"]
    return saved, master, any(bool(v.any()) for v in moments)


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("load_optimizer_states", [True, False])
def test_a_load_without_optimizer_state_takes_the_master_from_the_module(tmp_path, stage,
                                                                         load_optimizer_states):
    """As DeepSpeed 0.19.8 (tests/deepspeed_checkpoints/*/loaded.pt): without the optimizer
    state the fp32 master is rebuilt from the loaded bf16 weights and Adam starts afresh."""
    for saved, master, moments in run_distributed(
            _master_after_own_load, 2, args=(stage, str(tmp_path), load_optimizer_states)):
        assert moments == load_optimizer_states
        for name, value in master.items():
            want = saved[name] if load_optimizer_states else saved[name].bfloat16().float()
            assert torch.equal(value, want), name
        assert load_optimizer_states or any(not torch.equal(master[n], saved[n]) for n in saved)


def _different_seeds(rank, world):
    import zero

    torch.manual_seed(rank)  # each rank builds a different model
    model = training.TinyGPT(training.MODEL)
    engine, _, _, _ = zero.initialize(model=model, config=training.engine_config(0, gas=1))
    training.train_engine(engine, rank, world, 2, 1)
    return training.parameters_of(engine.module)


def test_every_rank_starts_from_rank_0s_weights():
    first, second = run_distributed(_different_seeds, 2)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def _zero_grad_to_none(rank, world):
    import zero

    model = training.make_model()
    engine, _, _, _ = zero.initialize(model=model, config=training.engine_config(1, gas=2))
    data = training.batches(world, 1, 2)
    tokens, targets = data[rank]
    engine.backward(engine(tokens, targets))
    engine.step()
    model.zero_grad()  # set_to_none=True: the first micro-step's gradients are discarded
    tokens, targets = data[world + rank]
    engine.backward(engine(tokens, targets) * 2)  # x2: this is the only micro-step (gas 2)
    engine.step()
    return training.parameters_of(engine.module)


def test_model_zero_grad_between_micro_steps_discards_the_accumulated_gradients():
    import copy

    world = 2
    results = run_distributed(_zero_grad_to_none, world)
    # Reference: one step on the second micro-batch alone.
    model = training.make_model()
    config = training.engine_config(1, gas=2)
    hyper = config["optimizer"]["params"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=hyper["lr"], betas=tuple(hyper["betas"]),
                                  eps=hyper["eps"], weight_decay=hyper["weight_decay"], foreach=False)
    from zero.schedulers import build_scheduler
    build_scheduler(config["scheduler"]["type"], copy.deepcopy(config["scheduler"]["params"]), optimizer)
    data = training.batches(world, 1, 2)
    parts = [data[world + r] for r in range(world)]
    model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    for params in results:
        for name, value in training.parameters_of(model).items():
            assert training.relative_error(params[name], value) < 1e-5, name


def _step_inside_no_sync(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(1, gas=1))
    tokens, targets = training.batches(world, 1, 1)[rank]
    with engine.no_sync():
        engine.backward(engine(tokens, targets))
        with pytest.raises(RuntimeError, match="inside no_sync\\(\\) would apply unreduced"):
            engine.step()
    # outside it, the step names no_sync (it blamed a backward around the engine)
    with pytest.raises(RuntimeError, match="backward ran inside engine.no_sync\\(\\)"):
        engine.step()
    return True


def test_step_at_a_boundary_inside_no_sync_is_refused():
    assert run_distributed(_step_inside_no_sync, 2) == [True, True]


def _client_scheduler(rank, world):
    import zero

    model = training.make_model()
    adamw = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(adamw, step_size=1, gamma=0.1)
    config = training.engine_config(1, gas=1, scheduler=False)
    del config["optimizer"]
    engine, _, _, engine_scheduler = zero.initialize(model=model, optimizer=adamw,
                                                     lr_scheduler=scheduler, config=config)
    training.train_engine(engine, rank, world, 3, 1)
    return engine.get_lr(), engine_scheduler.get_last_lr()


def test_a_client_scheduler_steers_the_lr_the_engine_uses():
    for engine_lr, scheduler_lr in run_distributed(_client_scheduler, 2):
        assert engine_lr == pytest.approx(scheduler_lr)
        assert engine_lr[0] == pytest.approx(0.1 * 0.1 ** 3)


def _engine_is_released(rank, world):
    import zero

    model = training.make_model()
    engine, _, _, _ = zero.initialize(model=model, config=training.engine_config(2, gas=1))
    training.train_engine(engine, rank, world, 1, 1)
    engine.destroy()
    del engine
    gc.collect()
    second, _, _, _ = zero.initialize(model=model, config=training.engine_config(2, gas=1))
    return training.train_engine(second, rank, world, 1, 1)


def test_a_destroyed_engine_leaves_the_model_free_for_a_new_one():
    losses = run_distributed(_engine_is_released, 2)
    assert losses[0] == losses[1]


def _new_engine_after_a_stage3_destroy(rank, world):
    import zero

    model = training.make_model()
    config = training.engine_config(3, gas=1, stage3_param_persistence_threshold=0)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    training.train_engine(engine, rank, world, 1, 1)
    engine.destroy()
    try:
        zero.initialize(model=model, config=config)
    except ValueError as error:
        return str(error)
    return None


def test_a_new_engine_over_parameters_a_destroyed_stage3_engine_partitioned_says_so():
    """They hold no values after destroy (as DeepSpeed's): "no trainable parameters" named
    the wrong cause."""
    for message in run_distributed(_new_engine_after_a_stage3_destroy, 2):
        assert message is not None and "destroyed" in message and "save" in message
        assert "token_embedding.weight" in message


def _calls_after_destroy(rank, world, stage):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(stage, gas=1))
    tokens = torch.randint(0, training.MODEL.vocab_size, (2, 8))
    loss = engine(tokens, tokens)
    engine.destroy()
    engine.zero_grad()  # nothing left to clear: a no-op, as before
    plain = engine(tokens, tokens)  # a plain module's forward, as under DeepSpeed
    named = [torch.allclose(plain, loss)]
    for call, run in (("backward", lambda: engine.backward(loss)), ("step", engine.step),
                      ("save_checkpoint", lambda: engine.save_checkpoint("unused")),
                      ("load_checkpoint", lambda: engine.load_checkpoint("unused")),
                      ("offload_states", engine.offload_states),
                      ("reload_states", engine.reload_states),
                      ("apply_delayed_update", engine.apply_delayed_update),
                      ("memory_report", engine.memory_report)):
        with pytest.raises(RuntimeError, match=rf"engine\.{call}\(\) after engine\.destroy\(\)"):
            run()
        named.append(call)
    return named


@pytest.mark.parametrize("stage", [1, 3])
def test_a_destroyed_engines_calls_say_it_was_destroyed(stage):
    [named] = run_distributed(_calls_after_destroy, 1, args=(stage,))
    assert named[0] is True and len(named) == 9  # the forward ran, the 8 calls were named


def test_client_optimizer_options_zero_does_not_build_run_the_client_itself():
    """amsgrad, maximize, ...: the client optimizer runs on the shards as it is
    (tests/test_external_optimizer.py trains with them); an Adam needs no DeepSpeed consent."""
    from zero.optimizer import OptimizerSpec

    model = training.make_model()
    amsgrad = OptimizerSpec.from_torch(torch.optim.AdamW(model.parameters(), amsgrad=True))
    assert amsgrad.kind == "external" and not amsgrad.needs_untested_flag()
    group = amsgrad.external.client.param_groups[0]
    assert amsgrad.external.state_names(group) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
    maximize = OptimizerSpec.from_torch(torch.optim.SGD(model.parameters(), lr=0.1, maximize=True))
    assert maximize.kind == "external" and maximize.needs_untested_flag()


def _optimizer_mismatch(rank, world, save_dir):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(1, gas=1))
    engine.save_checkpoint(save_dir)
    engine.destroy()
    config = training.engine_config(1, gas=1, scheduler=False)
    config["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    other, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    with pytest.raises(ValueError, match="optimizer='adam' but this engine has optimizer='sgd'"):
        other.load_checkpoint(save_dir)
    return True


def test_loading_another_optimizers_checkpoint_names_the_mismatch(tmp_path):
    assert run_distributed(_optimizer_mismatch, 2, args=(str(tmp_path),)) == [True, True]


class _AuxNet(torch.nn.Module):
    """Four layers, plus an aux head only some ranks use (a data-dependent branch)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32, bias=False) for _ in range(4))
        self.aux = torch.nn.Linear(32, 32, bias=False)

    def forward(self, x, use_aux):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        out = x.pow(2).mean()
        return out + self.aux(x).pow(2).mean() if use_aux else out


def _aux_inputs(rank):
    return torch.randn(4, 32, generator=torch.Generator().manual_seed(rank))


def _aux_step(rank, world, stage, persistence=None):
    import zero

    model = _AuxNet()
    groups = [{"params": list(model.layers.parameters())}, {"params": list(model.aux.parameters())}]
    config = {"train_micro_batch_size_per_gpu": 4,
              "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 1024,
                                    "overlap_comm": True}}
    if persistence is not None:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = persistence
    engine, _, _, _ = zero.initialize(model=model, model_parameters=groups, config=config)

    def weights():
        with zero.GatheredParameters(list(engine.module.parameters())):  # (stage 3: whole)
            return {n: p.detach().clone() for n, p in engine.module.named_parameters()}

    updates, buckets = [], []
    for _ in range(3):
        before = weights()
        engine.backward(engine(_aux_inputs(rank), rank == 0))  # only rank 0 takes aux
        engine.step()
        after = weights()
        updates.append({n: before[n] - after[n] for n in before})
        bucket = engine.memory_report()["categories"].get("bucket", {"peak": 0})
        buckets.append(bucket["peak"])
    return updates[0], buckets


# Stage 3: the aux head is in the root unit; partitioned (persistence 0) or kept whole (the
# default threshold keeps 32x32 weights whole). Its reduction is ready mid-backward on rank 0
# and only at the end on rank 1, between different gathers: it used to hang.
@pytest.mark.parametrize("stage,persistence", [(0, None), (1, None), (2, None), (3, 0),
                                               (3, None)])
def test_several_groups_with_a_rank_dependent_branch_average_the_right_gradients(stage,
                                                                                 persistence):
    world = 2
    expected = {}
    for rank in range(world):
        model = _AuxNet()
        model(_aux_inputs(rank), rank == 0).backward()
        for name, param in model.named_parameters():
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            expected[name] = expected.get(name, 0) + grad / world
    for rank, (update, buckets) in enumerate(run_distributed(_aux_step, world, timeout=60,
                                                             args=(stage, persistence))):
        for name, value in expected.items():
            assert torch.allclose(update[name], value, rtol=1e-4, atol=1e-7), name
        if stage == 2:
            # Buckets (a unit each, fp32: one micro-step per step, so the reduced half goes
            # straight into the gradient shard) at their peak. The first backward
            # (default order): 2 (overlap) for the layers + 1 for aux. Then every rank
            # launches in rank 0's order, aux first; on rank 1, which never uses aux, aux
            # completes only at the end of backward, so the layers' buckets wait behind it,
            # one per unit (5), and no more in later steps.
            one = 1024 * 4
            assert buckets == [3 * one] + [(3 if rank == 0 else 5) * one] * 2, (rank, buckets)


def _mixed_momentum(rank, world):
    import zero

    model = training.make_model()
    params = list(model.parameters())
    groups = [{"params": params[:4], "momentum": 0.9}, {"params": params[4:], "momentum": 0.0}]
    config = training.engine_config(1, gas=1, scheduler=False)
    config["optimizer"] = {"type": "SGD", "params": {"lr": 0.05}}
    engine, _, _, _ = zero.initialize(model=model, model_parameters=groups, config=config)
    training.train_engine(engine, rank, world, 1, 1)
    state = engine.memory_report()["categories"]["optimizer_state"]
    return state["current"], state["expected"]


def test_the_report_expects_momentum_only_for_groups_that_have_it():
    for current, expected in run_distributed(_mixed_momentum, 2):
        assert current == expected > 0


def _grads_seen_at_the_boundary(rank, world, stage):
    engine = training.engine_at_boundary(training.engine_config(
        stage, gas=2, scheduler=False, stage3_param_persistence_threshold=40), rank, world)
    return {name: None if p.grad is None else p.grad.clone()
            for name, p in engine.module.named_parameters()}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_param_grad_at_a_boundary_is_the_average_or_none_as_deepspeeds(stage):
    """Stage 0 shows the averaged gradients (equal on every rank); stages 1-3 none, as
    DeepSpeed. Stage 1's accumulation buffer (and stage 3's for the parameters kept whole)
    used to show through param.grad: the average in this rank's pieces, its own sum elsewhere."""
    first, second = run_distributed(_grads_seen_at_the_boundary, 2, args=(stage,))
    if stage == 0:
        assert all(torch.equal(first[name], second[name]) for name in first)
    else:
        assert set(first.values()) == set(second.values()) == {None}


def _first_grad_norm(rank, world, stage):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=training.engine_config(
        stage, gas=1, scheduler=False))
    before = engine.get_global_grad_norm()
    training.train_engine(engine, rank, world, 1, 1)
    return before, engine.get_global_grad_norm()


@pytest.mark.parametrize("stage", [0, 3])
def test_the_global_grad_norm_is_a_tensor_as_deepspeeds(stage):
    """DeepSpeed returns a tensor (None at stage 0 with a torch optimizer in fp32, where zero
    gives the norm too), and scripts log it with .item(); it was a Python float."""
    model = training.make_model()
    data = training.batches(2, 1, 1)
    model(torch.cat([data[0][0], data[1][0]]), torch.cat([data[0][1], data[1][1]])).backward()
    expected = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    for before, norm in run_distributed(_first_grad_norm, 2, args=(stage,)):
        assert before is None
        assert isinstance(norm, torch.Tensor) and norm.dim() == 0 and norm.dtype == torch.float32
        assert norm.item() == pytest.approx(expected, rel=1e-5)


def _grads_around_allreduce(rank, world, stage):
    from zero.compat.deepspeed.utils import safe_get_full_grad

    engine = training.engine_at_boundary(training.engine_config(stage, gas=2, scheduler=False),
                                         rank, world)
    params = list(engine.module.parameters())
    before = [safe_get_full_grad(p) for p in params]
    engine.allreduce_gradients()  # DeepSpeed's; some scripts call it after backward
    return all(torch.equal(a, safe_get_full_grad(p)) for a, p in zip(before, params))


@pytest.mark.parametrize("stage", [0, 2])
def test_allreduce_gradients_after_backward_leaves_the_reduced_gradients_as_they_are(stage):
    assert run_distributed(_grads_around_allreduce, 2, args=(stage,)) == [True, True]


def _two_backwards_at_the_boundary(stage, gas):
    return training.engine_config(stage, gas=gas, scheduler=False,
                                  stage3_param_persistence_threshold=40)


def _grads_of_two_backwards(rank, world, stage, gas, failing=False):
    """gas micro-steps, the last one with two losses' backwards (batch A, then B); the full
    gradients the step would apply. `failing`: around each backward, backwards that fail
    before any gradient comes (a detached loss, a per-token loss, the same loss again)."""
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_grad

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=_two_backwards_at_the_boundary(stage, gas))
    data = training.batches(world, 1, gas + 1)
    refused = []
    for micro in range(gas + 1):
        loss = engine(*data[micro * world + rank])
        for wrong in ([loss.detach(), loss.expand(3)] if failing else []):
            with pytest.raises(ValueError) as error:
                engine.backward(wrong)
            refused.append(str(error.value))
        engine.backward(loss)
        if failing:  # its graph is freed: autograd raises before any gradient comes
            with pytest.raises(RuntimeError, match="second time"):
                engine.backward(loss)
        if micro < gas - 1:
            engine.step()
    grads = {name: safe_get_full_grad(p) for name, p in engine.module.named_parameters()}
    return (grads, refused) if failing else grads


@pytest.mark.parametrize("stage,gas", [(0, 1), (1, 2), (2, 1), (3, 1), (3, 2)])
def test_two_backwards_at_a_boundary_reduce_the_sum_of_both(stage, gas):
    """Stage 1 accumulating and stage 3's persistent parameters reduce their buffer in place:
    a second backward before the step reduced the first one's half-averaged buffer again
    (wrong pieces), and dropping param.grad at the boundary made it start from zero."""
    world = 2
    model = training.make_model()
    data = training.batches(world, 1, gas + 1)
    for micro in range(gas + 1):  # each micro-step's loss over the global batch, / gas
        parts = [data[micro * world + r] for r in range(world)]
        (model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])) / gas).backward()
    for grads in run_distributed(_grads_of_two_backwards, world, args=(stage, gas)):
        for name, param in model.named_parameters():
            assert training.relative_error(grads[name], param.grad) < 1e-5, name
    # Backwards that fail before any gradient comes leave no trace: the engine goes on (it
    # refused every later backward and step, blaming partly reduced gradients).
    for grads, refused in run_distributed(_grads_of_two_backwards, world,
                                          args=(stage, gas, True)):
        for name, param in model.named_parameters():
            assert training.relative_error(grads[name], param.grad) < 1e-5, name
        assert "one-element tensor, got a tensor of shape (3,)" in refused[1]
        assert "not part of an autograd graph" in refused[0]


def _backward_outside_the_boundary_after_it(rank, world, stage, gas):
    engine = training.engine_at_boundary(_two_backwards_at_the_boundary(stage, gas), rank, world)
    engine.set_gradient_accumulation_boundary(False)  # as no_sync() or Accelerate would
    tokens, targets = training.batches(world, 1, gas + 1)[gas * world + rank]
    message = "no error"
    try:
        engine.backward(engine(tokens, targets))
    except RuntimeError as error:
        message = str(error)
    engine.set_gradient_accumulation_boundary(None)
    engine.step()  # refused before anything ran: the boundary's step goes on
    return message, engine.was_step_applied()


@pytest.mark.parametrize("stage,gas", [(1, 2), (3, 1)])
def test_a_backward_outside_the_boundary_after_its_reduction_is_refused_on_every_rank(stage, gas):
    """Its unreduced sums cannot join the average the boundary made (a wrong gradient at the
    step before); refused before it runs, so the step can still be taken."""
    for message, stepped in run_distributed(_backward_outside_the_boundary_after_it, 2,
                                            args=(stage, gas)):
        assert "Call engine.step() first" in message, message
        assert stepped
