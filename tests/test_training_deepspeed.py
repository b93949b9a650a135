"""zero trains like the real DeepSpeed 0.19.8 on the same JSON config and parameter groups
(tests/deepspeed_training/: cases.py, expected.pt written by make.py on 2 ranks): the losses
of 4 steps and the final fp32 weights, with accumulation, the default clipping, per-group lrs
and weight decay, Adam's L2 form and no bias correction, SGD with momentum, the decaying
schedules, Adagrad and Lion, the low-precision master (bf16_master_weights_and_grads,
bf16_optimizer_states) and fp32 gradient accumulation under bf16.
Where DeepSpeed itself fails (torch's Adagrad with several groups at stage 2), zero must not:
it is held to a single-process torch run instead."""
import os

import pytest
import torch

import training
from deepspeed_reference import TESTS, cases_of
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(180)
cases = cases_of("training")
EXPECTED = torch.load(os.path.join(TESTS, "deepspeed_training", "expected.pt"))


def _train(rank, world, name):
    import zero

    training.cpu_without_onednn_fp16()  # Muon's gram in fp32, as in DeepSpeed's recorded runs
    engine, losses = cases.train_case(zero.initialize, rank, name)
    state = engine.module_state_dict()
    return losses, ({k: v.float() for k, v in state.items()} if rank == 0 else None)


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_training_matches_deepspeeds(name):
    expected = EXPECTED[name]
    assert expected["deepspeed"] == "0.19.8"
    if "failed" in expected:  # DeepSpeed raised: zero trains like single-process torch
        losses, _ = run_distributed(_train, cases.WORLD, args=(name,))[0]
        reference = cases.reference(name)
        assert losses == pytest.approx(reference, rel=1e-5)
        assert reference[-1] != reference[0]
        return
    losses, weights = run_distributed(_train, cases.WORLD, args=(name,))[0]
    # bf16 weights (a bf16 master): the engines reduce and round in their own order, so a few
    # bf16 steps (2**-8 relative) apart; the losses still within 5e-5. The recordings come
    # from an AVX-512 machine: on an AVX2 one (other float kernels) zero's weights differ
    # from them by up to 1.2e-4 in fp32 and 2.6e-2 in bf16 (2026-11-29, also before that
    # day's changes), whence the margins
    loss_tolerance, weight_tolerance = (5e-5, 4e-2) if "bf16" in name else (1e-6, 2e-4)

    assert losses == pytest.approx(expected["losses"], rel=loss_tolerance, abs=1e-6)
    moved = 0.0
    for key, value in expected["weights"].items():
        error = ((weights[key] - value).norm() / value.norm().clamp_min(1e-12)).item()
        assert error < weight_tolerance, (name, key, error)
        moved = max(moved, ((cases.make_model().state_dict()[key] - value).norm()
                            / value.norm().clamp_min(1e-12)).item())
    assert moved > 1e-3  # the check can fail: the steps moved the weights
