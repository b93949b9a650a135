"""What DeepSpeed scripts reach for beside initialize (DeepSpeed-Chat's step 1 uses each): the
names at the package's top, deepspeed.compression.helper, get_accelerator()'s calls answered as
DeepSpeed's CPU accelerator answers them, the engine passing what it lacks to its model, and
the engine's throughput timer. tests/test_deepspeed_scripts.py runs them together in a script."""
import contextlib
import io
import mmap

import pytest
import torch

import zero.compat.deepspeed as deepspeed
from distributed_harness import run_distributed
from zero.compat.deepspeed.utils.module_utils import recursive_getattr, recursive_setattr

pytestmark = pytest.mark.timeout(120)


def test_the_package_top_has_deepspeeds_common_names():
    from zero.compat.deepspeed.accelerator import get_accelerator
    from zero.pipe import PipelineModule

    assert deepspeed.get_accelerator is get_accelerator
    assert deepspeed.PipelineModule is PipelineModule
    assert deepspeed.log_dist is deepspeed.utils.log_dist
    assert deepspeed.logger is deepspeed.utils.logger
    assert deepspeed.utils.recursive_getattr is recursive_getattr


def test_on_device_builds_on_the_device_in_the_dtype_then_restores_both():
    assert deepspeed.OnDevice is deepspeed.utils.OnDevice
    with deepspeed.OnDevice(dtype=torch.bfloat16, device="meta"):
        layer = torch.nn.Linear(4, 3)
        zeros, counts = torch.zeros(2), torch.arange(3)
        on_cpu = torch.ones(2, device="cpu")  # a device named by the call stays
    assert (layer.weight.device.type, layer.weight.dtype) == ("meta", torch.bfloat16)
    assert (zeros.device.type, zeros.dtype) == ("meta", torch.bfloat16)
    assert (counts.device.type, counts.dtype) == ("meta", torch.int64)
    assert (on_cpu.device.type, on_cpu.dtype) == ("cpu", torch.bfloat16)
    after = torch.zeros(1)
    assert (after.device.type, after.dtype) == ("cpu", torch.float32)
    with deepspeed.OnDevice(dtype=torch.float16, enabled=False):
        assert torch.zeros(1).device.type == "cpu"
    with deepspeed.OnDevice(dtype=None):
        kept = torch.zeros(1)
    assert (kept.device.type, kept.dtype) == ("meta", torch.float32)
    with pytest.raises(ValueError, match="pass a floating dtype"):
        with deepspeed.OnDevice(dtype=torch.int8):
            pass


def test_the_helpers_old_home_still_answers_with_deepspeeds_warning():
    import importlib
    import sys

    sys.modules.pop("zero.compat.deepspeed.compression.helper", None)
    with pytest.warns(FutureWarning, match="deepspeed.compression.helper is deprecated"):
        helper = importlib.import_module("zero.compat.deepspeed.compression.helper")
    assert (helper.recursive_getattr, helper.recursive_setattr) == \
        (recursive_getattr, recursive_setattr)


def test_recursive_getattr_and_setattr_follow_a_dotted_path():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sequential(torch.nn.Linear(3, 4)))
    assert recursive_getattr(model, "1.0") is model[1][0]
    assert recursive_getattr(model, "1.0.weight") is model[1][0].weight
    replacement = torch.nn.Identity()
    recursive_setattr(model, "1.0", replacement)
    assert model[1][0] is replacement
    recursive_setattr(model, "0", replacement)
    assert model[0] is replacement
    with pytest.raises(AttributeError):
        recursive_getattr(model, "1.missing")


