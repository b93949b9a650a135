"""LAMB, DeepSpeed's "Lamb" optimizer type (FusedLamb), at every ZeRO stage: each parameter's
trust ratio ||w|| / ||update|| is taken over the whole parameter although ranks hold slices
of it (their squares summed over the ranks sharing it), so 2 ranks at stages 0-3 (and MiCS)
train like a single-process reference of FusedLamb's kernel per tensor. Bias correction off,
eps inside the square root, the trust ratio's bounds and per-group hyperparameters, fp16 with
loss scaling, the script's own FusedLamb object, a checkpoint resumed at another stage, the
estimate, and the refusals (offload, a 16-bit master, stepping outside an engine) are
covered. DeepSpeed's FusedLamb is CUDA-only, so the reference follows its kernel source
(csrc/lamb/fused_lamb_cuda_kernel.cu) rather than a run of it."""
import copy

import pytest
import torch

import training
from distributed_harness import run_distributed

STEPS, GAS, WORLD = 6, 2, 2
# bing_bert's bounds: the ratio is clamped for some parameters, not for others
LAMB = {"type": "Lamb", "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-6,
                                   "weight_decay": 0.01, "max_coeff": 0.3, "min_coeff": 0.01}}


class ReferenceLamb(torch.optim.Optimizer):
    """FusedLamb's kernel, one tensor at a time, in torch ops: Adam's uncorrected moments, the
    update m / (sqrt(v) + eps) + weight_decay * w, the trust ratio of the whole tensor clamped
    to [min_coeff, max_coeff] (1 where a norm is 0), the step lr * sqrt(1 - b2^t) / (1 - b1^t)
    (lr without bias correction). `part` < 1 takes the norms over that first fraction of each
    tensor's elements alone (what a rank holding a slice would see without the sum)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0.0, max_coeff=10.0, min_coeff=0.01,
                 part=1.0):
        self.part = part
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas),
                                      eps=eps, eps_inside_sqrt=eps_inside_sqrt,
                                      weight_decay=weight_decay, max_coeff=max_coeff,
                                      min_coeff=min_coeff))
        self.ratios = []

    @torch.no_grad()
    def step(self):
        self.ratios = []
        for group, p, state in training.moment_steps(self):
            beta1, beta2 = group["betas"]
            m, v, t = state["m"], state["v"], state["step"]
            m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            eps = group["eps"]
            denom = (v + eps).sqrt() if group["eps_inside_sqrt"] else v.sqrt() + eps
            update = m / denom + group["weight_decay"] * p
            seen = max(1, int(p.numel() * self.part))
            w_norm = p.flatten()[:seen].norm().item()
            u_norm = update.flatten()[:seen].norm().item()
            ratio = 1.0
            if w_norm and u_norm:
                ratio = min(max(w_norm / u_norm, group["min_coeff"]), group["max_coeff"])
            self.ratios.append(ratio)
            size = group["lr"]
            if group["bias_correction"]:
                size *= (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t)
            p.add_(update, alpha=-size * ratio)

def _config(stage, precision="fp32", **params):
    zero_extra = {"stage3_param_persistence_threshold": 10} if stage == 3 else {}
    config = training.engine_config(stage, gas=GAS, precision=precision, scheduler=False,
                                    **zero_extra)
    config["optimizer"] = copy.deepcopy(LAMB)
    config["optimizer"]["params"].update(params)
    return config


def _groups(model):
    """The script's groups: no decay for biases and norms."""
    named = list(model.named_parameters())
    plain = [p for n, p in named if n.endswith("bias") or "ln" in n]
    return [{"params": [p for n, p in named if not (n.endswith("bias") or "ln" in n)]},
            {"params": plain, "weight_decay": 0.0}]


def _reference(config, steps=STEPS):
    model = training.make_model()
    hyper = dict(config["optimizer"]["params"])
    optimizer = ReferenceLamb(_groups(model), **hyper)
    losses = training.reference_steps(model, optimizer, training.batches(WORLD, steps, GAS),
                                      WORLD, steps, GAS, config["gradient_clipping"])
    return losses, training.parameters_of(model), optimizer.ratios


