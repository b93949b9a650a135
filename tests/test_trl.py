"""TRL's trainers, unmodified (examples/huggingface/train_trl.py names neither zero nor
DeepSpeed), launched by `zero --num_procs 2` with a DeepSpeed config, train on zero's engine
as under plain DDP: GRPO generates inside training (at stage 3 through TRL's
unwrap_model_for_generation: GatheredParameters and its remove_hooks / add_hooks) and keeps
a KL reference model (TRL's prepare_deepspeed, whose dotted top-level keys DeepSpeed
ignores); DPO trains against its reference model; SFT and GRPO train PEFT LoRA adapters on
a frozen model. All load the model from a directory, as from a hub name (at stage 3 under
zero.Init).

Each trainer's plain-DDP run (gloo on the CPU, zero not standing in for deepspeed) is recorded
in tests/recorded_ddp/trl.json (`python -m recorded_ddp trl` in tests/), with a digest of the
script, its arguments and the library versions: a stale recording fails the first test."""
import json
import sys
from pathlib import Path

import pytest

import recorded_ddp
from distributed_harness import launcher_argv, run_job

pytest.importorskip("trl")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "huggingface"
SCRIPT = EXAMPLES / "train_trl.py"
TIMEOUT = 180
COMMON = ["--max_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1",
          "--learning_rate", "1e-3", "--report_to", "none", "--disable_tqdm", "true",
          "--save_strategy", "no", "--bf16", "false"]
GENERATION = ["--num_generations", "4", "--max_completion_length", "8", "--beta", "0.04"]
ARGS = {"grpo": GENERATION, "rloo": GENERATION, "dpo": [], "kto": [], "sft": [], "reward": [],
        "distill": ["--max_completion_length", "8"]}
LOGGED = {"grpo": ["loss", "reward", "kl"], "rloo": ["loss", "reward", "kl"],
          "dpo": ["loss", "rewards/margins"], "kto": ["loss", "kl", "rewards/chosen"],
          "sft": ["loss"], "reward": ["loss", "accuracy", "margin"],
          "distill": ["loss", "entropy"]}
pytestmark = pytest.mark.timeout(TIMEOUT * 2)
CASES = [("grpo", 3, 0), ("grpo", 2, 0), ("dpo", 3, 0), ("sft", 3, 4), ("grpo", 3, 4),
         ("rloo", 3, 0), ("kto", 3, 0), ("reward", 3, 0), ("distill", 3, 0)]
DDP_RUNS = sorted({(trainer, lora) for trainer, _, lora in CASES})  # (grpo at both stages)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def save_tiny_model(path):
    run_job([sys.executable, str(SCRIPT), "--save_model", str(path)], TIMEOUT)
    return path


def run_trl(out, model, trainer, *extra, launcher=()):
    proc = run_job(launcher_argv(2, *launcher, SCRIPT, "--model", model, "--trainer", trainer,
                                 "--output_dir", out, *COMMON, *ARGS[trainer], *extra), TIMEOUT)
    return json.loads((Path(out) / "log_history.json").read_text()), proc.stderr


def logged(result, key):
    return [entry[key] for entry in result["log_history"] if key in entry]


def ddp_run(out, model, trainer, lora) -> dict:
    """The trainer under plain DDP: what the comparison reads of it."""
    result = run_trl(out, model, trainer, "--lora", str(lora), "--use_cpu", "true",
                     launcher=["--no_deepspeed_alias"])[0]
    return {"wrapped": result["wrapped"], **{key: logged(result, key) for key in LOGGED[trainer]}}


def ddp_digest() -> str:
    return recorded_ddp.digest(SCRIPT, COMMON, ARGS, packages=("torch", "transformers", "trl"))


def record_ddp(folder, scratch) -> dict:
    """The plain-DDP runs the tests compare with (`python -m recorded_ddp trl`)."""
    model = save_tiny_model(Path(scratch) / "tiny")
    return {f"{trainer}-{lora}": ddp_run(Path(scratch) / f"ddp-{trainer}-{lora}", model,
                                         trainer, lora)
            for trainer, lora in DDP_RUNS}


def test_the_recorded_ddp_runs_are_of_this_script_and_these_libraries():
    assert sorted(recorded_ddp.load("trl", ddp_digest())) == \
        sorted(f"{t}-{lora}" for t, lora in DDP_RUNS)


@pytest.mark.parametrize("trainer,stage,lora", CASES)
def test_trl_trainer_on_zero_matches_ddp(tmp_path, tiny_model, trainer, stage, lora):
    if lora:
        pytest.importorskip("peft")
    result, stderr = run_trl(tmp_path, tiny_model, trainer, "--lora", str(lora), "--deepspeed",
                             EXAMPLES / f"ds_zero{stage}.json")
    want = recorded_ddp.load("trl", ddp_digest())[f"{trainer}-{lora}"]
    assert result["wrapped"] == "zero.engine.ZeroEngine"
    assert want["wrapped"] == "torch.nn.parallel.distributed.DistributedDataParallel"
    for key in LOGGED[trainer]:
        assert len(logged(result, key)) == 4, key
        assert logged(result, key) == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    if stage == 3 and trainer == "grpo" and not lora:  # the reference model's engine was
        # built from TRL's dotted keys (with LoRA the reference is the policy, adapters off)
        assert "zero_optimization.reduce_bucket_size" in stderr
        assert "ignored, as DeepSpeed ignores them" in stderr
