"""ZeroEngine: the object `zero.initialize` returns, shaped like DeepSpeed's engine.

Python keeps this thin: it converts the model to the training dtype, groups parameters,
registers one post-accumulate-grad hook per parameter that tells the C++ EngineCore a
gradient is ready, and keeps the counters, scheduler and loss scaler. Bucketing,
reduction, the sharded update and the all-gather run in C++.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import warnings
import weakref
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

import offload
from offload import disk_space
from offload.progress import SwapWriteProgress

from . import _C, agreement, hybrid_engine, model_dtype, param_groups, process_groups, sharding
from . import deferred_interrupt, stage3
from . import offload_states as states_offload
from .moe import auto_ep
from .moe.engine_layout import ExpertLayout
from .parallel import data_group, sequence
from .autocast import ForwardAutocast
from .checkpoint import load_checkpoint, save_checkpoint
from .config import ZeroConfig
from .engine_batch import EngineBatch
from .engine_getters import EngineGetters
from .engine_model_save import EngineModelSave
from .engine_reports import EngineReports
from .loss_scaler import from_config as loss_scaler_from_config
from .memory import state_layouts
from .model_dtype import PRECISION_DTYPES  # (zero.engine's name for it too)
from .monitor import Watch
from .monitor.throughput import ThroughputTimer
from .monitor.timers import BACKWARD, BACKWARD_INNER, BACKWARD_REDUCE, FORWARD, STEP
from .optimizer import ZeroOptimizer, fill_initial_state, trust_ratios
from .parameter_offload import ParameterOffload
from .torch_backward import TorchStyleBackward

logger = logging.getLogger("zero")

ALIGNMENT_BYTES = 16  # every parameter starts 16-byte aligned in its flat buffer


class ZeroEngine(EngineGetters, EngineBatch, EngineReports, EngineModelSave, nn.Module):
    # Read with getattr(engine, name, default) by zero itself: defaults here, so that the
    # model's attribute of the same name (engine.__getattr__ passes to it) is never taken.
    grid = None  # the pipeline engine's grid
    sequence_parallel = None  # parallel/sequence.py's layout, with sequence parallelism
    moe = None  # moe/engine_layout.py's ExpertLayout, for a model with MoE layers
    _is_compiled = False

    def __init__(self, model: nn.Module, config: ZeroConfig, optimizer=None,
                 model_parameters: Iterable | None = None, lr_scheduler=None,
                 data_parallel_group=None, tensor_parallel_group=None, norm_span=None,
                 sequence_parallel=None):
        """`data_parallel_group`: the ranks that hold this same model and shard its states
        (default the world; a pipeline stage's ranks under zero.pipe; the ranks of one tensor
        slice under zero.tp). On a sub-group, stage 3 and whole-model 16-bit saves are refused
        (not built yet); checkpoints save each part (zero.checkpoint_mesh). `tensor_parallel_group` (zero.tp): the ranks holding the other slices of the
        same layers; the parameters not split start equal over it. `norm_span`
        (parallel/norm_span.py): with pipeline or tensor parallelism, the group and weights
        that make the gradient norm (clipping, non-finite skips) the whole model's.
        `sequence_parallel` (parallel/sequence.py): the sequence groups; ZeRO still shards
        and averages over every rank, and the batch counts the replicas."""
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("zero: torch.distributed is not initialised; call "
                               "zero.init_distributed() (zero.initialize does) first")
        stage3.refuse_released_parameters(model)
        self.config = config
        self.module = model
        self.stage = config.zero_optimization.stage
        self.dtype = PRECISION_DTYPES[config.precision]
        self.device = _training_device()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # collectives and allocations on this rank's GPU
        self.data_parallel_group = data_parallel_group or dist.group.WORLD
        self.tensor_parallel_group = tensor_parallel_group
        self.sequence_parallel = sequence_parallel
        if sequence_parallel is not None:
            config = sequence.reduction_config(config)
            self.config = config
        norm_span = self._place_model(model, config, norm_span)
        spec, groups, trainables = param_groups.parameter_groups(
            model, config, optimizer, model_parameters, moe=self.moe is not None)
        if self.moe is not None:
            self.moe.check_optimizer(spec.kind)
        # before a byte is written
        disk_space.check_swap_space(config, model, trainables, self.data_parallel_group)
        self._shard(model, config, spec, groups, trainables, norm_span)
        self._build_step(config, spec, groups, optimizer, lr_scheduler)
        self._warn_if_not_pinned()
        if self.config.memory_report.path and not self.config.memory_report.every_n_steps \
                and dist.get_rank() == 0:
            logger.warning("zero: memory_report.path is set but neither "
                           "memory_report.every_n_steps nor steps_per_print is: only the final "
                           "report (engine.destroy() or engine.final_memory_report()) is written")
        self._start_counting()
        self._watch = Watch(self)  # monitors, wall_clock_breakdown, comms_logger, flops_profiler
        hybrid_engine.take_over_generate(model, config.hybrid_engine, self._stage3)
        self.tput_timer = ThroughputTimer(self.train_batch_size(), config.steps_per_print,
                                          self.device, report=dist.get_rank() == 0,
                                          enabled=config.timers.throughput.enabled,
                                          synchronized=config.timers.throughput.synchronized)
        _LIVE_ENGINES.add(self)

    def _place_model(self, model: nn.Module, config: ZeroConfig, norm_span):
        """Agrees the config over the ranks, lays out MoE's experts, and puts the model on the
        device in the training dtype, equal over the ranks that hold it: the norm span, MoE's
        if it has one."""
        self._whole_world = data_group.is_world(self.data_parallel_group)
        if not self._whole_world:
            data_group.check_supported(self.stage, model)
        # before any collective that could hang on it
        agreement.agree(config.raw, model, group=self.data_parallel_group)
        auto_ep.apply(model, config.expert_parallel, config.use_data_before_expert_parallelism)
        self.moe = ExpertLayout.of(model, config, whole_world=self._whole_world,
                                   tensor_parallel_group=self.tensor_parallel_group,
                                   sequence_parallel=self.sequence_parallel)  # its groups made
        if self.moe is not None:
            norm_span = self.moe.norm_span(model, self.stage)
        self.full_shapes = sharding.full_shapes(model)  # checkpoint loads check against them
        buffer_dtype = model_dtype.buffer_dtype(config)
        if self.tensor_parallel_group is not None:  # before the data group's broadcast
            data_group.equalize_unsplit(model, self.device, self.dtype, buffer_dtype,
                                        self.tensor_parallel_group)
        sharding.prepare_model(model, self.device, self.dtype, buffer_dtype, self.stage,
                               self.data_parallel_group,
                               source=self.moe.source if self.moe is not None else None)
        return norm_span

    def _shard(self, model: nn.Module, config: ZeroConfig, spec, groups, trainables,
               norm_span) -> None:
        """The C++ engine core and its groups (each rank's shard of them), and the hooks that
        hand it each gradient."""
        self._core = _C.EngineCore(self.data_parallel_group.group_name)
        zero_cfg = config.zero_optimization
        self._swap_writes = SwapWriteProgress(enabled="nvme" in (
            zero_cfg.offload_optimizer.device, zero_cfg.offload_param.device))
        builder = sharding.GroupBuilder(
            self._core, config, spec, groups,
            alignment=max(1, ALIGNMENT_BYTES // _element_size(self.dtype)),
            on_swap_write=self._swap_writes.add, shared=sharding.shared_parameters(model),
            stage3_groups=process_groups.stage3_groups(zero_cfg) if self.stage == 3
            else process_groups.Stage3Groups())
        engine = weakref.ref(self)
        with self._swap_writes.shown("zero: writing NVMe swap files"):
            layout = sharding.shard_groups(
                builder, model, trainables, self.stage, self.device,
                step_counter=lambda: engine().global_steps,
                norm_weight=norm_span.weight if norm_span is not None else None,
                data_group=self.moe.data_group if self.moe is not None else None)
        self._engine_groups = layout.groups
        if norm_span is not None:
            self._core.span_norm([norm_span.weight(group.params[0]) for group in layout.groups],
                                 norm_span.group.group_name)
        self._stage3 = layout.stage3
        if self._stage3 is not None and self.moe is not None:
            self._stage3.modifier_source = self.moe.modifier_source
        self._hooks = [param.register_post_accumulate_grad_hook(self._grad_hook(g, i))
                       for g, group in enumerate(self._engine_groups)
                       for i, param in enumerate(group.params)]

    def _build_step(self, config: ZeroConfig, spec, groups, optimizer, lr_scheduler) -> None:
        """What backward and step use: autocast, the torch-style backward, the loss scaler,
        the optimizer the script sees (its state filled in the core), the scheduler."""
        self.forward_autocast = ForwardAutocast(config.torch_autocast, self.device.type)
        self._torch_backward = TorchStyleBackward(
            [param for group in self._engine_groups for param in group.params],
            self._open_backward, self._close_backward, self.gradient_accumulation_steps,
            self._needs_loss_scale)
        self.loss_scaler = (loss_scaler_from_config(
            loss_scale=config.fp16.loss_scale, initial_scale_power=config.fp16.initial_scale_power,
            loss_scale_window=config.fp16.loss_scale_window, hysteresis=config.fp16.hysteresis,
            consecutive_hysteresis=config.fp16.consecutive_hysteresis,
            min_loss_scale=config.fp16.min_loss_scale)
            if config.fp16.enabled or self.forward_autocast.loss_scaled else None)
        live = weakref.ref(self)  # (the optimizer may outlive the engine)
        self.optimizer = ZeroOptimizer(spec, groups, self.loss_scaler,
                                       owners=[group.owner for group in self._engine_groups],
                                       trust_ratios=lambda: trust_ratios(live()))
        fill_initial_state(self._core, self._engine_groups, groups)
        if self._stage3 is not None:  # DeepSpeed's stage-3 optimizer has one
            self.optimizer.parameter_offload = ParameterOffload(
                self._stage3, self.module,
                quantized_frozen=bool(config.zero_optimization.zero_quantized_nontrainable_weights))
        # No optimizer passed or configured: an engine for forward passes (DeepSpeed's
        # inference engine; the HF Trainer evaluates through one at stage 3).
        self.inference_only = optimizer is None and config.optimizer is None
        self.lr_scheduler = None if self.inference_only else \
            param_groups.scheduler(config, lr_scheduler, self.optimizer)
        self._layouts = state_layouts(self._core, self._engine_groups, spec, config,
                                      _element_size(self.dtype))

    def _start_counting(self) -> None:
        """The step counters and the state of the backward between calls, as before the first
        forward."""
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self.applied_steps = 0  # optimizer updates actually made (Adam's step count)
        self.last_step_result: _C.StepResult | None = None  # None before the first step
        self._grad_norm = None  # (last_step_result, its norm as a tensor): get_global_grad_norm
        self._step_applied = False  # the last step() updated the weights (was_step_applied)
        self._boundary_in_backward = False
        self._backward_open = False  # between _open_backward and _close_backward
        self._early_grads: list[tuple[int, int]] = []  # gradients the forward took
        self._boundary_backward_seen = False  # engine.backward ran for this boundary
        self._boundary_under_no_sync = False  # ... or a backward ran for it inside no_sync()
        self._no_sync = False
        self._boundary_override: bool | None = None  # set_gradient_accumulation_boundary
        self._final_report_step = None  # destroy() writes a final report unless one was

    # ---- DeepSpeed's engine surface -------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        if self.config.fp16.enabled and self.config.fp16.auto_cast:
            inputs = _floats_to_half(inputs)
        # (after destroy() below stage 3 the model runs as a plain module, as under DeepSpeed)
        if self._core is not None:  # stages 0-2: offloaded parameters back (stage 3 gathers)
            self._core.reload_states([_C.StateKind.lp_params])
        if self._stage3 is not None and not self._stage3.removed:
            if not self._stage3.module_hooks_attached():
                raise RuntimeError(
                    "zero: the stage-3 module hooks were taken off the model (as TRL's "
                    "remove_hooks does for generation) and not put back: put them back with "
                    "engine.optimizer.parameter_offload._register_deepspeed_module("
                    "engine.module) (TRL's add_hooks) before the engine's forward")
            self._stage3.make_hooks_eager()  # (the model compiled since: module.compile())
        self.tput_timer.start()
        with self._watch.phase(FORWARD), self.forward_autocast():
            try:
                outputs = self.module(*inputs, **kwargs)
            except RuntimeError as error:
                hint = model_dtype.mismatch_hint(self.module, self.dtype, error)
                if hint is None:
                    raise
                raise RuntimeError(hint) from error
        if self._core is not None:  # loss.backward() works too, as in DeepSpeed
            self._torch_backward.attach(outputs)
        return outputs

    def __getattr__(self, name: str):
        """What the engine lacks is the model's, as DeepSpeed's engine passes it through
        (`engine.config` of an HF model is the engine's own; `engine.gradient_checkpointing_enable()`,
        `engine.model` are the model's)."""
        try:
            return super().__getattr__(name)  # the engine's own parameters, buffers and modules
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is None or name.startswith("__"):
                raise
        if not hasattr(module, name):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}', nor has "
                                 f"its model ({type(module).__name__})")
        return getattr(module, name)

    @property
    def monitor(self):
        """DeepSpeed's MonitorMaster: write_events([(name, value, step)]) reaches every enabled
        monitor block (rank 0 writes)."""
        return self._watch.monitor

    @property
    def watch(self):
        """What the run reports (zero.monitor.Watch): `.monitor`, `.comms` (the comms_logger
        block's records; `.comms.log_all()` prints DeepSpeed's summary) and `.flops_profile`
        (the flops_profiler block's per-module profile, once made)."""
        return self._watch

    @property
    def core(self):
        """The C++ engine (zero._C.EngineCore): the groups' shards, optimizer state and
        registry. zero.checkpoint reads and writes through it; None once destroyed."""
        return self._core

    @property
    def stage3_hooks(self):
        """Stage 3's module hooks and unit plan (zero/stage3.py's Stage3Hooks: `.plan.modules`
        the gather units); None below stage 3."""
        return self._stage3

    @property
    def gradients_reduced(self) -> bool:
        """True once the backward of an accumulation boundary has returned, until the step:
        the ranks' averaged gradients are in the engine's shards, for
        deepspeed.utils.safe_get_full_grad (zeros after a zero_grad(), as the step would
        apply)."""
        return self._boundary_backward_seen

    @property
    def groups(self) -> list[sharding.EngineGroup]:
        """The C++ engine's groups in order: each one's optimizer group, parameters and stage
        (3: partitioned; 1 at stage 3: the parameters kept whole)."""
        return self._engine_groups

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def global_rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        """The data-parallel ranks the batch counts (the world unless a data_parallel_group
        was given; with sequence parallelism, its replicas)."""
        if self.sequence_parallel is not None:
            return self.sequence_parallel.data_size
        return dist.get_world_size(self.data_parallel_group)

    # DeepSpeed's names for the sequence-parallel layout (its engine attributes)
    @property
    def dp_world_size(self) -> int:
        return self.world_size

    @property
    def mp_world_size(self) -> int:
        """DeepSpeed's: the model-parallel (tensor-parallel) ranks, 1 without them."""
        group = self.tensor_parallel_group
        return 1 if group is None else dist.get_world_size(group)

    @property
    def sequence_parallel_size(self) -> int:
        return self.sequence_parallel.size if self.sequence_parallel is not None else 1

    @property
    def seq_data_parallel_group(self):
        return self.data_parallel_group

    @property
    def seq_dp_world_size(self) -> int:
        return dist.get_world_size(self.data_parallel_group)

    # DeepSpeed's MoE attributes
    @property
    def has_moe_layers(self) -> bool:
        return self.moe is not None

    @property
    def moe_layers(self) -> list:
        return list(self.moe.layers) if self.moe is not None else []

    @property
    def num_experts(self) -> list[int]:
        return [layer.num_experts for layer in self.moe_layers]

    def get_sequence_parallel_group(self):
        """This rank's sequence group; None without sequence parallelism."""
        return self.sequence_parallel.group if self.sequence_parallel is not None else None

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether this micro-batch ends the accumulation window: counted from the micro-steps,
        unless set_gradient_accumulation_boundary() says otherwise."""
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool | None) -> None:
        """DeepSpeed's override of the boundary (Accelerate and the HF Trainer set it before each
        backward and call step() only at the boundary); None goes back to counting."""
        self._boundary_override = None if is_boundary is None else bool(is_boundary)

    def get_lr(self) -> list[float]:
        # (an optimizer that sets its own step size, e.g. Adafactor's relative_step, has None)
        return [group["lr"] if group["lr"] is None else float(group["lr"])
                for group in self.optimizer.param_groups]

    @contextlib.contextmanager
    def no_sync(self):
        """Skip gradient communication for the backward passes inside (stages 0 and 1)."""
        if self.stage >= 2:
            raise RuntimeError(
                f"zero: no_sync() is not possible at ZeRO stage {self.stage}: gradients are "
                "partitioned, so each micro-batch's gradients must be reduce-scattered. Use "
                "gradient_accumulation_steps instead, or stage 0/1 if you need no_sync")
        previous, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = previous

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Scales the loss (1/gradient_accumulation_steps unless scale_wrt_gas is False, as
        DeepSpeed; and the fp16 loss scale), runs backward with gradient reduction overlapped,
        and waits for the reductions."""
        self._alive("backward")
        _check_loss(loss)
        scaled = loss.float() / self.gradient_accumulation_steps() if scale_wrt_gas else loss.float()
        if self.loss_scaler is not None:
            scaled = scaled * self.loss_scaler.loss_scale
        finishing = False
        try:
            boundary = self._open_backward()
            self._torch_backward.mark_engine_backward(scaled)
            with self._watch.phase(BACKWARD):
                with self._watch.phase(BACKWARD_INNER):
                    scaled.backward(retain_graph=retain_graph)
                finishing = True
                with self._watch.phase(BACKWARD_REDUCE):  # stage 3: the end-of-backward hook did it
                    self._close_backward(boundary)
        except Exception:
            # Autograd raised (a freed graph, a custom backward): the backward is finished as
            # the other ranks' (core.fail_backward), which may wait in its reductions, and the
            # next step is skipped on every rank. One that failed while finishing stays open:
            # its reductions are in an unknown state. (Ctrl-C is not held up: it leaves.)
            if not finishing and self._core is not None and self._core.backward_pending:
                self._core.fail_backward()
            self._backward_open = self._core is not None and self._core.backward_pending
            raise
        finally:
            self._torch_backward.engine_backward_done()
        self._watch.add_loss(loss)
        return loss

    def allreduce_gradients(self, bucket_size=None) -> None:
        """DeepSpeed's, which its backward calls: the reduction of an accumulation boundary's
        gradients. Here backward (engine's or loss.backward) has done it, overlapped, by the
        time it returns, and between boundaries there is nothing to reduce, as in DeepSpeed."""
        del bucket_size
        self._alive("allreduce_gradients")

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """DeepSpeed's: the loss times the loss scale (fp16), for `engine.scale(loss).backward()`
        (zero/torch_backward.py); the loss itself without one."""
        scaled = loss.float() * self.loss_scaler.loss_scale if self.loss_scaler is not None \
            else loss
        self._torch_backward.mark_scaled(scaled)
        return scaled

    def _open_backward(self) -> bool:
        """Before autograd runs a backward (engine.backward, or a torch-style one): the
        accumulation boundary it ends on, if any, and the C++ side made ready."""
        boundary = self.is_gradient_accumulation_boundary() and not self._no_sync
        self._boundary_backward_seen = self._boundary_backward_seen or boundary
        self._boundary_under_no_sync = self._boundary_under_no_sync or (
            self._no_sync and self.is_gradient_accumulation_boundary())
        self._begin_backward(boundary)
        return boundary

    def _close_backward(self, boundary: bool) -> None:
        self._backward_open = False
        if self._core is not None:
            self._core.finish_backward(boundary)

    def _begin_backward(self, boundary: bool) -> None:
        """The C++ side made ready for a backward ending on `boundary` (or not); gradients
        the forward took (a tiled loss) are handed over now."""
        self._boundary_in_backward = boundary
        self._core.prepare_backward(boundary)
        self._backward_open = True
        for group, index in self._early_grads:
            self._core.grad_ready(group, index, boundary)
        self._early_grads = []

    def _needs_loss_scale(self) -> bool:
        return self.loss_scaler is not None

    def step(self, lr_kwargs: dict | None = None):
        """At the accumulation boundary: the sharded optimizer step, then scheduler and loss
        scale updates. Between boundaries: only counts the micro-step."""
        self._alive("step")
        boundary = self.is_gradient_accumulation_boundary()
        if boundary and self._no_sync:
            raise RuntimeError("zero: engine.step() at an accumulation boundary inside no_sync() "
                               "would apply unreduced gradients; leave no_sync() before the "
                               "boundary's backward and step")
        if boundary and not self._boundary_backward_seen and self._boundary_under_no_sync:
            raise RuntimeError(
                f"zero: engine.step() at the end of step {self.global_steps + 1}, but that "
                "micro-batch's backward ran inside engine.no_sync(): its gradients were not "
                "reduced across ranks. Run the boundary micro-batch's backward outside "
                "no_sync(), as with DDP")
        if boundary and not self._boundary_backward_seen:
            raise RuntimeError(
                f"zero: engine.step() at the end of step {self.global_steps + 1}, but that "
                "micro-batch's backward did not go through the engine: compute the loss from "
                "the engine's forward (engine(...), not engine.module(...)) and call "
                "loss.backward() or engine.backward(loss). The engine reduces the gradients "
                "across ranks there; this step would apply unreduced gradients (at stages 2 and "
                "3: none)")
        if self.inference_only:
            raise RuntimeError("zero: engine.step() on an engine built without an optimizer "
                               "(no \"optimizer\" block and no optimizer= to initialize()); "
                               "add one to train")
        self._step_applied = False
        with self._watch.phase(STEP):
            self.micro_steps += 1
            if boundary:  # (DeepSpeed counts a step's samples at its boundary)
                self.global_samples += self.train_batch_size()
                self._optimizer_step(lr_kwargs)
        self.tput_timer.stop(global_step=boundary)
        if not boundary:
            return
        self._watch.after_step()
        self._maybe_report()

    def _optimizer_step(self, lr_kwargs: dict | None) -> None:
        with deferred_interrupt.deferred():  # the update and its counters, whole
            self._update(lr_kwargs)

    def _update(self, lr_kwargs: dict | None) -> None:
        self._boundary_backward_seen = self._boundary_under_no_sync = False
        result = self._core.step(self.optimizer.hypers(), self.optimizer.cur_scale,
                                 float(self.config.gradient_clipping), self.applied_steps + 1,
                                 muon=self.optimizer.spec.kind == "muon")
        self.last_step_result = result
        self.optimizer.overflow = result.overflow  # Accelerate's step_was_skipped
        if self.loss_scaler is not None and not result.failed_backward:
            self.loss_scaler.update_scale(result.overflow)
        if result.failed_backward:  # (no overflow of fp16's, no non-finite gradient)
            self.skipped_steps += 1
            if dist.get_rank() == 0:
                logger.warning("zero: step %d skipped on every rank: a backward raised since "
                               "the last step, so its gradients are partial (weights not "
                               "updated)", self.global_steps + 1)
        elif result.overflow:
            self._skip_nonfinite_step(result)
        else:
            self.applied_steps += 1
            self._step_applied = True
            if self.lr_scheduler is not None:
                with warnings.catch_warnings():
                    # torch's check that optimizer.step() ran first looks for its own wrapper
                    # on the optimizer's step, which the engine's update does not go through
                    # (nor a client optimizer's, whose update the engine took over).
                    warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
                    self.lr_scheduler.step(**(lr_kwargs or {}))
        self.global_steps += 1

    def zero_grad(self):
        if self._core is not None:  # after destroy() there are no gradients left to clear
            self._core.zero_grads()

    def _skip_nonfinite_step(self, result: _C.StepResult) -> None:
        """The C++ step found non-finite gradients (every rank agrees) and left the weights
        alone: fp16 lowers its loss scale; other precisions skip, or raise when
        nonfinite_gradients is "raise"."""
        step = self.global_steps + 1
        if self.loss_scaler is None and self.config.nonfinite_gradients == "raise":
            raise FloatingPointError(
                f"zero: step {step}: the gradients are not finite (global norm "
                f"{result.grad_norm}) in {self.config.precision}; the weights were not "
                "updated. Set \"nonfinite_gradients\": \"skip\" in the config to skip such steps "
                "and go on")
        self.skipped_steps += 1
        if dist.get_rank() != 0:
            return
        if self.loss_scaler is not None:
            logger.warning("zero: step %d skipped on every rank: fp16 gradients overflowed; "
                           "loss scale is now %s", step, self.optimizer.cur_scale)
        else:
            logger.warning("zero: step %d skipped on every rank: the gradients are not finite "
                           "(global norm %s) in %s; the weights were not updated (%d skipped "
                           "so far)", step, result.grad_norm, self.config.precision,
                           self.skipped_steps)

    def apply_delayed_update(self) -> None:
        """With offload_optimizer.delayed_update the model trains on parameters one update
        old; this waits for the last update and applies it (every rank must call it), e.g.
        before evaluating or saving the final model."""
        self._alive("apply_delayed_update")
        self._core.apply_delayed_update()

    # ---- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False):
        """`exclude_frozen_parameters` (the HF Trainer passes it for a PEFT model): the
        module state leaves out the frozen parameters, which the model rebuilds from its
        pretrained weights (load with load_module_strict=False)."""
        self._alive("save_checkpoint")
        if self._core is not None:  # (a rank saving alone is named, not left waiting)
            self._core.agree_on_checkpoint(save=True)
        return save_checkpoint(self, save_dir, tag, client_state or {}, save_latest,
                               exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None):
        """DeepSpeed's: returns (path, client_state); `custom_load_fn(src=, dst=)` writes the
        module's weights instead of load_state_dict (load_module_weights)."""
        self._alive("load_checkpoint")
        if self._core is not None:
            self._core.agree_on_checkpoint(save=False)
        with self._swap_writes.shown("zero: loading the checkpoint into NVMe swap files"):
            return load_checkpoint(self, load_dir, tag, load_module_strict,
                                   load_optimizer_states, load_lr_scheduler_states,
                                   load_module_only, custom_load_fn)

    # ---- stage 3 ----------------------------------------------------------------------------
    def gathered_parameters(self, params, modifier_rank=None):
        """Context in which `params` are whole (stage 3); see zero.GatheredParameters."""
        if self._stage3 is None:
            return contextlib.nullcontext()
        return stage3.gathered_parameters(self._stage3, params, modifier_rank)

    def was_step_applied(self) -> bool:
        """Whether the last engine.step() updated the weights: False between accumulation
        boundaries and for a skipped (overflowed, non-finite) step, as DeepSpeed."""
        return self._step_applied

    def empty_partition_cache(self) -> None:
        """Stage 3: gives back the memory of every gathered unit nobody holds (kept for a
        reuse, prefetched, or left by a forward without backward); the next use gathers
        again. Nothing to do below stage 3."""
        if self._core is not None:
            self._core.release_gathered()

    def offload_states(self, include=None, device=states_offload.OffloadDeviceEnum.cpu,
                       pin_memory: bool = True, non_blocking: bool = False) -> None:
        """DeepSpeed's: `include`'s states (OffloadStateTypeEnum; None: all) to host memory,
        their device memory given back (zero/offload_states.py). Anything that needs one
        brings it back; reload_states() brings all back at once."""
        del non_blocking  # the copies finish before the call returns
        self._alive("offload_states")
        states_offload.offload(self._core, self.device.type, include, device, pin_memory)

    def reload_states(self, non_blocking: bool = False) -> None:
        """DeepSpeed's: every state offload_states moved back on the device."""
        del non_blocking
        self._alive("reload_states")
        self._core.reload_states()

    def get_data_parallel_rank(self) -> int:
        """This rank among the dp_world_size data-parallel ranks (a sequence group's ranks
        share one)."""
        return self._replica()

    def get_tensor_parallel_rank(self) -> int:
        group = self.tensor_parallel_group
        return 0 if group is None else dist.get_rank(group)

    def get_model_parallel_rank(self) -> int:
        return self.get_tensor_parallel_rank()

    def get_global_grad_norm(self) -> torch.Tensor | None:
        """The global gradient norm of the last optimizer step, before clipping (None before
        the first step), as DeepSpeed's engine reports it: a 0-dim fp32 tensor on the engine's
        device (scripts call .item() on it); inf for a step skipped on overflow (DeepSpeed's,
        whatever non-finite value the gradients held)."""
        result = self.last_step_result
        if result is None:
            return None
        if self._grad_norm is None or self._grad_norm[0] is not result:  # once per step
            norm = float("inf") if result.overflow else result.grad_norm
            self._grad_norm = (result, torch.tensor(norm, dtype=torch.float32,
                                                    device=self.device))
        return self._grad_norm[1]

    def compile(self, backend="inductor", compile_kwargs=None, schedule=None,
                compiled_autograd_enabled=False) -> None:
        """DeepSpeed's engine.compile (Accelerate calls it for the HF Trainer's
        --torch_compile): torch.compile of the model (module.compile), its hooks included,
        which dynamo runs eagerly where it cannot trace them. DeepCompile `schedule`s and
        compiled autograd are DeepSpeed's own and refused."""
        if schedule is not None or compiled_autograd_enabled:
            raise NotImplementedError("zero: engine.compile takes backend and compile_kwargs; "
                                      "DeepSpeed's DeepCompile schedules and compiled autograd "
                                      "are not built")
        if self.is_compiled:
            return
        self.module.compile(**{**(compile_kwargs or {}), "backend": backend})
        if self._stage3 is not None:  # (dynamo is loaded now)
            self._stage3.make_hooks_eager()
        self._is_compiled = True

    @property
    def is_compiled(self) -> bool:
        return self._is_compiled

    def _warn_if_not_pinned(self) -> None:
        infos = [self._core.group_offload_info(g) for g in range(self._core.group_count)] + \
            [self._core.frozen_group_offload_info(g)
             for g in range(self._core.frozen_group_count)]  # stage 3's frozen shard
        message = offload.pinning_warning(self.config, infos)
        if message and dist.get_rank() == 0:
            warnings.warn(message, stacklevel=3)
            logger.warning(message)

    # ---- internals -------------------------------------------------------------------------
    def _grad_hook(self, group: int, index: int):
        engine = weakref.ref(self)  # hooks must not keep a finished engine alive

        def hook(param):
            live = engine()
            # a tiled compute (zero/parallel/tiled_compute.py, DeepSpeed's protocol) marks
            # its weights not ready until its last tile: the gradient adds up in param.grad
            if live is None or not getattr(param, "ds_grad_is_ready", True):
                return
            if live._backward_open:
                live._core.grad_ready(group, index, live._boundary_in_backward)
            else:  # a gradient taken in the forward (TiledFusedLogitsLoss): at the backward
                live._early_grads.append((group, index))
        return hook

    def destroy(self) -> None:
        """Removes the engine's hooks from the model and lets go of the C++ engine: its
        buffers, host pools and NVMe swap files. Below stage 3 the model is then a plain
        module again (it can get a new engine); at stage 3 its partitioned parameters stay
        empty (DeepSpeed's destroy() too only removes its hooks; here the shards go with the
        engine: save the weights first to go on with them). With a
        memory_report.path configured the final report is written first; with
        steps_per_print set rank 0 prints it as the full table."""
        try:  # (a report or a monitor that fails must not keep the engine's resources)
            self._final_report_once()
            if self._core is not None:
                self._watch.close()
        finally:
            self._release()

    def _release(self) -> None:
        """What destroy() lets go of, whatever happened before: hooks, the C++ engine."""
        _LIVE_ENGINES.discard(self)
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._torch_backward.detach()
        if self._stage3 is not None:
            self._stage3.remove()
        if self._core is not None:
            self._core.close()  # waits for and frees everything without holding the GIL
        self._core = None

    def _alive(self, call: str) -> None:
        if self._core is None:
            raise RuntimeError(
                f"zero: engine.{call}() after engine.destroy(): the engine has let go of its "
                "shards, gradients and optimizer state; build a new engine with "
                "zero.initialize (under the Hugging Face Trainer or Accelerate: a new Trainer, "
                "or accelerator.prepare again) and load a checkpoint to go on training")


