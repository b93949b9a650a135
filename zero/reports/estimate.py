"""Per-rank memory of model states before training: what the engine will allocate.

For the stages the engine builds (0, 1, 2) the estimate is exact, not a paper formula: the
parameters are laid out with the engine's own planner (`zero._C.ShardedLayout`: units of at
most reduce_bucket_size elements cut from the last parameter, every unit padded to a
multiple of world_size x alignment, alignment = 16 bytes / element size; stage 0 lays out for
one rank), and every category is the byte count the engine's accounting registry reports as
`current` after a step:

    param            b·Ψ                      (all stages the engine builds)
    gradient         b·Ψ (stages 0, 1)        b·Ψ/N (stage 2)
    fp32_master      4·Ψ (stage 0)            4·Ψ/N (stages >= 1)   0 when training in fp32
    optimizer_state  8·Ψ or 8·Ψ/N (Adam)      4· (SGD with momentum)    0 (plain SGD)
    bucket           0 (stages 0, 1)          stage 2: Σ over groups of
                                              min(slots, units)·(U + U/N)·b,
                                              U = the group's largest unit, slots = 2 with
                                              overlap_comm, else 1

Ψ and Ψ/N are the padded element counts (ShardedLayout.full_numel / shard_numel), b the
bytes of a 16-bit or 32-bit model parameter.

Stage 3 is built, but its rows here are still the ZeRO paper's formula on the same padded
numbers (the estimator does not yet lay out stage 3's module units), labelled "formula —
stage 3 built, estimate not checked against it"; offload is not built: "formula only — not
yet built/measured".

Not estimated: activations (they depend on the model's forward, batch and sequence length,
and the meta device cannot measure them), autograd's transient full-size gradients at
stage 2 before a parameter's hook copies them into the bucket, temporaries of the optimizer
step, and framework / allocator overhead. Leave room for them (`zero-mem tune --reserve`).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
OPTIMIZERS = ("adam", "sgd", "sgd_momentum")
OPTIMIZER_STATE_BYTES = {"adam": 8, "sgd": 0, "sgd_momentum": 4}  # fp32 bytes per element
# Every parameter starts 16-byte aligned in its flat buffer (zero/engine.py ALIGNMENT_BYTES;
# a test keeps the two equal).
ALIGNMENT_BYTES = 16
DEFAULT_REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's default, as in the config schema

BUILT = "built"
FORMULA_ONLY = "formula only — not yet built/measured"
STAGE3_FORMULA = "formula — stage 3 built, estimate not checked against it"

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

    @property
    def trainable_numel(self) -> int:
        return sum(_numel(shape) for group in self.groups for shape in group)

    @property
    def largest_param_numel(self) -> int:
        return max((_numel(shape) for group in self.groups for shape in group), default=0)

    @property
    def tensor_count(self) -> int:
        return sum(len(group) for group in self.groups)


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
    "params") mirrors a client optimizer's groups instead."""
    if not isinstance(module, torch.nn.Module):
        raise EstimateError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if param_groups is None:
        raw_groups = [list(module.parameters())]
    else:
        raw_groups = [list(g["params"]) if isinstance(g, Mapping) else list(g)
                      for g in param_groups]
    groups, seen = [], set()
    for raw in raw_groups:
        shapes = []
        for param in raw:
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            shapes.append(tuple(int(d) for d in param.shape))
        if shapes:
            groups.append(tuple(shapes))
    if not groups:
        raise EstimateError("the model has no trainable parameters")
    unique = {id(p): p for p in module.parameters()}
    frozen = sum(p.numel() for p in unique.values() if not p.requires_grad)
    return ModelShapes(groups=tuple(groups), description=description or type(module).__name__,
                       exact=True, frozen_numel=frozen)


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


