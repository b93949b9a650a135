"""DeepSpeed's `torch_autocast` block (zero/autocast.py): the engine's forward under
torch.autocast with fp32 parameters stepped directly. On 2 gloo ranks against one process
that runs the same forward under torch.autocast: at every ZeRO stage the losses and the
trained parameters follow it to bf16 rounding, the matmuls run in bf16 while the parameters
and the optimizer stay fp32 (no master copy); fp16 scales the loss; a torch.autocast the
script opens around the forward gives way as DeepSpeed's does; bad settings are refused."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(240)
WORLD, STEPS, GAS = 2, 3, 2


def config(stage: int, dtype: str | None = "bf16", **extra) -> dict:
    block = {"enabled": True} if dtype is None else {"enabled": True, "dtype": dtype}
    return {**training.engine_config(stage, gas=GAS, scheduler=False), "torch_autocast": block,
            **extra}


def _matmul_dtypes(model: nn.Module) -> list:
    """Records the output dtype of every nn.Linear in the model's forwards."""
    seen = []
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    return seen


def train_ranks(rank, world, cfg):
    import zero

    model = training.make_model()
    seen = _matmul_dtypes(model)
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    categories = engine.memory_report()["categories"]
    return {"losses": losses, "params": training.parameters_of(engine.module),
            "param_dtypes": {p.dtype for p in engine.module.parameters()},
            "matmul_dtypes": set(seen), "master_bytes": categories["fp32_master"]["current"],
            "scale": engine.optimizer.cur_scale, "skipped": engine.skipped_steps}


def _distance(a: list, b: list) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def reference(cfg, dtype=torch.bfloat16):
    """One process doing what the ranks do: each rank's micro-batch forward under
    torch.autocast on its own (bf16 matmuls of the same shapes), the gradients summed in fp32
    and averaged over ranks and micro-steps, clipped, stepped by torch's AdamW."""
    model = training.make_model()
    params = list(model.parameters())
    optimizer = training.reference_adamw(params, cfg)
    data, losses = training.batches(WORLD, STEPS, GAS), []
    for step in range(STEPS):
        optimizer.zero_grad()
        total = 0.0
        for micro in range(GAS):
            for rank in range(WORLD):
                with torch.autocast("cpu", dtype=dtype):
                    loss = model(*data[(step * GAS + micro) * WORLD + rank])
                (loss / (GAS * WORLD)).backward()
                total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, cfg["gradient_clipping"])
        optimizer.step()
        losses.append(total / (GAS * WORLD))
    return losses, training.parameters_of(model)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_forward_autocasts_and_training_follows_one_autocast_process(stage):
    cfg = config(stage)
    runs = run_distributed(train_ranks, WORLD, args=(cfg,), timeout=120)
    losses, params = reference(cfg)
    plain_losses, _ = training.train_reference(WORLD, STEPS, GAS, cfg)  # fp32, no autocast
    for run in runs:
        assert run["matmul_dtypes"] == {torch.bfloat16}  # the linears ran in bf16
        assert run["param_dtypes"] == {torch.float32} and run["master_bytes"] == 0
        assert run["losses"] == pytest.approx(losses, rel=1e-5)
        # fp32 training without autocast is much further away
        assert _distance(run["losses"], plain_losses) > 10 * _distance(run["losses"], losses)
        for name, value in run["params"].items():
            assert training.relative_error(value, params[name]) < 1e-4, (stage, name)


def test_fp16_autocast_scales_the_loss_and_skips_overflowing_steps_together():
    cfg = config(1, dtype="torch.float16", fp16={"enabled": False, "initial_scale_power": 8})
    runs = run_distributed(train_ranks, WORLD, args=(cfg,), timeout=120)
    losses, _ = reference(cfg, torch.float16)
    for run in runs:
        assert run["matmul_dtypes"] == {torch.float16} and run["skipped"] == 0
        assert run["scale"] == 2.0 ** 8 and run["param_dtypes"] == {torch.float32}
        assert run["losses"] == pytest.approx(losses, rel=5e-3)
    cfg["fp16"]["initial_scale_power"] = 40  # fp16 gradients overflow: the first steps skip
    runs = run_distributed(train_ranks, WORLD, args=(cfg,), timeout=120)
    assert runs[0]["skipped"] >= 1 and runs[0]["scale"] < 2.0 ** 40
    assert all((r["skipped"], r["scale"]) == (runs[0]["skipped"], runs[0]["scale"]) for r in runs)


def outer_autocast_ranks(rank, world, block_enabled):
    import zero

    model = training.make_model()
    seen = _matmul_dtypes(model)
    cfg = config(2, dtype="fp16") if block_enabled else training.engine_config(2, gas=GAS)
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    tokens, targets = training.batches(world, 1, GAS)[rank]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        engine(tokens, targets)
    return set(seen)


def test_a_scripts_own_autocast_gives_way_to_the_config_as_in_deepspeed():
    assert run_distributed(outer_autocast_ranks, WORLD, args=(False,)) == [{torch.float32}] * 2
    assert run_distributed(outer_autocast_ranks, WORLD, args=(True,)) == [{torch.float16}] * 2


def test_bad_settings_are_refused_naming_them():
    from zero.autocast import check_modules
    from zero.config import load_config
    from zero.config.validate import ConfigError

    with pytest.raises(ConfigError, match=r"torch_autocast.dtype = \"fp32\""):
        load_config(config(1, dtype="fp32"), world_size=WORLD)
    with pytest.raises(ValueError, match=r"'torch.nn.Lineer', which does not import"):
        check_modules(["torch.nn.Linear", "torch.nn.Lineer"])
    cfg = load_config(config(1, dtype="half"), world_size=WORLD)
    assert cfg.torch_autocast.lower_precision_safe_modules[0] == "torch.nn.Linear"
    # an fp16 autocast scales the loss with the fp16 block's keys: they are checked for it too
    with pytest.raises(ConfigError, match="fp16.min_loss_scale"):
        load_config(config(1, dtype="fp16", fp16={"initial_scale_power": 2,
                                                   "min_loss_scale": 8}), world_size=WORLD)
    from zero import autocast
    from zero.config import schema

    assert set(autocast.DTYPES) == set(schema.AUTOCAST_DTYPES)  # one list of spellings
    assert {k for k, v in autocast.DTYPES.items() if v == torch.float16} == \
        set(schema.FP16_AUTOCAST_DTYPES)