def _train(rank, world, config, client=False, steps=STEPS):
    import zero

    model = training.make_model()
    optimizer = None
    if client:  # the script's own deepspeed.ops.lamb.FusedLamb
        from zero.compat.deepspeed.ops.lamb import FusedLamb

        optimizer = FusedLamb(_groups(model), **config.pop("optimizer")["params"])
    engine, _, _, _ = zero.initialize(model=model, config=config, optimizer=optimizer,
                                      model_parameters=None if client else _groups(model))
    losses = training.train_engine(engine, rank, world, steps, GAS)
    with zero.GatheredParameters(list(engine.module.parameters())):
        params = training.parameters_of(engine.module)
    report = engine.memory_report()["categories"]["optimizer_state"]
    engine.destroy()
    return losses, params, (report["current"], report["expected"])


@pytest.mark.parametrize("stage,extra", [(0, {}), (1, {}), (2, {}), (3, {}),
                                         (3, {"mics_shard_size": 1})],
                         ids=["stage0", "stage1", "stage2", "stage3", "stage3-MiCS"])
def test_every_stage_takes_each_parameters_trust_ratio_whole(stage, extra):
    config = _config(stage)
    config["zero_optimization"].update(extra)
    reference = _reference(config)
    ratios = reference[2]
    # the bounds act: some ratios are clamped at max_coeff, others are not
    assert 0.3 in ratios and any(0.01 < r < 0.3 for r in ratios)
    result = run_distributed(_train, WORLD, args=(config,), env={"LOCAL_WORLD_SIZE": "2"})[0]
    training.assert_run_matches(result, reference)
    state_bytes, formula_bytes = result[2]
    assert state_bytes == formula_bytes > 0  # Adam's two arrays, counted as the formula says


def test_a_ratio_taken_over_each_ranks_slice_alone_would_differ():
    """The check above can fail: the same run with each parameter's ratio over the first half
    of its elements alone (what a rank holding half a parameter would see) is another run."""
    config = _config(2)
    _, whole, _ = _reference(config)
    model = training.make_model()
    halved = ReferenceLamb(_groups(model), **config["optimizer"]["params"], part=0.5)
    training.reference_steps(model, halved, training.batches(WORLD, STEPS, GAS), WORLD, STEPS,
                             GAS, config["gradient_clipping"])
    params = training.parameters_of(model)
    assert max(training.relative_error(params[n], whole[n]) for n in whole) > 1e-3


@pytest.mark.parametrize("params", [{"bias_correction": False}, {"eps_inside_sqrt": True},
                                    {"max_coeff": 10.0, "min_coeff": 0.0}],
                         ids=["no-bias-correction", "eps-inside-sqrt", "wide-bounds"])
def test_fusedlambs_switches(params):
    config = _config(2, **params)
    result = run_distributed(_train, WORLD, args=(config,))[0]
    # (uncorrected moments make larger early steps: rounding shows a little more)
    training.assert_run_matches(result, _reference(config), weight_tolerance=3e-5)


def test_the_scripts_fused_lamb_trains_as_the_config_does():
    config = _config(1)
    from_config = run_distributed(_train, WORLD, args=(config,))[0]
    from_client = run_distributed(_train, WORLD, args=(config, True))[0]
    assert from_client[0] == from_config[0]
    for name, value in from_config[1].items():
        assert torch.equal(from_client[1][name], value), name


def test_fp16_with_loss_scaling_tracks_the_fp32_reference():
    """bing_bert's setting: fp16 with dynamic loss scaling (the scaled 16-bit gradients are
    unscaled before the moments), an fp32 master."""
    config = _config(1, precision="fp16")
    losses, params, _ = run_distributed(_train, WORLD, args=(config,))[0]
    ref_losses, ref_params, _ = _reference(_config(1))
    assert losses == pytest.approx(ref_losses, rel=5e-3)
    assert max(training.relative_error(params[n], v) for n, v in ref_params.items()) < 2e-2


def _resume(rank, world, config, first, steps, load_dir, save_dir):
    import zero

    model = training.make_model()
    engine, _, _, _ = zero.initialize(model=model, config=config, model_parameters=_groups(model))
    return training.load_train_save(engine, rank, world, GAS, first, steps, load_dir, save_dir)


