"""Reading a checkpoint that DeepSpeed wrote, so that a run started under DeepSpeed resumes
under zero, at any world size and ZeRO stage: `engine.load_checkpoint(dir)` on it.

What DeepSpeed (0.19) writes for one model part (no pipeline or tensor split), ZeRO stage 1-3:
    <tag>/mp_rank_00_model_states.pt               stages 1-2: module, counters, scheduler,
                                                   param_shapes (the flat order), buffer_names
    <tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt   stage 3: the same from every rank, the
                                                   module's parameters empty
    <tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt   rank r's fp32 master partition
                                                   and Adam's moments laid out like it
    <tag>/layer_<L>_expert_<E>_mp_rank_00_model_states.pt   DeepSpeed-MoE: each expert's
                                                   weights under its global id
Stages 1-2 flatten each parameter group in param_shapes order and cut the flat buffer into
equal rank partitions (a DeepSpeed-MoE expert group's over each expert data-parallel group,
its experts named as on rank 0: read under their global ids, moe/checkpoint.copies); stage
3 cuts every parameter into ceil(numel / world) pieces, rank r's piece of each, in order,
making its flat buffer. DeepSpeed's own zero_to_fp32 reads them the
same way. From these, `read` says where every parameter's fp32 master and moments lie, by
name (checkpoint_pieces.Located, memory-mapped); `load_into` loads the module from the whole
master (in the engine's dtype) and cuts this rank's shards from the files, reading only its
own elements, as a zero checkpoint of another world size is resharded. DeepSpeed's classes in
the files (its loss scaler, its stage enum) are read as plain records: DeepSpeed need not be
installed.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import pickle
import re
import types

import torch

from . import checkpoint_layout
from .checkpoint_files import MANIFEST, CorruptCheckpoint
from .checkpoint_pieces import Flat, Located
from .moe import checkpoint as moe_checkpoint
from .moe import ep_checkpoint
from .optimizer import hyperparameters
from .sharding import names_by_id

logger = logging.getLogger("zero")

WHOLE_MODEL_FILE = "mp_rank_00_model_states.pt"
_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt")
# What DeepSpeed's load_checkpoint keeps out of the client state it returns (engine.py); the
# rest of the model file, the script's own keys among it, is returned.
_ENGINE_KEYS = ("module", "skipped_steps", "global_steps", "dp_world_size", "mp_world_size",
                "data_sampler", "random_ltd")
# The optimizer-state arrays read from a checkpoint: those zero's optimizers keep, under
# torch's names (csrc optimizer_state_names). DeepSpeed's CPU ops name some otherwise:
# DeepSpeedCPUAdagrad keeps Adagrad's sum as exp_avg_sq, and DeepSpeedCPULion an exp_avg_sq
# its kernel never touches beside its momentum exp_avg.
MOMENTS = ("exp_avg", "exp_avg_sq", "sum", "momentum_buffer")
_DEEPSPEED_ARRAYS = {"adagrad": {"exp_avg_sq": "sum"}, "lion": {"exp_avg": "exp_avg"}}


def rank_model_file(rank: int) -> str:
    """Stage 3's model file of data-parallel rank `rank`."""
    return f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"


class _Record:
    """A DeepSpeed object in a checkpoint, read without DeepSpeed: its fields, as attributes."""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "deepspeed" or module.startswith("deepspeed."):
            return _Record
        return super().find_class(module, name)


_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="pickle")


