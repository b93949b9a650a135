"""The Hugging Face Trainer on a GPU through zero: examples/huggingface/train_trainer.py,
unmodified, launched by `zero --num_procs 1` with the example's DeepSpeed configs (ZeRO-2,
ZeRO-3, and ZeRO-3 with parameters and optimizer in host memory) trains like the same script
under the plain Trainer on the same GPU, and saves a model that from_pretrained loads with
the plain run's weights; from_pretrained under ZeRO-3 (zero.Init) starts from them. The
Accelerate loop (examples/huggingface/train_accelerate.py) trains on zero as without it on the
GPU. Skipped without a GPU, or without transformers and accelerate (the GPU machine's image
has both)."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from test_hf_trainer import run_trainer, saved_weights, step_losses, \
    variant_config  # noqa: E402 - after the skips: it needs transformers


def _run(out, *extra, launcher=()):
    """The script in one process on GPU 0 (`zero --num_procs 1`)."""
    return run_trainer(out, *extra, launcher=launcher, procs=1)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain Trainer on the GPU (no --deepspeed, zero not standing in for deepspeed)."""
    out = tmp_path_factory.mktemp("plain")
    return _run(out, launcher=["--no_deepspeed_alias"]), out


@pytest.mark.parametrize("variant", ["zero2", "zero3", "zero3-offload"])
def test_the_trainer_on_zero_on_the_gpu_trains_like_the_plain_trainer(tmp_path, plain, variant):
    plain_result, plain_out = plain
    result = _run(tmp_path, "--deepspeed", variant_config(tmp_path, variant))
    assert result["wrapped"] == "zero.engine.ZeroEngine"
    assert len(step_losses(result)) == 8
    # fp32 on one GPU: the same batches, the same AdamW; only summation orders differ
    assert step_losses(result) == pytest.approx(step_losses(plain_result), rel=2e-3)
    assert result["eval"]["eval_loss"] == pytest.approx(plain_result["eval"]["eval_loss"],
                                                        rel=2e-3)
    ours, theirs = saved_weights(tmp_path / "final"), saved_weights(plain_out / "final")
    assert ours.keys() == theirs.keys()
    for name, weight in ours.items():
        assert torch.allclose(weight, theirs[name], rtol=2e-3, atol=1e-5), name


def test_from_pretrained_under_zero3_on_the_gpu_starts_from_the_saved_weights(tmp_path, plain):
    """ZeRO-3 from_pretrained on the GPU: the model is built inside zero.Init and the plain
    run's saved weights load through GatheredParameters, so the first evaluation is the plain
    run's last one; training goes on from there."""
    plain_result, plain_out = plain
    result = _run(tmp_path, "--deepspeed", variant_config(tmp_path, "zero3"), "--init_from",
                  str(plain_out / "final"), "--eval_on_start", "true", "--max_steps", "4")
    evals = [entry["eval_loss"] for entry in result["log_history"] if "eval_loss" in entry]
    assert evals[0] == pytest.approx(plain_result["eval"]["eval_loss"], rel=1e-4)
    assert len(step_losses(result)) == 4
    assert evals[-1] < evals[0]


@pytest.mark.parametrize("stage", [2, 3])
def test_the_accelerate_loop_on_zero_on_the_gpu_trains_like_the_plain_loop(tmp_path, stage):
    """The script's own AdamW under a DeepSpeedPlugin, one process on the GPU, against the
    same loop without DeepSpeed: losses and the weights get_state_dict gives back."""
    import json

    from test_hf_accelerate import run_script

    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True}}))
    plain, plain_model = run_script(tmp_path / "plain", launcher=["--no_deepspeed_alias"],
                                    procs=1)
    ours, model = run_script(tmp_path / "zero", "--ds_config", config, procs=1)
    assert ours["engine"] == "zero.engine.ZeroEngine"
    assert len(ours["losses"]) == 8
    assert ours["losses"] == pytest.approx(plain["losses"], rel=2e-3)
    for name, weight in plain_model.items():
        assert torch.allclose(model[name].cpu(), weight.cpu(), rtol=2e-3, atol=1e-5), name