# Engines not yet destroyed. Those still alive at interpreter exit are destroyed while Python
# and torch.distributed still work: final report, hooks, C++ buffers and threads, swap files.
_LIVE_ENGINES: "weakref.WeakSet[ZeroEngine]" = weakref.WeakSet()


def live_engines() -> list["ZeroEngine"]:
    """The engines built and not yet destroyed (deepspeed.comm.log_summary reads theirs)."""
    return list(_LIVE_ENGINES)


@atexit.register
def _destroy_live_engines() -> None:
    # After an uncaught exception the table would push the error out of the launcher's last
    # lines of the rank's log: the JSON report is still written, the table is not shown.
    crashed = getattr(sys, "last_value", None) is not None
    for engine in list(_LIVE_ENGINES):
        try:  # (each engine: one that fails does not keep the others' swap files)
            if crashed:
                engine._final_report_once(show_table=False)
            engine.destroy()
        except Exception as error:  # noqa: BLE001 - the interpreter is exiting
            logger.warning("zero: destroying an engine at exit failed: %s: %s",
                           type(error).__name__, error)


def _element_size(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def _training_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _floats_to_half(value):
    """fp16.auto_cast: floating-point tensors in (nested lists, tuples and dicts of) forward's
    positional inputs, as fp16."""
    if isinstance(value, torch.Tensor):
        return value.half() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_floats_to_half(v) for v in value)
    if isinstance(value, dict):
        return {k: _floats_to_half(v) for k, v in value.items()}
    return value


def _check_loss(loss) -> None:
    """engine.backward's loss, before anything starts: DeepSpeed's check (one element, part
    of a graph), naming the usual cause."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) \
            else type(loss).__name__
        raise ValueError(f"zero: engine.backward(loss) takes the loss as a one-element tensor, "
                         f"got {what}; reduce it first (loss.mean()), as DeepSpeed requires")
    if loss.grad_fn is None:
        raise ValueError("zero: engine.backward(loss): the loss is not part of an autograd "
                         "graph (computed under torch.no_grad() or inference_mode, detached, "
                         "or from frozen parameters only); compute it from the engine's forward "
                         "with gradients enabled")
