"""Jobs that go wrong end promptly on every rank with a message naming the cause, and never
put a NaN into the weights: non-finite gradients, a backward that bypassed the engine, ranks
started with different configs or models."""
import dataclasses
import functools
import math
import sys

import pytest
import torch

import training
from distributed_harness import run_distributed

TIMEOUT = 30  # every case must end within this (in practice: seconds)


def _nan_at_step(rank, world, stage, precision, policy):
    import zero

    config = training.engine_config(stage, gas=1, precision=precision, scheduler=False)
    config["nonfinite_gradients"] = policy
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    before_nan = {}

    def poison(step, loss):  # rank 1's loss is NaN at step 1 only
        if step == 1:
            before_nan.update(training.parameters_of(engine.module))
            if rank == 1:
                return loss * float("nan")
        return loss

    try:
        losses = training.train_engine(engine, rank, world, 3, 1, on_step=poison)
    except FloatingPointError as error:
        return {"raised": str(error)}
    after = training.parameters_of(engine.module)
    return {"losses": losses, "skipped": engine.skipped_steps, "applied": engine.applied_steps,
            "finite": all(torch.isfinite(p).all().item() for p in after.values()),
            "moved": any(not torch.equal(after[k], before_nan[k]) for k in after)}


@pytest.mark.parametrize("stage,precision", [(2, "bf16"), (2, "fp32"), (3, "bf16"), (1, "fp32")])
def test_a_nan_gradient_on_one_rank_skips_the_step_on_every_rank(stage, precision):
    results = run_distributed(_nan_at_step, 2, args=(stage, precision, "skip"), timeout=TIMEOUT)
    for result in results:
        assert result["skipped"] == 1 and result["applied"] == 2
        assert result["finite"], "a NaN reached the weights"
        assert result["moved"], "the steps after the skipped one must still train"
        assert math.isfinite(result["losses"][2])


def test_nonfinite_gradients_raise_names_the_option_on_every_rank():
    results = run_distributed(_nan_at_step, 2, args=(2, "bf16", "raise"), timeout=TIMEOUT)
    for result in results:
        assert "not finite" in result["raised"] and "nonfinite_gradients" in result["raised"]


def _plain_backward(rank, world, stage):
    import zero

    config = training.engine_config(stage, gas=1, scheduler=False)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    tokens, targets = training.batches(world, 1, 1)[rank]
    before = training.parameters_of(engine.module)
    engine.module(tokens, targets).backward()  # bypasses the engine altogether
    return _refused_step(engine, before)


def _refused_step(engine, before: dict, weights=None):
    """(the step's error or None, whether the weights are still `before`); `weights()` reads
    them (default: the module's parameters as they are)."""
    weights = weights or functools.partial(training.parameters_of, engine.module)
    try:
        engine.step()
    except RuntimeError as error:
        after = weights()
        return str(error), all(torch.equal(after[k], before[k]) for k in after)
    return None, False


@pytest.mark.parametrize("stage", [0, 2])
def test_step_after_a_backward_around_the_engine_is_an_error_naming_the_fix(stage):
    for message, untouched in run_distributed(_plain_backward, 2, args=(stage,), timeout=TIMEOUT):
        assert message is not None and "engine.backward(loss)" in message
        assert untouched


def _started_apart(rank, world, change):
    import zero
    from zero.agreement import StartupMismatch

    config = training.engine_config(2, gas=1, scheduler=False)
    model_config = training.MODEL
    if rank == 1:
        if change == "lr":
            config["optimizer"]["params"]["lr"] = 0.5
        elif change == "stage":
            config["zero_optimization"]["stage"] = 3
        elif change == "model":
            model_config = dataclasses.replace(training.MODEL, n_embd=48)
    try:
        zero.initialize(model=training.make_model(model_config), config=config)
    except StartupMismatch as error:
        return str(error)
    return None


