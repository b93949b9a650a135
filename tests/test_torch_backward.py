"""DeepSpeed's PyTorch-style backward (zero/torch_backward.py): `loss.backward()` then
`engine.step()` on a loss from the engine's forward trains exactly as `engine.backward(loss)`
does, at every ZeRO stage and with gradient accumulation, on 2 gloo ranks; with fp16 an
unscaled `loss.backward()` is refused naming the fix and `engine.scale(loss).backward()`
trains as `engine.backward(loss)`; a model answering with a mapping (as HF models do) works
too."""
from __future__ import annotations

import pytest
import torch

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(240)
WORLD, STEPS, GAS = 2, 3, 2


class DictOutput(torch.nn.Module):
    """The test model answering as an HF model does: a mapping holding the loss and the
    logits it was computed from (both outputs autograd reaches, one feeding the other)."""

    def __init__(self):
        super().__init__()
        self.inner = training.make_model()

    def forward(self, tokens, targets):
        logits = self.inner(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 targets.view(-1))
        return {"loss": loss, "logits": logits}


def train_ranks(rank, world, cfg, style, dict_output=False):
    import zero

    model = DictOutput() if dict_output else training.make_model()
    engine, _, _, _ = zero.initialize(model=model, config=cfg)
    data, losses = training.batches(world, STEPS, GAS), []
    for step in range(STEPS):
        for micro in range(GAS):
            out = engine(*data[(step * GAS + micro) * world + rank])
            loss = out["loss"] if dict_output else out
            if style == "engine":
                engine.backward(loss)
            else:
                (engine.scale(loss) if style == "scaled" else loss).backward()
            engine.step()
            losses.append(loss.item())
    return losses, training.parameters_of(engine.module), engine.skipped_steps


@pytest.mark.parametrize("stage,dict_output", [(0, False), (1, False), (2, True), (3, False),
                                               (3, True)])
def test_loss_backward_trains_as_engine_backward(stage, dict_output):
    cfg = training.engine_config(stage, gas=GAS, scheduler=False)
    torch_style = run_distributed(train_ranks, WORLD, args=(cfg, "torch", dict_output),
                                  timeout=120)
    engine_style = run_distributed(train_ranks, WORLD, args=(cfg, "engine", dict_output),
                                   timeout=120)
    for (losses, params, _), (expected_losses, expected, _) in zip(torch_style, engine_style):
        assert losses == expected_losses
        for name, value in params.items():
            assert training.relative_error(value, expected[name]) < 1e-6, (stage, name)


def unscaled_output_ranks(rank, world, scale_wrt_gas):
    """engine.backward(loss, scale_wrt_gas=False) on the forward's own fp32 output, as the HF
    Trainer calls it: autograd starts at the hooked output itself."""
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(2, gas=1, scheduler=False))
    data, losses = training.batches(world, 2, 1), []
    for step in range(2):
        loss = engine(*data[step * world + rank])
        engine.backward(loss, scale_wrt_gas=scale_wrt_gas)
        engine.step()
        losses.append(loss.item())
    return losses


def test_engine_backward_from_the_forwards_own_output_is_the_engines_pass():
    # at gas 1 the two spellings are the same backward; from the output itself it ran twice
    assert run_distributed(unscaled_output_ranks, WORLD, args=(False,)) == \
        run_distributed(unscaled_output_ranks, WORLD, args=(True,))


def unscaled_ranks(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(2, gas=1, precision="fp16"))
    tokens, targets = training.batches(world, 1, 1)[rank]
    with pytest.raises(RuntimeError, match=r"call engine.backward\(loss\), or "
                                           r"engine.scale\(loss\).backward\(\)"):
        engine(tokens, targets).backward()
    return True


def test_fp16_needs_the_scale_and_engine_scale_trains_as_engine_backward():
    assert run_distributed(unscaled_ranks, WORLD) == [True, True]
    cfg = training.engine_config(2, gas=GAS, precision="fp16", scheduler=False)
    scaled = run_distributed(train_ranks, WORLD, args=(cfg, "scaled"), timeout=120)
    engine_style = run_distributed(train_ranks, WORLD, args=(cfg, "engine"), timeout=120)
    # the same up to fp16 rounding: the torch-style pass carries gradients gas times larger
    # through the fp16 model and divides them at the parameters, engine.backward divides the
    # loss first (a power of two, so only values near fp16's smallest differ)
    for (losses, params, skipped), (expected_losses, expected, expected_skipped) in \
            zip(scaled, engine_style):
        assert losses == pytest.approx(expected_losses, rel=1e-5) and skipped == expected_skipped
        for name, value in params.items():
            assert training.relative_error(value, expected[name]) < 1e-3, name


def raised_ranks(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=DictOutput(),
                                      config=training.engine_config(1, gas=1, scheduler=False))
    batch = training.batches(world, 2, 1)
    handle = engine.module.inner.ln_f.weight.register_hook(lambda grad: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine(*batch[rank])["loss"].backward()
    handle.remove()
    with pytest.raises(RuntimeError, match="a backward is still open"):
        engine(*batch[world + rank])["loss"].backward()
    return True


def test_a_backward_that_raised_leaves_the_next_one_refused_not_silently_wrong():
    assert run_distributed(raised_ranks, WORLD) == [True, True]