def test_the_accelerator_answers_as_deepspeeds_cpu_accelerator():
    accelerator = deepspeed.get_accelerator()
    assert accelerator is deepspeed.get_accelerator()  # one object, as DeepSpeed's
    assert (accelerator._name, accelerator.device_name(), accelerator.device_name(1)) == \
        ("cpu", "cpu", "cpu")
    accelerator.set_device(1)  # nothing to set on the CPU
    assert accelerator.current_device_name() == "cpu" and accelerator.device_count() == 1
    assert accelerator.Stream is None and accelerator.Event is None
    assert accelerator.current_stream() is None
    with accelerator.stream(accelerator.current_stream()):
        pass
    assert accelerator.on_accelerator(torch.zeros(1))
    assert torch.bfloat16 in accelerator.supported_dtypes()
    state = accelerator.get_rng_state()
    first = torch.rand(3)
    accelerator.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    accelerator.reset_peak_memory_stats()
    resident = accelerator.memory_allocated()
    assert 0 < resident <= accelerator.max_memory_allocated()
    # 64 MiB of new pages, touched: an anonymous mapping of its own, which malloc's free lists
    # (resident memory freed by earlier tests in this process) cannot serve.
    held = mmap.mmap(-1, 64 << 20)
    held.write(b"\x01" * (64 << 20))
    assert accelerator.memory_allocated() >= resident + (60 << 20)  # (a call sees the peak)
    held.close()
    assert accelerator.max_memory_allocated() >= resident + (60 << 20)
    accelerator.reset_peak_memory_stats()  # the peak is the resident set again
    assert accelerator.max_memory_allocated() < resident + (60 << 20)
    assert accelerator.total_memory() > accelerator.available_memory() > 0
    assert accelerator.memory_stats()["allocated_bytes.all.peak"] > 0


class _WithExtras(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(4, 4)  # an HF causal LM's inner model has this name
        self.note = "the model's"
        self.checkpointing = False

    def forward(self, x):
        return self.model(x).sum()

    def gradient_checkpointing_enable(self):
        self.checkpointing = True


def _pass_through(rank, world, timers=None):
    import zero

    model = _WithExtras()
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 2}, **({"timers": timers} if timers else {})}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    engine.gradient_checkpointing_enable()
    seen = (engine.model is model.model, engine.note, model.checkpointing,
            engine.config is not model)  # the engine's own names come first
    with pytest.raises(AttributeError, match="'ZeroEngine' object has no attribute 'missing', "
                                             r"nor has its model \(_WithExtras\)"):
        engine.missing
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for _ in range(4):
            engine.backward(engine(torch.ones(2, 4)))
            engine.step()
    engine.tput_timer.update_epoch_count()
    timer = engine.tput_timer
    return seen, (timer.global_step_count, timer.epoch_count, timer.avg_samples_per_sec() > 0), \
        printed.getvalue()


def test_the_engine_passes_what_it_lacks_to_its_model_and_times_its_steps():
    """DeepSpeed's engine.__getattr__: engine.model, engine.gradient_checkpointing_enable() are
    the model's. tput_timer times steps from the third on and prints on rank 0 every
    steps_per_print steps."""
    (seen, timer, printed), (_, _, printed_by_rank_1) = run_distributed(_pass_through, 2)
    assert seen == (True, "the model's", True, True)
    assert timer == (4, 1, True)
    throughput = [line for line in printed.splitlines() if "RunningAvgSamplesPerSec=" in line]
    assert len(throughput) == 1  # step 4 (step 2 comes before the timing starts)
    assert throughput[0].startswith("epoch=0/micro_step=4/global_step=4, RunningAvgSamplesPerSec=")
    assert "RunningAvgSamplesPerSec=" not in printed_by_rank_1


def test_the_timers_block_turns_the_throughput_timer_off():
    """DeepSpeed's "timers": {"throughput": {"enabled": false}}: nothing timed or printed."""
    off = {"throughput": {"enabled": False, "synchronized": False}}
    (_, timer, printed), _ = run_distributed(_pass_through, 2, args=(off,))
    assert timer == (0, 1, False) and "RunningAvgSamplesPerSec=" not in printed


