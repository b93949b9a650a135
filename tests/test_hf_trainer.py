"""An unmodified Hugging Face Trainer script (examples/huggingface/train_trainer.py: nothing in
it names zero or DeepSpeed) launched by `zero --num_procs 2` with a DeepSpeed config trains on
zero's engine like plain DDP, resumes from its checkpoint, and saves a model that
from_pretrained loads. The plain-DDP runs are recorded (tests/recorded_ddp/trainer.json and the
model it saved, trainer/; `python -m recorded_ddp trainer` in tests/ makes them again)."""
import json
import math
import runpy
import shutil
from pathlib import Path

import pytest
import safetensors
import torch

import recorded_ddp
from distributed_harness import launcher_argv, run_job

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "huggingface"
SCRIPT = EXAMPLES / "train_trainer.py"
TIMEOUT = 240
ARGS = ["--max_steps", "8", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "2", "--logging_steps", "1", "--save_steps", "4",
        "--learning_rate", "3e-3", "--report_to", "none", "--disable_tqdm", "true"]


def run_trainer(out, *extra, launcher=(), procs=2):
    run_job(launcher_argv(procs, *launcher, SCRIPT, "--output_dir", out, *ARGS, *extra), TIMEOUT)
    return json.loads((Path(out) / "log_history.json").read_text())


def step_losses(result):
    return [entry["loss"] for entry in result["log_history"] if "loss" in entry]


RMSPROP = ["--optim", "rmsprop", "--learning_rate", "5e-4"]  # (the last lr given wins)


def ddp_run(out, *extra) -> dict:
    """The same script under plain DDP (gloo on the CPU, zero not standing in for deepspeed):
    what the comparisons read of it."""
    result = run_trainer(out, "--use_cpu", "true", *extra, launcher=["--no_deepspeed_alias"])
    return {"wrapped": result["wrapped"], "losses": step_losses(result),
            "eval_loss": result["eval"]["eval_loss"]}


def ddp_digest() -> str:
    return recorded_ddp.digest(SCRIPT, ARGS, RMSPROP,
                               packages=("torch", "transformers", "accelerate"))


def record_ddp(folder, scratch) -> dict:
    """DDP's runs with the config's AdamW and with --optim rmsprop; the AdamW run's saved
    model is kept (`python -m recorded_ddp trainer`)."""
    runs = {"adamw": ddp_run(Path(scratch) / "adamw"), "rmsprop": ddp_run(
        Path(scratch) / "rmsprop", *RMSPROP)}
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(Path(scratch) / "adamw" / "final" / name, folder / name)
    return runs


@pytest.fixture(scope="module")
def ddp():
    """DDP's AdamW run, recorded (tests/recorded_ddp/trainer.json), and its saved model."""
    return {**recorded_ddp.load("trainer", ddp_digest())["adamw"],
            "final": recorded_ddp.files("trainer")}


def saved_weights(path):
    model = transformers.GPT2LMHeadModel.from_pretrained(path)
    return {name: p.detach() for name, p in model.named_parameters()}


def variant_config(tmp_path, variant):
    """The example configs, and the offload variants HF users write: stage 3 with parameters
    and optimizer in host memory; stage 2 offloading the Trainer's own torch AdamW (no
    "optimizer" block: Accelerate swaps it for deepspeed.ops.adam.DeepSpeedCPUAdam)."""
    stage = 3 if variant.startswith("zero3") else 2
    config = json.loads((EXAMPLES / f"ds_zero{stage}.json").read_text())
    if "offload" in variant:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if variant == "zero3-offload":
        config["zero_optimization"]["offload_param"] = {"device": "cpu"}
    if variant == "zero2-offload-torch-adamw":
        del config["optimizer"]
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    """The example's ZeRO-3 config as it stands: its run, and the folder it wrote."""
    out = tmp_path_factory.mktemp("zero3")
    return run_trainer(out, "--deepspeed", str(EXAMPLES / "ds_zero3.json")), out


@pytest.mark.parametrize("variant", ["zero2", "zero3", "zero3-offload",
                                     "zero2-offload-torch-adamw"])
