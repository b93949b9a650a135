"""A Hugging Face MoE block's experts split over expert-parallel ranks (AutoEP, auto_ep.py).

Transformers 5 keeps a sparse MoE block's experts as two stacked parameters (Mixtral,
Qwen2-MoE, Qwen3-MoE, OLMoE, ...): `gate_up_proj` [experts, 2 x intermediate, hidden] and
`down_proj` [experts, hidden, intermediate], called as experts(hidden_states [tokens,
hidden], top_k_index [tokens, k], top_k_weights [tokens, k]) after the block's router.
`ExpertParallelExperts` takes their place with this rank's rows of both (its `ep_size`-th
of the experts, the same parameter objects cut down, under the same names) and runs the same
computation with the tokens exchanged:

1. each route (token, expert) is sorted by expert id; the rows go to the rank holding that
   expert, by one all-to-all of variable sizes (the counts traded first);
2. each local expert runs on the rows it received, as Hugging Face's loop runs it:
   act(x @ gate.T) * (x @ up.T) @ down.T;
3. the results go back by the reverse all-to-all, are weighted, and each token's are added
   in ascending expert id, in the block's dtype, as Hugging Face's loop over the experts adds
   them (on a GPU too, where one index_add of repeated tokens would add in any order).

The router, the block around it (jitter, shared experts) and the router logits Hugging
Face's load-balancing loss reads are the model's own. The parameters carry DeepSpeed's marks
(`allreduce = False`, `group_name = "ep_size_{n}"`): the engine shards and reduces them over
their expert data-parallel group (engine_layout.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .. import ds_param
from .. import init as zero_init
from .groups import EXPERT_GROUPS, group_name

# The key of a layer's entry in its state dict's `_metadata` while its stacked parameters
# hold this rank's rows: {"num_experts": E, "ep_size": n} (ep_checkpoint.whole_rows reads it).
LOCAL_ROWS = "autoep_local_rows"


class _AllToAllV(torch.autograd.Function):
    """Rows of dim 0 to each rank of `group` (`sends[r]` to rank r, `receives[r]` from it);
    the backward sends the gradients back the same way reversed."""

    @staticmethod
    def forward(ctx, group, sends: list[int], receives: list[int], rows: Tensor) -> Tensor:
        ctx.group, ctx.sends, ctx.receives = group, sends, receives
        output = rows.new_empty((sum(receives), *rows.shape[1:]))
        dist.all_to_all_single(output, rows.contiguous(), receives, sends, group=group)
        return output

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, None, None, _AllToAllV.apply(ctx.group, ctx.receives, ctx.sends, grad)


def _sum_in_expert_order(routes: Tensor, top_k_index: Tensor) -> Tensor:
    """[tokens, hidden]: each token's k weighted results [tokens, k, hidden] added one after
    another in ascending expert id, into zeros, as Hugging Face's loop over the experts adds
    them (the same sums, on any device)."""
    slots = torch.argsort(top_k_index, dim=1, stable=True)
    ordered = torch.gather(routes, 1, slots[..., None].expand(-1, -1, routes.shape[-1]))
    total = torch.zeros_like(ordered[:, 0])
    for j in range(ordered.shape[1]):
        total = total + ordered[:, j]
    return total


def _mark_local_rows(module: "ExpertParallelExperts", state: dict, prefix: str,
                     local_metadata: dict) -> None:
    """A state dict of the layer says that its stacked parameters are this rank's rows, in
    the layer's own metadata (ints only: torch.save keeps it, weights_only loads it)."""
    if module.ep_size > 1:
        local_metadata[LOCAL_ROWS] = {"num_experts": module.num_experts,
                                      "ep_size": module.ep_size}