def shapes_from_hf_config(path: str) -> ModelShapes:
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
    try:
        model = build_on_meta(transformers.AutoModelForCausalLM.from_config, config)
    except ValueError:
        model = build_on_meta(transformers.AutoModel.from_config, config)
    return shapes_from_module(model, description=f"{type(model).__name__} ({config_file})")


def shapes_from_count(count: int, tensor_numel: int | None = None,
                      reduce_bucket_size: int = DEFAULT_REDUCE_BUCKET_SIZE) -> ModelShapes:
    """`--params N` without shapes: N elements as ceil(N / T) tensors of T elements (the last
    one smaller), T = tensor_numel or, by default, min(N, reduce_bucket_size), so that the
    largest unit is about reduce_bucket_size, as in a real model whose layers are smaller than
    a bucket.

    What this gets right: every byte count that is a multiple of Ψ, to within the padding
    (at most world_size x alignment - 1 elements per unit). What it cannot know: the real
    unit boundaries and the largest parameter, so the stage-2 bucket (and the stage-3
    working set) are estimates; a model with a parameter larger than reduce_bucket_size has
    larger buckets. Use --model for an exact answer."""
    count = int(count)
    if count < 1:
        raise EstimateError(f"--params must be >= 1, got {count}")
    size = int(tensor_numel) if tensor_numel else min(count, int(reduce_bucket_size))
    if size < 1:
        raise EstimateError(f"--tensor-numel must be >= 1, got {size}")
    full, rest = divmod(count, size)
    if full + bool(rest) > 200_000:
        raise EstimateError(f"--params {count} as tensors of {size} elements is "
                            f"{full + bool(rest):,} tensors; pass a larger --tensor-numel")
    shapes = [(size,)] * full + ([(rest,)] if rest else [])
    return ModelShapes(groups=(tuple(shapes),), description=f"{count:,} parameters (--params)",
                       exact=False,
                       note=f"approximate layout: {len(shapes)} tensor(s) of at most {size:,} "
                            "elements stand in for the real shapes (exact padding and buckets "
                            "need them: use --model)")


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
                "reduce_bucket_size": self.reduce_bucket_size, "overlap_comm": self.overlap_comm}


def setup_from_config(config, world_size: int, num_nodes: int = 1, **overrides):
    """(Setup, stage) from a DeepSpeed JSON config (a path or dict); keyword overrides that are
    not None win (precision, optimizer, reduce_bucket_size, overlap_comm, stage). Stage 3 and
    offload configs are read too (the estimate covers them as formulas)."""
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
    name: str
    stage: int
    offload_optimizer: bool = False
    offload_param: bool = False

    @property
    def built(self) -> bool:
        return self.stage <= 2 and not self.offload_optimizer and not self.offload_param


OPTIONS = (
    Option("stage 0", 0),
    Option("stage 1", 1),
    Option("stage 2", 2),
    Option("stage 1 + offload optimizer", 1, offload_optimizer=True),
    Option("stage 2 + offload optimizer", 2, offload_optimizer=True),
    Option("stage 3", 3),
    Option("stage 3 + offload optimizer", 3, offload_optimizer=True),
    Option("stage 3 + offload optimizer + params", 3, offload_optimizer=True, offload_param=True),
)

CATEGORIES = ("param", "gradient", "fp32_master", "optimizer_state", "bucket", "gathered_param")


