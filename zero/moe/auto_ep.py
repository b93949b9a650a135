"""AutoEP: DeepSpeed's `expert_parallel` block, expert parallelism for a Hugging Face MoE model
without changing its code.

When the engine is built with `"expert_parallel": {"enabled": true, "autoep_size": N}`, each
sparse MoE block of the model (a module whose name matches `moe_layer_pattern`, default
`model.layers.<i>.mlp`, with a `gate` router and `experts` holding transformers 5's stacked
`gate_up_proj` / `down_proj`) keeps its router and gets `ExpertParallelExperts`
(ep_experts.py) for its experts: this rank's num_experts / N of them, the tokens exchanged
by all-to-all. The expert-parallel groups are DeepSpeed-MoE's (`ep_size_N`, groups.py), so
the engine trains them as it trains DeepSpeed-MoE experts (engine_layout.py) at ZeRO stages
0-3.

Unlike DeepSpeed 0.19.8's AutoEP, the blocks keep Hugging Face's own router, module and
parameter names (`...mlp.experts.gate_up_proj`): routing and the load-balancing loss are
the model's, and a whole-model save (`save_16bit_model`, zero_to_fp32) is a state dict
`from_pretrained` reads. (DeepSpeed 0.19.8's AutoEP does not start on transformers 5.24:
its preset calls the model's output-recorder registry with another signature.)
"""
from __future__ import annotations

import re

import torch.distributed as dist
from torch import nn

from .. import init as zero_init
from .ep_experts import ExpertParallelExperts
from .groups import EXPERT_GROUPS

DEFAULT_PATTERN = r"model\.layers\.\d+\.mlp"
# DeepSpeed's presets and the Hugging Face model types each stands for
PRESETS = {"mixtral": ("mixtral",), "qwen3_moe": ("qwen3_moe", "qwen2_moe")}


def apply(model: nn.Module, settings, data_before_expert: bool) -> list[ExpertParallelExperts]:
    """Splits the experts of `model`'s MoE blocks over `settings.autoep_size` ranks (config
    block `expert_parallel`), in place; the new experts modules, [] when it is off."""
    if not settings.enabled:
        return []
    ep_size, world = settings.autoep_size, dist.get_world_size()
    if world % ep_size:
        raise ValueError(f"zero: expert_parallel.autoep_size={ep_size} does not divide the world "
                         f"of {world} ranks; use a divisor of {world}")
    blocks = moe_blocks(model, settings)
    groups = EXPERT_GROUPS.create(ep_size, data_before_expert)
    for _, block in blocks:
        if not isinstance(block.experts, ExpertParallelExperts):  # (split by an earlier engine)
            block.experts = ExpertParallelExperts(block.experts, ep_size, groups.expert_rank)
    return [block.experts for _, block in blocks]


def moe_blocks(model: nn.Module, settings) -> list[tuple[str, nn.Module]]:
    """(name, block) of the MoE blocks whose experts `settings` (the expert_parallel block)
    splits, each checked to split autoep_size ways (the memory estimate reads them too)."""
    pattern = _pattern(model, settings)
    blocks = [(name, module) for name, module in model.named_modules()
              if pattern.fullmatch(name) and _is_moe_block(module)]
    if not blocks:
        raise ValueError(
            f"zero: expert_parallel is enabled but {type(model).__name__} has no MoE block: no "
            f"module named like {pattern.pattern!r} with a `gate` router and `experts` holding "
            "3-D gate_up_proj and down_proj (transformers 5's layout); set "
            "expert_parallel.moe_layer_pattern to the blocks' module names, or disable it")
    for name, block in blocks:
        _check_experts(name, block.experts, settings.autoep_size)
    return blocks


def _pattern(model: nn.Module, settings) -> re.Pattern:
    """The blocks' name pattern: the config's, or the default for a model DeepSpeed has a
    preset for (named by preset_model, or found by config.model_type)."""
    if settings.moe_layer_pattern:
        try:
            return re.compile(settings.moe_layer_pattern)
        except re.error as error:
            raise ValueError(f"zero: expert_parallel.moe_layer_pattern="
                             f"{settings.moe_layer_pattern!r} is not a regular expression "
                             f"({error})") from error
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    known = [t for types in PRESETS.values() for t in types]
    if settings.preset_model is None and model_type not in known:
        raise ValueError(
            f"zero: expert_parallel has no preset for model type {model_type!r} (presets: "
            f"{', '.join(known)}); set expert_parallel.moe_layer_pattern to the MoE blocks' "
            "module names")
    return re.compile(DEFAULT_PATTERN)


def _is_moe_block(module: nn.Module) -> bool:
    experts = getattr(module, "experts", None)
    return isinstance(getattr(module, "gate", None), nn.Module) and all(
        isinstance(getattr(experts, name, None), nn.Parameter)
        and len(zero_init.full_shape(getattr(experts, name))) == 3
        for name in ("gate_up_proj", "down_proj"))


def _check_experts(name: str, experts: nn.Module, ep_size: int) -> None:
    """The stacked layout ExpertParallelExperts computes with, splittable ep_size ways."""
    if isinstance(experts, ExpertParallelExperts):
        if experts.ep_size != ep_size:
            raise ValueError(f"zero: MoE block {name}'s experts were split over "
                             f"{experts.ep_size} ranks by an earlier engine; build the model "
                             f"again for expert_parallel.autoep_size={ep_size}")
        return
    # (the whole shapes: experts built under zero.Init hold this rank's shard until split)
    gate_up, down = (zero_init.full_shape(p) for p in (experts.gate_up_proj, experts.down_proj))
    count, hidden = gate_up[0], gate_up[2]
    others = sorted({n for n, _ in experts.named_parameters()} - {"gate_up_proj", "down_proj"})
    problem = None
    if others:
        problem = (f"its experts also hold {others} (biases or other weights this AutoEP does not "
                   "compute)")
    elif tuple(down) != (count, hidden, gate_up[1] // 2) or gate_up[1] % 2:
        problem = (f"its experts' shapes {tuple(gate_up)} and {tuple(down)} are not "
                   "[experts, 2 x intermediate, hidden] and [experts, hidden, intermediate]")
    elif not callable(getattr(experts, "act_fn", None)):
        problem = "its experts have no act_fn"
    elif _other_layout(experts):
        problem = (f"its experts compute otherwise than act(gate) * up ({_other_layout(experts)}: "
                   "transformers' experts layout flags or gate function)")
    elif count % ep_size:
        problem = (f"its {count} experts do not split over expert_parallel.autoep_size="
                   f"{ep_size} ranks; use a divisor of {count}")
    if problem:
        raise ValueError(f"zero: expert_parallel cannot split MoE block {name}: {problem}")


# transformers' use_experts_implementation flags, at the layout ExpertParallelExperts computes
_DEFAULT_LAYOUT = {"has_gate": True, "has_bias": False, "has_post_expert_norm": False,
                   "is_transposed": False, "is_concatenated": True}


def _other_layout(experts: nn.Module) -> str | None:
    """What differs from [gate; up] concatenated, act(gate) * up, no bias or norm (None: as
    computed here)."""
    for flag, default in _DEFAULT_LAYOUT.items():
        if getattr(experts, flag, default) != default:
            return f"{flag}={getattr(experts, flag)}"
    gate = getattr(type(experts), "_apply_gate", None)
    if gate is not None and gate.__name__ != "_default_apply_gate":
        return f"{type(experts).__name__}._apply_gate"
    return None
