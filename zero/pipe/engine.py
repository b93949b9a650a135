"""PipelineEngine: DeepSpeed's pipeline engine on zero's ZeRO engine.

One engine per rank runs its pipeline stage: the PipelineModule's layers, trained by
ZeroEngine (ZeRO stage 0, 1 or 2) over the stage's data-parallel group. A batch is
`train_batch()`: the stage executes its schedule (schedule.py: 1F1B or GPipe), moving
activations forward and gradients back with point-to-point ops (p2p.py), then sums tied
weights' gradients over the stages that share them, reduces the stage's gradients over its
data-parallel group and steps. `forward`, `backward` and `step` are not for direct use, as
in DeepSpeed.

Gradients of a batch accumulate locally at stages 0 and 1 and are reduced once, after the
tied-weight sum (the order DeepSpeed uses); stage 2 (and stage 1 with one micro-batch per
step, whose gradients are sharded as at stage 2) reduces every micro-batch's gradients as they
come, so layers tied across stages are refused there.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..boundary import grads_sharded
from ..engine import ZeroEngine
from ..parallel.norm_span import norm_span
from ..saved_activations import SavedActivations
from . import p2p
from .module import PipelineModule
from .schedule import (BackwardPass, ForwardPass, LoadMicroBatch, OptimizerStep,
                       RecvActivation, RecvGrad, ReduceGrads, ReduceTiedGrads, SendActivation,
                       SendGrad, eval_schedule, train_schedule)


class PipelineError(RuntimeError):
    """A call the pipeline engine does not take (forward/backward/step) or cannot run."""


class _Batch:
    """What one train_batch / eval_batch holds while its schedule runs, by micro-batch."""

    def __init__(self, training: bool, keep_logits: bool = False, compute_loss: bool = True):
        self.training = training
        self.keep_logits = keep_logits  # eval_batch(return_logits=True)
        self.compute_loss = compute_loss  # eval_batch(compute_loss=False): no loss_fn
        self.logits = None  # the last stage's model output of the latest micro-batch
        self.inputs: dict = {}
        self.labels: dict = {}
        self.outputs: dict = {}
        self.grads: dict = {}
        self.losses: list = []  # the last stage's per micro-batch: losses (or eval outputs)
        self.sends = p2p.PendingSends()
        self.backwards = 0
        self.saved_bytes: dict[int, int] = {}  # micro-batch -> bytes its forward saved


class PipelineEngine(ZeroEngine):
    def __init__(self, module: PipelineModule, config, optimizer=None, model_parameters=None,
                 lr_scheduler=None, tensor_parallel_group=None):
        """`tensor_parallel_group`: with a topology of tensor size > 1, the ranks holding the
        other slices of this stage's layers (zero.tp; initialize() converts them)."""
        _check(module, config)
        self.grid = module.mpu()
        super().__init__(module, config, optimizer=optimizer, model_parameters=model_parameters,
                         lr_scheduler=lr_scheduler,
                         data_parallel_group=self.grid.get_data_parallel_group(),
                         tensor_parallel_group=tensor_parallel_group,
                         norm_span=norm_span(self.grid, module))
        self.num_stages = module.num_stages
        self.stage_id = self.grid.get_stage_id()
        self.schedule = config.pipeline.schedule
        if config.pipeline.activation_checkpoint_interval > 0:  # as DeepSpeed's engine does
            module.activation_checkpoint_interval = config.pipeline.activation_checkpoint_interval
        self.data_iterator = None
        self.agg_train_loss = None
        # With measure_activations on: the most bytes autograd held for backward at once over
        # the batches trained so far (saved_activations.py, summed over live micro-batches).
        self.measure_activations = False
        self.peak_activation_bytes = 0

    # ---- DeepSpeed's pipeline surface --------------------------------------------------------
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def set_dataiterator(self, iterator) -> None:
        self.data_iterator = iterator

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step: the gradient accumulation steps, as set_train_batch_size
        leaves them."""
        return self.gradient_accumulation_steps()

    def train_batch(self, data_iter=None) -> torch.Tensor:
        """One optimizer step over `micro_batches` micro-batches (gradient_accumulation_steps)
        read from `data_iter` (first and last stage: each item is (inputs, labels)). Returns
        the mean loss over the micro-batches and the data-parallel ranks, on every rank."""
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        self.module.train()
        batch = _Batch(training=True)
        self._run(train_schedule(self.schedule, self.micro_batches, self.num_stages,
                                 self.stage_id), batch)
        self.agg_train_loss = self._aggregate_loss(batch)
        return self.agg_train_loss

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output="avg",
                   bcast_loss=True, num_micro_batches=None):
        """DeepSpeed's eval_batch: forward only over `num_micro_batches` (default
        micro_batches) micro-batches. Each gives, on the last stage, loss_fn(output, labels),
        or the model's output without compute_loss or loss_fn. reduce_output "avg" averages
        them over the micro-batches and the data-parallel ranks, None returns their list.
        With compute_loss and bcast_loss the average reaches every stage; otherwise the other
        stages return None. return_logits: (that, the last micro-batch's model output on the
        last stage, None elsewhere)."""
        if reduce_output is not None and str(reduce_output).lower() != "avg":
            raise NotImplementedError(f"zero: eval_batch(reduce_output={reduce_output!r}): the "
                                      "reductions are 'avg' and None (as DeepSpeed's)")
        training_iterator, self.data_iterator = self.data_iterator, data_iter
        self.module.eval()
        batch = _Batch(training=False, keep_logits=return_logits, compute_loss=compute_loss)
        try:
            with torch.no_grad():
                self._run(eval_schedule(num_micro_batches or self.micro_batches,
                                        self.num_stages, self.stage_id), batch)
            batch.sends.wait_all()
        finally:  # as DeepSpeed: train_batch() reads the training data again afterwards
            self.data_iterator = training_iterator
        broadcast = compute_loss and bcast_loss and reduce_output is not None
        output, failure = None, None
        if self.is_last_stage():
            try:
                output = batch.losses if reduce_output is None else self._dp_mean(batch.losses)
            except Exception as error:  # noqa: BLE001 - the other stages wait for the broadcast
                failure = error
        if broadcast and self.num_stages > 1:
            output = p2p.broadcast_value(output, self._last_stage_rank(),
                                         self.grid.get_pipe_parallel_group(), self.device,
                                         failure)
        elif failure is not None:
            raise failure
        return (output, batch.logits) if return_logits else output

    def forward(self, *args, **kwargs):
        raise PipelineError("zero: only train_batch() and eval_batch() are accessible in "
                            "pipeline mode (as in DeepSpeed)")

    def backward(self, *args, **kwargs):
        raise PipelineError("zero: only train_batch() is accessible in pipeline mode; it runs "
                            "the backward passes itself")

    def step(self, *args, **kwargs):
        raise PipelineError("zero: only train_batch() is accessible in pipeline mode; it runs "
                            "the optimizer step itself")

    # ---- the schedule's instructions -----------------------------------------------------------
    def _run(self, instructions, batch: _Batch) -> None:
        handlers = {LoadMicroBatch: self._load, RecvActivation: self._recv_activation,
                    ForwardPass: self._forward, SendActivation: self._send_activation,
                    RecvGrad: self._recv_grad, BackwardPass: self._backward,
                    SendGrad: self._send_grad, ReduceTiedGrads: self._reduce_tied,
                    ReduceGrads: self._reduce, OptimizerStep: self._step}
        for instruction in instructions:
            handlers[type(instruction)](instruction.micro_batch, batch)

    def _load(self, mb: int, batch: _Batch) -> None:
        if self.data_iterator is None:
            raise PipelineError("zero: train_batch() on the first or last stage needs a data "
                                "iterator: pass train_batch(data_iter=...) or training_data to "
                                "initialize()")
        inputs, labels = next(self.data_iterator)
        if self.is_first_stage():
            batch.inputs[mb] = _to(inputs, self.device)
        if self.is_last_stage():
            batch.labels[mb] = _to(labels, self.device)

    def _recv_activation(self, mb: int, batch: _Batch) -> None:
        batch.inputs[mb] = p2p.recv_activation(self.grid.prev_stage_rank, self.device)

    def _forward(self, mb: int, batch: _Batch) -> None:
        if batch.training and self.measure_activations:
            counter = SavedActivations(self.module)
            with counter.counting():
                outputs = self._stage_forward(mb, batch)
            batch.saved_bytes[mb] = counter.bytes
            self.peak_activation_bytes = max(self.peak_activation_bytes,
                                             sum(batch.saved_bytes.values()))
        else:
            outputs = self._stage_forward(mb, batch)
        if batch.training:
            batch.outputs[mb] = outputs
        elif not self.is_last_stage():
            batch.inputs.pop(mb)
            batch.outputs[mb] = outputs.detach() if isinstance(outputs, torch.Tensor) \
                else tuple(t.detach() for t in outputs)

    def _stage_forward(self, mb: int, batch: _Batch):
        """This stage's layers on the micro-batch; on the last stage the loss."""
        with self.forward_autocast():
            outputs = self.module(batch.inputs[mb])
        if self.is_last_stage():
            if batch.keep_logits:
                batch.logits = outputs
            labels = batch.labels.pop(mb)
            loss_fn = self.module.loss_fn if batch.compute_loss else None
            outputs = loss_fn(outputs, labels) if loss_fn is not None else outputs
            if batch.training and not isinstance(outputs, torch.Tensor):
                raise PipelineError(
                    f"zero: train_batch() needs the loss as one tensor on the last stage, got "
                    f"{type(outputs).__name__}: give PipelineModule a loss_fn(outputs, labels) "
                    "that returns it, or make the last layer return it")
            batch.losses.append(_detached(outputs))
        return outputs

    def _send_activation(self, mb: int, batch: _Batch) -> None:
        value = batch.outputs[mb] if batch.training else batch.outputs.pop(mb)
        p2p.send_activation(value, self.grid.next_stage_rank, batch.sends)

    def _recv_grad(self, mb: int, batch: _Batch) -> None:
        batch.grads[mb] = p2p.recv_grads(p2p.needing_grad(batch.outputs[mb]),
                                         self.grid.next_stage_rank)

    def _backward(self, mb: int, batch: _Batch) -> None:
        outputs = batch.outputs.pop(mb)
        if self.is_last_stage():  # the mean over micro-batches, times fp16's loss scale
            loss = outputs.float() / self.micro_batches
            tensors = [loss * self.optimizer.cur_scale if self.loss_scaler is not None else loss]
            grads = None
        else:
            tensors, grads = p2p.needing_grad(outputs), batch.grads.pop(mb)
        # Stage 0/1 accumulate locally (reduced once, in _reduce); stage 2 reduces each
        # micro-batch, the last one as the accumulation boundary.
        batch.backwards += 1
        batch.saved_bytes.pop(mb, None)
        boundary = self.stage == 2 and batch.backwards == self.micro_batches
        self._begin_backward(boundary)
        torch.autograd.backward(tensors, grads)
        self._close_backward(boundary)
        if self.is_first_stage():
            batch.inputs.pop(mb)

    def _send_grad(self, mb: int, batch: _Batch) -> None:
        inputs = [t for t in p2p.as_tuple(batch.inputs.pop(mb)) if t.requires_grad]
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in inputs]
        p2p.send_grads(grads, self.grid.prev_stage_rank, batch.sends)

    def _reduce_tied(self, mb: int, batch: _Batch) -> None:
        self.module.allreduce_tied_weight_gradients(grad_of=self._accumulated_grad)

    def _accumulated_grad(self, weight: torch.Tensor):
        """A weight's gradient as this batch accumulated it: its place in the engine's full
        gradient buffer (the one param.grad views, or the fp32 one of data_types.grad_accum_dtype
        fp32); weight.grad for a weight the engine does not train."""
        for g, group in enumerate(self._engine_groups):
            for i, param in enumerate(group.params):
                if param is weight:
                    grad = self._core.group_accumulated_grad(g, i)
                    if grad is None:  # _check refuses ties over sharded gradients
                        raise PipelineError("zero: a tied weight's gradient is sharded; it "
                                            "cannot be summed across stages")
                    return grad
        return weight.grad  # frozen: not the engine's

    def _reduce(self, mb: int, batch: _Batch) -> None:
        if self.stage < 2:  # the boundary reduction of what the batch accumulated
            self._begin_backward(True)
            self._close_backward(True)
        self._boundary_backward_seen = True

    def _step(self, mb: int, batch: _Batch) -> None:
        batch.sends.wait_all()
        self.micro_steps += self.micro_batches
        self.global_samples += self.train_micro_batch_size_per_gpu() * self.micro_batches * \
            self.world_size
        self._optimizer_step(None)
        self._watch.after_step()
        self._maybe_report()

    # ---- helpers ---------------------------------------------------------------------------------
    def _aggregate_loss(self, batch: _Batch) -> torch.Tensor:
        """The last stage's mean loss, averaged over the data-parallel group, then broadcast
        to every stage of the pipeline (DeepSpeed's _aggregate_total_loss)."""
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.is_last_stage():
            loss = self._dp_mean(batch.losses)
        if self.num_stages > 1:
            dist.broadcast(loss, src=self._last_stage_rank(),
                           group=self.grid.get_pipe_parallel_group())
        return loss

    def _dp_mean(self, values: list):
        """The mean of the micro-batches' values (tensors, or tuples of tensors: each place
        by itself) in fp32, averaged over the data-parallel group."""
        if isinstance(values[0], torch.Tensor):
            mean = torch.stack([v.float() for v in values]).mean(0)
            dist.all_reduce(mean, group=self.grid.get_data_parallel_group())
            return mean / self.grid.get_data_parallel_world_size()
        if not isinstance(values[0], (tuple, list)):
            raise TypeError(f"zero: the pipeline's last stage gave {type(values[0]).__name__}; "
                            "averaging takes a tensor or a tuple of tensors (eval_batch: pass "
                            "reduce_output=None for the outputs as they are)")
        return tuple(self._dp_mean([v[i] for v in values]) for i in range(len(values[0])))

    def _last_stage_rank(self) -> int:
        return self.grid.stage_to_global(self.num_stages - 1)


def _check(module, config) -> None:
    if not isinstance(module, PipelineModule):
        raise TypeError(f"zero: PipelineEngine needs a PipelineModule, got "
                        f"{type(module).__name__}")
    if dist.get_backend() != "gloo":
        raise NotImplementedError(
            f"zero: pipeline parallelism on the {dist.get_backend()} backend has not run yet: its "
            "point-to-point exchange is built and tested on gloo only (its send/receive order "
            "relies on gloo's non-blocking sends); initialise torch.distributed with "
            "backend='gloo' to use it")
    stage = config.zero_optimization.stage
    if grads_sharded(stage, config.gradient_accumulation_steps) and module.ties_across_stages():
        raise NotImplementedError(
            f"zero: ZeRO stage {stage} with gradient_accumulation_steps "
            f"{config.gradient_accumulation_steps} and tied layers across pipeline stages is not "
            "built: the gradients are sharded (stage 2, or stage 1 with one micro-batch per "
            "step) and reduced before the tied sum; use zero_optimization.stage 0, or stage 1 "
            "with several micro-batches (DeepSpeed's pipeline engine allows only stages 0 and 1)")


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    return value


def _detached(value):
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value