def load_file(path: str, mmap: bool = False) -> dict:
    """A DeepSpeed torch file (memory-mapped with `mmap`: tensors are read when touched)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PICKLE,
                          mmap=mmap)
    except Exception as error:
        raise CorruptCheckpoint(f"zero: cannot read DeepSpeed's {path}: {error}") from error


def is_deepspeed_checkpoint(path: str) -> bool:
    """A tag directory DeepSpeed wrote: no zero manifest, and DeepSpeed's model file naming the
    DeepSpeed version that wrote it."""
    if os.path.exists(os.path.join(path, MANIFEST)):
        return False
    for name in (WHOLE_MODEL_FILE, rank_model_file(0)):
        if os.path.isfile(os.path.join(path, name)):
            return "ds_version" in load_file(os.path.join(path, name), mmap=True)
    return False


@dataclasses.dataclass
class DeepSpeedCheckpoint:
    """One DeepSpeed checkpoint put back together by parameter name."""
    path: str
    model_state: dict          # rank 0's model file
    stage: int
    world_size: int
    master: dict               # name -> where its fp32 master lies (tied names too)
    moments: dict              # "exp_avg" / "exp_avg_sq" / ... -> name -> where it lies
    step: int                  # the optimizer's step count
    param_groups: list         # the optimizer's hyperparameters per group
    loss_scale: dict | None    # fp16: DeepSpeed's loss scaler's fields
    frozen: dict               # name -> value of a parameter the optimizer does not own
    universal: bool = False    # ds_to_universal's output (checkpoint_universal.py)
    # DeepSpeed-MoE's layers (moe/checkpoint.describe's records); their experts are named by
    # global id in `master`, `moments` and the module state
    moe_layers: list = dataclasses.field(default_factory=list)

    def module_state(self, dtype: torch.dtype) -> dict:
        """The module's state dict: the parameters from the fp32 master (in `dtype`, as
        DeepSpeed's bf16 weights are its master rounded), frozen parameters and buffers as
        saved (stage 3 saves empty placeholders for the parameters in its module)."""
        state = {name: value for name, value in self.model_state["module"].items()
                 if value.numel() or name in self.model_state.get("buffer_names", [])}
        state.update(self.frozen)
        state.update({name: value.whole().to(dtype) for name, value in self.master.items()})
        return state

    def client_state(self, rank: int, load_optimizer: bool, load_scheduler: bool,
                     module_only: bool) -> dict:
        """What DeepSpeed's load_checkpoint returns as client state: the model file's keys
        but the engine's own; at stage 3 this rank's own file's (each rank wrote one), when
        there is one for it."""
        state = self.model_state
        own = os.path.join(self.path, rank_model_file(rank))
        if self.stage == 3 and rank and os.path.isfile(own):
            state = load_file(own, mmap=True)
        kept = {"module"} if module_only else set(_ENGINE_KEYS)
        kept |= ({"optimizer"} if load_optimizer else set()) \
            | ({"lr_scheduler"} if load_scheduler else set())
        return {key: value for key, value in state.items() if key not in kept}


def read(path: str) -> DeepSpeedCheckpoint:
    """Reads every rank's files of a DeepSpeed checkpoint (tag directory `path`), mapped."""
    stage3 = os.path.isfile(os.path.join(path, rank_model_file(0)))
    model_file = rank_model_file(0) if stage3 else WHOLE_MODEL_FILE
    model_state = load_file(os.path.join(path, model_file), mmap=True)
    check_one_part(model_state, path)
    optim = _optimizer_files(path, model_state)
    world = len(optim)
    shapes = model_state["param_shapes"]
    experts = _moe_layers(path, model_state, optim[0], stage3)
    if experts:  # every expert under its global id beside the shared weights
        model_state["module"].update(moe_checkpoint.every_expert(
            path, experts, lambda file: load_file(file, mmap=True)))
        model_state["buffer_names"] = [  # rank 0's names: every expert's buffers
            name for buffer in model_state.get("buffer_names", [])
            for name in moe_checkpoint.on_every_expert_rank(experts, buffer)]
    copies = _group_copies(optim[0], world, shapes, experts, path)
    if stage3:
        if any(t.numel() == 0 for o in optim for t in o["fp32_flat_groups"]):
            raise ValueError(
                f"zero: DeepSpeed checkpoint {path} has empty fp32 sub-groups: it was saved with "
                "offload_optimizer to NVMe, whose swapped state is not in the checkpoint files; "
                "zero cannot resume it. Convert it to fp32 weights with DeepSpeed's "
                "zero_to_fp32.py")
        flats = [o["fp32_flat_groups"] for o in optim]  # per rank: its sub-groups
        adam = [o["optimizer_state_dict"] for o in optim]
        locate = _stage3_located
    else:
        flats = [o["single_partition_of_fp32_groups"] for o in optim]  # per rank: its groups
        adam = [_base_state(o["base_optimizer_state"], path) for o in optim]
        locate = _stage12_located
    paddings = optim[0].get("param_alignment_paddings") or [[0] * len(g) for g in shapes]
    master = locate(flats, shapes, paddings, path, copies)
    moments = {}
    for key in MOMENTS:  # another optimizer's state stays behind (check_fits says so)
        if all(key in state for a in adam for state in a["state"].values()) and adam[0]["state"]:
            laid_out_like_flats = [[a["state"][i][key] for i in sorted(a["state"])] for a in adam]
            moments[key] = locate(laid_out_like_flats, shapes, paddings, path, copies)
    frozen = frozen_parameters(path, model_state, stage3, world, master)
    tie_names(model_state, frozen, master, *moments.values())
    step = next(iter(adam[0]["state"].values()), {}).get("step", 0)
    return DeepSpeedCheckpoint(
        path=path, model_state=model_state, stage=3 if stage3 else zero_stage(optim[0]),
        world_size=world, master=master, moments=moments, step=int(step),
        param_groups=[{k: v for k, v in g.items() if k != "params"}
                      for g in adam[0]["param_groups"]],
        frozen=frozen, moe_layers=experts,
        loss_scale=record_fields(optim[0].get("loss_scaler")) or None)


