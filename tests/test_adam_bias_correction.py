"""Adam without bias correction (DeepSpeed's FusedAdam / DeepSpeedCPUAdam `bias_correction`
false, as BERT recipes set it in the config): at every stage, offloaded or not, from the
config or as the script's own optimizer with per-group values, training matches a
single-process reference that uses the moments as they are. (Against the real DeepSpeed:
tests/deepspeed_training's no-bias-correction cases.)"""
import copy

import pytest
import torch

import training
from distributed_harness import run_distributed

STEPS, GAS, WORLD = 6, 2, 2
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                     "weight_decay": 0.1, "bias_correction": False}}


class UncorrectedAdamW(torch.optim.Optimizer):
    """AdamW whose step uses exp_avg / (sqrt(exp_avg_sq) + eps) unscaled where a group's
    bias_correction is false (torch's AdamW otherwise)."""

    def __init__(self, params, lr, betas, eps, weight_decay, bias_correction=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction))

    @torch.no_grad()
    def step(self):
        for group, p, state in training.moment_steps(self):
            beta1, beta2 = group["betas"]
            p.mul_(1 - group["lr"] * group["weight_decay"])
            state["m"].lerp_(p.grad, 1 - beta1)
            state["v"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            c1 = 1 - beta1 ** state["step"] if group["bias_correction"] else 1.0
            c2 = 1 - beta2 ** state["step"] if group["bias_correction"] else 1.0
            denom = state["v"].sqrt().div_(c2 ** 0.5).add_(group["eps"])
            p.addcdiv_(state["m"], denom, value=-group["lr"] / c1)


def _config(stage, **zero_extra):
    if stage == 3:
        zero_extra.setdefault("stage3_param_persistence_threshold", 10)
    config = training.engine_config(stage, gas=GAS, scheduler=False, **zero_extra)
    config["optimizer"] = copy.deepcopy(ADAMW)
    return config


def _groups(model, corrected_biases):
    """Two groups: the weights without bias correction, the biases with it when asked."""
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if not n.endswith("bias")]},
            {"params": [p for n, p in named if n.endswith("bias")],
             "bias_correction": corrected_biases}]


def _reference(config, corrected_biases=False):
    model = training.make_model()
    hyper = {k: v for k, v in config["optimizer"]["params"].items()}
    hyper["betas"] = tuple(hyper["betas"])
    optimizer = UncorrectedAdamW(_groups(model, corrected_biases), **hyper)
    losses = training.reference_steps(model, optimizer, training.batches(WORLD, STEPS, GAS), WORLD,
                                      STEPS, GAS, config["gradient_clipping"])
    return losses, training.parameters_of(model)


def _train(rank, world, config, client):
    import zero
    from zero.compat.deepspeed.ops.adam import FusedAdam

    model = training.make_model()
    optimizer = None
    if client:  # the script's own FusedAdam, the biases' group with bias correction
        hyper = config.pop("optimizer")["params"]
        optimizer = FusedAdam(_groups(model, corrected_biases=True), lr=hyper["lr"],
                              betas=tuple(hyper["betas"]), eps=hyper["eps"],
                              weight_decay=hyper["weight_decay"], bias_correction=False)
    engine, _, _, _ = zero.initialize(model=model, config=config, optimizer=optimizer,
                                      model_parameters=None if client else _groups(model, False))
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    with zero.GatheredParameters(list(engine.module.parameters())):
        params = training.parameters_of(engine.module)
    engine.destroy()
    return losses, params


def _assert_matches(result, reference):
    """Float rounding apart (the uncorrected first updates are ~3x larger, 0.1 / sqrt(0.001),
    so the kernels' rounding differences grow faster than with correction: seen 1.0e-5)."""
    losses, params = result
    ref_losses, ref_params = reference
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for name, expected in ref_params.items():
        assert training.relative_error(params[name], expected) < 3e-5, name


@pytest.mark.parametrize("stage,offload", [(0, None), (1, None), (2, None), (3, None),
                                           (2, "cpu"), (3, "nvme")])
def test_every_stage_steps_the_uncorrected_moments(stage, offload, tmp_path):
    extra = {}
    if offload:  # the fused CPU Adam kernel's path
        extra["offload_optimizer"] = {"device": offload, "nvme_path": str(tmp_path)} \
            if offload == "nvme" else {"device": offload}
    config = _config(stage, **extra)
    reference = _reference(config)
    corrected = _reference(dict(config, optimizer={
        "type": "AdamW", "params": dict(ADAMW["params"], bias_correction=True)}),
        corrected_biases=True)
    # the check can fail: the corrected run is another run
    assert abs(reference[0][-1] - corrected[0][-1]) > 1e-3
    _assert_matches(run_distributed(_train, WORLD, args=(config, False))[0], reference)


def test_the_scripts_fused_adam_keeps_each_groups_bias_correction():
    config = _config(2)
    reference = _reference(config, corrected_biases=True)
    _assert_matches(run_distributed(_train, WORLD, args=(config, True))[0], reference)


def test_outside_an_engine_the_uncorrected_class_refuses_to_step():
    """torch's Adam underneath always corrects: stepping it would silently differ."""
    from zero.compat.deepspeed.ops.adam import DeepSpeedCPUAdam

    model = torch.nn.Linear(3, 2)
    model(torch.ones(3)).sum().backward()
    with pytest.raises(NotImplementedError, match="bias_correction=False"):
        DeepSpeedCPUAdam(model.parameters(), bias_correction=False).step()
    DeepSpeedCPUAdam(model.parameters()).step()  # the default steps as torch's Adam
