"""An unmodified Accelerate training loop (examples/huggingface/train_accelerate.py: a
DeepSpeedPlugin, the script's own torch AdamW and LambdaLR, accumulate(), save_state,
get_state_dict) launched by `zero --num_procs 2` trains on zero's engine like plain DDP. The
plain-DDP runs are recorded (tests/recorded_ddp/accelerate.json and the model DDP saved,
accelerate/; `python -m recorded_ddp accelerate` in tests/ makes them again)."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

import recorded_ddp
from distributed_harness import JOB_SITE, free_port, launcher_argv, run_job, subprocess_env

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "huggingface" / "train_accelerate.py"
CONFIG = REPO / "examples" / "huggingface" / "ds_accelerate.json"
TIMEOUT = 240


def run_script(out, *extra, launcher=(), procs=2):
    Path(out).mkdir(parents=True, exist_ok=True)
    run_job(launcher_argv(procs, *launcher, SCRIPT, "--out", out, *extra), TIMEOUT)
    return json.loads((Path(out) / "losses.json").read_text()), torch.load(Path(out) / "model.pt")


SAVE_AT = ["--save_at", "4"]  # save_state after step 4 of 8


def resume_from(whole):
    """The arguments of the job that load_state's what `whole` saved at step 4."""
    return ["--resume", whole / "state_4", "--resume_step", "4"]


def run_ddp(out, *extra):
    """The script under plain DDP (gloo on the CPU, zero not standing in for deepspeed)."""
    return run_script(out, "--cpu", *extra, launcher=["--no_deepspeed_alias"])


def ddp_digest() -> str:
    return recorded_ddp.digest(SCRIPT, SAVE_AT, packages=("torch", "transformers", "accelerate"))


def record_ddp(folder, scratch) -> dict:
    """A run saved at step 4 (its final model kept; the saving does not change its curve) and
    its resumption (`python -m recorded_ddp accelerate`)."""
    scratch = Path(scratch)
    whole, _ = run_ddp(scratch / "whole", *SAVE_AT)
    resumed, _ = run_ddp(scratch / "resumed", *resume_from(scratch / "whole"))
    folder.mkdir()
    shutil.copy(scratch / "whole" / "model.pt", folder / "model.pt")
    return {"whole": whole, "resumed": resumed}


@pytest.fixture(scope="module")
def ddp():
    return (recorded_ddp.load("accelerate", ddp_digest())["whole"],
            torch.load(recorded_ddp.files("accelerate") / "model.pt"))


@pytest.mark.parametrize("stage,precision", [(2, "fp32"), (3, "fp32"), (3, "bf16")])
def test_accelerate_loop_on_zero_matches_ddp(tmp_path, ddp, stage, precision):
    """In bf16 (fp32 master weights) against DDP in fp32: equal within bf16's rounding."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.0,  # the script clips nothing, under DDP neither
        "bf16": {"enabled": precision == "bf16"},
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True}}))
    rel = 2e-3 if precision == "fp32" else 1e-2
    (result, model), (reference, reference_model) = run_script(tmp_path, "--ds_config", config), ddp
    assert result["engine"] == "zero.engine.ZeroEngine"
    assert reference["engine"] == "torch.nn.parallel.distributed.DistributedDataParallel"
    assert len(result["losses"]) == 8
    assert result["losses"] == pytest.approx(reference["losses"], rel=rel)
    assert (tmp_path / "state" / "pytorch_model" / "manifest.json").exists()  # save_state
    assert model.keys() >= reference_model.keys()  # get_state_dict: the whole model
    for name, weight in reference_model.items():
        assert model[name].dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
        if precision == "fp32":
            assert torch.allclose(model[name], weight, rtol=rel, atol=1e-5), name
    if precision == "bf16":  # bf16 gradients shift some small Adam updates: the whole model
        ours = torch.cat([model[name].float().flatten() for name in reference_model])
        theirs = torch.cat([weight.flatten() for weight in reference_model.values()])
        assert (ours - theirs).norm() < 1e-2 * theirs.norm()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """`accelerate launch --use_deepspeed` of the script with the example's config, saving
    after step 4 of 8: its losses, and the folder it wrote (the load_state test resumes it)."""
    from zero.compat.deepspeed_alias import ALIAS_PATH

    out = tmp_path_factory.mktemp("launched")
    env = subprocess_env(PYTHONPATH=os.pathsep.join([JOB_SITE, ALIAS_PATH, str(REPO)]),
                         OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed",
            "--num_processes", "2", "--main_process_port", str(free_port()),
            "--deepspeed_config_file", str(CONFIG),
            str(SCRIPT), "--out", str(out), *SAVE_AT]
    run_job(argv, TIMEOUT, env=env)
    return json.loads((out / "losses.json").read_text()), out


def test_accelerate_launch_use_deepspeed_runs_on_zero_with_the_alias_on_the_path(launched, ddp):
    """`accelerate launch --use_deepspeed` starts torchrun in its own process, not zero's
    launcher: with the alias folder on PYTHONPATH (docs/HUGGINGFACE.md) it gets zero too, and
    trains as DDP's recorded run (which saved at step 4 too)."""
    (whole, _), (reference, _) = launched, ddp
    assert whole["engine"] == "zero.engine.ZeroEngine"
    assert whole["losses"] == pytest.approx(reference["losses"], rel=1e-4)


def test_accelerate_load_state_resumes_as_ddp_does(tmp_path, launched):
    """save_state after step 4 of 8 (zero's checkpoint under the Accelerate folder, the
    script's LambdaLR beside it; the launched job's), then a job of zero's launcher
    load_state's it and runs steps 5-8: the same losses as the same save and resume under
    plain DDP. (Accelerate's resume itself is not exact: its resumed curve differs from the
    uninterrupted one by about 1e-3, under DDP too.)"""
    whole, folder = launched
    resumed, _ = run_script(tmp_path / "zero-resumed", "--ds_config", CONFIG,
                            *resume_from(folder))
    ddp = recorded_ddp.load("accelerate", ddp_digest())
    assert resumed["losses"][:4] == [None] * 4
    assert resumed["losses"][4:] == pytest.approx(ddp["resumed"]["losses"][4:], rel=1e-4)
    assert resumed["losses"][4:] != pytest.approx(whole["losses"][:4], rel=1e-4)  # no restart
