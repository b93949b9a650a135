"""What an engine reports while it trains: the one object engine.py calls around forward,
backward and step, feeding the monitors (tensorboard, csv_monitor, wandb, comet), the
wall_clock_breakdown timers, the comms logger, the FLOPs profiler and the memory report's
measured activations.

With all of those off, every call here is a check of one flag.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist

import offload
from offload.progress import FirstStepProgress

from ..saved_activations import SavedActivations
from . import events, timers
from .comms_logger import CommsLogger
from .master import MonitorMaster
from .memory_usage import see_memory_usage

_IDLE = contextlib.nullcontext()
_PHASE_NAMES = {timers.FORWARD: "forward", timers.BACKWARD: "backward", timers.STEP: "step"}


class Watch:
    def __init__(self, engine):
        config = engine.config
        self._engine = weakref.ref(engine)  # the engine owns this object
        self._core = engine.core
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        self._config = config
        self.monitor = MonitorMaster(config, self._rank)
        self.comms = CommsLogger(config.comms_logger, self._rank, self._world)
        self._core.set_comm_logging(self.comms.enabled)
        self.flops = _flops_profiler(engine) if config.flops_profiler.enabled and self._rank == 0 \
            else None
        timed = config.wall_clock_breakdown or self.monitor.enabled or config.flops_profiler.enabled
        self.timers = timers.EngineTimers(engine.device) if timed else None
        # The memory report's activations: what autograd keeps from each forward, measured
        # when a report or a monitor will show it.
        reports = bool(config.memory_report.path or config.memory_report.every_n_steps
                       or config.steps_per_print or self.monitor.enabled)
        self._activations = SavedActivations(engine.module) if reports else None
        self._counting = None
        zero_cfg = config.zero_optimization
        self._first_step = FirstStepProgress(enabled="nvme" in (
            zero_cfg.offload_optimizer.device, zero_cfg.offload_param.device))
        self._memory_breakdown = config.memory_breakdown
        # wall_clock_breakdown: the last optimizer step's milliseconds per phase (fwd, bwd,
        # bwd_inner, bwd_allreduce, step), as DeepSpeed's get_wall_clock_timers() gives them
        self.wall_clock_ms: dict[str, float] = {}
        self.active = timed or self.comms.enabled or reports or self._first_step.enabled \
            or self._memory_breakdown
        self._labels: list[str] = []
        self._loss = None
        self._profiled = False
        self.flops_profile = None  # {module name: zero.profiling.ModuleProfile} once profiled
        self._comm_before = self._core.comm_stats() if self.monitor.enabled else None
        self._window = _Window(self._offload_timings()) if config.wall_clock_breakdown else None

    # ---- around the engine's phases ------------------------------------------------------------
    def phase(self, name: str):
        """A context timing one phase (timers.FORWARD, ...) of the engine."""
        return _Phase(self, name) if self.active else _IDLE

    def add_loss(self, loss: torch.Tensor) -> None:
        """The micro-batch loss, for Train/Samples/train_loss: its mean over the window."""
        if self.monitor.enabled:
            value = loss.detach().float().mean() / self._engine().gradient_accumulation_steps()
            self._loss = value if self._loss is None else self._loss + value

    def _enter(self, name: str) -> None:
        if name in (timers.FORWARD, timers.BACKWARD, timers.STEP):
            self._first_step.entering(_PHASE_NAMES[name])
            if self._memory_breakdown:
                see_memory_usage(f"Engine before {_PHASE_NAMES[name]}", force=True)
        if self.timers is not None:
            self.timers.start(name)
        if self.comms.debug:
            self._labels.append(name)
            self._core.set_comm_label(name)
        if name == timers.FORWARD and self._profile_now():
            self.flops.start_profile()
            self._profiled = True
        if name == timers.FORWARD and self._activations is not None:
            self._counting = self._activations.counting()
            self._counting.__enter__()

    def _exit(self, name: str) -> None:
        if name in (timers.FORWARD, timers.BACKWARD, timers.STEP):
            self._first_step.left(_PHASE_NAMES[name], self._engine().global_steps > 0)
            if self._memory_breakdown:
                see_memory_usage(f"Engine after {_PHASE_NAMES[name]}", force=True)
        if self.timers is not None:
            self.timers.stop(name)
        if self.comms.debug:
            self._labels.pop()
            self._core.set_comm_label(self._labels[-1] if self._labels else "")
        if name == timers.FORWARD and self.flops is not None and self._profiled:
            self.flops.stop_profile()
        if name == timers.FORWARD and self._counting is not None:
            counting, self._counting = self._counting, None
            counting.__exit__(None, None, None)

    @property
    def activation_bytes(self) -> int | None:
        """What the last forward kept for backward (None: not measured, no report is on)."""
        return self._activations.bytes if self._activations is not None else None

    def _profile_now(self) -> bool:
        return (self.flops is not None and not self._profiled
                and self._engine().global_steps == self._config.flops_profiler.profile_step)

    # ---- after an optimizer step ---------------------------------------------------------------
    def after_step(self) -> None:
        """At the end of an optimizer step (every rank): monitors, breakdown, profile, comms."""
        if not self.active:
            return
        engine = self._engine()
        milliseconds = self.timers.collect() if self.timers is not None else {}
        if self._config.wall_clock_breakdown:
            self.wall_clock_ms = dict(milliseconds)
        if self.comms.enabled:
            self.comms.ingest(self._core.drain_comm_records())
        if self.flops is not None and self._profiled:
            self._print_profile(engine, milliseconds)
        if self.monitor.enabled:
            self._write_monitor(engine, milliseconds)
        if self._window is not None:
            self._window.add(milliseconds)
            every = self._config.steps_per_print or 1
            if engine.global_steps % every == 0:
                line = self._window.line(self._offload_timings())
                if self._rank == 0:
                    print(line, flush=True)

    def _write_monitor(self, engine, milliseconds: dict) -> None:
        samples = engine.global_samples
        memory = self._gathered_memory(engine)  # collective: every rank, same steps
        if self._rank != 0:
            self._loss = None
            return
        loss = float(self._loss) if self._loss is not None else None
        self._loss = None
        comm_after = self._core.comm_stats()
        batch = events.training_events(samples, engine.get_lr()[0], loss,
                                       engine.optimizer.cur_scale if engine.loss_scaler is not None
                                       else None)
        batch += events.timer_events(samples, milliseconds)
        batch += events.comm_events(samples, self._comm_before, comm_after)
        if memory is not None:
            batch += events.memory_events(samples, memory)
        self._comm_before = comm_after
        self.monitor.write_events(batch)

    def _gathered_memory(self, engine) -> list[list[float]] | None:
        every = self._config.memory_report.every_n_steps or 1
        if engine.global_steps % every:
            return None
        mine = torch.tensor(events.memory_scalars(self._core.registry(), self.activation_bytes),
                            dtype=torch.float64, device=engine.device)
        everyone = [torch.empty_like(mine) for _ in range(self._world)]
        dist.all_gather(everyone, mine)
        return [values.tolist() for values in everyone]

    def _print_profile(self, engine, milliseconds: dict) -> None:
        cfg = self._config.flops_profiler
        micro_batches = engine.gradient_accumulation_steps()  # the forward profiled is one of them
        self.flops.print_model_profile(  # (DeepSpeed's header: the steps taken, this one's too)
            profile_step=engine.global_steps, module_depth=cfg.module_depth,
            top_modules=cfg.top_modules, detailed=cfg.detailed, output_file=cfg.output_file,
            fwd_latency=self.flops.get_total_duration(),
            bwd_latency=milliseconds.get(timers.BACKWARD, 0.0) / 1000 / micro_batches,
            step_latency=milliseconds.get(timers.STEP, 0.0) / 1000,
            world_size=self._world, batch_size=engine.train_micro_batch_size_per_gpu())
        self.flops_profile = self.flops.get_module_profile()
        self.flops.end_profile()
        self.flops = None  # profiled once, as DeepSpeed

    def _offload_timings(self) -> dict[str, float]:
        if self._config.zero_optimization.offload_optimizer.device == "none":
            return {}
        seconds = offload.step_timings(self._core)
        parts = {name: 1000 * seconds[field] for name, field in _OFFLOAD_PARTS.items()}
        parts["bwd_offload_wait"] = 1000 * offload.backward_copy_timings(self._core)["wait_s"]
        return parts

    def drained_comms(self):
        """The comms logger, holding every record made so far."""
        self.comms.ingest(self._core.drain_comm_records())
        return self.comms

    def log_comms(self, print_log: bool = True, show_straggler: bool = False,
                  return_dict: bool = False):
        """DeepSpeed's log_summary: the comms logger's table (rank 0 prints) with every record
        made so far; with show_straggler every rank must call it."""
        return self.drained_comms().log_all(print_log, show_straggler, return_dict)

    def configure_comms(self, **flags) -> None:
        """deepspeed.comm.configure: enabled, prof_all, prof_ops, verbose, debug (None: keep)."""
        for name, value in flags.items():
            if value is not None:
                setattr(self.comms, name, list(value) if name == "prof_ops" else value)
        self._core.set_comm_logging(self.comms.enabled)
        self.active = self.active or self.comms.enabled

    def close(self) -> None:
        """At engine.destroy(): the comms summary (rank 0 prints it) unless the script's
        log_summary() already showed every record, writers closed."""
        if self.comms.enabled and self.drained_comms().operation_count() != self.comms.shown_count:
            self.log_comms()
        self.monitor.close()
        if self.flops is not None:
            self.flops.end_profile()
            self.flops = None


# Where an offloaded step's time went (OffloadTimings), as breakdown entries: waiting for
# gradients to reach the host (D2H copies, NVMe reads), the CPU optimizer, waiting for new
# parameters to reach the device (H2D copies, NVMe writes); and bwd_offload_wait, backward's
# wait for its copies into a host gradient shard (HostCopyTimings).
_OFFLOAD_PARTS = {"step_offload_in": "grads_in_wait_s", "step_cpu_adam": "cpu_optimizer_s",
                  "step_offload_out": "params_out_wait_s"}


class _Phase:
    __slots__ = ("_watch", "_name")

    def __init__(self, watch: Watch, name: str):
        self._watch, self._name = watch, name

    def __enter__(self):
        self._watch._enter(self._name)

    def __exit__(self, *exc):
        self._watch._exit(self._name)
        return False


class _Window:
    """The breakdown since the last print: per-step means of every timer, and of the offloaded
    step's parts (OffloadTimings are running totals: the difference since the last print)."""

    def __init__(self, offload_totals: dict[str, float]):
        self._sums: dict[str, float] = {}
        self._steps = 0
        self._offload = offload_totals

    def add(self, milliseconds: dict[str, float]) -> None:
        for name, value in milliseconds.items():
            self._sums[name] = self._sums.get(name, 0.0) + value
        self._steps += 1

    def line(self, offload_totals: dict[str, float]) -> str:
        steps = max(self._steps, 1)
        means = {name: value / steps for name, value in self._sums.items()}
        means.update((name, (offload_totals[name] - self._offload[name]) / steps)
                     for name in offload_totals)
        self._sums, self._steps, self._offload = {}, 0, offload_totals
        return timers.format_breakdown(means)


def _flops_profiler(engine):
    from ..profiling import FlopsProfiler
    shapes = engine.full_shapes
    counts: dict[str, int] = {}
    for name, _ in engine.module.named_parameters():
        numel = shapes[name].numel()
        parts = name.split(".")[:-1]
        for depth in range(len(parts) + 1):
            module = ".".join(parts[:depth])
            counts[module] = counts.get(module, 0) + numel
    return FlopsProfiler(engine.module, engine,
                         engine.config.flops_profiler.recompute_fwd_factor, param_counts=counts)
