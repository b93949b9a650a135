"""DeepSpeed scripts run unmodified but for the import line: their argparse patterns, their
config rules, and whole scripts launched by `zero --num_procs 2` (train, save, resume).

The scripts are examples/deepspeed/*.py, written in the shape of DeepSpeedExamples' CIFAR and
bing_bert / HelloDeepSpeed training loops.
"""
import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

import zero.compat.deepspeed as deepspeed
from distributed_harness import launcher_argv, run_job

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "deepspeed"
LAUNCH_TIMEOUT = 240


# -- argparse: the patterns DeepSpeed scripts use ------------------------------------------
def script_parser():
    """The most common shape: the script's own --local_rank, then DeepSpeed's flags."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=1)
    return deepspeed.add_config_arguments(parser)


def test_script_with_its_own_local_rank_parses_launcher_arguments():
    args = script_parser().parse_args(
        ["--local_rank=1", "--epochs", "3", "--deepspeed", "--deepspeed_config", "ds.json"])
    assert (args.local_rank, args.epochs, args.deepspeed, args.deepspeed_config) == \
        (1, 3, True, "ds.json")
    assert (args.deepscale, args.deepscale_config) == (False, None)


def test_add_config_arguments_adds_exactly_deepspeeds_flags():
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    flags = {option for action in parser._actions for option in action.option_strings}
    assert flags == {"-h", "--help", "--deepspeed", "--deepspeed_config", "--deepscale",
                     "--deepscale_config"}
    args = parser.parse_args([])
    assert (args.deepspeed, args.deepspeed_config) == (False, None)


def test_script_without_local_rank_uses_parse_known_args_or_no_local_rank():
    """A script that never declares --local_rank: parse_known_args leaves the launcher's
    --local_rank=N aside (with --no_local_rank there is none)."""
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args, rest = parser.parse_known_args(["--local_rank=0", "--deepspeed_config", "c.json"])
    assert args.deepspeed_config == "c.json" and rest == ["--local_rank=0"]


def _model():
    import torch
    return torch.nn.Linear(4, 4)


@pytest.mark.parametrize("argv, config, message", [
    (["--deepspeed_config", "a.json"], {"train_batch_size": 1},
     "we were given deepspeed configs in the deepspeed arguments (--deepspeed_config a.json) "
     "and deepspeed.initialize() function call"),
    (["--deepspeed_config", "a.json", "--deepscale_config", "b.json"], None,
     "both a deepscale_config and deepspeed_config"),
    ([], None, "DeepSpeed requires --deepspeed_config to specify configuration file"),
])
def test_config_source_errors_are_deepspeeds(argv, config, message):
    args = script_parser().parse_args(argv)
    with pytest.raises(ValueError, match=re.escape(message)):
        deepspeed.initialize(args=args, model=_model(), config=config)


def test_deprecated_deepscale_config_is_taken_as_deepspeed_config():
    args = script_parser().parse_args(["--deepscale_config", "old.json"])
    with pytest.raises(ValueError, match=re.escape("(--deepspeed_config old.json)")):
        deepspeed.initialize(args=args, model=_model(), config={"train_batch_size": 1})
    assert (args.deepspeed_config, args.deepscale_config) == ("old.json", None)


def test_local_rank_argument_must_agree_with_the_environment(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = script_parser().parse_args(["--local_rank=1"])
    with pytest.raises(ValueError, match=re.escape(
            "Mismatch in local rank setting, args.local_rank=1 but env['LOCAL_RANK']=0")):
        deepspeed.initialize(args=args, model=_model(), config={"train_batch_size": 1},
                             dist_init_required=False)


def test_unset_local_rank_argument_takes_the_environments(monkeypatch):
    """args.local_rank = LOCAL_RANK (DeepSpeed sets it for scripts that read it later); the
    call then stops for want of a process group, which this test does not make."""
    monkeypatch.setenv("LOCAL_RANK", "3")
    args = script_parser().parse_args([])
    with pytest.raises(Exception, match="process group"):
        deepspeed.initialize(args=args, model=_model(), config={"train_batch_size": 1},
                             dist_init_required=False)
    assert args.local_rank == 3


# -- whole scripts under the launcher --------------------------------------------------------
def launch(tmp_path, script, *script_args, procs=2):
    return run_job(launcher_argv(procs, script, *script_args), LAUNCH_TIMEOUT,
                   cwd=tmp_path).stdout


def losses(output):
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^step (\d+) loss ([\d.]+)$", output,
                                                        re.M)}


def bert_config(tmp_path, stage):
    config = json.loads((EXAMPLES / "ds_config_bert.json").read_text())
    config["zero_optimization"]["stage"] = stage
    path = tmp_path / f"ds_config_stage{stage}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", [2, 3])
def test_bert_style_script_trains_saves_and_resumes_at_the_saved_step(tmp_path, stage):
    """Unmodified but for the import: --deepspeed --deepspeed_config, initialize(args=args),
    save_checkpoint with client_state (every 10 steps and at the end), load_checkpoint; a run
    resumed from the step-10 checkpoint continues with the losses of the uninterrupted run."""
    config = bert_config(tmp_path, stage)
    script = EXAMPLES / "train_bert_ds.py"
    flags = ["--deepspeed", "--deepspeed_config", config]
    out = launch(tmp_path, script, *flags, "--num_steps", 20, "--checkpoint_dir", "ckpt",
                 "--checkpoint_every", 10)
    whole = losses(out)
    assert sorted(whole) == list(range(1, 21))
    assert sum(list(whole.values())[-3:]) < 0.8 * sum(list(whole.values())[:3])  # it learns
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "global_step20"

    # the step-10 checkpoint, as the latest of a folder of its own
    shutil.copytree(tmp_path / "ckpt" / "global_step10", tmp_path / "at10" / "global_step10")
    (tmp_path / "at10" / "latest").write_text("global_step10")
    resumed = launch(tmp_path, script, *flags, "--num_steps", 20, "--load_checkpoint_dir",
                     "at10")
    assert "resumed from step 10" in resumed
    assert losses(resumed) == {s: whole[s] for s in range(11, 21)}

    # the periodic memory report is one line per rank (steps_per_print 10), the table comes
    # once, at the end
    for rank in (0, 1):
        line = next(l for l in out.splitlines() if l.startswith(f"[zero] step 10 rank {rank}:"))
        assert "model states" in line and "= formula" in line
    assert out.count("memory after step") == 1
    assert out.index("memory after step 20") > out.index("step 20 loss")


@pytest.mark.timeout(300)
def test_cifar_style_script_with_config_dict_and_training_data(tmp_path):
    out = launch(tmp_path, EXAMPLES / "cifar10_deepspeed.py", "--stage", 3, "--dtype", "bf16",
                 "--epochs", 2, "--samples", 640)
    logged = [float(m) for m in re.findall(r"loss:\s+([\d.]+)", out)]
    assert len(logged) >= 4, out
    assert logged[-1] < 0.7 * logged[0], out
    assert out.count("Finished Training") == 2


@pytest.mark.timeout(300)
def test_main_job_script_runs_under_the_launcher(tmp_path):
    """scripts/main.sh's job, shortened: the README's first command ends in this run."""
    out = launch(tmp_path, REPO / "examples" / "train_gpt.py", "--deepspeed_config",
                 REPO / "configs" / "stage2_bf16.json", "--steps", 4, "--n_layer", 1)
    assert "memory after step 4" in out, out


UTILS_SCRIPT = '''
import logging

import deepspeed
import torch
from deepspeed.runtime.utils import see_memory_usage
from deepspeed.utils import RepeatingLoader, log_dist

deepspeed.init_distributed()
log_dist("not said: DeepSpeed's logger shows warnings and above", ranks=[-1])
log_dist("said by rank 0", ranks=[0], level=logging.WARNING)
log_dist("said by every rank", ranks=[-1], level=logging.WARNING)
loader = RepeatingLoader(torch.utils.data.DataLoader(list(range(3)), batch_size=2))
print(f"rank {torch.distributed.get_rank()} batches", [next(loader).tolist() for _ in range(4)])
see_memory_usage("memory now", force=True)
'''


@pytest.mark.timeout(120)
def test_deepspeed_utils_that_scripts_import(tmp_path):
    """log_dist, RepeatingLoader (deepspeed.utils) and see_memory_usage (deepspeed.runtime.
    utils), as DeepSpeed scripts import them, under the launcher."""
    script = tmp_path / "uses_utils.py"
    script.write_text(UTILS_SCRIPT)
    out = launch(tmp_path, script)
    assert out.count("[Rank 0] said by rank 0") == 1 and "[Rank 1] said by rank 0" not in out
    for rank in (0, 1):  # DeepSpeed's format: [time] [WARNING] [file:line:function] message
        assert re.search(rf"^\[.+\] \[WARNING\] \[logging.py:\d+:log_dist\] "
                         rf"\[Rank {rank}\] said by every rank$", out, re.M), out
    assert "not said" not in out
    for rank in (0, 1):
        assert f"rank {rank} batches [[0, 1], [2], [0, 1], [2]]" in out
    assert out.count("memory now") == 1 and out.count("CPU Virtual Memory:  used = ") == 1


def _saved_model_eval_loss(output_dir):
    """The held-out loss of the model sft_chat.py saved, computed here in fp32 (its data: the
    script's dataset(16, seed=1))."""
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    model = OPTForCausalLM(OPTConfig.from_json_file(output_dir / "config.json")).float()
    state = torch.load(output_dir / "pytorch_model.bin")
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()},
                                                strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied
    patterns = torch.randint(2, 64, (8, 4), generator=torch.Generator().manual_seed(0))
    choice = torch.randint(0, 8, (16,), generator=torch.Generator().manual_seed(1))
    ids = patterns[choice].repeat(1, 8)
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("flags", [
    ["--zero_stage", 2],
    ["--zero_stage", 3, "--lora_dim", 8, "--only_optimize_lora", "--offload",
     "--gradient_checkpointing"],
], ids=["stage2-bf16", "stage3-lora-offload-checkpointing"])
def test_deepspeed_chat_style_sft_trains_and_saves_a_model_that_loads(tmp_path, flags):
    """DeepSpeed-Chat's step-1 shape (examples/deepspeed/sft_chat.py): its config spellings, LoRA
    swapped in through deepspeed.compression.helper, `from deepspeed import get_accelerator`,
    the model's own methods and attributes called on the engine, tput_timer, and the stage-3
    save that keeps `param.data.cpu()` from inside GatheredParameters: the loss falls, and the
    saved file is the trained model (its held-out loss is the one the script measured)."""
    out = launch(tmp_path, EXAMPLES / "sft_chat.py", *flags, "--output_dir", "saved")
    before = float(re.search(r"^rank 0 eval loss before ([\d.]+)", out, re.M)[1])
    after = float(re.search(r"^rank 0 eval loss after ([\d.]+)", out, re.M)[1])
    assert after < 0.97 * before, out
    assert re.search(r"^epoch=1/micro_step=\d+/global_step=10, RunningAvgSamplesPerSec=[\d.]+, "
                     r"CurrSamplesPerSec=[\d.]+, MemAllocated=[\d.]+GB", out, re.M), out
    assert out.count("global_step=10, RunningAvg") == 1  # rank 0 alone
    assert _saved_model_eval_loss(tmp_path / "saved") == pytest.approx(after, abs=0.03)