@pytest.mark.parametrize("change,named", [
    ("lr", "config optimizer.params.lr"),
    ("stage", "config zero_optimization.stage"),
    ("model", "parameter "),
])
def test_ranks_started_with_different_configs_or_models_stop_naming_the_difference(change, named):
    for message in run_distributed(_started_apart, 2, args=(change,), timeout=TIMEOUT):
        assert message is not None, "the mismatch was not caught"
        assert named in message and "rank 0" in message and "rank 1" in message


def _invalid_on_one_rank(rank, world):
    import time

    import zero
    from zero.config import ConfigError

    config = training.engine_config(2, gas=1, scheduler=False)
    if rank == 1:
        config["zero_optimization"]["reduce_bucket_sise"] = 1000  # misspelled on this rank
    start = time.monotonic()
    try:
        zero.initialize(model=training.make_model(), config=config)
    except ConfigError as error:
        return str(error), time.monotonic() - start
    return None, time.monotonic() - start


def test_a_config_invalid_on_one_rank_is_named_on_every_rank():
    """The rank whose config failed validation raised alone; the others waited in the config
    agreement's collective and then died of a closed connection."""
    for message, seconds in run_distributed(_invalid_on_one_rank, 2, timeout=TIMEOUT):
        assert message is not None and "reduce_bucket_sise" in message and seconds < 10


BASE = {"train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


@pytest.mark.parametrize("change,named", [
    ({"optimizer": []}, "optimizer"),
    ({"zero_optimization": 0}, "zero_optimization"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": 10**15}},
     "zero_optimization.reduce_bucket_size"),
    ({"train_micro_batch_size_per_gpu": 10**12}, "train_micro_batch_size_per_gpu"),
    ({"gradient_clipping": 1e30}, "gradient_clipping"),
    ({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e15}},
     "zero_optimization.stage3_max_live_parameters = 1000000000000000: out of range"),
    ({"fp16": {"enabled": True, "loss_scale_window": 1e15}}, "fp16.loss_scale_window = 1000000000000000: out of range"),
    ({"aio": {"block_size": 4096 * 10**9}}, "aio.block_size = 4096000000000: out of range"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, "Hugging Face Trainer"),
])
def test_bad_config_values_are_named_not_a_traceback(change, named):
    from zero.config import ConfigError, load_config

    with pytest.raises(ConfigError) as error:
        load_config({**BASE, **change}, world_size=2)
    assert named in str(error.value)


FINISHED_JOB = """
import sys
import torch
import zero
from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
stage, optimizer, ending = int(args[0]), args[1], args[2]
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": optimizer, "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": stage, "reduce_bucket_size": 2000}}
if stage == 3:
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 100
model_config = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=32)
torch.manual_seed(0)
engine, *_ = zero.initialize(model=TinyGPT(model_config), config=config)
for tokens, targets in synthetic_batches(model_config, 2, 6, seed=engine.global_rank):
    engine.backward(engine(tokens, targets))
    engine.step()
print("done", engine.global_steps, flush=True)
if ending == "group_first":  # the script tears down torch.distributed while the engine lives
    torch.distributed.destroy_process_group()
    engine.destroy()
    sys.exit(0)
if ending == "destroy":
    engine.destroy()
# The script's own last collective, as real scripts average a metric: its gloo worker drops the
# finished work just as the script ends (the exit race of pytorch/pytorch#190489).
losses = [torch.zeros(1) for _ in range(2)]
torch.distributed.all_gather(losses, torch.ones(1))
"""


def test_a_finished_job_exits_0_every_time(tmp_path):
    """4 short 2-rank jobs in a row (stages 2 and 3, Adam and SGD with accumulation, with
    and without engine.destroy() before exit, ending with the script's own all_gather), each
    combination once: each exits 0, no SIGABRT, no hang. The odds against passing the exit
    race by luck rest on the 20 runs of the script ending in a collective, below; these runs
    cover the engine's own threads and buffers at exit."""
    combinations = [(2, "SGD"), (3, "AdamW")]
    for run in range(4):
        stage, optimizer = combinations[run % 2]
        ending = "exit" if run >= 2 else "destroy"
        proc = _launch_two_ranks(tmp_path, FINISHED_JOB, str(stage), optimizer, ending)
        assert proc.returncode == 0 and proc.stdout.count("done 3") == 2, \
            f"run {run} (stage {stage}, {optimizer}, {ending}): rc={proc.returncode}\n" \
            f"{proc.stdout}\n{proc.stderr}"