@dataclass
class Estimate:
    option: Option
    setup: Setup
    categories: dict[str, dict]   # name -> {"bytes", "formula", "location": device|host}
    numel: int                    # Ψ (padded)
    shard_numel: int              # Ψ/N (padded)
    max_unit_numel: int           # U
    unit_count: int
    groups: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.option.name

    @property
    def status(self) -> str:
        if self.option.built:
            return BUILT
        if self.option.stage == 3 and not (self.option.offload_optimizer or self.option.offload_param):
            return STAGE3_FORMULA
        return FORMULA_ONLY

    def bytes_at(self, location: str) -> int:
        return sum(row["bytes"] for row in self.categories.values() if row["location"] == location)

    @property
    def device_bytes(self) -> int:
        return self.bytes_at("device")

    @property
    def host_bytes(self) -> int:
        return self.bytes_at("host")

    @property
    def model_state_bytes(self) -> int:
        """param + gradient + fp32_master + optimizer_state, wherever they live."""
        return sum(self.categories[name]["bytes"] for name in CATEGORIES[:4])

    def to_dict(self) -> dict:
        per_node = self.setup.ranks_per_node
        return {
            "option": self.name, "stage": self.option.stage,
            "offload_optimizer": self.option.offload_optimizer,
            "offload_param": self.option.offload_param,
            "status": self.status, "built": self.option.built,
            "categories": self.categories,
            "device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
            "model_state_bytes": self.model_state_bytes,
            "per_node": {"ranks": per_node, "device_bytes": self.device_bytes * per_node,
                         "host_bytes": self.host_bytes * per_node},
            "numel": self.numel, "shard_numel": self.shard_numel,
            "max_unit_numel": self.max_unit_numel, "unit_count": self.unit_count,
            "groups": self.groups,
        }


def layouts(shapes: ModelShapes, setup: Setup, stage: int, reduce_bucket_size: int | None = None):
    """One zero._C.ShardedLayout per group, exactly as the engine builds it."""
    from zero import _C

    world = 1 if stage == 0 else setup.world_size
    unit = int(reduce_bucket_size or setup.reduce_bucket_size)
    return [_C.ShardedLayout([list(s) for s in group], DTYPE_NAMES[setup.precision], world,
                             setup.alignment, unit)
            for group in shapes.groups]


def _term(coefficient: int, sharded: bool) -> str:
    if not coefficient:
        return "0"
    return f"{coefficient}Ψ/N" if sharded else f"{coefficient}Ψ"


