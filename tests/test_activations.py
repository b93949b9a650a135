"""The activation estimate from a sample input (zero-mem estimate --sample-input): a forward
on fake tensors must predict what a real forward keeps for backward."""
import json
import subprocess
import sys

import pytest
import torch

from zero.models.tiny_gpt import GPTConfig, TinyGPT
from zero.reports import activations

CONFIG = GPTConfig(vocab_size=512, block_size=64, n_layer=3, n_head=4, n_embd=64)


def _real_saved_bytes(batch, seq, dtype):
    torch.manual_seed(0)
    model = TinyGPT(CONFIG).to(dtype)
    tokens = torch.randint(0, CONFIG.vocab_size, (batch, seq))
    return activations.saved_activation_bytes(model, [tokens, tokens.clone()])


@pytest.mark.parametrize("batch,seq", [(2, 16), (4, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_estimate_equals_a_real_forward(batch, seq, dtype):
    samples = [activations.SampleInput.parse(f"{batch}x{seq}:int64")] * 2
    estimate = activations.estimate_activations(lambda: TinyGPT(CONFIG), samples, dtype)
    assert estimate == _real_saved_bytes(batch, seq, dtype)


def test_activations_grow_with_the_micro_batch():
    small = activations.estimate_activations(lambda: TinyGPT(CONFIG),
                                             [activations.SampleInput.parse("2x32:int64")] * 2,
                                             torch.float32)
    large = activations.estimate_activations(lambda: TinyGPT(CONFIG),
                                             [activations.SampleInput.parse("8x32:int64")] * 2,
                                             torch.float32)
    assert 3.5 * small < large < 4.5 * small


def test_the_cli_reports_activations_in_json():
    done = subprocess.run([sys.executable, "-m", "zero.reports.cli", "estimate", "--model",
                           "zero.models.tiny_gpt:TinyGPT", "--world-size", "2", "--json",
                           "--sample-input", "2x64:int64", "--sample-input", "2x64:int64"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["activations"]["bytes"] > 0 and "activations" not in out["not_included"]


@pytest.mark.parametrize("text", ["4x", "4xq:int64", "4x128:complex"])
def test_a_bad_sample_input_is_named(text):
    with pytest.raises(activations.ActivationError, match="sample input"):
        activations.SampleInput.parse(text)


def _engine_activations(rank, world, stage):
    import zero

    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = zero.initialize(model=TinyGPT(CONFIG), config=config)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 16))
    engine.backward(engine(tokens, tokens.clone()))
    return engine.watch.activation_bytes


@pytest.mark.timeout(120)
def test_the_engines_activations_leave_out_stage_3s_gathered_weights():
    """Stage 3 counted the views of its gathered weights autograd saves (a linear's
    weight.t()) as activations: every weight of the model again, freed after forward."""
    from distributed_harness import run_distributed

    plain = _real_saved_bytes(2, 16, torch.float32)
    for stage in (2, 3):
        assert run_distributed(_engine_activations, 2, args=(stage,)) == [plain, plain], stage