def test_trainer_on_zero_matches_ddp_and_saves_a_loadable_model(tmp_path, ddp, variant,
                                                                 request):
    if variant == "zero3":  # (the resume test below continues this run)
        result, tmp_path = request.getfixturevalue("zero3")
    else:
        result = run_trainer(tmp_path, "--deepspeed", variant_config(tmp_path, variant))
    assert result["wrapped"] == "zero.engine.ZeroEngine"  # trainer.model_wrapped
    assert ddp["wrapped"] == "torch.nn.parallel.distributed.DistributedDataParallel"
    assert len(step_losses(result)) == 8
    assert step_losses(result) == pytest.approx(ddp["losses"], rel=2e-3)
    assert result["eval"]["eval_loss"] == pytest.approx(ddp["eval_loss"], rel=2e-3)
    assert result["eval"]["eval_loss"] < step_losses(result)[0]
    # save_model (at stage 3: the 16-bit gather) wrote a model that from_pretrained loads,
    # with the weights DDP's run saved.
    ours, theirs = saved_weights(tmp_path / "final"), saved_weights(ddp["final"])
    assert ours.keys() == theirs.keys()
    for name, weight in ours.items():
        assert torch.allclose(weight, theirs[name], rtol=2e-3, atol=1e-5), name


def test_the_trainers_other_optimizers_train_on_zero_like_ddp(tmp_path, ddp):
    """--optim rmsprop with a config that names no optimizer: the Trainer builds torch's
    RMSprop and tells DeepSpeed "zero_allow_untested_optimizer"; zero runs it on each rank's
    shard (zero/external_optimizer.py), step for step like DDP with the same optimizer."""
    config = json.loads((EXAMPLES / "ds_zero2.json").read_text())
    del config["optimizer"]
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    ours = run_trainer(tmp_path / "zero", "--deepspeed", str(path), *RMSPROP)
    theirs = recorded_ddp.load("trainer", ddp_digest())["rmsprop"]
    assert ours["wrapped"] == "zero.engine.ZeroEngine"
    assert step_losses(ours) == pytest.approx(theirs["losses"], rel=2e-3)
    assert ours["eval"]["eval_loss"] == pytest.approx(theirs["eval_loss"], rel=2e-3)
    assert ours["eval"]["eval_loss"] < step_losses(ours)[0]
    # and it is RMSprop's run: nearer DDP's RMSprop than a tenth of its distance to AdamW's
    off = max(abs(a - b) for a, b in zip(step_losses(ours), theirs["losses"]))
    adamw = max(abs(a - b) for a, b in zip(step_losses(ours), ddp["losses"]))
    assert off < 0.1 * adamw, (off, adamw)


def test_trainer_with_gradient_checkpointing_and_torch_compile_at_stage3_trains_like_ddp(
        tmp_path, ddp):
    """--gradient_checkpointing (transformers' own, its default kwargs: each block's forward
    runs again in backward, gathering its unit again) and --torch_compile (Accelerate calls
    engine.compile(backend=..., compile_kwargs=...), which compiles the model with the
    engine's stage-3 hooks on it; the eager backend: DDP's numbers without compilation)."""
    result = run_trainer(tmp_path, "--deepspeed", variant_config(tmp_path, "zero3"),
                         "--gradient_checkpointing", "true", "--torch_compile", "true",
                         "--torch_compile_backend", "eager")
    assert result["wrapped"] == "zero.engine.ZeroEngine"
    assert step_losses(result) == pytest.approx(ddp["losses"], rel=2e-3)


@pytest.mark.parametrize("stage,extra", [(2, None), (3, None), (3, "bf16-master"),
                                         (2, "fp32-grads")])