def tie_names(model_state: dict, frozen: dict, *arrays: dict) -> None:
    """Adds each tied name DeepSpeed records (shared_params: name -> the name it saved) to
    the arrays that hold its source, or to `frozen` for a tie to a frozen parameter (as its
    zero_to_fp32 does)."""
    for alias, source in model_state.get("shared_params", {}).items():
        for values in arrays:
            if source in values:
                values[alias] = values[source]
        if source in frozen:
            frozen[alias] = frozen[source]


def _optimizer_files(path: str, model_state: dict) -> list[dict]:
    """Every rank's optimizer state, in rank order, mapped; a missing rank is named."""
    found = sorted((int(m.group(1)), m.group(0)) for m in map(_OPTIM.fullmatch,
                                                              os.listdir(path)) if m)
    if not found:
        raise ValueError(
            f"zero: DeepSpeed checkpoint {path} has no ZeRO optimizer files (it was saved "
            "without ZeRO, stage 0); zero resumes DeepSpeed checkpoints of ZeRO stages 1-3. "
            f"Load its weights, torch.load('{path}/{WHOLE_MODEL_FILE}')['module'], into the "
            "model before zero.initialize" + (
                " (with MoE layers each expert's from its layer_<L>_expert_<E>_mp_rank_00_"
                "model_states.pt, under its global id)" if model_state.get("num_experts")
                else ""))
    world = model_state.get("dp_world_size", len(found))
    if [rank for rank, _ in found] != list(range(world)):
        raise CorruptCheckpoint(
            f"zero: DeepSpeed checkpoint {path} was saved by {world} ranks but has the optimizer "
            f"files of ranks {[rank for rank, _ in found]}; copy every rank's "
            "zero_pp_rank_<r>_mp_rank_00_optim_states.pt into it")
    return [load_file(os.path.join(path, name), mmap=True)["optimizer_state_dict"]
            for _, name in found]