def test_destroying_the_process_group_before_the_engine_exits_0(tmp_path):
    """dist.destroy_process_group() while the engine lives leaves the engine holding the last
    reference to the group; engine.destroy() lets go of it without the GIL (gloo's workers may
    need the GIL to drop finished work, so a teardown under it could deadlock)."""
    for run in range(4):
        stage, optimizer = (2, "SGD") if run % 2 else (3, "AdamW")
        proc = _launch_two_ranks(tmp_path, FINISHED_JOB, str(stage), optimizer, "group_first")
        assert proc.returncode == 0 and proc.stdout.count("done 3") == 2, \
            f"run {run} (stage {stage}): rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


SCRIPT_ENDING_IN_A_COLLECTIVE = """
import torch
import torch.distributed as dist
import zero
zero.init_distributed(verbose=False)
gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, torch.tensor([float(dist.get_rank())]))
print("done", flush=True)
"""


def test_a_short_script_ending_in_a_collective_exits_0_every_time(tmp_path):
    """The exit race of pytorch/pytorch#190489 bites small scripts most: a gloo worker still
    dropping the last collective when finalization starts aborts the rank. Without
    zero.clean_exit 4 runs in 20 failed; the chance that 20 runs pass by luck is about 1%."""
    for run in range(20):
        proc = _launch_two_ranks(tmp_path, SCRIPT_ENDING_IN_A_COLLECTIVE)
        assert proc.returncode == 0 and proc.stdout.count("done") == 2, \
            f"run {run}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


PLAIN_TORCH_SCRIPT = """
import sys
import torch
import torch.distributed as dist
assert "zero" not in sys.modules
dist.init_process_group("gloo")
gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, torch.tensor([float(dist.get_rank())]))
if sys.argv[-1] == "destroy":
    dist.destroy_process_group()
print("done", flush=True)
"""


