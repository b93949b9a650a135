"""What an engine does differently for a model with MoE layers (ZeroEngine takes one
`ExpertLayout`, or None without MoE):

- the layers' process groups are made (layer.MoE.set_deepspeed_parallelism);
- each expert parameter starts from its expert data-parallel group's first rank (the shared
  ones from rank 0), as DeepSpeed broadcasts them;
- the experts' engine groups shard and reduce over their expert data-parallel group, their
  gradient mean divided by the whole world (`data_group`);
- the gradient norm is the whole model's: at stages 1-2 each element is held by one rank of
  the world already; at stage 0 each rank's squares are weighted (shared ones 1/world,
  experts 1/expert data-parallel size) and summed over the world (`norm_span`). DeepSpeed's
  norm is built from each rank's norm over its own experts (averaged over ranks), not every
  expert once, so with clipping the two engines clip by different norms.

Built with ZeRO stages 0-3 on the whole world (DeepSpeed refuses its MoE at stage 3; here
the experts' stage-3 groups partition them over their expert data-parallel group, gathered
within it); every other combination is refused here, naming the fix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from .. import init as zero_init
from ..parallel.norm_span import NormSpan
from .groups import EXPERT_GROUPS, ExpertDataGroup, ExpertGroups, layout
from .ep_experts import ExpertParallelExperts
from .layer import MoE
from .params import is_moe_param


@dataclass(frozen=True)
class ExpertLayout:
    """The expert groups of an engine's MoE layers, by name ("ep_size_{n}")."""
    groups: dict[str, ExpertGroups]
    world: int
    layers: tuple  # the model's MoE layers

    @classmethod
    def of(cls, model: nn.Module, config, *, whole_world: bool, tensor_parallel_group,
           sequence_parallel) -> "ExpertLayout | None":
        layers = [module for module in model.modules()
                  if isinstance(module, (MoE, ExpertParallelExperts))]
        if not layers:
            return None
        _check_supported(config, whole_world, tensor_parallel_group, sequence_parallel)
        if any(zero_init.is_partitioned(p) for layer in layers if isinstance(layer, MoE)
               for p in layer.parameters()):  # (AutoEP's experts were gathered when split)
            raise NotImplementedError(
                "zero: DeepSpeed-MoE layers built under zero.Init are not built (zero.Init "
                "partitions over every rank, the experts differ between ranks); build the "
                "model without zero.Init")
        for layer in layers:
            layer.set_deepspeed_parallelism(bool(config.use_data_before_expert_parallelism))
        names = sorted({layer.expert_group_name for layer in layers})
        return cls({name: EXPERT_GROUPS.get(name) for name in names}, dist.get_world_size(),
                   tuple(layers))

    def check_optimizer(self, kind: str) -> None:
        """LAMB's trust ratios and Muon's whole matrices add up squares over the engine's
        ranks, which hold other experts: not built for MoE's expert groups."""
        if kind in ("lamb", "muon"):
            raise NotImplementedError(
                f"zero: optimizer {kind!r} with MoE layers is not built (its per-parameter "
                "norms would mix other ranks' experts); use Adam, AdamW, SGD, Adagrad or Lion")

    def _groups_of(self, tensor) -> ExpertGroups | None:
        if is_moe_param(tensor):
            return self.groups[tensor.group_name]
        if isinstance(tensor, nn.Parameter):  # a shared parameter
            return None
        for layer in self.layers:  # an expert's buffer (looked up now: .to() replaces them)
            if any(buffer is tensor for buffer in layer.expert_buffers()):
                return self.groups[layer.expert_group_name]
        return None

    def _split_groups(self, param) -> ExpertGroups | None:
        """An expert parameter's groups where its expert data-parallel group is smaller than
        the world (None: a shared parameter, or ep_size 1: the engine's own group)."""
        groups = self._groups_of(param)
        return None if groups is None or len(groups.data_ranks) == self.world else groups

    def source(self, tensor) -> tuple[int, object]:
        """(global rank, group) a parameter's or buffer's starting value is broadcast from
        and over: an expert's from its expert data-parallel group's first rank."""
        groups = self._groups_of(tensor)
        if groups is None:
            return 0, dist.group.WORLD
        return groups.data_ranks[0], groups.data_group

    def data_group(self, param) -> ExpertDataGroup | None:
        """The group an expert parameter's engine group shards and reduces over; None for a
        shared one, or where its experts are on every rank (ep_size 1)."""
        groups = self._split_groups(param)
        return None if groups is None else ExpertDataGroup(groups.data_group.group_name,
                                                           self.world)

    def modifier_source(self, param, modifier_rank: int) -> tuple[int, object]:
        """(rank, group) an edit under GatheredParameters(modifier_rank=r) is broadcast from
        and over: a shared parameter's from r over the world; an expert's within its expert
        data-parallel group, from the member at r's place in r's own such group (r holds
        other experts)."""
        groups = self._groups_of(param)
        if groups is None:
            return modifier_rank, None
        _, data_layout = layout(self.world, groups.ep_size, groups.data_before_expert)
        place = next(ranks.index(modifier_rank) for ranks in data_layout
                     if modifier_rank in ranks)
        return groups.data_ranks[place], groups.data_group

    def shard_group(self, param, shard_world: int) -> tuple[int, object] | None:
        """(this rank's place, the process group) an expert parameter's shards are spread
        over, for reading and writing its elements (zero/param_values.py, a checkpoint's
        reshard); None for a shared one, and where its engine group is held whole
        (`shard_world`, its layout's world size, 1: stage 0, or ep_size the world)."""
        groups = self._split_groups(param)
        return None if groups is None or shard_world == 1 else \
            (groups.data_rank, groups.data_group)

    def norm_span(self, model: nn.Module, stage: int) -> NormSpan | None:
        """Stage 0: the weights that make the summed squares the whole model's (above)."""
        if stage != 0:
            return None
        weights = {}
        for param in model.parameters():
            groups = self._groups_of(param)
            weights[id(param)] = 1.0 / (len(groups.data_ranks) if groups else self.world)
        return NormSpan(dist.group.WORLD, weights)


def _check_supported(config, whole_world: bool, tensor_parallel_group, sequence_parallel):
    zero_cfg = config.zero_optimization
    if zero_cfg.stage == 3:
        stage3_keys = [key for key, on in (
            ("mics_shard_size", zero_cfg.mics_shard_size > 0),
            ("zero_hpz_partition_size", zero_cfg.zero_hpz_partition_size > 1),
            ("zero_quantized_weights", zero_cfg.zero_quantized_weights),
            ("zero_quantized_gradients", zero_cfg.zero_quantized_gradients),
            ("zero_quantized_nontrainable_weights", zero_cfg.zero_quantized_nontrainable_weights),
            ("offload_param", zero_cfg.offload_param.device != "none")) if on]
        if stage3_keys:
            raise NotImplementedError(
                f"zero: MoE layers at stage 3 with zero_optimization.{stage3_keys[0]} are not "
                "built (the experts shard over their own expert data-parallel group); leave it "
                "at its default, or use stage 1 or 2")
    others = [name for name, on in (
        ("pipeline or tensor parallelism", not whole_world or tensor_parallel_group is not None),
        ("sequence parallelism", sequence_parallel is not None)) if on]
    if others:
        raise NotImplementedError(
            f"zero: MoE layers with {others[0]} are not built; train the MoE model with data "
            "and expert parallelism alone")
