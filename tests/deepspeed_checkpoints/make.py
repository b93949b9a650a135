"""Writes the DeepSpeed checkpoints in this folder with the real DeepSpeed 0.19.8 (its CPU
accelerator, gloo), and beside each the run's continuation as DeepSpeed trains it: the losses
of the 2 steps after the save and DeepSpeed's own zero_to_fp32 of the weights at the save and
after those steps (expected.pt); <run>-universal: DeepSpeed's ds_to_universal of some of
them (ds_checkpoint_run.UNIVERSAL). And hf-trainer-stage2: examples/huggingface/train_trainer.py
with ds_zero2.json on 2 ranks, tests/test_hf_trainer.py's arguments: its checkpoint-4 (without
the files a DeepSpeed resume does not read), the losses and eval loss of all 8 steps and the
final model (expected.json, final.safetensors). zero-*-universal: zero's own run
(ds_checkpoint_run.ZERO_TO_DEEPSPEED) converted by zero/checkpoint_to_universal.py, and the
real DeepSpeed resuming that at another world size and stage (expected.pt). From the project
root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python \
        tests/deepspeed_checkpoints/make.py [RUN ...]   # these runs, else all
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
import ds_checkpoint_run as run  # noqa: E402
from distributed_harness import run_distributed  # noqa: E402


def _rank(rank, world, name, scratch):
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    deepspeed.init_distributed(dist_backend="gloo")
    model = run.make_model(run.RUNS[name])
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=run.config(run.RUNS[name], deepspeed=True),
        model_parameters=[p for p in model.parameters() if p.requires_grad])
    run.train(engine, rank, world, 0, run.SAVED_AT)
    saved = os.path.join(run.FIXTURES, name)
    engine.save_checkpoint(saved, client_state=dict(run.CLIENT_STATE))
    losses = run.train(engine, rank, world, run.SAVED_AT, run.MORE)
    after = os.path.join(scratch, name)
    engine.save_checkpoint(after)
    torch.distributed.barrier()
    if rank != 0:
        return None
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's: not needed here
        os.remove(os.path.join(saved, script))

    def fp32(path):  # each tensor on its own (DeepSpeed's are views of one flat buffer)
        return {k: v.clone() for k, v in get_fp32_state_dict_from_zero_checkpoint(path).items()}

    return {"deepspeed": deepspeed.__version__, "losses": losses,
            "buffers": {"seen_steps": engine.module.seen_steps.clone()},
            "fp32_at_save": fp32(saved), "fp32_after": fp32(after)}


HF_RUN = "hf-trainer-stage2"
HF_ARGS = ["--max_steps", "8", "--per_device_train_batch_size", "4",
           "--gradient_accumulation_steps", "2", "--logging_steps", "1", "--save_steps", "4",
           "--learning_rate", "3e-3", "--report_to", "none", "--disable_tqdm", "true"]


def hf_trainer():
    root = os.path.dirname(TESTS)
    examples = os.path.join(root, "examples", "huggingface")
    target = os.path.join(run.FIXTURES, HF_RUN)
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        os.path.join(run.FIXTURES, "real_deepspeed_trainer.py"),
                        os.path.join(examples, "train_trainer.py"), "--deepspeed",
                        os.path.join(examples, "ds_zero2.json"), "--output_dir", out, *HF_ARGS],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
        shutil.copytree(os.path.join(out, "checkpoint-4"), os.path.join(target, "checkpoint-4"),
                        ignore=shutil.ignore_patterns("*.py", "*.safetensors", "*.bin", "*.json",
                                                      "!trainer_state.json"))
        shutil.copy(os.path.join(out, "checkpoint-4", "trainer_state.json"),
                    os.path.join(target, "checkpoint-4"))
        shutil.copy(os.path.join(out, "final", "model.safetensors"),
                    os.path.join(target, "final.safetensors"))
        with open(os.path.join(out, "log_history.json")) as file:
            history = json.load(file)
    import deepspeed
    expected = {"deepspeed": deepspeed.__version__, "arguments": HF_ARGS,
                "losses": [e["loss"] for e in history["log_history"] if "loss" in e],
                "eval_loss": history["eval"]["eval_loss"]}
    with open(os.path.join(target, "expected.json"), "w") as file:
        json.dump(expected, file, indent=1)
    print(f"{HF_RUN}: DeepSpeed {expected['deepspeed']}, losses {expected['losses']}", flush=True)


# (load_optimizer_states, load_module_only) as load_checkpoint is called with them
LOAD_FLAGS = ((True, False), (False, False), (False, True))
LOADED = ("stage2-bf16", "stage3-bf16", "stage1-bf16-frozen-universal")


def _loaded(rank, world, name):
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    deepspeed.init_distributed(dist_backend="gloo")
    spec = run.RUNS[name.removesuffix("-universal")]
    config = run.config(spec, deepspeed=True)
    if name.endswith("-universal"):
        config["checkpoint"] = {"load_universal": True}
    result = {}
    for flags in LOAD_FLAGS:
        model = run.make_model(spec)
        engine, _, _, _ = deepspeed.initialize(
            model=model, config=config,
            model_parameters=[p for p in model.parameters() if p.requires_grad])
        engine.load_checkpoint(os.path.join(run.FIXTURES, name), load_optimizer_states=flags[0],
                               load_module_only=flags[1])
        trained = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
        # its Adam's moments on this rank are zeros or absent unless the load set them
        moments = [t for state in engine.optimizer.optimizer.state.values()
                   for key, t in state.items() if key in ("exp_avg", "exp_avg_sq")]
        result[flags] = {
            "master": {n: safe_get_full_fp32_param(p).clone() for n, p in trained},
            "moments_loaded": any(bool(t.any()) for t in moments)}
        engine.destroy()
    return result


def loaded(name: str):
    result = run_distributed(_loaded, run.WORLD, args=(name,), timeout=300,
                             env={"DS_ACCELERATOR": "cpu"})[0]
    torch.save(result, os.path.join(run.FIXTURES, name, "loaded.pt"))
    print(f"{name}: loaded under {len(result)} flag settings", flush=True)


def universal(name: str):
    """DeepSpeed's ds_to_universal of run `name`'s checkpoint, into <name>-universal (with
    --inject_missing_state: a plain DeepSpeed script records no universal_checkpoint_info)."""
    target = os.path.join(run.FIXTURES, f"{name}-universal")
    tag = f"global_step{run.SAVED_AT}"
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                    "--input_folder", os.path.join(run.FIXTURES, name, tag),
                    "--output_folder", os.path.join(target, f"{tag}_universal"),
                    "--inject_missing_state"], check=True, timeout=600)
    entries = os.listdir(os.path.join(target, f"{tag}_universal", "zero"))
    print(f"{name}-universal: {len(entries)} entries", flush=True)


def _deepspeed_resumes(rank, world, name, load_dir):
    """The real DeepSpeed loads zero's universal checkpoint `name` and trains on."""
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    deepspeed.init_distributed(dist_backend="gloo")
    zero_run = run.ZERO_TO_DEEPSPEED[name]
    spec = run.RUNS[zero_run.run]
    config = run.config(spec, world, zero_run.deepspeed_stage, deepspeed=True)
    config["checkpoint"] = {"load_universal": True}
    model = run.make_model(spec)
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=config,
        model_parameters=[p for p in model.parameters() if p.requires_grad])
    _, client_state = engine.load_checkpoint(load_dir)
    counters = (engine.global_steps, engine.global_samples)
    lr = engine.optimizer.param_groups[0]["lr"]
    losses = run.train(engine, rank, world, run.SAVED_AT, run.MORE)
    after = os.path.join(os.path.dirname(load_dir), "after")
    engine.save_checkpoint(after)
    torch.distributed.barrier()
    if rank != 0:
        return None
    fp32 = get_fp32_state_dict_from_zero_checkpoint(after)
    return {"deepspeed": deepspeed.__version__, "losses": losses, "lr": lr,
            "counters": counters, "client_state": {k: client_state.get(k)
                                                   for k in run.CLIENT_STATE},
            "fp32_after": {k: v.clone() for k, v in fp32.items()}}