def estimate(shapes: ModelShapes, setup: Setup, option: Option | int = 0,
             reduce_bucket_size: int | None = None, overlap_comm: bool | None = None) -> Estimate:
    """Per-rank bytes by category for one option (an Option, or a stage number)."""
    if isinstance(option, int):
        option = next(o for o in OPTIONS if o.stage == option and not o.offload_optimizer)
    stage = option.stage
    b = setup.param_bytes
    n = 1 if stage == 0 else setup.world_size
    group_layouts = layouts(shapes, setup, stage, reduce_bucket_size)
    psi = sum(layout.full_numel for layout in group_layouts)
    shard = sum(layout.shard_numel for layout in group_layouts)
    largest_unit = max(layout.max_unit_numel for layout in group_layouts)
    overlap = setup.overlap_for(stage) if overlap_comm is None else overlap_comm
    slots = 2 if overlap else 1
    mixed = setup.precision != "fp32"
    optimizer_bytes = OPTIMIZER_STATE_BYTES[setup.optimizer]

    def row(coefficient: int, sharded: bool, location: str = "device") -> dict:
        return {"bytes": coefficient * (shard if sharded else psi),
                "formula": _term(coefficient, sharded), "location": location}

    opt_location = "host" if option.offload_optimizer else "device"
    categories = {
        "param": row(b, stage >= 3, "host" if option.offload_param else "device"),
        "gradient": row(b, stage >= 2),
        "fp32_master": row(4 if mixed else 0, stage >= 1, opt_location),
        "optimizer_state": row(optimizer_bytes, stage >= 1, opt_location),
    }
    bucket_bytes = 0
    if stage >= 2:
        # GradReducer: min(slots, units) buckets per group, each a full unit + its 1/N piece.
        bucket_bytes = sum(min(slots, layout.unit_count) *
                           (layout.max_unit_numel + layout.max_unit_numel // n) * b
                           for layout in group_layouts)
    sum_text = "Σ groups " if len(group_layouts) > 1 else ""
    categories["bucket"] = {
        "bytes": bucket_bytes, "location": "device",
        "formula": f"{sum_text}{slots}·(U + U/N)·{b}" if stage >= 2 else "0"}
    gathered = 2 * largest_unit * b if stage >= 3 else 0
    categories["gathered_param"] = {
        "bytes": gathered, "location": "device",
        "formula": f"2·U·{b} (unit in use + one prefetched)" if stage >= 3 else "0"}
    return Estimate(
        option=option, setup=setup, categories=categories, numel=psi, shard_numel=shard,
        max_unit_numel=largest_unit, unit_count=sum(l.unit_count for l in group_layouts),
        groups=[{"numel": l.full_numel, "shard_numel": l.shard_numel,
                 "max_unit_numel": l.max_unit_numel, "unit_count": l.unit_count}
                for l in group_layouts])


def estimate_all(shapes: ModelShapes, setup: Setup) -> list[Estimate]:
    """Every option of OPTIONS: stages 0-2 exact, stage 3 / offload as formulas."""
    return [estimate(shapes, setup, option) for option in OPTIONS]


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
    ]
    if shapes.note:
        lines.append(f"note: {shapes.note}")
    sharded = next((e for e in estimates if e.option.stage >= 1), first)
    lines.append(f"padded: Ψ = {first.numel:,} (stage 0), {sharded.numel:,} (stages 1-3, "
                 f"Ψ/N = {sharded.shard_numel:,}); largest unit U = {sharded.max_unit_numel:,} "
                 f"elements in {sharded.unit_count} unit(s)")
    lines.append("")
    names = ["param", "gradient", "fp32_master", "optimizer_state", "bucket", "gathered_param"]
    headers = ["per rank", *names, "device", "host (offload)"]
    rows = []
    for est in estimates:
        mark = "*" if selected_stage is not None and est.option.stage == selected_stage and \
            not est.option.offload_optimizer else " "
        cells = []
        for name in names:
            row = est.categories[name]
            text = format_bytes(row["bytes"])
            cells.append(text + (" (host)" if row["location"] == "host" and row["bytes"] else ""))
        rows.append([f"{mark}{est.name}", *cells, format_bytes(est.device_bytes),
                     format_bytes(est.host_bytes)])
    lines.extend(_table(headers, rows))
    lines.append("")
    per_node = setup.ranks_per_node
    headers = ["formula per rank", "on the device", "on the host", f"devices/node (x{per_node})",
               f"host RAM/node (x{per_node})", "status"]
    rows = [[est.name, location_formula(est, "device"), location_formula(est, "host"),
             format_bytes(est.device_bytes * per_node), format_bytes(est.host_bytes * per_node),
             est.status] for est in estimates]
    lines.extend(_table(headers, rows, left={0, 1, 2, 5}))
    lines.append(f"(Ψ padded parameter count, N = {setup.world_size} ranks, U = largest unit in "
                 f"elements, b = {setup.param_bytes})")
    lines.append("")
    lines.append("Built stages (0-2) are exact: each category equals the engine's measured "
                 "`current` bytes. Not included anywhere: activations, autograd's transient "
                 "gradients, optimizer-step temporaries, framework and allocator overhead.")
    return "\n".join(lines)


def location_formula(est: Estimate, location: str) -> str:
    """The bytes at one location in the paper's notation, e.g. '2Ψ + 14Ψ/N + 1·(U + U/N)·2'."""
    full = divided = 0
    extra = []
    for name in CATEGORIES:
        row = est.categories[name]
        if row["location"] != location or not row["bytes"]:
            continue
        text = row["formula"]
        if text.endswith("Ψ/N"):
            divided += int(text[:-3])
        elif text.endswith("Ψ"):
            full += int(text[:-1])
        else:
            extra.append(text.split(" (")[0])
    parts = ([f"{full}Ψ"] if full else []) + ([f"{divided}Ψ/N"] if divided else []) + extra
    return " + ".join(parts) or "0"


def _table(headers: list[str], rows: list[list[str]], left=frozenset({0})) -> list[str]:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]
