"""Pipeline schedules as plain instruction lists, one list per stage.

A schedule says, for one stage, in which order it loads micro-batches, receives and sends
activations and gradients, runs forward and backward passes, and steps. The engine executes
the list; the tests check the lists without processes.

  - "1f1b" (DeepSpeed's TrainSchedule, the default): stage s first runs p - s - 1 forwards
    (warm-up), then alternates one forward and one backward, then drains the remaining
    backwards. At most p - s micro-batches hold activations at once.
  - "gpipe": every forward, then every backward: all m micro-batches hold activations.

Sends are non-blocking and receives block (the engine's contract); with that, both schedules
complete on every stage (tests/test_pipe_schedule.py simulates them).
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class Instruction:
    """One step of a stage's schedule; `micro_batch` is -1 for the per-batch steps."""
    micro_batch: int = -1

    @property
    def name(self) -> str:
        return type(self).__name__


class LoadMicroBatch(Instruction):
    """First stage: the inputs; last stage: the labels (both read the data iterator)."""


class RecvActivation(Instruction):
    """Receive the previous stage's outputs of this micro-batch (blocking)."""


class ForwardPass(Instruction):
    """Run this stage's layers; on the last stage also the loss."""


class SendActivation(Instruction):
    """Send this micro-batch's outputs to the next stage (non-blocking)."""


class RecvGrad(Instruction):
    """Receive the gradient of this micro-batch's outputs from the next stage (blocking)."""


class BackwardPass(Instruction):
    """Backward through this stage's layers; frees the micro-batch's activations."""


class SendGrad(Instruction):
    """Send the gradient of this micro-batch's inputs to the previous stage (non-blocking)."""


class ReduceTiedGrads(Instruction):
    """Sum the gradients of tied weights over the stages that hold them."""


class ReduceGrads(Instruction):
    """The data-parallel (ZeRO) reduction of the stage's accumulated gradients."""


class OptimizerStep(Instruction):
    """The sharded optimizer step of the stage's engine."""


def _forward(mb: int, stage: int, stages: int, load_labels: bool = True) -> list[Instruction]:
    steps: list[Instruction] = []
    if stage == 0 or (stage == stages - 1 and load_labels):
        steps.append(LoadMicroBatch(mb))
    if stage > 0:
        steps.append(RecvActivation(mb))
    steps.append(ForwardPass(mb))
    if stage < stages - 1:
        steps.append(SendActivation(mb))
    return steps


def _backward(mb: int, stage: int, stages: int) -> list[Instruction]:
    steps: list[Instruction] = []
    if stage < stages - 1:
        steps.append(RecvGrad(mb))
    steps.append(BackwardPass(mb))
    if stage > 0:
        steps.append(SendGrad(mb))
    return steps


def _check(micro_batches: int, stages: int, stage_id: int) -> None:
    if micro_batches < 1 or stages < 1 or not 0 <= stage_id < stages:
        raise ValueError(f"zero: a pipeline schedule needs micro_batches >= 1 (got "
                         f"{micro_batches}), stages >= 1 (got {stages}) and 0 <= stage_id < "
                         f"stages (got {stage_id})")


def train_schedule(kind: str, micro_batches: int, stages: int,
                   stage_id: int) -> list[Instruction]:
    """The instructions of one training batch on `stage_id` for schedule `kind`."""
    _check(micro_batches, stages, stage_id)
    if kind == "1f1b":
        order = one_f_one_b_order(micro_batches, stages, stage_id)
    elif kind == "gpipe":
        order = [("F", mb) for mb in range(micro_batches)] + \
                [("B", mb) for mb in range(micro_batches)]
    else:
        raise ValueError(f"zero: pipeline.schedule = {kind!r} is not a schedule; use one of "
                         f"{list(SCHEDULES)}")
    steps: list[Instruction] = []
    for pass_kind, mb in order:
        steps += _forward(mb, stage_id, stages) if pass_kind == "F" else \
            _backward(mb, stage_id, stages)
    return steps + [ReduceTiedGrads(), ReduceGrads(), OptimizerStep()]


def one_f_one_b_order(micro_batches: int, stages: int, stage_id: int) -> list[tuple[str, int]]:
    """("F"|"B", micro-batch) in 1F1B order: warm-up forwards, steady 1F1B, drain."""
    warmup = min(stages - stage_id - 1, micro_batches)
    order = [("F", mb) for mb in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", mb) for mb in range(micro_batches - warmup, micro_batches)]
    return order


def eval_schedule(micro_batches: int, stages: int, stage_id: int) -> list[Instruction]:
    """Forward passes only (DeepSpeed's InferenceSchedule, in order)."""
    _check(micro_batches, stages, stage_id)
    return [step for mb in range(micro_batches) for step in _forward(mb, stage_id, stages)]


def peak_in_flight(steps: list[Instruction]) -> int:
    """The most micro-batches whose activations are held at once (forward done, backward not)."""
    live = peak = 0
    for step in steps:
        if isinstance(step, ForwardPass):
            live += 1
            peak = max(peak, live)
        elif isinstance(step, BackwardPass):
            live -= 1
    return peak
