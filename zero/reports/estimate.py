"""Per-rank memory of model states before training: what the engine will allocate.

The estimate is exact, not a paper formula: the parameters are laid out with the engine's own
planner (`zero._C.ShardedLayout` / `plan_partition`: every unit padded to a multiple of
world_size x alignment, alignment = 16 bytes / element size; stage 0 lays out for one rank),
and every category is the byte count the engine's accounting registry reports after a step:

    param            b·Ψ (stages 0-2)         stage 3: b·Ψ/N + b·Ψp
    gradient         b·Ψ (stages 0, 1)        b·Ψ/N (stage 2)      stage 3: b·Ψ/N + b·Ψp
                     (stages 2-3 with the whole optimizer step offloaded: the b·Ψ/N shard
                     in host memory)
    fp32_master      4·Ψ (stage 0)            4·Ψ/N (stages >= 1; stage 3 + 4·Ψp/N)
                     0 when training in fp32 without optimizer offload (the parameter
                     shard is the master)
    optimizer_state  8·Ψ or 8·Ψ/N (Adam)      4· (SGD with momentum)    0 (plain SGD)
    bucket           0 (stages 0, 1)          stages 2 and 3: Σ over groups of
                                              min(slots, units)·(U + U/N)·b,
                                              U = the group's largest unit, slots = 2 with
                                              overlap_comm, else 1 (stage 3, 1 slot: 2 in
                                              backward when the root's bucket fills over all
                                              of it; `stage3.bucket_kept_bytes` is the pool
                                              between steps)
    gathered_param   0 (stages 0-2)           stage 3: W·b, W = the most elements gathered at
                                              once (peak), from the gather schedule's rule

Stages 0-2: units are cut from the parameters at reduce_bucket_size elements. Stage 3
(`zero/stage3.py::plan_units`, the engine's rule): gather units are the modules marked with
`zero.gather_unit` / `set_z3_leaf_modules`, else the children of every nn.ModuleList, plus
the root unit with everything else; Ψ counts the partitioned parameters (numel >
stage3_param_persistence_threshold), every unit its own buffer; Ψp the persistent ones, kept
whole as a stage-1 group (units of reduce_bucket_size), reported apart.

The stage-3 working set W comes from running the engine's own gather schedule
(csrc/adapter/gather_schedule.cpp, through _C.simulate_schedule: no tensors, no process
group) on the unit sizes, with the same bounds
(stage3_prefetch_bucket_size, stage3_max_live_parameters, stage3_max_reuse_distance,
stage3_max_inflight_gathers) over two micro-steps (the first records the order, the second
prefetches and keeps units for reuse). It assumes the forward runs every unit once, in
definition order, inside the root (a transformer's blocks); a model that calls a unit twice
or in another order gathers differently. See `simulate_stage3_schedule`.

Offload (built, exact against the engine; `offload_optimizer` at stages 1-3, `offload_param`
cpu and nvme at stage 3): fp32_master and optimizer_state move to the host (cpu) or to NVMe
(the registry's `nvme` location: a swap file); an offloaded optimizer always keeps an fp32
master, fp32 training included. At stages 2-3 with the whole step offloaded (ratio 1) the
gradient shard is in host memory too (stage 3: the partitioned group's). Every engine group
(stages 1-2: one per optimizer group; stage 3: the partitioned group and the persistent
stage-1 group) owns one host pool that adds `staging`:

    chunk C          min(sub_group_size, 4,194,304, the group's Ψ/N) elements
    cpu              2 slots x (C·b gradients + C·b parameters if the model is 16-bit);
                     with offload_optimizer.delayed_update also the shard's gradients and
                     new parameters, 2 x b·Ψ/N
    nvme             the cpu chunks (no delayed update with NVMe) + 2 slots x each state
                     array (master, exp_avg, exp_avg_sq; master + momentum; master) x
                     round_up(4·C, 4096) bytes; the state itself on NVMe
    offload_param    the partitioned parameter shard b·Ψ/N on the host (the persistent part
                     stays on the device); every gather copies the unit's shard piece to a
                     device staging buffer held until its all-gather completes: device
                     staging = b x the most shard elements in flight at once (replayed)

    offload_param    as cpu, but per partitioned group the units in order stay in host
      nvme           memory while their shards add up to at most max_in_cpu (default 0); the
                     first that does not fit and every later one go to the swap file (param at
                     `nvme`: b x their shard elements, unrounded). Host staging + buffer_count
                     x round_up(b·V, 4096), V = the group's largest NVMe unit shard (the
                     engine raises when V > buffer_size: so does the estimate); swap file
                     Σ round_up(b·s_u, 4096) over the NVMe units

    ratio < 1        offload_optimizer.ratio: of every group's shard only the tail,
                     llround(ratio x Ψ/N) elements, keeps its master and state offloaded (the
                     pool and its chunks are sized for the tail); the head keeps master and
                     state on the device, an fp32 master included

Activations are estimated separately, from a sample input (`activations.py`, CLI
`--sample-input`). Not estimated: autograd's transient full-size gradients before a
parameter's hook copies them into the bucket, temporaries of the optimizer step, and
framework / allocator overhead. Leave room for them (`zero-mem tune --reserve`).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import torch

from offload import OFFLOAD_TILE

PRECISIONS = ("fp32", "bf16", "fp16")
PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
OPTIMIZERS = ("adam", "sgd", "sgd_momentum")
OPTIMIZER_STATE_BYTES = {"adam": 8, "sgd": 0, "sgd_momentum": 4}  # fp32 bytes per element
# Every parameter starts 16-byte aligned in its flat buffer (zero/engine.py ALIGNMENT_BYTES;
# a test keeps the two equal).
ALIGNMENT_BYTES = 16
DEFAULT_REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's default, as in the config schema
# Stage-3 defaults of the config schema (zero/config/schema.py; a test keeps them equal).
DEFAULT_PERSISTENCE_THRESHOLD = 100_000
DEFAULT_PREFETCH_BUCKET_SIZE = 50_000_000
DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000
DEFAULT_MAX_REUSE_DISTANCE = 1_000_000_000
DEFAULT_MAX_INFLIGHT_GATHERS = 2

# Offload (OFFLOAD_TILE from offload/options.py, the engine's own constant;
# csrc/core/aligned_buffer.h kIoAlignment): the offloaded step streams chunks of at most
# OFFLOAD_TILE elements, and NVMe staging chunks are rounded up to whole I/O pages.
IO_ALIGNMENT = 4096
DEFAULT_SUB_GROUP_SIZE = 1_000_000_000
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# offload_param "nvme" defaults (zero/config/schema.py OFFLOAD_PARAM; a test keeps them equal)
DEFAULT_PARAM_BUFFER_COUNT = 5
DEFAULT_PARAM_BUFFER_SIZE = 100_000_000
DEFAULT_PARAM_MAX_IN_CPU = 0
_BUFFER_COUNT_ERROR = ("zero_optimization.offload_param.buffer_count = {}: parameters on NVMe "
                       "need at least 2 host buffers (one unit is read while another is written "
                       "back)")
LOCATIONS = ("device", "host", "nvme")

BUILT = "built"
# No option of OPTIONS is formula-only any more (offload_param nvme is built); the status
# stays for an option added before the engine builds it.
FORMULA_ONLY = "formula only — not yet built/measured"
# Stage 3 without gather units (a ModelShapes made by hand with no `units`): the paper's
# formula on the padded numbers, not checked against the engine.
STAGE3_FORMULA = "formula — stage 3 built, estimate not checked against it"
# Stage 3 from --params: the units are assumed (see shapes_from_count), so are W and U.
STAGE3_ASSUMED_UNITS = "built — stage-3 units assumed (--params), not the model's"

# --params without --units: at most this many assumed stage-3 gather units.
MAX_ASSUMED_UNITS = 1024

GiB = 1024 ** 3
MiB = 1024 ** 2
KiB = 1024


class EstimateError(ValueError):
    """Bad input to the estimator (model source, config, sizes); the message says what to do."""


# ---- sizes ----------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2,
          "g": 1000 ** 3, "gb": 1000 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4,
          "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024 ** 4}


def parse_bytes(text: str | int | float) -> int:
    """'2GiB', '512 MiB', '1.5GB' (decimal), '3e9' or a plain number of bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise EstimateError(f"cannot read the size {text!r}: write e.g. 2GiB, 512MiB, 1.5GB or a "
                            "number of bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_count(text: str | int | float) -> int:
    """An element count: '125000000', '1.3e9', '7B', '350M', '20k'."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*", str(text))
    if not match:
        raise EstimateError(f"cannot read the count {text!r}: write e.g. 125000000, 1.3e9, 350M "
                            "or 7B")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
    return int(round(float(match.group(1)) * scale))


def format_bytes(value: int | float) -> str:
    """GiB from 1 GiB up, MiB below (KiB under 0.01 MiB), always labelled."""
    value = float(value)
    if value == 0:
        return "0"
    if abs(value) >= GiB:
        return f"{value / GiB:.2f} GiB"
    if abs(value) >= 0.01 * MiB:
        return f"{value / MiB:.3f} MiB" if abs(value) < 10 * MiB else f"{value / MiB:.1f} MiB"
    return f"{value / KiB:.2f} KiB"


# ---- the model: parameter shapes ------------------------------------------------------------

@dataclass(frozen=True)
class ModelShapes:
    """Trainable parameter shapes per optimizer group (engine order), and what is frozen."""
    groups: tuple[tuple[tuple[int, ...], ...], ...]
    description: str
    exact: bool = True            # False: --params N, shapes are a stand-in (see shapes_from_count)
    frozen_numel: int = 0          # requires_grad=False: not managed by the engine
    note: str = ""
    # Stage 3: the gather unit (zero.stage3.plan_units; 0 is the root) of every shape above,
    # nested like `groups`; None when unknown (stage 3 is then a formula only).
    units: Optional[tuple[tuple[int, ...], ...]] = None
    unit_names: tuple[str, ...] = ()          # per unit index ("" is the root)
    # (user unit, owner unit) per register_external_parameter link
    externals: tuple[tuple[int, int], ...] = ()
    # Stage 3, per shape (nested like `groups`): a root-unit parameter registered after the
    # first parameter of another unit (a final norm, an untied head): in a sequential model
    # it is used after the blocks, so its gradient arrives at the start of backward.
    root_late: Optional[tuple[tuple[bool, ...], ...]] = None

    @property
    def trainable_numel(self) -> int:
        return sum(_numel(shape) for group in self.groups for shape in group)

    @property
    def largest_param_numel(self) -> int:
        return max((_numel(shape) for group in self.groups for shape in group), default=0)

    @property
    def tensor_count(self) -> int:
        return sum(len(group) for group in self.groups)

    @property
    def has_units(self) -> bool:
        return self.units is not None


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for dim in shape:
        out *= max(int(dim), 0)
    return out


def shapes_from_module(module: torch.nn.Module, description: str | None = None,
                       param_groups: Iterable | None = None) -> ModelShapes:
    """The shapes the engine will manage: trainable parameters in `module.parameters()` order
    (tied parameters once), one group, as `zero.initialize(model=..., config=...)` does with a
    config optimizer. `param_groups` (a list of lists of parameters, or of dicts with
    "params") mirrors a client optimizer's groups instead. Stage 3: every shape's gather unit
    from `zero.stage3.plan_units` (the engine's rule), the units' names, the
    register_external_parameter links, and which root parameters come after the blocks."""
    if not isinstance(module, torch.nn.Module):
        raise EstimateError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if param_groups is None:
        raw_groups = [list(module.parameters())]
    else:
        raw_groups = [list(g["params"]) if isinstance(g, Mapping) else list(g)
                      for g in param_groups]
    from zero import stage3

    plan = stage3.plan_units(module)  # the engine's gather units (stage 3)
    position = {id(p): i for i, p in enumerate(module.parameters())}  # first registration
    first_block = min((position[id(p)] for p in module.parameters()
                       if plan.unit_of_param.get(id(p), 0) != 0), default=len(position))
    groups, units, late, seen = [], [], [], set()
    for raw in raw_groups:
        shapes, unit_ids, late_ids = [], [], []
        for param in raw:
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            shapes.append(tuple(int(d) for d in param.shape))
            unit = plan.unit_of_param.get(id(param), 0)
            unit_ids.append(unit)
            late_ids.append(unit == 0 and position.get(id(param), -1) > first_block)
        if shapes:
            groups.append(tuple(shapes))
            units.append(tuple(unit_ids))
            late.append(tuple(late_ids))
    if not groups:
        raise EstimateError("the model has no trainable parameters")
    unique = {id(p): p for p in module.parameters()}
    frozen = sum(p.numel() for p in unique.values() if not p.requires_grad)
    return ModelShapes(groups=tuple(groups), description=description or type(module).__name__,
                       exact=True, frozen_numel=frozen, units=tuple(units),
                       unit_names=tuple(name for name, _ in plan.modules),
                       externals=tuple(stage3.external_links(plan)),
                       root_late=tuple(late))


def _import_factory(spec: str):
    """'package.module:callable' or 'path/to/file.py:callable' -> the callable."""
    if ":" not in spec:
        raise EstimateError(f"--model {spec!r}: expected module.path:factory (a callable that "
                            "returns an nn.Module), e.g. zero.models.tiny_gpt:TinyGPT")
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            if not os.path.exists(path):
                raise EstimateError(f"--model {spec!r}: no file {path}")
            directory = os.path.dirname(path)
            if directory not in sys.path:
                sys.path.insert(0, directory)  # the file's own imports of its neighbours
            name = os.path.splitext(os.path.basename(path))[0]
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the current folder imports
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise EstimateError(f"--model {spec!r}: cannot import {module_name!r}: {error}") from None
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise EstimateError(f"--model {spec!r}: {module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise EstimateError(f"--model {spec!r}: {attr} is not callable")
    return target


def build_on_meta(factory, *args, **kwargs) -> torch.nn.Module:
    """Calls the factory with the meta device as the default: shapes without storage."""
    with torch.device("meta"):
        model = factory(*args, **kwargs)
    if not isinstance(model, torch.nn.Module):
        raise EstimateError(f"the model factory returned {type(model).__name__}, not an "
                            "nn.Module")
    return model


def shapes_from_factory(spec: str) -> ModelShapes:
    """`module.path:factory`: the model built on the meta device (nothing allocated)."""
    model = build_on_meta(_import_factory(spec))
    return shapes_from_module(model, description=f"{type(model).__name__} ({spec})")


def model_from_hf_config(path: str, on_meta: bool = True) -> torch.nn.Module:
    """A Hugging Face config.json (or its folder), built on meta. Needs `transformers`, which
    zero does not require: without it this raises an EstimateError that says so."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise EstimateError(
            "--hf-config needs the `transformers` package, which is not installed (zero does not "
            "require it). Install it (pip install transformers) or describe the model another "
            "way: --model module.path:factory (exact) or --params N (approximate)") from None
    config_file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(config_file, encoding="utf-8") as handle:
            values = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise EstimateError(f"--hf-config {path!r}: cannot read {config_file}: {error}") from None
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise EstimateError(f"--hf-config {config_file}: no \"model_type\" key")
    config = transformers.AutoConfig.for_model(model_type, **values)
    build = build_on_meta if on_meta else (lambda factory, *args: factory(*args))
    try:
        model = build(transformers.AutoModelForCausalLM.from_config, config)
    except ValueError:
        model = build(transformers.AutoModel.from_config, config)
    model.zero_config_file = config_file
    return model


def shapes_from_hf_config(path: str) -> ModelShapes:
    model = model_from_hf_config(path)
    return shapes_from_module(model, description=f"{type(model).__name__} ({model.zero_config_file})")


def shapes_from_count(count: int, tensor_numel: int | None = None,
                      reduce_bucket_size: int = DEFAULT_REDUCE_BUCKET_SIZE,
                      units: int | None = None) -> ModelShapes:
    """`--params N` without shapes: N elements as ceil(N / T) tensors of T elements (the last
    one smaller), T = tensor_numel or, by default, min(N, reduce_bucket_size), so that the
    largest unit is about reduce_bucket_size, as in a real model whose layers are smaller than
    a bucket.

    Stage 3 needs gather units, which a count does not have. The assumption: without `units`,
    every stand-in tensor is one gather unit (the largest-tensor heuristic: a unit of T
    elements; beyond MAX_ASSUMED_UNITS tensors they are split evenly over that many units, to
    keep the schedule replay quick); with `units=K`, the model is K gather units of equal size (K transformer
    blocks; the tensors are then K tensors of about N/K elements, or, with tensor_numel, the
    T-element tensors split over K units as evenly as they go). The root unit holds nothing.

    What this gets right: every byte count that is a multiple of Ψ, to within the padding
    (at most world_size x alignment - 1 elements per unit). What it cannot know: the real
    unit boundaries and the largest parameter, so the stage-2 bucket and the stage-3 bucket
    and working set are estimates; a model with a parameter larger than reduce_bucket_size
    has larger buckets. Use --model for an exact answer."""
    count = int(count)
    if count < 1:
        raise EstimateError(f"--params must be >= 1, got {count}")
    if units is not None and (int(units) < 1 or int(units) > count):
        raise EstimateError(f"--units must be between 1 and --params ({count:,}), got {units}")
    if units is not None and not tensor_numel:
        k = int(units)
        base, extra = divmod(count, k)
        shapes = [(base + 1,)] * extra + [(base,)] * (k - extra)
        unit_ids = list(range(1, k + 1))
        size = base + bool(extra)
    else:
        size = int(tensor_numel) if tensor_numel else min(count, int(reduce_bucket_size))
        if size < 1:
            raise EstimateError(f"--tensor-numel must be >= 1, got {size}")
        full, rest = divmod(count, size)
        if full + bool(rest) > 200_000:
            raise EstimateError(f"--params {count} as tensors of {size} elements is "
                                f"{full + bool(rest):,} tensors; pass a larger --tensor-numel")
        shapes = [(size,)] * full + ([(rest,)] if rest else [])
        if units is None and len(shapes) <= MAX_ASSUMED_UNITS:
            unit_ids = list(range(1, len(shapes) + 1))
        elif units is None:
            unit_ids = [1 + i * MAX_ASSUMED_UNITS // len(shapes) for i in range(len(shapes))]
        else:
            if int(units) > len(shapes):
                raise EstimateError(f"--units {units}: only {len(shapes)} tensor(s) of "
                                    f"{size:,} elements to split; pass a smaller --tensor-numel")
            unit_ids = [1 + i * int(units) // len(shapes) for i in range(len(shapes))]
    unit_count = max(unit_ids)
    stage3_text = (f"{unit_count} equal gather unit(s) (--units)" if units is not None else
                   "each tensor one gather unit (pass --units K for K equal blocks)"
                   if unit_count == len(shapes) else
                   f"the tensors split evenly over {unit_count} gather units (--units K for K)")
    return ModelShapes(groups=(tuple(shapes),), description=f"{count:,} parameters (--params)",
                       exact=False, units=(tuple(unit_ids),),
                       unit_names=("",) + tuple(f"unit{i}" for i in range(1, unit_count + 1)),
                       note=f"approximate layout: {len(shapes)} tensor(s) of at most {size:,} "
                            f"elements stand in for the real shapes; stage 3: {stage3_text} "
                            "(exact padding, buckets and working set need them: use --model)")


# ---- the training set-up ----------------------------------------------------------------------

@dataclass(frozen=True)
class Setup:
    """What the estimate depends on besides the shapes."""
    world_size: int = 1
    num_nodes: int = 1
    precision: str = "fp32"
    optimizer: str = "adam"          # adam | sgd | sgd_momentum
    reduce_bucket_size: int = DEFAULT_REDUCE_BUCKET_SIZE
    overlap_comm: Optional[bool] = None  # None: DeepSpeed's default, stage == 3
    # stage 3 (zero_optimization.stage3_*), in elements
    persistence_threshold: int = DEFAULT_PERSISTENCE_THRESHOLD
    prefetch_bucket_size: int = DEFAULT_PREFETCH_BUCKET_SIZE
    max_live_parameters: int = DEFAULT_MAX_LIVE_PARAMETERS
    max_reuse_distance: int = DEFAULT_MAX_REUSE_DISTANCE
    max_inflight_gathers: int = DEFAULT_MAX_INFLIGHT_GATHERS
    # offload: the configured devices (which row `estimate(shapes, setup, stage)` gives and the
    # table marks) and the chunk of the offloaded step
    offload_optimizer: str = "none"   # none | cpu | nvme
    offload_param: str = "none"       # none | cpu | nvme
    sub_group_size: int = DEFAULT_SUB_GROUP_SIZE
    delayed_update: bool = False      # offload_optimizer.delayed_update (cpu only)
    offload_ratio: float = 1.0        # offload_optimizer.ratio: the offloaded tail of each shard
    # offload_param "nvme" (zero_optimization.offload_param.*): host buffers that carry units
    # to and from the swap file, the most shard elements one NVMe unit may have, and the shard
    # elements of the first units kept in host memory
    param_buffer_count: int = DEFAULT_PARAM_BUFFER_COUNT
    param_buffer_size: int = DEFAULT_PARAM_BUFFER_SIZE
    param_max_in_cpu: int = DEFAULT_PARAM_MAX_IN_CPU

    def __post_init__(self):
        if self.world_size < 1:
            raise EstimateError(f"world size must be >= 1, got {self.world_size}")
        if self.num_nodes < 1 or self.world_size % self.num_nodes:
            raise EstimateError(f"{self.world_size} ranks do not split evenly over "
                                f"{self.num_nodes} nodes")
        if self.precision not in PRECISIONS:
            raise EstimateError(f"precision {self.precision!r}: expected one of {PRECISIONS}")
        if self.optimizer not in OPTIMIZERS:
            raise EstimateError(f"optimizer {self.optimizer!r}: expected one of {OPTIMIZERS}")
        if self.reduce_bucket_size < 1:
            raise EstimateError(f"reduce_bucket_size must be >= 1, got {self.reduce_bucket_size}")
        for name in ("persistence_threshold", "prefetch_bucket_size", "max_live_parameters",
                     "max_reuse_distance"):
            if getattr(self, name) < 0:
                raise EstimateError(f"stage3 {name} must be >= 0, got {getattr(self, name)}")
        if self.max_inflight_gathers < 1:
            raise EstimateError(f"stage3 max_inflight_gathers must be >= 1, got "
                                f"{self.max_inflight_gathers}")
        for name in ("offload_optimizer", "offload_param"):
            if getattr(self, name) not in OFFLOAD_DEVICES:
                raise EstimateError(f"{name} {getattr(self, name)!r}: expected one of "
                                    f"{OFFLOAD_DEVICES}")
        if self.sub_group_size < 1:
            raise EstimateError(f"sub_group_size must be >= 1, got {self.sub_group_size}")
        if not 0.0 <= float(self.offload_ratio) <= 1.0:
            raise EstimateError(f"offload_optimizer.ratio must be in [0, 1], got "
                                f"{self.offload_ratio}")
        if self.delayed_update and float(self.offload_ratio) < 1.0:
            raise EstimateError("the delayed update needs the whole step on the host (ratio 1)")
        for name in ("param_buffer_count", "param_buffer_size", "param_max_in_cpu"):
            if getattr(self, name) < 0:
                raise EstimateError(f"offload_param.{name[len('param_'):]} must be >= 0, got "
                                    f"{getattr(self, name)}")
        # as the config validator: only parameters on NVMe use the buffers (the NVMe rows of
        # another set-up say that they do not run instead)
        if self.offload_param == "nvme" and self.param_buffer_count < 2:
            raise EstimateError(_BUFFER_COUNT_ERROR.format(self.param_buffer_count))

    def offloaded_numel(self, shard_numel: int) -> int:
        """Of one engine group's shard, the elements whose state and step are offloaded (the
        shard's tail): llround(ratio x shard), as the engine rounds (half away from zero)."""
        value = float(self.offload_ratio) * int(shard_numel)
        whole = math.floor(value)
        return int(whole) + (1 if value - whole >= 0.5 else 0)

    @property
    def offload_chunk_limit(self) -> int:
        """Elements per chunk of the offloaded step, before the shard caps it."""
        return min(int(self.sub_group_size), OFFLOAD_TILE)

    def offload_chunk(self, shard_numel: int) -> int:
        """C of one engine group: min(sub_group_size, 4,194,304, the group's shard)."""
        return min(self.offload_chunk_limit, max(int(shard_numel), 1))

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.num_nodes

    @property
    def param_bytes(self) -> int:
        return PARAM_BYTES[self.precision]

    @property
    def alignment(self) -> int:
        return max(1, ALIGNMENT_BYTES // self.param_bytes)

    def overlap_for(self, stage: int) -> bool:
        return (stage == 3) if self.overlap_comm is None else bool(self.overlap_comm)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "num_nodes": self.num_nodes,
                "ranks_per_node": self.ranks_per_node, "precision": self.precision,
                "param_bytes": self.param_bytes, "optimizer": self.optimizer,
                "reduce_bucket_size": self.reduce_bucket_size, "overlap_comm": self.overlap_comm,
                "stage3": self.stage3_dict(),
                "offload": {"offload_optimizer": self.offload_optimizer,
                            "offload_param": self.offload_param,
                            "sub_group_size": self.sub_group_size,
                            "delayed_update": self.delayed_update,
                            "ratio": self.offload_ratio,
                            "param_buffer_count": self.param_buffer_count,
                            "param_buffer_size": self.param_buffer_size,
                            "param_max_in_cpu": self.param_max_in_cpu}}

    def stage3_dict(self) -> dict:
        """The stage-3 settings under their config names."""
        return {"stage3_param_persistence_threshold": self.persistence_threshold,
                "stage3_prefetch_bucket_size": self.prefetch_bucket_size,
                "stage3_max_live_parameters": self.max_live_parameters,
                "stage3_max_reuse_distance": self.max_reuse_distance,
                "stage3_max_inflight_gathers": self.max_inflight_gathers}


# config key -> Setup field (stage 3)
STAGE3_KEYS = {"stage3_param_persistence_threshold": "persistence_threshold",
               "stage3_prefetch_bucket_size": "prefetch_bucket_size",
               "stage3_max_live_parameters": "max_live_parameters",
               "stage3_max_reuse_distance": "max_reuse_distance",
               "stage3_max_inflight_gathers": "max_inflight_gathers"}


def setup_from_config(config, world_size: int, num_nodes: int = 1, **overrides):
    """(Setup, stage) from a DeepSpeed JSON config (a path or dict); keyword overrides that are
    not None win (precision, optimizer, reduce_bucket_size, overlap_comm, stage, and the
    stage-3 and offload fields of Setup). Stage-3 keys are read, and the offload blocks
    (devices, sub_group_size, ratio, delayed_update; offload_param's buffer_count, buffer_size
    and max_in_cpu)."""
    from zero.config import ALL_FEATURES, ConfigError, load_config

    try:
        cfg = load_config(config, world_size=world_size, enabled_features=ALL_FEATURES)
    except ConfigError as error:
        raise EstimateError(f"--config: {error}") from None
    raw_zero = cfg.raw.get("zero_optimization") or {}
    optimizer = "adam"
    if cfg.optimizer is not None and cfg.optimizer.type == "SGD":
        optimizer = "sgd_momentum" if cfg.optimizer.params.get("momentum", 0.0) else "sgd"
    values = {
        "precision": cfg.precision,
        "optimizer": optimizer,
        "reduce_bucket_size": cfg.zero_optimization.reduce_bucket_size,
        "overlap_comm": raw_zero.get("overlap_comm"),  # None: the stage-dependent default
    }
    for key, name in STAGE3_KEYS.items():
        values[name] = int(getattr(cfg.zero_optimization, key))
    zero_cfg = cfg.zero_optimization
    values["offload_ratio"] = float(zero_cfg.offload_optimizer.ratio)
    values["offload_optimizer"] = zero_cfg.offload_optimizer.device
    values["offload_param"] = zero_cfg.offload_param.device
    values["sub_group_size"] = int(zero_cfg.sub_group_size)
    values["delayed_update"] = bool(getattr(zero_cfg.offload_optimizer, "delayed_update", False))
    param = zero_cfg.offload_param
    values["param_buffer_count"] = int(param.buffer_count)
    values["param_buffer_size"] = int(param.buffer_size)
    values["param_max_in_cpu"] = int(param.max_in_cpu)
    stage = cfg.zero_optimization.stage
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "stage":
            stage = value
        else:
            values[key] = value
    return Setup(world_size=world_size, num_nodes=num_nodes, **values), stage


# ---- the estimate ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One way to run: a ZeRO stage, where the optimizer state lives (none = on the device,
    cpu = host memory, nvme = a swap file) and, at stage 3, where the parameter shard lives."""
    name: str
    stage: int
    offload_optimizer: str = "none"   # none | cpu | nvme
    offload_param: str = "none"       # none | cpu | nvme

    @property
    def offloaded(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    @property
    def built(self) -> bool:
        """The engine builds it: every option of OPTIONS (offload_param on NVMe since the
        parameter swap, csrc/adapter/param_swap.h)."""
        return True


OPTIONS = (
    Option("stage 0", 0),
    Option("stage 1", 1),
    Option("stage 2", 2),
    Option("stage 1 + offload optimizer", 1, "cpu"),
    Option("stage 1 + offload optimizer (NVMe)", 1, "nvme"),
    Option("stage 2 + offload optimizer", 2, "cpu"),
    Option("stage 2 + offload optimizer (NVMe)", 2, "nvme"),
    Option("stage 3", 3),
    Option("stage 3 + offload optimizer", 3, "cpu"),
    Option("stage 3 + offload optimizer (NVMe)", 3, "nvme"),
    Option("stage 3 + offload params", 3, "none", "cpu"),
    Option("stage 3 + offload optimizer + params", 3, "cpu", "cpu"),
    Option("stage 3 + offload optimizer (NVMe) + params", 3, "nvme", "cpu"),
    Option("stage 3 + offload params (NVMe)", 3, "none", "nvme"),
    Option("stage 3 + offload optimizer (host) + params (NVMe)", 3, "cpu", "nvme"),
    Option("stage 3 + offload optimizer + params (NVMe)", 3, "nvme", "nvme"),  # both on NVMe
)


def option_for(stage: int, offload_optimizer: str = "none", offload_param: str = "none"
               ) -> Option:
    """The option of OPTIONS for a stage and offload devices (an EstimateError naming why
    when there is none: offload at stage 0, parameter offload below stage 3)."""
    for option in OPTIONS:
        if (option.stage, option.offload_optimizer, option.offload_param) == \
                (stage, offload_optimizer, offload_param):
            return option
    if offload_param != "none" and stage != 3:
        raise EstimateError(f"offload_param {offload_param!r} needs stage 3 (stage is {stage})")
    if offload_optimizer != "none" and stage == 0:
        raise EstimateError("offload_optimizer needs ZeRO stage 1, 2 or 3 (at stage 0 nothing is "
                            "sharded to offload)")
    raise EstimateError(f"no estimate for stage {stage} with offload_optimizer "
                        f"{offload_optimizer!r} and offload_param {offload_param!r}")


CATEGORIES = ("param", "gradient", "fp32_master", "optimizer_state", "bucket", "gathered_param",
              "staging")


@dataclass
class Estimate:
    option: Option
    setup: Setup
    # name -> {"bytes", "formula", "location": device|host|nvme, "by_location": {location:
    # bytes}}; a category split over locations (stage 3's param with offload_param: the
    # partitioned shard on the host, the persistent part on the device; staging) also has
    # "formula_by_location", and "location" names where most of it is
    categories: dict[str, dict]
    numel: int                    # Ψ (padded; stage 3: the partitioned parameters)
    shard_numel: int              # Ψ/N (padded)
    max_unit_numel: int           # U
    unit_count: int
    groups: list[dict] = field(default_factory=list)
    exact_units: bool = True      # stage 3: the model's gather units (False: assumed / none)
    persistent_numel: int = 0     # stage 3: Ψp, the persistent (whole) parameters, padded
    persistent_shard_numel: int = 0
    stage3: Optional[dict] = None  # stage 3: units, working set, bounds (see estimate())
    offload: Optional[dict] = None  # offload: chunks, staging, swap file (see _offload_detail)

    @property
    def name(self) -> str:
        return self.option.name

    @property
    def status(self) -> str:
        if not self.option.built:
            return FORMULA_ONLY
        if self.option.stage == 3:
            if self.stage3 is None:
                return STAGE3_FORMULA
            return BUILT if self.exact_units else STAGE3_ASSUMED_UNITS
        return BUILT

    @property
    def runs(self) -> bool:
        """False when the engine would refuse this set-up (stage 3: a unit in use does not fit
        under stage3_max_live_parameters; parameters on NVMe: a unit above buffer_size)."""
        return not self.error

    @property
    def error(self) -> str:
        """What the engine would raise ("" when it builds and runs)."""
        params = (self.offload or {}).get("param_nvme") or {}
        return (self.stage3 or {}).get("error") or params.get("error", "")

    def bytes_at(self, location: str) -> int:
        """Bytes per rank at one location ("device", "host" or "nvme"); transient categories
        (buckets, gathered parameters, device staging) at their peak."""
        return sum(_by_location(row).get(location, 0) for row in self.categories.values())

    @property
    def device_bytes(self) -> int:
        return self.bytes_at("device")

    @property
    def host_bytes(self) -> int:
        return self.bytes_at("host")

    @property
    def nvme_bytes(self) -> int:
        return self.bytes_at("nvme")

    def model_state_at(self, location: str) -> int:
        """The model states (param, gradient, master, optimizer state) at one location: what
        the live report's model_state_by_location gives."""
        return sum(_by_location(self.categories[name]).get(location, 0)
                   for name in CATEGORIES[:4])

    @property
    def model_state_bytes(self) -> int:
        """param + gradient + fp32_master + optimizer_state, wherever they live (stage 3: the
        persistent part included)."""
        return sum(self.categories[name]["bytes"] for name in CATEGORIES[:4])

    @property
    def persistent_bytes(self) -> int:
        """Stage 3: the model-state bytes of the persistent parameters alone."""
        return sum(self.categories[name].get("persistent_bytes", 0) for name in CATEGORIES[:4])

    def to_dict(self) -> dict:
        per_node = self.setup.ranks_per_node
        out = {
            "option": self.name, "stage": self.option.stage,
            "offload_optimizer": self.option.offload_optimizer,
            "offload_param": self.option.offload_param,
            "status": self.status, "built": self.option.built,
            "categories": self.categories,
            "device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
            "nvme_bytes": self.nvme_bytes,
            "model_state_bytes": self.model_state_bytes,
            "model_state_by_location": {where: self.model_state_at(where)
                                        for where in LOCATIONS},
            "per_node": {"ranks": per_node, "device_bytes": self.device_bytes * per_node,
                         "host_bytes": self.host_bytes * per_node,
                         "nvme_bytes": self.nvme_bytes * per_node},
            "numel": self.numel, "shard_numel": self.shard_numel,
            "max_unit_numel": self.max_unit_numel, "unit_count": self.unit_count,
            "groups": self.groups,
        }
        if self.option.stage == 3:
            out.update(persistent_numel=self.persistent_numel,
                       persistent_shard_numel=self.persistent_shard_numel,
                       persistent_bytes=self.persistent_bytes, stage3=self.stage3)
        if self.offload is not None:
            out["offload"] = self.offload
        if self.error:
            out["error"] = self.error
        return out


def _by_location(row: dict) -> dict:
    return row.get("by_location") or {row["location"]: row["bytes"]}


def layouts(shapes: ModelShapes, setup: Setup, stage: int, reduce_bucket_size: int | None = None):
    """One zero._C.ShardedLayout per group, exactly as the engine builds it (stages 0-2)."""
    from zero import _C

    world = 1 if stage == 0 else setup.world_size
    unit = int(reduce_bucket_size or setup.reduce_bucket_size)
    return [_C.ShardedLayout([list(s) for s in group], DTYPE_NAMES[setup.precision], world,
                             setup.alignment, unit)
            for group in shapes.groups]


def _term(coefficient: int, sharded: bool, symbol: str = "Ψ") -> str:
    if not coefficient:
        return "0"
    return f"{coefficient}{symbol}/N" if sharded else f"{coefficient}{symbol}"


# ---- stage 3: units and the gather schedule ----------------------------------------------------

@dataclass
class Stage3Layout:
    """What `ZeroEngine._build_stage3` lays out, per optimizer group: the partitioned
    parameters as one buffer per gather unit, the persistent ones as a stage-1 group."""
    unit_numel: list[int]                 # per model unit: padded elements over all groups
    group_units: list[list[tuple[int, int, int]]]  # per group: (model unit, numel, shard numel)
    persistent: list                      # per group with persistent parameters: ShardedLayout
    persistent_count: int                 # persistent tensors
    root_early_grads: list[bool] = field(default_factory=list)  # per partitioned group

    @property
    def numel(self) -> int:
        return sum(numel for units in self.group_units for _, numel, _ in units)

    @property
    def shard_numel(self) -> int:
        return sum(shard for units in self.group_units for _, _, shard in units)

    @property
    def persistent_numel(self) -> int:
        return sum(layout.full_numel for layout in self.persistent)

    @property
    def persistent_shard_numel(self) -> int:
        return sum(layout.shard_numel for layout in self.persistent)


def stage3_layout(shapes: ModelShapes, setup: Setup,
                  reduce_bucket_size: int | None = None) -> Stage3Layout:
    """The engine's stage-3 layout from the shapes and their gather units: parameters with
    more than `persistence_threshold` elements go to their unit's buffer (each unit padded to
    a multiple of N x alignment, `zero._C.plan_partition`), the rest to a stage-1 group
    (`ShardedLayout` with reduce_bucket_size units)."""
    from zero import _C

    if shapes.units is None:
        raise EstimateError("stage 3 needs the model's gather units: describe the model with "
                            "--model (or shapes_from_module)")
    dtype = DTYPE_NAMES[setup.precision]
    world, threshold = setup.world_size, setup.persistence_threshold
    rbs = int(reduce_bucket_size or setup.reduce_bucket_size)
    unit_total = max((u for group in shapes.units for u in group), default=0) + 1
    unit_numel = [0] * max(unit_total, len(shapes.unit_names), 1)
    group_units, persistent, persistent_count, root_early = [], [], 0, []
    late_flags = shapes.root_late or tuple((False,) * len(group) for group in shapes.groups)
    for group, units, late in zip(shapes.groups, shapes.units, late_flags):
        small = [list(shape) for shape in group if _numel(shape) <= threshold]
        large = [(list(shape), unit) for shape, unit in zip(group, units)
                 if _numel(shape) > threshold]
        if small:
            persistent.append(_C.ShardedLayout(small, dtype, world, setup.alignment, rbs))
            persistent_count += len(small)
        if not large:
            continue
        model_units = sorted({unit for _, unit in large})
        local = {unit: i for i, unit in enumerate(model_units)}
        plan = _C.plan_partition([shape for shape, _ in large], [dtype] * len(large),
                                 [local[unit] for _, unit in large], world, setup.alignment)
        rows = []
        for unit in model_units:
            buffer = plan.buffers[local[unit]]
            rows.append((unit, int(buffer.numel), int(buffer.shard_numel)))
            unit_numel[unit] += int(buffer.numel)
        group_units.append(rows)
        root_early.append(any(flag and _numel(shape) > threshold
                              for shape, flag in zip(group, late)))
    return Stage3Layout(unit_numel=unit_numel, group_units=group_units, persistent=persistent,
                        persistent_count=persistent_count, root_early_grads=root_early)


@dataclass
class WorkingSet:
    """What the gather schedule does on a model's units (simulate_stage3_schedule)."""
    peak_numel: int               # the most elements gathered at once (the registry's peak)
    live_at_peak: tuple[int, ...]  # the units gathered at that moment
    first_peak_numel: int         # the first micro-step's peak (no recorded order yet)
    gathers: int                  # all-gathers of one micro-step once the order is recorded
    gathered_numel: int           # elements all-gathered in that micro-step
    prefetches: int               # of those, started ahead of use
    reuses: int                   # units kept gathered for a use soon after
    error: str = ""               # what the engine would raise (live bound too small)
    # the most elements whose all-gather was in flight at once (the unit being gathered
    # included): with offload_param each holds its shard piece in device staging
    peak_inflight_numel: int = 0
    inflight_at_peak: tuple[int, ...] = ()


def simulate_stage3_schedule(unit_numel: Sequence[int], prefetch_bucket_size: int,
                             max_live_parameters: int, max_reuse_distance: int,
                             max_inflight_gathers: int = DEFAULT_MAX_INFLIGHT_GATHERS,
                             externals: Iterable[tuple[int, int]] = (),
                             unit_names: Sequence[str] = ()) -> WorkingSet:
    """The engine's own stage-3 gather schedule (csrc/adapter/gather_schedule.cpp) run on unit
    sizes (elements; unit 0 is the root, units without partitioned parameters have 0) by
    _C.simulate_schedule: two training micro-steps of a sequential model, the first recording
    the order, the second following it. Returns the peak and the steady micro-step's gathers."""
    from zero import _C
    from zero.boundary import typed

    options = typed(_C.ScheduleOptions, prefetch_numel=int(prefetch_bucket_size),
                    max_live_numel=int(max_live_parameters),
                    max_reuse_distance=int(max_reuse_distance),
                    max_inflight=int(max_inflight_gathers))
    run = _C.simulate_schedule([int(n) for n in unit_numel], options,
                               [(int(user), int(owner)) for user, owner in externals])
    working = WorkingSet(peak_numel=run.peak_numel, live_at_peak=tuple(run.live_at_peak),
                         first_peak_numel=run.first_peak_numel, gathers=run.gathers,
                         gathered_numel=run.gathered_numel, prefetches=run.prefetches,
                         reuses=run.reuses, peak_inflight_numel=run.peak_inflight_numel,
                         inflight_at_peak=tuple(run.inflight_at_peak))
    if run.bound_unit >= 0:
        unit = run.bound_unit
        name = (unit_names[unit] if unit < len(unit_names) else "") or "<root module>"
        working.error = (f"gathering unit '{name}' brings the gathered parameters to "
                         f"{run.bound_live_numel:,} elements, above stage3_max_live_parameters "
                         f"= {int(max_live_parameters):,}: the engine raises")
    return working


def _short(number: int) -> str:
    """1000000000 -> '1e9', 50000000 -> '5e7', 13000 -> '13,000'."""
    text = f"{number:.0e}".replace("e+0", "e").replace("e+", "e")
    return text if number >= 10_000_000 and float(text) == number else f"{number:,}"


def _describe_live(units: Sequence[int], names: Sequence[str]) -> str:
    if not units:
        return "nothing"
    parts = ["root" if u == 0 else (names[u] if u < len(names) and names[u] else f"unit {u}")
             for u in units]
    if len(parts) > 4:
        root = ["root"] if 0 in units else []
        return " + ".join(root + [f"{len(units) - len(root)} units"])
    return " + ".join(parts)


# ---- the estimate -----------------------------------------------------------------------------

_WHERE = {"none": "device", "cpu": "host", "nvme": "nvme"}  # offload device -> location


def _row(value: int, formula: str, location: str = "device") -> dict:
    return {"bytes": value, "formula": formula if value else "0", "location": location,
            "by_location": {location: value}}


def _gradient_location(setup: Setup, option: Option) -> str:
    """Where the gradient shard lives (csrc grads_offloaded): with the whole optimizer step
    offloaded (ratio 1) at stages 2-3 the shard is reduced straight into host memory
    (ZeRO-Offload); at stage 3 only the partitioned group's, the persistent parameters are a
    stage-1 group whose whole gradients stay on the device. A partial offload keeps it on
    the device, where the head's step runs."""
    offloaded = option.offload_optimizer != "none" and float(setup.offload_ratio) >= 1.0
    return "host" if option.stage >= 2 and offloaded else "device"


def _master_bytes(setup: Setup, option: Option) -> int:
    """4 in mixed precision; in fp32 the parameter shard is the master, unless the optimizer
    is offloaded: the host (or NVMe) keeps an fp32 master of its own."""
    return 4 if setup.precision != "fp32" or option.offload_optimizer != "none" else 0


def state_arrays(setup: Setup) -> list[str]:
    """The fp32 arrays an offloaded optimizer keeps per element (csrc ShardState)."""
    return ["master"] + {"adam": ["exp_avg", "exp_avg_sq"], "sgd_momentum": ["momentum_buffer"],
                         "sgd": []}[setup.optimizer]


def _round_up(value: int, alignment: int = IO_ALIGNMENT) -> int:
    return -(-int(value) // alignment) * alignment


# ---- offload_param on NVMe -------------------------------------------------------------------

@dataclass(frozen=True)
class ParamPlacement:
    """Where offload_param "nvme" puts one rank's partitioned parameter shard, summed over
    the partitioned groups (Stage3Group::place_param_shard, per group)."""
    host_numel: int = 0           # the first units' shards, up to max_in_cpu, in host memory
    nvme_numel: int = 0           # the rest, in the group's swap file
    nvme_units: int = 0
    buffer_bytes: int = 0         # host staging: per group with an NVMe unit, buffer_count x
    largest_shards: tuple[int, ...] = ()  # ... round_up(b x its largest NVMe unit's shard)
    swap_file_bytes: int = 0      # every NVMe unit's shard at a page-aligned offset
    error: str = ""               # what the engine raises at initialize ("" when it builds)

    def to_dict(self) -> dict:
        return {"host_numel": self.host_numel, "nvme_numel": self.nvme_numel,
                "nvme_units": self.nvme_units, "buffer_bytes": self.buffer_bytes,
                "largest_nvme_unit_shards": list(self.largest_shards),
                "swap_file_bytes": self.swap_file_bytes, "error": self.error}


def _kept_in_host_memory(unit_shards: Sequence[int], max_in_cpu: int) -> int:
    """How many of a group's units stay in host memory: the engine walks them in order and
    keeps each while the kept shard elements stay within max_in_cpu; the first that does not
    fit goes to NVMe, and so does every unit after it (one host tensor holds a prefix of the
    shard, the swap file the rest)."""
    kept = 0
    for count, shard in enumerate(unit_shards):
        if kept + shard > max_in_cpu:
            return count
        kept += shard
    return len(unit_shards)


def param_placement(setup: Setup, groups: Sequence[Sequence[tuple[str, int]]]
                    ) -> ParamPlacement:
    """offload_param "nvme": per partitioned group (its units in order as (name, shard
    elements)), the units up to max_in_cpu in host memory and the rest on NVMe, buffer_count
    page-rounded host buffers of the largest NVMe unit, and the engine's errors: a unit above
    buffer_size (named with the size that every unit fits), fewer than 2 buffers."""
    b = setup.param_bytes
    host = nvme = units = buffers = swap = 0
    largest, too_big = [], []
    for rows in groups:
        shards = [int(shard) for _, shard in rows]
        kept = _kept_in_host_memory(shards, setup.param_max_in_cpu)
        host += sum(shards[:kept])
        on_nvme = rows[kept:]
        if not on_nvme:
            continue
        nvme += sum(shard for _, shard in on_nvme)
        units += len(on_nvme)
        largest.append(max(shard for _, shard in on_nvme))
        buffers += setup.param_buffer_count * _round_up(b * largest[-1])
        swap += sum(_round_up(b * shard) for _, shard in on_nvme)
        too_big += [(name, shard) for name, shard in on_nvme if shard > setup.param_buffer_size]
    error = ""
    if too_big:  # the engine's message names the key and its value the same way
        name, shard = too_big[0]
        error = (f"gather unit '{name}' has {shard:,} parameter elements per rank on NVMe, more "
                 f"than zero_optimization.offload_param.buffer_size = {setup.param_buffer_size}"
                 f": the engine raises; raise buffer_size to at least "
                 f"{max(s for _, s in too_big)} or split the unit (every ModuleList child is "
                 "one unit)")
    elif units and setup.param_buffer_count < 2:
        error = _BUFFER_COUNT_ERROR.format(setup.param_buffer_count)
    return ParamPlacement(host_numel=host, nvme_numel=nvme, nvme_units=units,
                          buffer_bytes=buffers, largest_shards=tuple(largest),
                          swap_file_bytes=swap, error=error)


def _param_row_on_nvme(placement: ParamPlacement, b: int, persistent_bytes: int = 0,
                       persistent_term: str = "0") -> dict:
    """The `param` row with offload_param on NVMe: the shard's NVMe units at `nvme`, the
    first units kept within max_in_cpu (H elements) at `host`, stage 3's persistent
    parameters whole on the device. Exact bytes: the registry counts the NVMe tiles unrounded."""
    host, nvme = placement.host_numel, placement.nvme_numel
    note = (f" (H = {host:,}: the first units' shards within max_in_cpu, in host memory)"
            if host and nvme else "")
    parts = [("nvme", b * nvme, f"{b}·(Ψ/N − H)" if host else f"{b}Ψ/N"),
             ("host", b * host, f"{b}·H{note}" if nvme else f"{b}Ψ/N"),
             ("device", persistent_bytes, persistent_term)]
    parts = [(where, value, text) for where, value, text in parts if value]
    if not parts:
        return _row(0, "0", "nvme")
    by_location = {where: value for where, value, _ in parts}
    total = " + ".join(t for t in (f"{b}Ψ/N" if host or nvme else "", persistent_term)
                       if t and t != "0")
    out = {"bytes": sum(by_location.values()), "persistent_bytes": persistent_bytes,
           "formula": total + note, "location": max(by_location, key=by_location.get),
           "by_location": by_location}
    if len(parts) > 1:
        out["formula_by_location"] = {where: text for where, _, text in parts}
    return out


def _staging(setup: Setup, option: Option, group_shards: Sequence[int], device_bytes: int = 0,
             device_formula: str = "0", params: Optional[ParamPlacement] = None
             ) -> tuple[dict, Optional[dict]]:
    """The `staging` row and the offload detail. Host: the optimizer's chunks (see
    _optimizer_staging) and, with offload_param on NVMe, the parameter buffers. Device
    (offload_param): given."""
    host, terms, notes, detail = 0, [], [], None
    if option.offload_optimizer != "none" or option.offload_param != "none":
        detail = {"offload_optimizer": option.offload_optimizer,
                  "offload_param": option.offload_param,
                  "device_staging_bytes": device_bytes, "host_staging_bytes": 0,
                  "swap_file_bytes": 0}
    if option.offload_optimizer != "none":
        host, term, note, more = _optimizer_staging(setup, option, group_shards)
        terms.append(term)
        notes.append(note)
        detail.update(more)
    if params is not None:
        detail["param_nvme"] = params.to_dict()
        detail["swap_file_bytes"] += params.swap_file_bytes
        if params.buffer_bytes:
            # each buffer holds one whole unit's shard (the largest on NVMe), page-rounded for
            # O_DIRECT; prefetches and write-backs share them
            b = setup.param_bytes
            sigma = "Σ groups " if len(params.largest_shards) > 1 else ""
            terms.append(f"{sigma}{setup.param_buffer_count}·⌈{b}·V⌉")
            notes.append(f"V = the largest NVMe unit's shard = "
                         f"{', '.join(f'{v:,}' for v in params.largest_shards)}"
                         + ("" if option.offload_optimizer == "nvme" else
                            "; ⌈⌉: whole 4 KiB pages"))
            host += params.buffer_bytes
    if detail is not None:
        detail["host_staging_bytes"] = host
    by_location = {}
    formulas = {}
    if host:
        by_location["host"] = host
        formulas["host"] = f"{' + '.join(terms)} ({'; '.join(notes)})"
    if device_bytes:
        by_location["device"], formulas["device"] = device_bytes, device_formula
    if not by_location:  # no staging: nothing offloaded (a ratio rounding to 0)
        return _row(0, "0"), detail
    location = max(by_location, key=lambda where: by_location[where])
    text = "; ".join(f"{where}: {formula}" for where, formula in formulas.items()) \
        if len(formulas) > 1 else formulas[location]
    return {"bytes": host + device_bytes, "formula": text, "location": location,
            "by_location": by_location, "formula_by_location": formulas}, detail


def _optimizer_staging(setup: Setup, option: Option, group_shards: Sequence[int]
                       ) -> tuple[int, str, str, dict]:
    """offload_optimizer, per engine group: 2 slots x (C·b gradients + C·b parameters for a
    16-bit model), with NVMe also 2 slots x each state array x round_up(4·C, 4096); the
    delayed update adds the shard's gradients and new parameters. (host bytes, formula term,
    its note, the offload detail's fields)."""
    b = setup.param_bytes
    sixteen_bit = b != 4
    nvme = option.offload_optimizer == "nvme"
    arrays = state_arrays(setup)
    # with a ratio < 1 only each shard's tail is offloaded: the pool is sized for it, and a
    # group whose tail is empty has no pool
    tails = [setup.offloaded_numel(shard) for shard in group_shards]
    group_shards = [tail for tail in tails if tail]
    chunks = [setup.offload_chunk(shard) for shard in group_shards]
    model = f"({b}+{b})" if sixteen_bit else f"{b}"
    host = sum(2 * c * b * (2 if sixteen_bit else 1) for c in chunks)
    term = f"2·C·{model}"
    if nvme:
        host += sum(2 * len(arrays) * _round_up(4 * c) for c in chunks)
        term += f" + 2·{len(arrays)}·⌈4C⌉"
    delayed = setup.delayed_update and not nvme  # the engine refuses it with NVMe
    if delayed:  # the whole shard's gradients and new parameters, one update behind
        host += sum(2 * int(shard) * b for shard in group_shards)
        term += f" + 2·S·{b}"
    sigma = "Σ groups " if len(chunks) > 1 else ""
    part = "Ψ/N" if setup.offload_ratio == 1 else f"the offloaded {setup.offload_ratio:g}·Ψ/N"
    note = (f"C = min(sub_group_size, {OFFLOAD_TILE:,}, {part} of the group) = "
            f"{', '.join(f'{c:,}' for c in chunks) or '-'}"
            + ("; ⌈⌉: whole 4 KiB pages" if nvme else "")
            + ("; S = the group's Ψ/N, the delayed update's gradients and parameters"
               if delayed else ""))
    swap = 0
    if nvme:  # the swap file: every chunk of every array at a page-aligned offset
        for shard, c in zip(group_shards, chunks):
            full, rest = divmod(int(shard), c)
            swap += len(arrays) * (full * _round_up(4 * c) + (_round_up(4 * rest) if rest
                                                               else 0))
    detail = dict(chunk_limit=setup.offload_chunk_limit, state_arrays=arrays,
                  groups=[{"offloaded_numel": int(shard), "chunk_numel": c}
                          for shard, c in zip(group_shards, chunks)],
                  ratio=setup.offload_ratio, offloaded_numel=sum(tails),
                  delayed_update=delayed, swap_file_bytes=swap)
    return host, f"{sigma}{term}", note, detail


def _split_partial(categories: dict, setup: Setup, option: Option,
                   group_shards: Sequence[int]) -> None:
    """offload_optimizer.ratio < 1: of every group's shard only the tail (llround(ratio x
    shard) elements) keeps its master and optimizer state on the host / NVMe; the head keeps
    them on the device (an fp32 master too: the parameters and master are separate wherever
    the step runs)."""
    if option.offload_optimizer == "none" or float(setup.offload_ratio) == 1.0:
        return
    total = sum(int(shard) for shard in group_shards)
    tail = sum(setup.offloaded_numel(shard) for shard in group_shards)
    where = _WHERE[option.offload_optimizer]
    ratio = f"{setup.offload_ratio:g}"
    rest = f"{1 - float(setup.offload_ratio):g}"
    for name in ("fp32_master", "optimizer_state"):
        row = categories[name]
        if not row["bytes"] or not total:
            continue
        per_element = row["bytes"] // total  # 4 (master), 8 / 4 (Adam / momentum)
        offloaded = per_element * tail
        formula = row["formula"]
        row["by_location"] = {k: v for k, v in ((where, offloaded),
                                                ("device", row["bytes"] - offloaded)) if v}
        row["formula_by_location"] = {where: f"{ratio}·({formula})",
                                      "device": f"{rest}·({formula})"}
        row["location"] = max(row["by_location"], key=lambda k: row["by_location"][k])
        row["formula"] = f"{where}: {ratio}·({formula}); device: {rest}·({formula})"


def estimate(shapes: ModelShapes, setup: Setup, option: Option | int = 0,
             reduce_bucket_size: int | None = None, overlap_comm: bool | None = None,
             strict: bool = True) -> Estimate:
    """Per-rank bytes by category for one option: an Option, or a stage number (then with the
    setup's offload devices, none by default). Parameters on NVMe that the engine would
    refuse to build (a unit above offload_param.buffer_size) raise an EstimateError naming
    the key; strict=False returns the row with `error` set instead (`runs` is False), as
    for a stage-3 live bound that is too small."""
    if isinstance(option, int):
        option = option_for(option, setup.offload_optimizer, setup.offload_param)
    result = _estimate(shapes, setup, option, reduce_bucket_size, overlap_comm)
    params = (result.offload or {}).get("param_nvme") or {}
    if strict and params.get("error"):
        raise EstimateError(f"{option.name}: {params['error']}")
    return result


def _estimate(shapes: ModelShapes, setup: Setup, option: Option,
              reduce_bucket_size: int | None, overlap_comm: bool | None) -> Estimate:
    if option.stage == 3 and shapes.units is not None:
        return _estimate_stage3(shapes, setup, option, reduce_bucket_size, overlap_comm)
    stage = option.stage
    b = setup.param_bytes
    n = 1 if stage == 0 else setup.world_size
    group_layouts = layouts(shapes, setup, stage, reduce_bucket_size)
    psi = sum(layout.full_numel for layout in group_layouts)
    shard = sum(layout.shard_numel for layout in group_layouts)
    largest_unit = max(layout.max_unit_numel for layout in group_layouts)
    overlap = setup.overlap_for(stage) if overlap_comm is None else overlap_comm
    slots = 2 if overlap else 1
    optimizer_bytes = OPTIMIZER_STATE_BYTES[setup.optimizer]

    def row(coefficient: int, sharded: bool, location: str = "device") -> dict:
        return _row(coefficient * (shard if sharded else psi), _term(coefficient, sharded),
                    location)

    opt_location = _WHERE[option.offload_optimizer]
    params = None
    if option.offload_param == "nvme":  # stage 3 without units: the layout's units stand in
        params = param_placement(setup, [[(f"unit {u}", layout.unit(u).shard_numel)
                                          for u in range(layout.unit_count)]
                                         for layout in group_layouts])
    categories = {
        "param": (row(b, stage >= 3, _WHERE[option.offload_param]) if params is None
                  else _param_row_on_nvme(params, b)),
        "gradient": row(b, stage >= 2, _gradient_location(setup, option)),
        "fp32_master": row(_master_bytes(setup, option), stage >= 1, opt_location),
        "optimizer_state": row(optimizer_bytes, stage >= 1, opt_location),
    }
    bucket_bytes = 0
    if stage >= 2:
        # GradReducer: min(slots, units) buckets per group, each a full unit + its 1/N piece.
        bucket_bytes = sum(min(slots, layout.unit_count) *
                           (layout.max_unit_numel + layout.max_unit_numel // n) * b
                           for layout in group_layouts)
    sum_text = "Σ groups " if len(group_layouts) > 1 else ""
    categories["bucket"] = _row(bucket_bytes, f"{sum_text}{slots}·(U + U/N)·{b}")
    gathered = 2 * largest_unit * b if stage >= 3 else 0
    categories["gathered_param"] = _row(gathered, f"2·U·{b} (unit in use + one prefetched)")
    # stage 3 without units (a formula): two units' shard pieces in flight
    device_staging = 2 * (largest_unit // n) * b if option.offload_param != "none" else 0
    _split_partial(categories, setup, option, [layout.shard_numel for layout in group_layouts])
    categories["staging"], offload = _staging(
        setup, option, [layout.shard_numel for layout in group_layouts], device_staging,
        f"2·(U/N)·{b} (two units' shard pieces in flight)", params)
    return Estimate(
        option=option, setup=setup, categories=categories, numel=psi, shard_numel=shard,
        max_unit_numel=largest_unit, unit_count=sum(l.unit_count for l in group_layouts),
        groups=[{"numel": l.full_numel, "shard_numel": l.shard_numel,
                 "max_unit_numel": l.max_unit_numel, "unit_count": l.unit_count}
                for l in group_layouts], exact_units=False, offload=offload)


def _estimate_stage3(shapes: ModelShapes, setup: Setup, option: Option,
                     reduce_bucket_size: int | None, overlap_comm: bool | None) -> Estimate:
    """Stage 3 as the engine builds it: partitioned units (Ψ, every byte / N), the persistent
    stage-1 group (Ψp), reduce-scatter buckets per partitioned group, the working set of the
    gather schedule, and offload (master + optimizer state of both groups; the partitioned
    parameter shard with offload_param, the persistent parameters staying on the device)."""
    layout = stage3_layout(shapes, setup, reduce_bucket_size)
    n, b = setup.world_size, setup.param_bytes
    psi, shard = layout.numel, layout.shard_numel
    psi_p, shard_p = layout.persistent_numel, layout.persistent_shard_numel
    optimizer_bytes = OPTIMIZER_STATE_BYTES[setup.optimizer]
    overlap = setup.overlap_for(3) if overlap_comm is None else overlap_comm
    slots = 2 if overlap else 1
    opt_location = _WHERE[option.offload_optimizer]

    def row(coefficient: int, persistent_sharded: bool, location: str = "device",
            persistent_location: str | None = None,
            persistent_coefficient: int | None = None) -> dict:
        persistent_location = persistent_location or location
        persistent_coefficient = coefficient if persistent_coefficient is None \
            else persistent_coefficient
        main = coefficient * shard
        extra = persistent_coefficient * (shard_p if persistent_sharded else psi_p)
        main_term = _term(coefficient, True) if psi else "0"
        extra_term = _term(persistent_coefficient, persistent_sharded, "Ψp") if psi_p else "0"
        terms = [t for t in (main_term, extra_term) if t != "0"]
        by_location = {location: main}
        by_location[persistent_location] = by_location.get(persistent_location, 0) + extra
        out = {"bytes": main + extra, "persistent_bytes": extra,
               "formula": " + ".join(terms) or "0", "location": location,
               "by_location": by_location}
        if persistent_location != location and main and extra:
            out["formula_by_location"] = {location: main_term, persistent_location: extra_term}
            out["location"] = max(by_location, key=lambda where: by_location[where])
        elif not main and extra:
            out["location"] = persistent_location
            out["by_location"] = {persistent_location: extra}
        return out

    params = None
    if option.offload_param == "nvme":  # the partitioned groups' units, in the engine's order
        names = list(shapes.unit_names) + [""] * len(layout.unit_numel)
        params = param_placement(setup, [[(names[unit] or "<root>", shard)
                                          for unit, _, shard in rows]
                                         for rows in layout.group_units])
    categories = {
        # the persistent parameters stay whole (a stage-1 group: whole params and gradients,
        # sharded master and optimizer state) and on the device: offload_param moves the
        # partitioned shard only
        "param": (row(b, False, _WHERE[option.offload_param], "device") if params is None else
                  _param_row_on_nvme(params, b, b * psi_p, _term(b, False, "Ψp"))),
        "gradient": row(b, False, _gradient_location(setup, option), "device"),
        # with the parameter shard on the host, the partitioned group keeps its own master
        # (also in fp32) for a device-side step; the persistent group does not need one
        "fp32_master": row(4 if option.offload_param != "none" else _master_bytes(setup, option),
                           True, opt_location, persistent_coefficient=_master_bytes(setup, option)),
        "optimizer_state": row(optimizer_bytes, True, opt_location),
    }
    # One GradReducer per partitioned group: min(slots, units) buckets of (U + U/N) elements,
    # kept between steps. In backward the root unit's bucket may fill from the start (its
    # parameters used after the blocks: final norm, untied head) to the end (the embeddings)
    # while each block fills and launches its own; with one slot the pool then grows by one
    # for the backward (grad_reducer.cpp: it grows only when every bucket is filling).
    bucket_bytes = kept_bytes = 0
    group_rows, grown = [], False
    for rows, root_early in zip(layout.group_units, layout.root_early_grads):
        largest = max(numel for _, numel, _ in rows)
        kept = min(slots, len(rows))
        blocks = sum(1 for unit, _, _ in rows if unit != 0)
        filling = 1 + (1 if root_early and blocks and any(u == 0 for u, _, _ in rows) else 0)
        peak = max(kept, min(filling, len(rows)))
        grown = grown or peak > kept
        kept_bytes += kept * (largest + largest // n) * b
        bucket_bytes += peak * (largest + largest // n) * b
        group_rows.append({"numel": sum(r[1] for r in rows), "shard_numel": sum(r[2] for r in rows),
                           "max_unit_numel": largest, "unit_count": len(rows),
                           "block_units": blocks, "buckets_kept": kept, "buckets_peak": peak})
    sum_text = "Σ groups " if len(layout.group_units) > 1 else ""
    if not psi:
        bucket_formula = "0"
    elif grown:
        bucket_formula = (f"{sum_text}2·(U + U/N)·{b} (in backward: 1 kept between steps + 1 "
                          "while the root's bucket fills over the whole backward)")
    else:
        bucket_formula = f"{sum_text}{slots}·(U + U/N)·{b}"
    categories["bucket"] = _row(bucket_bytes, bucket_formula)
    work = simulate_stage3_schedule(layout.unit_numel, setup.prefetch_bucket_size,
                                    setup.max_live_parameters, setup.max_reuse_distance,
                                    setup.max_inflight_gathers, shapes.externals,
                                    shapes.unit_names)
    bounds = (f"prefetch ≤ {_short(setup.prefetch_bucket_size)}, reuse < "
              f"{_short(setup.max_reuse_distance)}, live ≤ {_short(setup.max_live_parameters)}")
    categories["gathered_param"] = _row(
        work.peak_numel * b,
        (f"W·{b} (W = {work.peak_numel:,}: "
         f"{_describe_live(work.live_at_peak, shapes.unit_names)} gathered at once; "
         f"{bounds})") if psi else "0")
    # offload_param: every gather copies the unit's shard piece (numel / N, every unit padded
    # to a multiple of N) into a device buffer held until its all-gather completes
    inflight_shard = work.peak_inflight_numel // n
    device_staging = inflight_shard * b if option.offload_param != "none" and psi else 0
    group_shards = [sum(r[2] for r in rows) for rows in layout.group_units] + \
        [group.shard_numel for group in layout.persistent]
    _split_partial(categories, setup, option, group_shards)
    categories["staging"], offload = _staging(
        setup, option, group_shards, device_staging,
        f"P·{b} (P = {inflight_shard:,}: the shard pieces of "
        f"{_describe_live(work.inflight_at_peak, shapes.unit_names)} in flight at once)", params)
    largest_unit = max((numel for rows in layout.group_units for _, numel, _ in rows), default=0)
    partitioned_units = [u for u, numel in enumerate(layout.unit_numel) if numel]
    names = list(shapes.unit_names) + [""] * len(layout.unit_numel)
    detail = {
        "units": [{"unit": u, "name": names[u] or "<root>", "numel": layout.unit_numel[u]}
                  for u in partitioned_units],
        "persistent_tensors": layout.persistent_count,
        "persistent_units": sum(group.unit_count for group in layout.persistent),
        "bucket_kept_bytes": kept_bytes,  # the pool between steps (`current` after a step)
        "working_set": {"peak_numel": work.peak_numel,
                        "live_at_peak": [names[u] or "<root>" for u in work.live_at_peak],
                        "live_at_peak_text": _describe_live(work.live_at_peak, names),
                        "first_micro_step_peak_numel": work.first_peak_numel,
                        "gathers_per_micro_step": work.gathers,
                        "gathered_numel_per_micro_step": work.gathered_numel,
                        "prefetches_per_micro_step": work.prefetches,
                        "reuses_per_micro_step": work.reuses,
                        "peak_inflight_numel": work.peak_inflight_numel,
                        "inflight_at_peak": [names[u] or "<root>"
                                             for u in work.inflight_at_peak]},
        "bounds": setup.stage3_dict(),
        "overlap_comm": overlap,
        # what the engine raises: the live bound, parameters on NVMe (offload detail)
        "error": "; ".join(e for e in (work.error, params.error if params else "") if e),
    }
    return Estimate(option=option, setup=setup, categories=categories, numel=psi,
                    shard_numel=shard, max_unit_numel=largest_unit,
                    unit_count=len(partitioned_units), groups=group_rows,
                    exact_units=shapes.exact, persistent_numel=psi_p,
                    persistent_shard_numel=shard_p, stage3=detail, offload=offload)


def estimate_all(shapes: ModelShapes, setup: Setup) -> list[Estimate]:
    """Every option of OPTIONS: stages 0-3 and their offload variants as the engine builds
    them. A row the engine would refuse (parameters on NVMe with a unit above buffer_size)
    is listed with its `error`, as one whose live bound is too small: the table says so."""
    return [estimate(shapes, setup, option, strict=False) for option in OPTIONS]


# ---- text ---------------------------------------------------------------------------------

def format_estimates(shapes: ModelShapes, setup: Setup, estimates: list[Estimate],
                     selected_stage: int | None = None) -> str:
    """The estimate as tables: per-rank bytes by category, then per node."""
    first = estimates[0]
    lines = [
        f"model: {shapes.description}: {shapes.trainable_numel:,} trainable parameters in "
        f"{shapes.tensor_count:,} tensors" + (f", {shapes.frozen_numel:,} frozen (not managed "
                                              "by the engine)" if shapes.frozen_numel else ""),
        f"setup: {setup.world_size} rank(s) = {setup.num_nodes} node(s) x "
        f"{setup.ranks_per_node}, {setup.precision} (b = {setup.param_bytes}), "
        f"{setup.optimizer}, reduce_bucket_size {setup.reduce_bucket_size:,}, overlap_comm "
        + ("default (stage 3 only)" if setup.overlap_comm is None else str(setup.overlap_comm)),
        f"stage 3: persistence threshold {setup.persistence_threshold:,}, prefetch "
        f"{setup.prefetch_bucket_size:,}, max live {setup.max_live_parameters:,}, max reuse "
        f"distance {setup.max_reuse_distance:,}, {setup.max_inflight_gathers} gather(s) in flight",
    ]
    if shapes.note:
        lines.append(f"note: {shapes.note}")
    sharded = next((e for e in estimates if e.option.stage >= 1), first)
    lines.append(f"padded: Ψ = {first.numel:,} (stage 0), {sharded.numel:,} (stages 1-2, "
                 f"Ψ/N = {sharded.shard_numel:,}); largest unit U = {sharded.max_unit_numel:,} "
                 f"elements in {sharded.unit_count} unit(s)")
    stage3 = next((e for e in estimates if e.option.stage == 3 and e.stage3 is not None), None)
    if stage3 is not None:
        work = stage3.stage3["working_set"]
        lines.append(
            f"stage 3: Ψ = {stage3.numel:,} partitioned (Ψ/N = {stage3.shard_numel:,}) in "
            f"{stage3.unit_count} gather unit(s), largest U = {stage3.max_unit_numel:,}; "
            f"Ψp = {stage3.persistent_numel:,} persistent ({stage3.stage3['persistent_tensors']} "
            f"tensor(s) of at most {setup.persistence_threshold:,} elements, whole on every "
            f"rank: {format_bytes(stage3.persistent_bytes)}); working set W = "
            f"{work['peak_numel']:,} ({work['live_at_peak_text']}), "
            f"{work['gathers_per_micro_step']} all-gather(s) per micro-step")
        if stage3.stage3["error"]:
            lines.append(f"stage 3 does not run as configured: {stage3.stage3['error']}")
    if any(e.option.offload_optimizer != "none" for e in estimates):
        lines.append(f"offload: the step streams chunks of C = min(sub_group_size "
                     f"{setup.sub_group_size:,}, {OFFLOAD_TILE:,}, the group's Ψ/N) elements "
                     "through 2 host staging slots per engine group; an offloaded optimizer keeps "
                     "an fp32 master (fp32 training too)")
    on_nvme = next((e for e in estimates if e.option.offload_param == "nvme"), None)
    if on_nvme is not None:
        lines.append(_params_on_nvme_line(on_nvme))
    lines.append("")
    names = list(CATEGORIES)
    headers = ["per rank", *names, "device", "host (offload)", "NVMe"]
    selected = None
    if selected_stage is not None:
        selected = (selected_stage, setup.offload_optimizer, setup.offload_param)
    rows = []
    for est in estimates:
        option = est.option
        mark = "*" if (option.stage, option.offload_optimizer, option.offload_param) == selected \
            else " "
        cells = [_cell(est.categories[name]) for name in names]
        rows.append([f"{mark}{est.name}", *cells, format_bytes(est.device_bytes),
                     format_bytes(est.host_bytes), format_bytes(est.nvme_bytes)])
    lines.extend(_table(headers, rows))
    lines.append("")
    per_node = setup.ranks_per_node
    headers = ["formula per rank", "on the device", "on the host", "on NVMe",
               f"devices/node (x{per_node})", f"host RAM/node (x{per_node})",
               f"NVMe/node (x{per_node})", "status"]
    rows = [[est.name, location_formula(est, "device"), location_formula(est, "host"),
             location_formula(est, "nvme"), format_bytes(est.device_bytes * per_node),
             format_bytes(est.host_bytes * per_node), format_bytes(est.nvme_bytes * per_node),
             est.status] for est in estimates]
    lines.extend(_table(headers, rows, left={0, 1, 2, 3, 7}))
    lines.append(f"(Ψ padded parameter count (stage 3: partitioned), Ψp stage 3's persistent "
                 f"parameters, N = {setup.world_size} ranks, U = largest unit in elements, W = "
                 f"most elements gathered at once, C = offload chunk, P = shard elements whose "
                 f"all-gather is in flight at once, b = {setup.param_bytes})")
    lines.append("")
    lines.append("Built options are exact: each model-state category (on the device, the host "
                 "and NVMe), the buckets and the host staging equal the engine's measured "
                 "`current` bytes; stage 3's gathered_param (and, with offload_param, the device "
                 "staging) is the peak of the gather schedule replayed on the units (every unit "
                 "once per forward, in definition order). Not included (activations only with --sample-input): "
                 "autograd's transient gradients, optimizer-step temporaries, framework and "
                 "allocator overhead.")
    return "\n".join(lines)


def _params_on_nvme_line(est: Estimate) -> str:
    """offload_param nvme in one line: what stays in host memory, what the buffers hold, or
    why the engine refuses it."""
    setup, params = est.setup, est.offload["param_nvme"]
    if params["error"]:
        return f"params on NVMe do not run as configured: {params['error']}"
    kept = (f"{params['host_numel']:,} shard elements of the first units in host memory "
            f"(max_in_cpu {setup.param_max_in_cpu:,}), " if params["host_numel"] else "")
    largest = ", ".join(f"{v:,}" for v in params["largest_nvme_unit_shards"]) or "-"
    return (f"params on NVMe: {kept}{params['nvme_numel']:,} in a swap file; the host holds "
            f"buffer_count = {setup.param_buffer_count} buffers of the largest NVMe unit's shard "
            f"(V = {largest} elements, whole 4 KiB pages) per partitioned group; every gather "
            "reads its unit through them")


def _cell(row: dict) -> str:
    """Bytes of one category, marked with where they are when not (only) on the device:
    '27.781 KiB (host) + 896 B'."""
    parts = []
    for where, value in sorted(_by_location(row).items(), key=lambda item: item[0] == "device"):
        if not value:
            continue
        parts.append(format_bytes(value) + ("" if where == "device" else f" ({where})"))
    return " + ".join(parts) or "0"


_SYMBOLS = ("Ψ", "Ψ/N", "Ψp", "Ψp/N")


def location_formula(est: Estimate, location: str) -> str:
    """The bytes at one location in the paper's notation, e.g. '2Ψ + 14Ψ/N + 1·(U + U/N)·2'
    (stage 3: '16Ψ/N + 8Ψp + 8Ψp/N + 2·(U + U/N)·2 + W·2'; offload to the host:
    '14Ψ/N + 2·C·(2+2)')."""
    coefficients = dict.fromkeys(_SYMBOLS, 0)
    extra = []
    for name in CATEGORIES:
        row = est.categories[name]
        if not _by_location(row).get(location):
            continue
        formula = row.get("formula_by_location", {row["location"]: row["formula"]}).get(location)
        if formula is None:  # one formula for a split row: the location's bytes, labelled
            extra.append(f"{name} {format_bytes(_by_location(row)[location])}")
            continue
        for term in formula.split(" (")[0].split(" + "):
            match = re.fullmatch(r"(\d+)(Ψp/N|Ψp|Ψ/N|Ψ)", term)
            if match:
                coefficients[match.group(2)] += int(match.group(1))
            elif term != "0":
                extra.append(term)
    parts = [f"{c}{symbol}" for symbol, c in coefficients.items() if c] + extra
    return " + ".join(parts) or "0"


def _table(headers: list[str], rows: list[list[str]], left=frozenset({0})) -> list[str]:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]