def test_a_plain_torch_script_under_the_launcher_exits_0_every_time(tmp_path):
    """A script that never imports zero (plain DDP, `--no_deepspeed_alias`) races the same way
    at exit, with or without destroy_process_group(): measured here without the launcher's
    rank start-up, 15 runs in 50 died of SIGABRT. The chance that 10 runs pass by luck at that
    rate is about 3%."""
    for run in range(10):
        ending = "destroy" if run % 2 else "keep"
        proc = _launch_two_ranks(tmp_path, PLAIN_TORCH_SCRIPT, ending,
                                 launcher=("--no_deepspeed_alias",))
        assert proc.returncode == 0 and proc.stdout.count("done") == 2, \
            f"run {run} ({ending}): rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _launch_two_ranks(tmp_path, text, *args, launcher=()):
    import subprocess

    from distributed_harness import launcher_argv, subprocess_env

    script = tmp_path / "job.py"
    script.write_text(text)
    return subprocess.run(launcher_argv(2, *launcher, script, *args), cwd=tmp_path,
                          env=subprocess_env(OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=TIMEOUT)


def _state_dict_on_one_rank_forward_on_the_other(rank, world):
    import zero

    config = training.engine_config(3, gas=1, scheduler=False,
                                     stage3_param_persistence_threshold=10)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    tokens, targets = training.batches(world, 1, 1)[rank]
    try:
        if rank == 0:
            engine.module_state_dict()
        else:
            engine(tokens, targets)
    except RuntimeError as error:
        return str(error)
    return None


def test_a_stage3_gather_on_one_rank_only_is_named_instead_of_hanging():
    for message in run_distributed(_state_dict_on_one_rank_forward_on_the_other, 2,
                                   timeout=TIMEOUT):
        assert message is not None and "ranks diverged" in message
        assert "outside forward and backward" in message


class _RaiseInBackward(torch.autograd.Function):
    """An identity whose backward raises: a backward cut short midway, after the reductions
    of the layers behind it were launched (an out-of-memory error, a bug in a custom op)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward failed on purpose")


def _whole_weights(engine) -> dict:
    import zero

    with zero.GatheredParameters(list(engine.module.parameters())):  # (stage 3: whole)
        return training.parameters_of(engine.module)


def _backward_that_raised(rank, world, stage, persistence, raising_ranks, where):
    """A backward raises on `raising_ranks` (midway: at the first block's output, after the
    later blocks' gradients came; or at the loss, before any came); the script catches it,
    steps and trains on. What each rank saw."""
    import zero

    config = training.engine_config(stage, gas=1, scheduler=False, bucket=500,
                                    **({} if persistence is None else
                                       {"stage3_param_persistence_threshold": persistence}))
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    data = training.batches(world, 3, 1)
    armed = [rank in raising_ranks]
    raising = lambda out: _RaiseInBackward.apply(out) if armed[0] else out  # noqa: E731
    if where == "midway":
        engine.module.blocks[0].register_forward_hook(lambda m, i, out: raising(out))
    before = _whole_weights(engine)
    tokens, targets = data[rank]
    message = None
    try:
        loss = engine(tokens, targets)
        engine.backward(raising(loss) if where == "at the loss" else loss)
    except RuntimeError as error:
        message = str(error)
    armed[0] = False
    engine.step()
    skipped = not engine.was_step_applied()
    untouched = all(torch.equal(v, before[k]) for k, v in _whole_weights(engine).items())
    losses = training.train_engine(engine, rank, world, 2, 1, first_step=1, data=data)
    return message, skipped, untouched, losses, _whole_weights(engine)


# (stage 3 with one rank raising: the unit checks name the ranks' divergence instead)
@pytest.mark.parametrize("stage,persistence,raising_ranks,where", [
    (stage, None, ranks, where) for stage in (0, 1, 2)
    for ranks, where in (((0, 1), "midway"), ((1,), "midway"), ((1,), "at the loss"))
] + [(3, 0, (0, 1), "midway")])
def test_a_backward_that_raised_is_finished_on_every_rank_and_training_goes_on(
        stage, persistence, raising_ranks, where):
    """A backward that raised leaves partial gradients (or a micro-batch missing from the
    average): its step is skipped on every rank, without a word about overflow, and training
    goes on. The engine refused every later step and backward; a backward raising on one
    rank only left the others waiting in its reductions (30 minutes at stages 0-2)."""
    results = run_distributed(_backward_that_raised, 2, timeout=TIMEOUT,
                              args=(stage, persistence, raising_ranks, where))
    for rank, (message, skipped, untouched, losses, _) in enumerate(results):
        assert (message is not None) == (rank in raising_ranks), message
        assert skipped and untouched  # partial gradients, or a micro-batch missing
        assert all(math.isfinite(loss) for loss in losses)
    assert results[0][3] == results[1][3]  # the same global losses and the same weights
    assert all(torch.equal(v, results[1][4][k]) for k, v in results[0][4].items())


def _diverging(rank, world, stage, divergence, save_dir):
    """Rank 1 leaves the others' program once: skips a step, runs an extra backward, or
    saves a checkpoint alone; then both go on training. The error each rank raised, and the
    seconds it took."""
    import time

    import zero

    config = training.engine_config(stage, gas=1, scheduler=False,
                                    stage3_param_persistence_threshold=0)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    data = training.batches(world, 3, 1)
    start = time.monotonic()
    try:
        for step in range(3):
            tokens, targets = data[step * world + rank]
            loss = engine(tokens, targets)
            engine.backward(loss)
            if rank == 1 and step == 1:
                if divergence == "skipped step":
                    continue
                if divergence == "extra backward":
                    engine.backward(engine(tokens, targets))
                if divergence == "save alone":
                    engine.save_checkpoint(save_dir)
            engine.step()
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return None, time.monotonic() - start


@pytest.mark.parametrize("stage,divergence,named", [
    (0, "skipped step", "rank 0 is at engine.step() after 2 reducing backwards and 1 optimizer step; "
                        "rank 1 is at the gradient reduction of a backward after 2"),
    (1, "skipped step", "rank 0 is at engine.step()"),
    (2, "skipped step", "rank 0 is at engine.step()"),
    (2, "extra backward", "rank 1 is at the gradient reduction of a backward after 2 reducing "
                          "backwards and 1 optimizer step"),
    (1, "save alone", "rank 1 is at save_checkpoint"),
    (3, "skipped step", "rank 0 is at engine.step()"),
])
def test_a_rank_that_leaves_the_others_program_is_named_on_every_rank(tmp_path, stage,
                                                                      divergence, named):
    """Stages 0-2 had no check: the ranks waited in mismatched collectives until the process
    group's timeout (30 min), or at stage 0 a skipped step paired with the next backward's
    all-reduce and the ranks trained on apart, exit 0. DeepSpeed aborts some of these in gloo
    (a size mismatch) and hangs on the others."""
    for message, seconds in run_distributed(_diverging, 2, timeout=TIMEOUT,
                                            args=(stage, divergence, str(tmp_path))):
        assert message is not None and message.startswith("zero: ranks diverged"), message
        assert named in message and seconds < 10, message


EXIT_TABLE = """
import sys
import training
import zero
config = training.engine_config(1, gas=1, scheduler=False)
config["steps_per_print"] = 100
engine, *_ = zero.initialize(model=training.make_model(), config=config)
training.train_engine(engine, 0, 1, 1, 1)
if sys.argv[1] == "raise":
    raise RuntimeError("the script failed")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ending", ["finish", "raise"])
def test_the_exit_table_is_left_out_after_an_uncaught_error(tmp_path, ending):
    """With steps_per_print the engine prints its memory table when the interpreter exits;
    after an uncaught error its 13 lines pushed the error out of the last lines of the rank's
    log that the launcher shows."""
    import os
    import subprocess

    from distributed_harness import REPO, subprocess_env

    script = tmp_path / "job.py"
    script.write_text(EXIT_TABLE)
    env = subprocess_env(OMP_NUM_THREADS="1")
    env["PYTHONPATH"] += os.pathsep + os.path.join(REPO, "tests")
    proc = subprocess.run([sys.executable, str(script), ending], env=env, capture_output=True,
                          text=True, timeout=100)
    shown = "model states" in proc.stdout
    if ending == "finish":
        assert proc.returncode == 0 and shown, proc.stdout[-2000:] + proc.stderr[-2000:]
    else:
        assert proc.returncode == 1 and not shown and "the script failed" in proc.stderr


def _interrupted_step(rank, world):
    import os
    import signal

    import zero

    # Python's Ctrl-C handler, as in a terminal (a job started in the background, as CI may
    # start this one, inherits SIGINT ignored, and Python then installs none)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    config = training.engine_config(1, gas=1, scheduler=False)
    model = training.make_model()
    engine, optimizer, _, _ = zero.initialize(model=model, config=config)

    def interrupting(step):  # Ctrl-C as the scheduler steps, after the update
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return 1.0

    engine.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, interrupting)
    tokens, targets = training.batches(world, 1, 1)[rank]
    engine.backward(engine(tokens, targets))
    try:
        engine.step()
    except KeyboardInterrupt:
        return engine.applied_steps, engine.global_steps, engine.lr_scheduler.last_epoch
    return None


def test_ctrl_c_inside_the_step_arrives_after_its_counters():
    """Ctrl-C between the update and the counters after it left a checkpoint saved on the
    interrupt one step ahead in its weights and moments, behind in global_steps."""
    assert run_distributed(_interrupted_step, 1, timeout=TIMEOUT) == [(1, 1, 1)]