def test_trainer_in_bf16_trains_on_zero_in_bf16_near_ddp(tmp_path, ddp, stage, extra):
    """--bf16 (on a machine without a GPU transformers asks for --use_cpu true with it; the
    DeepSpeed config's "bf16": "auto" follows): zero's engine trains in bf16 with an fp32
    master, or with the config's bf16_master_weights_and_grads and bf16_optimizer_states with
    none, or with its data_types.grad_accum_dtype fp32 (Megatron-DeepSpeed's), within bf16's
    rounding of DDP in fp32, and save_model writes bf16 weights (DeepSpeed's 16-bit save) that
    from_pretrained loads, near DDP's."""
    config = json.loads((EXAMPLES / f"ds_zero{stage}.json").read_text())
    if extra == "bf16-master":
        config["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    if extra == "fp32-grads":
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    result = run_trainer(tmp_path, "--deepspeed", str(path), "--bf16", "true",
                         "--use_cpu", "true")
    assert result["wrapped"] == "zero.engine.ZeroEngine"
    assert step_losses(result) == pytest.approx(ddp["losses"], rel=2e-2)
    assert result["eval"]["eval_loss"] == pytest.approx(ddp["eval_loss"], rel=2e-2)
    assert result["eval"]["eval_loss"] < step_losses(result)[0]
    with safetensors.safe_open(str(tmp_path / "final" / "model.safetensors"), "pt") as saved:
        assert {saved.get_tensor(name).dtype for name in saved.keys()} == {torch.bfloat16}
    ours, theirs = saved_weights(tmp_path / "final"), saved_weights(ddp["final"])
    assert ours.keys() == theirs.keys()
    difference = torch.cat([(ours[name].float() - theirs[name]).flatten() for name in ours])
    whole = torch.cat([weight.flatten() for weight in theirs.values()])
    assert difference.norm() < 1e-2 * whole.norm()  # of the model's norm, as in bf16 Accelerate


def test_evaluation_at_stage3_leaves_the_unused_scheduler_block_alone(tmp_path, ddp):
    """trainer.evaluate() at ZeRO-3 before any training initializes an engine without an
    optimizer from the training config, its "auto" scheduler finalized for 0 steps
    (transformers deletes "lr_scheduler", not "scheduler"). DeepSpeed never reads that block
    without an optimizer; zero does not validate it either. (Training after it fails in
    transformers itself, with either backend: total_num_steps is then 0, not "auto".)"""
    config = json.loads((EXAMPLES / "ds_zero3.json").read_text())
    config["scheduler"] = {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
        "total_num_steps": "auto"}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    result = run_trainer(tmp_path / "out", "--deepspeed", str(path), "--evaluate_first", "true",
                         "--train", "false", "--warmup_steps", "2")
    assert step_losses(result) == []
    # The untrained model (the same seed as DDP's): near the uniform guess, above DDP's end.
    assert result["first"]["eval_loss"] == pytest.approx(math.log(96), rel=0.05)
    assert result["first"]["eval_loss"] > ddp["eval_loss"]


def test_trainer_resumes_from_its_checkpoint_on_the_same_curve(tmp_path, zero3):
    """At stage 3 (stage 2's resume through the Trainer: the checkpoint the real DeepSpeed
    wrote, below)."""
    config = str(EXAMPLES / "ds_zero3.json")
    whole, whole_dir = zero3
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(whole_dir / "checkpoint-4", resumed_dir / "checkpoint-4")
    assert (resumed_dir / "checkpoint-4" / "latest").exists()  # the engine's own checkpoint
    resumed = run_trainer(resumed_dir, "--deepspeed", config, "--resume_from_checkpoint",
                          str(resumed_dir / "checkpoint-4"))
    assert step_losses(resumed) == pytest.approx(step_losses(whole), rel=2e-3)
    assert resumed["eval"]["eval_loss"] == pytest.approx(whole["eval"]["eval_loss"], rel=2e-3)


def test_a_peft_model_at_stage3_checkpoints_its_adapters_alone_and_resumes_on_its_curve(
        tmp_path):
    """PEFT LoRA at stage 3: the frozen GPT-2 is partitioned (zero's frozen group); the
    Trainer saves with exclude_frozen_parameters=True, so the checkpoint's module state holds
    the adapters alone, and resuming (load_module_strict=False, the base rebuilt by the
    script) follows the uninterrupted run."""
    pytest.importorskip("peft")
    config = str(EXAMPLES / "ds_zero3.json")
    whole = run_trainer(tmp_path / "whole", "--deepspeed", config, "--lora", "4")
    checkpoint = tmp_path / "whole" / "checkpoint-4"
    tag = (checkpoint / "latest").read_text().strip()
    module = torch.load(checkpoint / tag / "model_states.pt",
                        weights_only=False)["module"]
    assert module and all("lora_" in name for name in module), sorted(module)[:5]
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(checkpoint, resumed_dir / "checkpoint-4")
    resumed = run_trainer(resumed_dir, "--deepspeed", config, "--lora", "4",
                          "--resume_from_checkpoint", str(resumed_dir / "checkpoint-4"))
    assert step_losses(resumed) == pytest.approx(step_losses(whole), rel=2e-3)
    assert step_losses(whole)[-1] < step_losses(whole)[0]


def test_trainer_resumes_a_checkpoint_the_real_deepspeed_wrote(tmp_path):
    """The same script trained to step 4 by the HF Trainer on the real DeepSpeed 0.19.8
    (tests/deepspeed_checkpoints/make.py), resumed on zero: steps 5-8 and the final model are
    DeepSpeed's own."""
    from safetensors.torch import load_file

    from zero.compat.deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    fixture = REPO / "tests" / "deepspeed_checkpoints" / "hf-trainer-stage2"
    want = json.loads((fixture / "expected.json").read_text())
    assert want["arguments"] == ARGS
    shutil.copytree(fixture / "checkpoint-4", tmp_path / "checkpoint-4")
    resumed = run_trainer(tmp_path, "--deepspeed", str(EXAMPLES / "ds_zero2.json"),
                          "--resume_from_checkpoint", str(tmp_path / "checkpoint-4"))
    assert step_losses(resumed) == pytest.approx(want["losses"], rel=1e-5)
    assert resumed["eval"]["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-5)
    ours = load_file(tmp_path / "final" / "model.safetensors")
    theirs = load_file(fixture / "final.safetensors")
    at_save = get_fp32_state_dict_from_zero_checkpoint(str(fixture / "checkpoint-4"))
    moved = max((theirs[k] - at_save[k]).abs().max().item() for k in theirs)
    difference = max((ours[k] - theirs[k]).abs().max().item() for k in theirs)
    assert difference < 1e-3 * moved, (difference, moved)  # DeepSpeed's last 4 steps, to rounding


def test_from_pretrained_under_zero3_loads_the_saved_model_and_trains(tmp_path, ddp):
    """ZeRO-3 from_pretrained builds the model inside zero.Init (the config still holds
    "auto" then) and loads the weights through GatheredParameters: the first evaluation
    equals the one DDP's run made with those weights, and training goes on from them."""
    result = run_trainer(tmp_path, "--deepspeed", str(EXAMPLES / "ds_zero3.json"), "--init_from",
                         str(ddp["final"]), "--eval_on_start", "true",
                         "--max_steps", "4")
    evals = [entry["eval_loss"] for entry in result["log_history"] if "eval_loss" in entry]
    assert evals[0] == pytest.approx(ddp["eval_loss"], rel=1e-4)
    assert len(step_losses(result)) == 4
    assert evals[-1] < evals[0]


def test_trainer_with_autoep_trains_and_saves_mixtral_as_without_it(tmp_path):
    """A small Mixtral (the example's --moe model, saved untrained) loaded by from_pretrained:
    at ZeRO-3 under zero.Init, as Hugging Face loads it there. The config's expert_parallel
    block splits its experts over the 2 ranks (zero.moe.auto_ep; the experts arrive as
    zero.Init shards and are gathered first); the Trainer's save_model gathers them whole at
    stage 3 (the 16-bit gather) and at stage 2 (Accelerate's clone_tensors_for_torch_save of
    the module's state dict, on every rank; DeepSpeed's writes each rank's rows there)."""
    transformers.set_seed(0)
    small_model = runpy.run_path(str(SCRIPT))["small_model"]  # (the script's main does not run)
    small_model(moe=True).save_pretrained(tmp_path / "init")
    runs = {}
    for name, stage, expert_parallel in (
            ("split", 3, {"enabled": True, "autoep_size": 2}),
            ("split-stage2", 2, {"enabled": True, "autoep_size": 2}),
            ("whole", 3, {"enabled": False})):
        config = json.loads((EXAMPLES / f"ds_zero{stage}.json").read_text())
        config["expert_parallel"] = expert_parallel
        if stage == 3:  # every weight a zero.Init shard, however small (a real model's are)
            config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        out = tmp_path / name
        runs[name] = run_trainer(out, "--deepspeed", str(path), "--init_from",
                                 str(tmp_path / "init"), "--use_cpu", "true")
        runs[name]["model"] = transformers.MixtralForCausalLM.from_pretrained(out / "final")
    whole = runs.pop("whole")
    for name, split in runs.items():
        assert len(step_losses(split)) == 8, name
        assert step_losses(split) == pytest.approx(step_losses(whole), abs=1e-5), name
        assert split["model"].model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4, name
        # (8 AdamW steps: an element whose gradient is near zero moves by rounding; 1.2e-5 seen)
        for (param, ours), theirs in zip(split["model"].named_parameters(),
                                         whole["model"].parameters()):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=5e-5,
                                       msg=lambda text, at=f"{name} {param}": f"{at}: {text}")