def test_a_checkpoint_resumes_at_another_stage(tmp_path):
    """Saved at stage 2 after 3 steps, loaded at stage 3: the moments and master carry over,
    the remaining steps are the uninterrupted run's."""
    save, load = _config(2), _config(3)
    full = run_distributed(_resume, WORLD, args=(save, 0, 6, None, None))[0]
    run_distributed(_resume, WORLD, args=(save, 0, 3, None, str(tmp_path)))
    resumed = run_distributed(_resume, WORLD, args=(load, 3, 3, str(tmp_path), None))[0]
    assert resumed == pytest.approx(full[3:], rel=1e-5)


def test_the_estimate_counts_two_arrays_and_refuses_offload():
    from zero.reports import estimate as est

    setup, stage = est.setup_from_config(_config(2), world_size=WORLD)
    assert setup.optimizer == "lamb" and stage == 2
    shapes = est.shapes_from_factory(training.__file__ + ":make_model")
    row = est.estimate(shapes, setup, 2)
    assert row.categories["optimizer_state"]["bytes"] == 8 * row.shard_numel
    with pytest.raises(est.EstimateError, match="optimizer Lamb: LAMB steps on the device"):
        est.estimate(shapes, setup, est.option_for(2, "cpu", "none"))


def _build(rank, world, config, client_kwargs):
    import zero

    optimizer = None
    model = training.make_model()
    if client_kwargs is not None:
        from zero.compat.deepspeed.ops.lamb import FusedLamb

        optimizer = FusedLamb(model.parameters(), **client_kwargs)
    zero.initialize(model=model, config=config, optimizer=optimizer)


@pytest.mark.parametrize("change,message", [
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
     r'offload_optimizer \(device "cpu".* with optimizer Lamb'),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}},
     "bf16.bf16_master_weights_and_grads with optimizer Lamb"),
])
def test_what_lamb_does_not_do_is_refused_on_every_rank(change, message):
    config = _config(2)
    config.update(change)
    with pytest.raises(AssertionError, match=message):  # RankFailed, naming the key
        run_distributed(_build, WORLD, args=(config, None), timeout=60)


def test_the_fused_lamb_class_refuses_what_it_cannot_do():
    from zero.compat.deepspeed.ops.lamb import FusedLamb

    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="max_grad_norm"):
        FusedLamb(model.parameters(), max_grad_norm=1.0)
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedLamb(model.parameters(), amsgrad=True)
    model(torch.ones(3)).sum().backward()
    with pytest.raises(NotImplementedError, match="inside zero's engine"):
        FusedLamb(model.parameters()).step()


def test_zero_mem_tune_writes_a_lamb_config(tmp_path, capsys):
    """Without --config the tuner's template keeps the optimizer it estimated for."""
    import json

    from zero.reports import cli

    out = tmp_path / "ds.json"
    assert cli.main(["tune", "--model", training.__file__ + ":make_model", "--world-size", "2",
                     "--optimizer", "lamb", "--budget", "1GiB", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["optimizer"]["type"] == "Lamb"


def test_a_groups_bounds_are_checked_before_any_group_steps():
    from zero.boundary import optimizer_hyper

    group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
             "bias_correction": True, "max_coeff": 0.3, "min_coeff": 0.5, "eps_inside_sqrt": False}
    with pytest.raises(ValueError, match="min_coeff 0.5 is above its max_coeff 0.3"):
        optimizer_hyper("lamb", group, True)


def _coefficients(rank, world, config):
    import zero

    model = training.make_model()
    engine, _, _, _ = zero.initialize(model=model, config=config, model_parameters=_groups(model))
    before = engine.optimizer.get_lamb_coeffs()
    training.train_engine(engine, rank, world, STEPS, GAS)
    return before, engine.optimizer.optimizer.get_lamb_coeffs()  # as bing_bert reaches it


@pytest.mark.parametrize("stage", [1, 3])
def test_get_lamb_coeffs_gives_the_last_steps_ratios_in_group_order(stage):
    """DeepSpeed's FusedLamb.get_lamb_coeffs() (bing_bert logs it): every parameter's ratio of
    the last step, group by group, the same on every rank."""
    config = _config(stage)
    _, _, expected = _reference(config)
    for before, after in run_distributed(_coefficients, WORLD, args=(config,)):
        assert before == []
        assert after == pytest.approx(expected, rel=1e-4)