def _single_process_losses(model_dir, steps, batch_size=2, seq_length=16, lr=1e-3):
    """autotp_mpu.py's training (data rank 0's fixed batch, AdamW, DeepSpeed's default
    gradient clipping 1.0) in one process on the whole model."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = torch.randint(0, model.config.vocab_size, (batch_size, seq_length),
                        generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.timeout(300)
def test_autotp_example_with_its_own_groups_and_optimizer_matches_one_process(tmp_path):
    """DeepSpeed's AutoTP example's shape (examples/deepspeed/autotp_mpu.py): its own tensor
    and data groups passed as mpu=, a torch optimizer built before initialize() (AutoTP keeps
    its parameter objects), `data_parallel_size` in the config: on 2 ranks at tensor size 2
    both ranks train like one process on the whole model."""
    import sys

    sys.path.insert(0, str(REPO))
    from examples.deepspeed.autotp_mpu import save_tiny_llama

    save_tiny_llama(tmp_path / "tiny")
    out = launch(tmp_path, EXAMPLES / "autotp_mpu.py", "--model_name", "tiny", "--tp_size", 2,
                 "--dp_size", 1, "--num_steps", 4)
    expected = _single_process_losses(tmp_path / "tiny", 4)
    for rank in (0, 1):
        got = [float(m) for m in re.findall(rf"^rank {rank} step \d+ loss ([\d.]+)$", out, re.M)]
        assert got == pytest.approx(expected, rel=1e-5), (rank, got, expected)
    assert expected[-1] < expected[0] - 0.1  # it trains