def _moe_layers(path: str, model_state: dict, optim: dict, stage3: bool) -> list[dict]:
    """DeepSpeed-MoE's layers, as zero's checkpoints describe them (moe/checkpoint.describe):
    each layer's module name from its first expert's file, its expert count from the model
    file, its ep_size from the name of the optimizer group holding its experts
    ("ep_size_<n>"), the rank layout from the config. [] for a model without MoE layers."""
    if model_state.get("ds_autoep_layers"):
        raise NotImplementedError(
            f"zero: DeepSpeed checkpoint {path} is of a model with AutoEP layers "
            "(expert_parallel), which zero does not build; convert it to fp32 weights with "
            "DeepSpeed's zero_to_fp32.py and load those into the model")
    counts = model_state.get("num_experts") or []
    if not counts:
        return []
    if not isinstance(counts, (list, tuple)):
        raise ValueError(f"zero: DeepSpeed checkpoint {path} records num_experts={counts!r}, "
                         "an older DeepSpeed's MoE record that zero does not read; load its "
                         "weights with load_optimizer_states=False after converting it with "
                         "DeepSpeed's zero_to_fp32.py")
    if stage3:  # (DeepSpeed refuses its MoE at stage 3: no such checkpoint is written)
        raise ValueError(f"zero: DeepSpeed checkpoint {path} has MoE layers at ZeRO stage 3, "
                         "which DeepSpeed does not write; the files are not DeepSpeed's")
    groups = _base_state(optim["base_optimizer_state"], path)["param_groups"] \
        if "base_optimizer_state" in optim else []
    ep_sizes = {moe_checkpoint.layer_name(name): int(group["name"].rsplit("_", 1)[1])
                for group, shapes in zip(groups, model_state["param_shapes"])
                if group.get("moe") for name in shapes}
    data_before_expert = bool(model_state.get("ds_config", {}).get(
        "use_data_before_expert_parallelism", False))
    layers = []
    for index, count in enumerate(counts):
        file = os.path.join(path, moe_checkpoint.expert_file(index, 0))
        key = next(iter(load_file(file, mmap=True)), "")
        if not moe_checkpoint.is_expert_key(key):
            raise CorruptCheckpoint(f"zero: {file} holds no DeepSpeed-MoE expert "
                                    f"(...{moe_checkpoint.EXPERTS}<id>... keys)")
        name = moe_checkpoint.layer_name(key)
        layers.append({"name": name, "num_experts": int(count),
                       "ep_size": ep_sizes.get(name, 1), "data_before_expert": data_before_expert})
    return layers


def _group_copies(optim: dict, world: int, shapes: list[dict], moe_layers: list[dict],
                  path: str) -> list[list]:
    """Per group, where its flat buffer lies (moe/checkpoint.copies): over every rank that
    wrote files, or an expert group over each expert data-parallel group; any other group
    partitioned over fewer ranks (MiCS) is refused."""
    counts = optim.get("partition_count", world)
    counts = counts if isinstance(counts, (list, tuple)) else [counts] * len(shapes)
    found = []
    for count, names in zip(counts, shapes):
        found.append(moe_checkpoint.copies(moe_layers, world, int(count), list(names)))
        if sum(len(ranks) for ranks, _ in found[-1]) != world:
            raise ValueError(
                f"zero: DeepSpeed checkpoint {path} partitions its groups over {list(counts)} "
                f"ranks of the {world} that saved it (MiCS, or expert groups other than its "
                "MoE layers'); zero reads DeepSpeed checkpoints partitioned over every "
                "data-parallel rank or expert data-parallel group. Convert it to fp32 weights "
                "with DeepSpeed's zero_to_fp32.py")
    return found


def _base_state(state, path: str) -> dict:
    """Stages 1-2: the torch optimizer's state_dict over the flat groups."""
    if not isinstance(state, dict):  # elastic_checkpoint's list of per-group states
        raise ValueError(
            f"zero: DeepSpeed checkpoint {path} was saved with zero_optimization."
            "elastic_checkpoint, whose optimizer state zero does not read; load it with "
            "load_optimizer_states=False, or save it again from DeepSpeed without that option")
    return state


def record_fields(value) -> dict:
    """The fields of a DeepSpeed object read from a checkpoint ({} for anything else)."""
    return dict(vars(value)) if isinstance(value, _Record) else {}