def _parsed_on(rank, world, config):
    """A script's own DeepSpeedConfig in a process group, and its MonitorMaster."""
    from zero.compat.deepspeed.monitor.monitor import MonitorMaster
    from zero.compat.deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig(config)
    monitor = MonitorMaster(parsed.monitor_config)
    writers = len(monitor.writers)
    monitor.write_events([("Train/loss", 1.5, 3)])
    monitor.close()
    return (parsed.global_rank, parsed.world_size, parsed.train_batch_size,
            parsed.gradient_accumulation_steps, monitor.enabled, writers)


def test_a_scripts_deepspeed_config_resolves_at_the_world_size_and_feeds_its_monitor(tmp_path):
    """`DeepSpeedConfig(path)` after init_distributed, as scripts build their own MonitorMaster
    from it: the batch trio at the process group's size, and only rank 0 writes."""
    import json

    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
              "csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "run"}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    ranks = run_distributed(_parsed_on, 2, args=(str(path),))
    assert ranks == [(0, 2, 16, 2, True, 1), (1, 2, 16, 2, True, 0)]
    assert (tmp_path / "run" / "Train_loss.csv").read_text().splitlines() == ["step,loss", "3,1.5"]


def test_a_bad_config_in_deepspeed_config_names_the_key():
    from zero.config import ConfigError

    assert deepspeed.DeepSpeedConfig is deepspeed.runtime.config.DeepSpeedConfig
    with pytest.raises(ConfigError, match="zero_optimization.stage"):
        deepspeed.DeepSpeedConfig({"train_batch_size": 8, "zero_optimization": {"stage": 4}})
    parsed = deepspeed.DeepSpeedConfig({"train_micro_batch_size_per_gpu": 2})  # no process group
    assert (parsed.global_rank, parsed.world_size, parsed.train_batch_size) == (0, 1, 2)
    assert parsed.optimizer_name is None and parsed.zero_enabled is False


def test_deepspeed_config_reads_its_other_blocks_as_deepspeed_and_copies():
    import copy
    import pickle

    parsed = deepspeed.DeepSpeedConfig({
        "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        "torch_autocast": {"enabled": True, "dtype": "bfloat16"},
        "pipeline": {"schedule": "gpipe"},
        "zero_optimization": {"stage": 3, "offload_param": None,
                              "stage3_max_live_parameters": 1000}})
    assert parsed.torch_autocast_dtype is torch.bfloat16  # DeepSpeed's DtypeEnum value
    assert parsed.torch_autocast_lower_precision_safe_modules is None  # not written
    assert parsed.pipeline == {"stages": "auto", "partition": "best", "seed_layers": False,
                               "activation_checkpoint_interval": 0, "pipe_partitioned": True,
                               "grad_partitioned": True, "schedule": "gpipe"}
    assert parsed.zero_config.offload_param is None  # written as null: DeepSpeed's None
    for clone in (copy.deepcopy(parsed), pickle.loads(pickle.dumps(parsed))):
        assert clone.zero_config.max_live_parameters == 1000
        assert clone.zero_optimization_stage == 3


def test_the_runtime_helpers_scripts_call_by_their_full_path():
    """DeepSpeedExamples' pipeline example seeds with deepspeed.runtime.utils.set_random_seed;
    bing_bert compares engine.optimizer_name() with deepspeed.runtime.config.LAMB_OPTIMIZER."""
    import random

    import numpy

    deepspeed.runtime.utils.set_random_seed(2**64 + 7)  # (taken modulo, as DeepSpeed's)
    drawn = (random.random(), numpy.random.rand(), torch.rand(1).item())
    deepspeed.runtime.utils.set_random_seed(2**64 + 7)
    assert (random.random(), numpy.random.rand(), torch.rand(1).item()) == drawn
    assert torch.initial_seed() == 7
    config = deepspeed.runtime.config
    assert (config.ADAM_OPTIMIZER, config.ADAMW_OPTIMIZER, config.LAMB_OPTIMIZER) == \
        ("adam", "adamw", "lamb")
    assert config.DEEPSPEED_OPTIMIZERS == ["adagrad", "adam", "adamw", "lamb", "muadam",
                                           "muadamw", "musgd", "lion", "muon"]