def zero_to_deepspeed(name: str):
    """zero's run `name` (run.ZERO_TO_DEEPSPEED) saved by zero, converted by zero into
    <name>/global_step3_universal, and the real DeepSpeed resuming it (expected.pt)."""
    from zero.checkpoint_to_universal import convert

    zero_run = run.ZERO_TO_DEEPSPEED[name]
    target = os.path.join(run.FIXTURES, name)
    shutil.rmtree(target, ignore_errors=True)
    tag = f"global_step{run.SAVED_AT}"
    with tempfile.TemporaryDirectory() as scratch:
        run_distributed(run.zero_save, run.WORLD, args=(zero_run, scratch), timeout=300)
        convert(os.path.join(scratch, tag), os.path.join(target, f"{tag}_universal"))
        resumed = os.path.join(scratch, "resumed", "u")
        shutil.copytree(target, resumed)  # DeepSpeed saves its continuation beside it
        expected = run_distributed(_deepspeed_resumes, zero_run.deepspeed_world,
                                   args=(name, resumed), timeout=300,
                                   env={"DS_ACCELERATOR": "cpu"})[0]
    torch.save(expected, os.path.join(target, "expected.pt"))
    print(f"{name}: DeepSpeed {expected['deepspeed']} resumed zero's run, losses "
          f"{expected['losses']}", flush=True)


def deepspeed_run(name: str):
    shutil.rmtree(os.path.join(run.FIXTURES, name), ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        expected = run_distributed(_rank, run.WORLD, args=(name, scratch),
                                   timeout=300, env={"DS_ACCELERATOR": "cpu"})[0]
    torch.save(expected, os.path.join(run.FIXTURES, name, "expected.pt"))
    print(f"{name}: DeepSpeed {expected['deepspeed']}, losses after the save "
          f"{expected['losses']}", flush=True)


def main(names: list[str]):
    names = names or [*run.RUNS, *run.UNIVERSAL, HF_RUN, *run.ZERO_TO_DEEPSPEED]
    for name in names:  # (a conversion after its run)
        if name.startswith("loaded:"):  # only the loads, of a checkpoint already written
            loaded(name.removeprefix("loaded:"))
        elif name in run.ZERO_TO_DEEPSPEED:
            zero_to_deepspeed(name)
        elif name == HF_RUN:
            hf_trainer()
        elif name.endswith("-universal"):
            universal(name.removesuffix("-universal"))
        else:
            deepspeed_run(name)
        if name in LOADED:
            loaded(name)

if __name__ == "__main__":
    main(sys.argv[1:])  # the runs named, else all