def zero_stage(optim: dict) -> int:
    """The ZeRO stage the files were written at (1 or 2; 3 has its own file names)."""
    stage = optim.get("zero_stage")
    if isinstance(stage, _Record):  # DeepSpeed's ZeroStageEnum, pickled as its value
        return int(stage.args[0])
    return 1 if stage is None else int(stage)  # BF16_Optimizer (stage 1) records none


def check_one_part(model_state: dict, path: str) -> None:
    dims = model_state.get("checkpoint_parallel_dimensions", {})
    if model_state.get("mp_world_size", 1) != 1 or dims.get("pp_degree", 1) != 1:
        raise ValueError(
            f"zero: DeepSpeed checkpoint {path} is split over model-parallel ranks "
            f"(mp_world_size={model_state.get('mp_world_size')}, pipeline degree "
            f"{dims.get('pp_degree', 1)}); zero reads DeepSpeed checkpoints of the whole model. "
            "Convert it to fp32 weights with DeepSpeed's zero_to_fp32.py and load those into "
            "the model before zero.initialize")


def _stage12_located(flats: list[list[torch.Tensor]], shapes: list[dict],
                     paddings: list[list[int]], path: str, copies: list[list]
                     ) -> dict[str, Located]:
    """Stages 1-2: group g's flat buffer is its ranks' partitions end to end (flats[r][g]:
    every rank's, or an expert group's each expert data-parallel group's, one buffer per
    expert-parallel rank, its experts renamed to their global ids: `copies`), its parameters
    one after another from offset 0, each followed by its alignment padding (DeepSpeed's
    parameter_alignment; the group's tail is padding too)."""
    values = {}
    for g, group in enumerate(shapes):
        for ranks, rename in copies[g]:
            full = Flat([flats[r][g] for r in ranks])
            offset = 0
            for (name, shape), padding in zip(group.items(), paddings[g]):
                values[rename(name)] = _located(full, shape, offset, name, path)
                offset += math.prod(shape) + padding
    return values


def _stage3_located(flats: list[list[torch.Tensor]], shapes: list[dict], paddings, path: str,
                    copies) -> dict[str, Located]:
    """Stage 3: rank r's flat buffer (its sub-groups end to end, flats[r]) holds its
    ceil(numel / world) piece of every parameter in order, the last rank's shorter."""
    del paddings, copies  # stage 3 pads each parameter to a multiple of the world size instead
    ranks = [Flat(rank_flats) for rank_flats in flats]
    values, offset = {}, 0
    for group in shapes:
        for name, shape in group.items():
            counts = _stage3_counts(math.prod(shape), len(ranks))
            pieces = [_located(flat, [count], offset, name, path)
                      for flat, count in zip(ranks, counts) if count]
            values[name] = Located(shape, [run for p in pieces for run in p.runs],
                                   ranks[0].dtype)
            offset += counts[0]
    return values


def _stage3_counts(numel: int, world: int) -> list[int]:
    """How many of a parameter's elements each rank holds at DeepSpeed's stage 3: pieces of
    ceil(numel / world), the last ones shorter or empty (the rest of each is padding)."""
    piece = math.ceil(numel / world)
    return [max(0, min(piece, numel - r * piece)) for r in range(world)]


def _located(flat: Flat, shape, offset: int, name: str, path: str) -> Located:
    try:
        return flat.located(shape, offset)
    except ValueError as error:
        raise CorruptCheckpoint(
            f"zero: DeepSpeed checkpoint {path} holds too few master elements for its "
            f"param_shapes at {name} ({error}); the files are of different saves or "
            "truncated") from error


