"""DeepSpeed-MoE's process groups, named `ep_size_{n}` as DeepSpeed names them.

- An **expert-parallel group**: the `ep_size` ranks that split one layer's experts among
  them and trade tokens by all-to-all.
- An **expert data-parallel group**: the `world / ep_size` ranks that hold the same experts,
  over which the experts' gradients are reduced and their optimizer state is sharded.

Layouts, as DeepSpeed's `groups._create_expert_and_data_parallel` lays them out:
- "E + D" (the default): expert-parallel groups of consecutive ranks ([0, 1], [2, 3] for
  ep 2 on 4 ranks), so rank r is expert-parallel rank r % ep and its expert data-parallel
  group is [r % ep, r % ep + ep, ...].
- "D + E" (`use_data_before_expert_parallelism`): expert data-parallel groups of consecutive
  ranks, expert-parallel groups strided.

The groups live for the process, as DeepSpeed's do (`deepspeed.utils.groups`): every MoE
layer of one `ep_size` shares them, and `groups.EXPERT_GROUPS` is where they are kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


def group_name(ep_size: int) -> str:
    return f"ep_size_{ep_size}"


@dataclass(frozen=True)
class ExpertGroups:
    """This rank's two groups for one `ep_size`."""
    ep_size: int
    data_before_expert: bool       # the "D + E" layout
    expert_ranks: tuple[int, ...]  # this rank's expert-parallel group
    expert_group: object           # its torch ProcessGroup (None for a single rank)
    data_ranks: tuple[int, ...]    # this rank's expert data-parallel group
    data_group: object             # its torch ProcessGroup

    @property
    def name(self) -> str:
        return group_name(self.ep_size)

    @property
    def expert_rank(self) -> int:
        """This rank's place in its expert-parallel group: which experts it holds."""
        return self.expert_ranks.index(dist.get_rank())

    @property
    def data_rank(self) -> int:
        return self.data_ranks.index(dist.get_rank())


@dataclass(frozen=True)
class ExpertDataGroup:
    """What an engine group of expert parameters shards and reduces over: the registered name
    of the expert data-parallel group and the count its gradient mean divides by (the whole
    data-parallel world: DeepSpeed keeps an expert's gradient the same whatever ep_size)."""
    name: str
    average_over: int


def layout(world: int, ep_size: int, data_before_expert: bool
           ) -> tuple[list[list[int]], list[list[int]]]:
    """(expert-parallel groups, expert data-parallel groups) of `world` ranks."""
    if ep_size < 1 or world % ep_size:
        raise ValueError(
            f"zero: MoE ep_size={ep_size} does not divide the world of {world} ranks; use an "
            f"ep_size that divides it (1, {', '.join(str(d) for d in range(2, world + 1) if world % d == 0)})")
    replicas = world // ep_size
    if data_before_expert:
        data = [list(range(i * replicas, (i + 1) * replicas)) for i in range(ep_size)]
        expert = [list(range(i, world, replicas)) for i in range(replicas)]
    else:
        expert = [list(range(i * ep_size, (i + 1) * ep_size)) for i in range(replicas)]
        data = [list(range(i, world, ep_size)) for i in range(ep_size)]
    return expert, data


class _Registry:
    """The groups made so far, by name; made on every rank in the same order."""

    def __init__(self):
        self._groups: dict[str, ExpertGroups] = {}
        self._world = None  # the torch.distributed world they were made in

    def create(self, ep_size: int, data_before_expert: bool = False) -> ExpertGroups:
        if self._world is not dist.group.WORLD:  # a new process group: the old ones are gone
            self._groups, self._world = {}, dist.group.WORLD
        name = group_name(ep_size)
        if name not in self._groups:
            self._groups[name] = _make(ep_size, data_before_expert)
        made = self._groups[name]
        if made.data_before_expert != data_before_expert:
            raise ValueError(
                f"zero: the MoE groups {name} were made with use_data_before_expert_parallelism="
                f"{str(made.data_before_expert).lower()} in this process; a model cannot take "
                f"the other layout now: set use_data_before_expert_parallelism to "
                f"{str(made.data_before_expert).lower()}")
        return made

    def get(self, name: str) -> ExpertGroups:
        if name not in self._groups or self._world is not dist.group.WORLD:
            raise KeyError(f"zero: no MoE process groups named {name!r}: they are made when an "
                           "engine is built over a model with MoE layers (or by "
                           "MoE.set_deepspeed_parallelism())")
        return self._groups[name]

    def names(self) -> list[str]:
        return list(self._groups) if self._world is dist.group.WORLD else []



EXPERT_GROUPS = _Registry()


def _make(ep_size: int, data_before_expert: bool) -> ExpertGroups:
    rank, world = dist.get_rank(), dist.get_world_size()
    expert_layout, data_layout = layout(world, ep_size, data_before_expert)
    mine = {}
    # every rank makes every group, in one order (torch.distributed.new_group's rule)
    for kind, groups in (("data", data_layout), ("expert", expert_layout)):
        for ranks in groups:
            group = dist.new_group(ranks) if len(ranks) < world else dist.group.WORLD
            if rank in ranks:
                mine[kind] = (tuple(ranks), group)
    return ExpertGroups(ep_size, data_before_expert, mine["expert"][0], mine["expert"][1],
                        mine["data"][0], mine["data"][1])
