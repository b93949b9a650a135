"""Per-rank memory of model states before training: what the engine will allocate.

The estimate is exact, not a paper formula: the parameters are laid out with the engine's own
planner (`zero._C.ShardedLayout` / `plan_partition`: every unit padded to a multiple of
world_size x alignment, alignment = 16 bytes / element size; stage 0 lays out for one rank),
and every category is the byte count the engine's accounting registry reports after a step:

    param            b·Ψ (stages 0-2)         stage 3: b·Ψ/N + b·Ψp
    gradient         b·Ψ (stages 0, 1)        b·Ψ/N (stage 2)      stage 3: b·Ψ/N + b·Ψp
                     (stages 2-3 with the whole optimizer step offloaded: the b·Ψ/N shard
                     in host memory; stage 1 with gradient_accumulation_steps 1: b·Ψ/N,
                     its gradients sharded as at stage 2)
    fp32_master      4·Ψ (stage 0)            4·Ψ/N (stages >= 1; stage 3 + 4·Ψp/N)
                     0 when training in fp32 without optimizer offload (the parameter
                     shard is the master)
    optimizer_state  8·Ψ or 8·Ψ/N (Adam, Lamb) 4· (SGD with momentum, Adagrad, Lion)   0 (SGD)
    bucket           0 (stage 0)              made per unit at its first gradient (stage 1:
                                              at its reduce-scatter) and freed once reduced:
                                              the backward's peak, nothing between steps.
                                              stage 1: Σ over groups of slots·U/N·b;
                                              stage 2 (and stage 1 with gradient accumulation
                                              steps 1): Σ over groups of slots·(U + U/N)·b,
                                              U over the `slots` neighbouring units (launch
                                              order) that hold the most, slots = 2 with
                                              overlap_comm, else 1; stage 3: the
                                              min(slots, units) largest units' (U + U/N)·b
                                              (1 slot: 2 when the root's bucket fills over all
                                              of backward), + the persistent group's
                                              min(slots, units)·Up/N·b. No U/N piece where the
                                              reduced 1/N goes straight into the gradient
                                              shard (categories.bucket_pieces): gradient
                                              accumulation steps 1, no qgZ or MiCS, the shard
                                              on the buckets' device
    gathered_param   0 (stages 0-2)           stage 3: W·b, W = the most elements gathered at
                                              once (peak), from the gather schedule's rule;
                                              with the hybrid engine, every unit (Ψ·b): its
                                              generate holds them all

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
gradient shard is in host memory too (stage 3: the partitioned group's), unless
offload_optimizer.grads_on_device keeps it on the device. Every engine group
(stages 1-2: one per optimizer group; stage 3: the partitioned group and the persistent
stage-1 group) owns one host pool that adds `staging`:

    chunk C          min(sub_group_size, 4,194,304, the group's Ψ/N) elements
    cpu              2 slots x (C·b gradients + C·b parameters if the model is 16-bit);
                     with offload_optimizer.delayed_update instead the shard's gradients
                     and new parameters, 2 x b·Ψ/N
    nvme             the cpu chunks (no delayed update with NVMe) + 2 slots x each state
                     array (master, exp_avg, exp_avg_sq; master + one array: momentum,
                     Adagrad's sum, Lion's exp_avg; master) x
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
# The modules of this package, one concept each (the estimate's names are all re-exported
# here: `from zero.reports import estimate as est; est.estimate(...)`):
#   errors             EstimateError
#   sizes              byte and element counts: parse, format, round to I/O pages
#   training_setup     Setup (ranks, precision, optimizer, stage 3, offload), setup_from_config
#   shapes             ModelShapes, from a module or a parameter count
#   model_loading      the model from an import path or a Hugging Face config, on meta
#   options            Option, OPTIONS (stages 0-3 x offload), option_for
#   categories         a category's row; where gradients, master and optimizer state live
#   result             Estimate: bytes per category and location
#   layout             the engine's layouts: stages 0-2, stage 3 (Stage3Layout)
#   gather_schedule    stage 3's working set: the engine's gather schedule replayed
#   params_on_nvme     offload_param nvme: ParamPlacement, the param row
#   staging            offload's staging row and detail
#   estimate_stages_0_2, estimate_stage3    the estimate of one option, per stage
#   estimator          estimate(), estimate_all()
#   mesh               pipeline stages x tensor slices: each part's shapes (MeshSizes, mesh_parts)
#   text               format_estimates, location_formula
from offload import OFFLOAD_TILE

from .categories import CATEGORIES, LOCATIONS, by_location
from .errors import EstimateError
from .estimator import estimate, estimate_all
from .gather_schedule import WorkingSet, simulate_stage3_schedule
from .layout import Stage3Layout, layouts, stage3_layout
from .mesh import MeshPart, MeshSizes, mesh_parts, tensor_slice
from .model_loading import build_on_meta, import_factory, model_from_hf_config, \
    shapes_from_factory, shapes_from_hf_config
from .options import OPTIONS, Option, option_for
from .params_on_nvme import ParamPlacement, param_placement
from .result import BUILT, FORMULA_ONLY, STAGE3_ASSUMED_UNITS, STAGE3_FORMULA, Estimate
from .shapes import MAX_ASSUMED_UNITS, ModelShapes, shapes_from_count, shapes_from_module
from .sizes import IO_ALIGNMENT, GiB, KiB, MiB, format_bytes, parse_bytes, parse_count
from .staging import state_arrays
from .text import format_estimates, location_formula
from .training_setup import (ALIGNMENT_BYTES, DEFAULT_MAX_INFLIGHT_GATHERS,
                             DEFAULT_MAX_LIVE_PARAMETERS, DEFAULT_MAX_REUSE_DISTANCE,
                             DEFAULT_PARAM_BUFFER_COUNT, DEFAULT_PARAM_BUFFER_SIZE,
                             DEFAULT_PARAM_MAX_IN_CPU, DEFAULT_PERSISTENCE_THRESHOLD,
                             DEFAULT_PREFETCH_BUCKET_SIZE, DEFAULT_REDUCE_BUCKET_SIZE,
                             DEFAULT_SUB_GROUP_SIZE, DTYPE_NAMES, OFFLOAD_DEVICES, OPTIMIZERS,
                             PARAM_BYTES, PRECISIONS, STAGE3_KEYS, Setup,
                             optimizer_state_bytes, setup_from_config)

__all__ = [
    "ALIGNMENT_BYTES", "BUILT", "CATEGORIES", "DEFAULT_MAX_INFLIGHT_GATHERS",
    "DEFAULT_MAX_LIVE_PARAMETERS", "DEFAULT_MAX_REUSE_DISTANCE", "DEFAULT_PARAM_BUFFER_COUNT",
    "DEFAULT_PARAM_BUFFER_SIZE", "DEFAULT_PARAM_MAX_IN_CPU", "DEFAULT_PERSISTENCE_THRESHOLD",
    "DEFAULT_PREFETCH_BUCKET_SIZE", "DEFAULT_REDUCE_BUCKET_SIZE", "DEFAULT_SUB_GROUP_SIZE",
    "DTYPE_NAMES", "Estimate", "EstimateError", "FORMULA_ONLY", "GiB", "IO_ALIGNMENT", "KiB",
    "LOCATIONS", "MAX_ASSUMED_UNITS", "MeshPart", "MeshSizes", "MiB", "ModelShapes", "OFFLOAD_DEVICES", "OFFLOAD_TILE",
    "OPTIMIZERS", "OPTIONS", "Option", "PARAM_BYTES", "PRECISIONS",
    "ParamPlacement", "STAGE3_ASSUMED_UNITS", "STAGE3_FORMULA", "STAGE3_KEYS", "Setup",
    "Stage3Layout", "WorkingSet", "build_on_meta", "by_location", "estimate", "estimate_all", "format_bytes",
    "format_estimates", "import_factory", "layouts", "location_formula", "mesh_parts", "model_from_hf_config", "optimizer_state_bytes", "option_for",
    "param_placement", "parse_bytes", "parse_count", "setup_from_config", "shapes_from_count",
    "shapes_from_factory", "shapes_from_hf_config", "shapes_from_module",
    "simulate_stage3_schedule", "stage3_layout", "state_arrays", "tensor_slice",
]