def frozen_parameters(path: str, model_state: dict, stage3: bool, world: int,
                      master: dict) -> dict:
    """The parameters the optimizer does not own (frozen, or of no elements): whole in the
    module at stages 1-2 (with MoE an expert's in its own file), rank fragments at stage 3."""
    if not stage3:  # (stage 1 records no frozen_param_shapes)
        owned = set(master) | set(model_state.get("shared_params", {}))
        owned |= set(model_state.get("buffer_names", []))
        return {name: value for name, value in model_state["module"].items()
                if name not in owned}
    shapes = model_state.get("frozen_param_shapes") or {}
    fragments = [load_file(os.path.join(path, rank_model_file(r)))["frozen_param_fragments"]
                 for r in range(world)] if shapes else []
    frozen = {}
    for name, shape in shapes.items():  # each rank's fragment is its stage-3 piece
        counts = _stage3_counts(math.prod(shape), world)
        frozen[name] = Located(shape, [(Flat([f[name]]), 0, count) for f, count in
                                       zip(fragments, counts) if count],
                               fragments[0][name].dtype).whole()
    return frozen


def load_into(engine, saved: DeepSpeedCheckpoint, load_shards: bool, load_module,
              module_only: bool = False) -> None:
    """The module from the fp32 master, written by `load_module(state)`
    (engine.load_module_weights with the load's strict and custom_load_fn); with
    `load_shards` this rank's shards of every engine group's master and moments, cut from the
    files (checkpoint_pieces.shard_from).
    Without them the master follows the module, as DeepSpeed 0.19.8's load_checkpoint
    rebuilds it from the 16-bit weights (_restore_from_bit16_weights), except from a
    universal checkpoint, whose fp32 master DeepSpeed loads whatever the flags say (and its
    moments too: zero leaves those out when asked to; tests/deepspeed_checkpoints/*/loaded.pt
    holds what DeepSpeed does). `module_only`: the master always follows the module."""
    state = saved.module_state(engine.dtype)
    if engine.moe is not None:  # this rank's experts under their local ids
        state = moe_checkpoint.localized(engine.module, state)
    load_module(state)
    if module_only or not (load_shards or saved.universal):
        checkpoint_layout.refresh_masters(engine.core)
        return
    moments = engine_moments(engine, saved) if load_shards else {}
    for g, wanted in enumerate(checkpoint_layout.global_param_names(engine)):
        checkpoint_layout.load_group(engine, g, wanted, saved.master, moments)


def _engine_arrays(engine) -> set[str]:
    """The optimizer-state arrays the engine keeps per element (not a delayed update's own
    state), over its groups (Muon's keep the momentum, its Adam's the moments), copying
    nothing."""
    return {name for g in range(engine.core.group_count)
            for name in engine.core.group_state_names(g)}


def engine_moments(engine, saved: DeepSpeedCheckpoint) -> dict | None:
    """The saved optimizer-state arrays under the engine's names (DeepSpeed's CPU Adagrad and
    Lion name theirs otherwise); None when they are not what the engine's optimizer keeps. A
    Lion checkpoint is told from an Adam one, whose arrays have the same names, by its
    hyperparameters (Lion has no eps)."""
    names = _engine_arrays(engine)
    kind = engine.optimizer.spec.kind
    # DeepSpeed's files hold no state of an external optimizer that is not per element; of
    # Muon's, zero reads the universal form (each parameter's arrays), not DeepSpeed's flat
    # partitions
    if kind == "external" or (kind == "muon" and not saved.universal):
        return None
    lion = all("betas" in group and "eps" not in group for group in saved.param_groups)
    if lion != (kind == "lion"):
        return None
    if set(saved.moments) == names:
        return dict(saved.moments)
    renamed = _DEEPSPEED_ARRAYS.get(kind, {})
    if set(renamed) <= set(saved.moments) and set(renamed.values()) == names:
        return {ours: saved.moments[theirs] for theirs, ours in renamed.items()}
    return None


