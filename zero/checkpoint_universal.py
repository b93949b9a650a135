"""Reading a DeepSpeed universal checkpoint: what DeepSpeed's `ds_to_universal` makes of a
ZeRO checkpoint so that it loads at any parallel layout (`"checkpoint": {"load_universal":
true}`). A run DeepSpeed converted that way resumes under zero with `load_checkpoint`.

    <save_dir>/latest_universal              the tag, as `latest` for other checkpoints
    <tag>/mp_rank_00_model_states.pt         the module's buffers, counters, scheduler, shapes
    <tag>/zero/<parameter>/fp32.pt           {"param": its whole fp32 master} (from stage 3:
                                             the flat tensor alone)
    <tag>/zero/<parameter>/exp_avg.pt        Adam's moments, whole (exp_avg_sq.pt too)
    <tag>/zero/<parameter>/step.pt           Adam's step count (stages 1-2)
    <tag>/zero/optimizer_state.pt            the optimizer's param_groups, loss scaler (stage
                                             3: its whole state_dict, and the step there)

It becomes the same record as a DeepSpeed ZeRO checkpoint (checkpoint_deepspeed.py), each
value memory-mapped from its file, so each rank cuts only its own shard from it.
"""
from __future__ import annotations

import os

from .checkpoint_deepspeed import (MOMENTS, WHOLE_MODEL_FILE, DeepSpeedCheckpoint,
                                   check_one_part, frozen_parameters, load_file,
                                   rank_model_file, record_fields, tie_names, zero_stage)
from .checkpoint_files import CorruptCheckpoint
from .checkpoint_pieces import Located

LATEST_UNIVERSAL = "latest_universal"
_OPTIMIZER = os.path.join("zero", "optimizer_state.pt")


def is_universal_checkpoint(path: str) -> bool:
    """A tag directory ds_to_universal wrote."""
    return os.path.isfile(os.path.join(path, _OPTIMIZER))


def read(path: str) -> DeepSpeedCheckpoint:
    """The universal checkpoint in tag directory `path`, every value mapped, not read."""
    model_file = next((os.path.join(path, name) for name in (WHOLE_MODEL_FILE, rank_model_file(0))
                       if os.path.isfile(os.path.join(path, name))), None)
    if model_file is None:
        raise CorruptCheckpoint(f"zero: DeepSpeed universal checkpoint {path} has no "
                                f"{WHOLE_MODEL_FILE}; copy it from the checkpoint it was made of")
    model_state = load_file(model_file, mmap=True)
    check_one_part(model_state, path)
    optimizer = load_file(os.path.join(path, _OPTIMIZER), mmap=True)  # stage 3: a rank's all
    shapes = {name: shape for group in model_state["param_shapes"]
              for name, shape in group.items()}
    master = {name: _value(path, name, "fp32", shape) for name, shape in shapes.items()}
    moments = {key: {name: _value(path, name, key, shapes[name]) for name in names}
               for key, names in _moments_saved(path, shapes).items()}
    # as saved in the model files ds_to_universal copied (stage 3: every rank's fragment)
    frozen = frozen_parameters(path, model_state, os.path.basename(model_file) != WHOLE_MODEL_FILE,
                               model_state.get("dp_world_size", 1), master)
    tie_names(model_state, frozen, master, *moments.values())
    step = _step(path, next(iter(shapes), None), optimizer, bool(moments))
    return DeepSpeedCheckpoint(
        path=path, model_state=model_state, stage=zero_stage(optimizer),
        world_size=model_state.get("dp_world_size", 1), master=master, moments=moments,
        step=step, param_groups=[{k: v for k, v in group.items() if k != "params"}
                                      for group in optimizer["param_groups"]],
        frozen=frozen, loss_scale=record_fields(optimizer.get("loss_scaler")) or None,
        universal=True)


def _moments_saved(path: str, shapes: dict) -> dict[str, list[str]]:
    """Which parameters hold each optimizer-state array (MOMENTS) that some parameter has:
    all of them, or with Muon's groups (its momentum, Adam's moments) each parameter those
    of its group. A parameter with none while others have some, or with one of Adam's two
    moments where others have both, is a conversion cut short."""
    holders = {key: [name for name in shapes if _has(path, name, key)] for key in MOMENTS}
    holders = {key: names for key, names in holders.items() if names}
    covered = {name for names in holders.values() for name in names}
    lacking = [("optimizer state", [name for name in shapes if holders and name not in covered])]
    pair = [set(holders.get(key, ())) for key in ("exp_avg", "exp_avg_sq")]
    if pair[0] & pair[1]:  # Adam's: whoever has one moment has both
        lacking += [(f"{key}.pt", [name for name in shapes if name in pair[0] | pair[1]
                                   and name not in holders[key]])
                    for key in ("exp_avg", "exp_avg_sq")]
    for what, names in lacking:
        if names:
            raise CorruptCheckpoint(
                f"zero: DeepSpeed universal checkpoint {path} has no {what} for "
                f"{', '.join(names[:3])}" + (f" (and {len(names) - 3} more)" if len(names) > 3
                                             else "") +
                "; convert the checkpoint with ds_to_universal again")
    return holders


def _step(path: str, first: str | None, optimizer: dict, moments: bool) -> int:
    """Adam's step: in each parameter's step.pt (from stages 1-2), else in the optimizer's
    state (stage 3 keeps its torch state_dict in optimizer_state.pt)."""
    if first and _has(path, first, "step"):
        return int(load_file(os.path.join(path, "zero", first, "step.pt")))
    state = optimizer.get("optimizer_state_dict", {}).get("state", {})
    if state:
        return int(next(iter(state.values())).get("step", 0))
    if moments:  # Adam's bias correction would start over
        raise CorruptCheckpoint(f"zero: DeepSpeed universal checkpoint {path} holds Adam's "
                                f"moments but no step ({first}/step.pt); convert the "
                                "checkpoint with ds_to_universal again")
    return 0


def _has(path: str, name: str, key: str) -> bool:
    return os.path.isfile(os.path.join(path, "zero", name, f"{key}.pt"))


def _value(path: str, name: str, key: str, shape) -> Located:
    """zero/<name>/<key>.pt's whole value, mapped, checked against the parameter's shape."""
    file = os.path.join(path, "zero", name, f"{key}.pt")
    if not os.path.isfile(file):
        raise CorruptCheckpoint(f"zero: DeepSpeed universal checkpoint {path} has no {file}; "
                                "convert the checkpoint with ds_to_universal again")
    value = load_file(file, mmap=True)
    value = value["param"] if isinstance(value, dict) else value  # stage 3: the tensor alone
    if value.numel() != shape.numel():
        raise CorruptCheckpoint(f"zero: {file} holds {value.numel()} elements, {name} has "
                                f"shape {tuple(shape)}")
    return Located.of(value.reshape(shape))