class ExpertParallelExperts(nn.Module):
    """This rank's `num_experts / ep_size` experts of one MoE block (the module docstring)."""

    def __init__(self, experts: nn.Module, ep_size: int, expert_rank: int):
        """Every rank makes its layers in the same order: experts built under zero.Init
        (Hugging Face's from_pretrained at ZeRO-3) are gathered whole first, then cut."""
        super().__init__()
        self.num_experts = zero_init.full_shape(experts.gate_up_proj)[0]
        self.ep_size = ep_size
        self.num_local_experts = self.num_experts // ep_size
        self.expert_group_name = group_name(ep_size)
        self.act_fn = experts.act_fn
        self.ep_group = None
        first = expert_rank * self.num_local_experts
        for name in ("gate_up_proj", "down_proj"):  # the same parameters, cut to local rows
            param = getattr(experts, name)
            built_under_init = zero_init.is_partitioned(param)
            if built_under_init:
                zero_init.unpartition(param)  # (collective)
            with torch.no_grad():
                param.data = param.data[first:first + self.num_local_experts].clone()
            if built_under_init:  # DeepSpeed's marks at the rows kept (the engine's at stage
                # 3); not persistent: no GatheredParameters(modifier_rank=) broadcasts this
                # rank's rows over another's (zero.init.kept_whole)
                ds_param.mark(param, param.shape, persist=False)
            param.allreduce = False
            param.group_name = self.expert_group_name
            self.register_parameter(name, param)
        self.register_state_dict_post_hook(_mark_local_rows)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        """Makes (once per ep_size) and takes this layer's process groups (groups.py)."""
        groups = EXPERT_GROUPS.create(self.ep_size, use_data_before_expert_parallel_)
        self.ep_group = groups.expert_group

    def expert_buffers(self) -> list[Tensor]:
        return list(self.buffers())

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor
                ) -> Tensor:
        tokens, k = top_k_index.shape
        experts = top_k_index.reshape(-1)
        order = torch.argsort(experts, stable=True)  # routes by expert, tokens in order
        token_of = torch.div(order, k, rounding_mode="floor")
        counts = torch.bincount(experts, minlength=self.num_experts)
        received, per_expert, splits = self._exchange(hidden_states[token_of], counts)
        outputs = self._run(received, per_expert)
        if splits is not None:  # back to the ranks they came from, in the order sent
            outputs = _AllToAllV.apply(self.ep_group, splits[1], splits[0], outputs)
        weighted = (outputs * top_k_weights.reshape(-1)[order, None]).to(hidden_states.dtype)
        return _sum_in_expert_order(weighted[torch.argsort(order)].view(tokens, k, -1),
                                    top_k_index)

    def _exchange(self, rows: Tensor, counts: Tensor):
        """(the rows for this rank's experts from every rank, rank after rank, each rank's
        sorted by expert; their counts [ranks, local experts]; the row counts (sent to,
        received from) each rank, None on one rank)."""
        if self.ep_size == 1:
            return rows, counts.view(1, -1), None
        per_rank = counts.view(self.ep_size, self.num_local_experts)
        incoming = torch.empty_like(per_rank)
        dist.all_to_all_single(incoming, per_rank.contiguous(), group=self.ep_group)
        splits = (per_rank.sum(1).tolist(), incoming.sum(1).tolist())
        return _AllToAllV.apply(self.ep_group, *splits, rows), incoming, splits

    def _run(self, rows: Tensor, per_expert: Tensor) -> Tensor:
        """Each local expert on its rows (every expert runs, on no rows too: each parameter
        gets its gradient every step); the results in `rows`' order."""
        spans = per_expert.reshape(-1).tolist()  # [rank][expert] row counts, rank-major
        pieces = list(torch.split(rows, spans))
        ranks = per_expert.shape[0]
        for j in range(self.num_local_experts):
            mine = [pieces[r * self.num_local_experts + j] for r in range(ranks)]
            out = self._expert(j, torch.cat(mine))
            for r, part in enumerate(torch.split(out, [p.shape[0] for p in mine])):
                pieces[r * self.num_local_experts + j] = part
        return torch.cat(pieces)

    def _expert(self, j: int, x: Tensor) -> Tensor:
        gate, up = F.linear(x, self.gate_up_proj[j]).chunk(2, dim=-1)
        return F.linear(self.act_fn(gate) * up, self.down_proj[j])