def check_fits(engine, saved: DeepSpeedCheckpoint, load_shards: bool) -> None:
    """Before anything is loaded: the same trainable parameters and shapes, the checkpoint's
    optimizer here when its state is to be loaded, and one optimizer group per group."""
    where = f"DeepSpeed checkpoint {saved.path}"
    if saved.moe_layers or engine.moe is not None:
        moe_checkpoint.check_layers({"moe": saved.moe_layers}, engine.module, saved.path)
    trainable = {n for group in checkpoint_layout.global_param_names(engine) for n in group}
    rename = checkpoint_layout.global_name(engine)  # MoE: an expert by its global id
    whole = ep_checkpoint.whole_shapes(engine.module, engine.full_shapes)  # AutoEP's rows
    checkpoint_layout.check_same_model(
        where, saved.master, {rename(name): shape for name, shape in whole.items()},
        required=sorted(trainable))
    if load_shards:
        _check_optimizer(engine, saved, trainable)


def _check_optimizer(engine, saved: DeepSpeedCheckpoint, trainable: set[str]) -> None:
    """The engine's optimizer state arrays in the checkpoint, and the same parameters in each
    optimizer group."""
    names = _engine_arrays(engine)
    if engine_moments(engine, saved) is None:
        raise ValueError(
            f"zero: DeepSpeed checkpoint {saved.path} holds the optimizer state "
            f"{sorted(saved.moments) or 'of an optimizer zero does not build'}, this engine's "
            f"optimizer ({engine.optimizer.spec.kind}) keeps {sorted(names)}; zero resumes "
            "Adam, AdamW, Adagrad, Lion, Lamb and SGD from DeepSpeed: configure the optimizer the "
            "checkpoint was trained with, or load with load_optimizer_states=False")
    # by names without expert ids (moe/checkpoint.generic): rank 0's experts saved, this
    # rank's now, at any ep_size
    generic = moe_checkpoint.generic
    trainable = {generic(name) for name in trainable}
    saved_groups = [{generic(name) for name in group} & trainable
                    for group in saved.model_state["param_shapes"]]
    by_id = names_by_id(engine.module)
    groups = [{generic(by_id[id(p)][0]) for p in group["params"]} & trainable
              for group in engine.optimizer.param_groups]
    if len(saved.param_groups) != len(groups) or (len(saved_groups) == len(groups)
                                                  and saved_groups != groups):
        raise ValueError(
            f"zero: DeepSpeed checkpoint {saved.path} has {len(saved.param_groups)} optimizer "
            f"groups of {[len(g) for g in saved_groups]} parameters, the engine "
            f"{len(groups)} of {[len(g) for g in groups]}; pass the parameter groups the "
            "checkpoint was trained with, in its order")


def restore_engine_state(engine, saved: DeepSpeedCheckpoint, load_optimizer: bool,
                         load_scheduler: bool) -> None:
    """Hyperparameters, scheduler and counters, as DeepSpeed's load_checkpoint restores them."""
    state = saved.model_state
    if load_optimizer:
        for group, values in zip(engine.optimizer.param_groups, saved.param_groups):
            group.update({k: v for k, v in hyperparameters(values).items() if k in group})
        engine.applied_steps = saved.step
        _restore_loss_scale(engine, saved)
    if load_scheduler and engine.lr_scheduler is not None and state.get("lr_scheduler"):
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    engine.global_steps = state["global_steps"]
    engine.global_samples = state.get("global_samples",
                                      state["global_steps"] * engine.train_batch_size())
    engine.skipped_steps = state["skipped_steps"]


def _restore_loss_scale(engine, saved: DeepSpeedCheckpoint) -> None:
    """fp16: zero's dynamic scaler keeps DeepSpeed's DynamicLossScaler's own fields
    (cur_scale, cur_iter, last_overflow_iter, cur_hysteresis); a static scale is the config's."""
    scaler = engine.loss_scaler
    if scaler is None or not saved.loss_scale or not saved.loss_scale.get("dynamic"):
        return
    state = scaler.state_dict()
    if state.get("dynamic"):
        scaler.load_state_dict({**state, **{k: saved.loss_scale[k] for k in state
                                            if k in saved.loss_scale}})
