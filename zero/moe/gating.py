"""DeepSpeed-MoE's gates: which experts each token goes to, at which slot of the expert's
capacity, with which weight. The decisions are DeepSpeed's (`deepspeed.moe.sharded_moe`'s
top1gating, top2gating and topkgating; checked against its outputs in
tests/deepspeed_moe/), their auxiliary load-balancing loss too.

Every gate returns `Routes` (k routes per token, as [k, tokens] arrays: the expert, or -1
where the capacity dropped the route, the slot, the weight); `as_deepspeed` turns them into
DeepSpeed's return values: its sparse tuple, or its dense combine weights and dispatch mask.
Everything here is fp32, as in DeepSpeed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Routes:
    l_aux: Tensor       # the load-balancing loss
    capacity: int       # slots per expert
    num_experts: int
    indices: Tensor     # [k, tokens] int32: the expert of each route, -1 if dropped
    locations: Tensor   # [k, tokens] int32: its slot
    gates: Tensor       # [k, tokens] fp32: its weight
    exp_counts: Tensor  # [experts]: the routes each expert was chosen for, before drops

    def __post_init__(self):
        self.capacity = int(self.capacity)  # (DeepSpeed's sparse answer holds a tensor)

    def as_deepspeed(self, sparse_routes: bool):
        """DeepSpeed's return value: with sparse_routes (l_aux, capacity, experts, indices,
        locations, gates, exp_counts); else (l_aux, combine_weights [s, e, c],
        dispatch_mask, exp_counts)."""
        if sparse_routes:
            return (self.l_aux, torch.tensor(self.capacity), self.num_experts, self.indices,
                    self.locations, self.gates, self.exp_counts)
        tokens = self.indices.shape[1]
        combine = torch.zeros(tokens, self.num_experts, self.capacity,
                              device=self.gates.device)
        kept = self.indices >= 0
        token = torch.arange(tokens, device=kept.device).expand_as(kept)
        combine[token[kept], self.indices[kept].long(), self.locations[kept].long()] = \
            self.gates[kept]
        return self.l_aux, combine, combine.bool(), self.exp_counts


def capacity(tokens: int, experts: int, capacity_factor: float, min_capacity: int) -> int:
    """Slots per expert: tokens / experts * capacity_factor, rounded up (in fp32, as
    DeepSpeed computes it: 200 tokens, 8 experts, factor 1.2 give 31), at least
    min_capacity."""
    slots = torch.ceil(torch.tensor(tokens / experts) * torch.tensor(capacity_factor))
    return max(int(slots), int(min_capacity))


def _agreed_capacity(exp_counts: Tensor, ep_group) -> int:
    """drop_tokens=False: as many slots as the busiest expert needs, the same over the
    expert-parallel group (every rank's buffers must match for the all-to-all)."""
    busiest = exp_counts.max().reshape(1).clone()
    if ep_group is not None and dist.get_world_size(ep_group) > 1:
        dist.all_reduce(busiest, op=dist.ReduceOp.MAX, group=ep_group)
    return int(busiest.item())


def _gumbel(shape, like: Tensor) -> Tensor:
    one = torch.ones((), device=like.device)
    return torch.distributions.gumbel.Gumbel(torch.zeros_like(one), one).rsample(shape)


def _uniform(shape, like: Tensor, low: float, high: float) -> Tensor:
    return torch.distributions.uniform.Uniform(
        torch.tensor(low, device=like.device), torch.tensor(high, device=like.device)).rsample(shape)


def multiplicative_jitter(x: Tensor, device=None, epsilon: float = 1e-2) -> Tensor:
    """x times uniform noise in [1 - epsilon, 1 + epsilon] (the "Jitter" noisy gate)."""
    if epsilon == 0:
        return x
    return x * _uniform(x.shape, x, 1.0 - epsilon, 1.0 + epsilon)


def _balance_loss(gates: Tensor, first_choice: Tensor) -> Tensor:
    """mean gate probability times the fraction of tokens whose first choice is the expert,
    per expert (the Switch / GShard auxiliary loss before its scaling)."""
    return torch.mean(gates, dim=0) * torch.mean(first_choice.float(), dim=0)


def top1gating(logits: Tensor, capacity_factor: float, min_capacity: int, used_token=None,
               noisy_gate_policy=None, drop_tokens: bool = True, use_rts: bool = True,
               ep_group=None, sparse_routes: bool = False, use_tutel: bool = False):
    """DeepSpeed's top1gating (its signature and return values)."""
    return route_top1(logits, capacity_factor, min_capacity, used_token, noisy_gate_policy,
                      drop_tokens, use_rts, ep_group).as_deepspeed(sparse_routes)


def route_top1(logits: Tensor, capacity_factor: float, min_capacity: int, used_token=None,
               noisy_gate_policy=None, drop_tokens: bool = True, use_rts: bool = True,
               ep_group=None) -> Routes:
    tokens, experts = logits.shape
    gates = F.softmax(logits, dim=1)
    chooser = logits + _gumbel(logits.shape, logits) if noisy_gate_policy == "RSample" else gates
    choice = torch.argmax(chooser, dim=1)
    mask = F.one_hot(choice, num_classes=experts)
    if used_token is not None:
        mask = mask * used_token.reshape(-1, 1).to(mask.dtype)
    exp_counts = mask.sum(dim=0).detach()
    slots = capacity(tokens, experts, capacity_factor, min_capacity)
    if not drop_tokens:
        slots = min(_agreed_capacity(exp_counts, ep_group), tokens)
    l_aux = _balance_loss(gates, mask).sum() * experts
    if tokens < min_capacity:
        raise ValueError(
            f"zero: MoE top-1 gate got {tokens} tokens, fewer than min_capacity={min_capacity}; "
            "set min_capacity lower (0 is allowed) or give the layer more tokens per rank")
    # Which tokens keep their expert when it is over capacity: DeepSpeed's order (random
    # with use_rts, else torch.topk's among equals).
    priority = mask * _uniform(mask.shape, logits, 0.0, 1.0) if use_rts else mask
    kept_rows = torch.topk(priority, k=min(slots, tokens), dim=0)[1]
    mask = mask * torch.zeros_like(mask).scatter_(0, kept_rows, 1)
    locations = ((torch.cumsum(mask, dim=0) - 1) * mask).sum(dim=1)
    indices = torch.where(mask.sum(dim=1) > 0, choice, torch.full_like(choice, -1))
    weights = (gates * mask).sum(dim=1)
    return Routes(l_aux, slots, experts, indices.to(torch.int32).unsqueeze(0),
                  locations.to(torch.int32).unsqueeze(0), weights.unsqueeze(0), exp_counts)


def top2gating(logits: Tensor, capacity_factor: float, min_capacity: int,
               drop_tokens: bool = True, ep_group=None, top2_2nd_expert_sampling: bool = True,
               sparse_routes: bool = False):
    """DeepSpeed's top2gating (its signature and return values)."""
    return route_top2(logits, capacity_factor, min_capacity, drop_tokens, ep_group,
                      top2_2nd_expert_sampling).as_deepspeed(sparse_routes)


def route_top2(logits: Tensor, capacity_factor: float, min_capacity: int,
               drop_tokens: bool = True, ep_group=None,
               top2_2nd_expert_sampling: bool = True) -> Routes:
    tokens, experts = logits.shape
    gates = F.softmax(logits, dim=1)
    first = F.one_hot(torch.argmax(gates, dim=1), num_classes=experts)
    if top2_2nd_expert_sampling:  # the second expert drawn by the Gumbel-max trick
        logits = logits + _gumbel(logits.shape, logits)
    second_choice = torch.argmax(logits.masked_fill(first.bool(), float("-inf")), dim=1)
    second = F.one_hot(second_choice, num_classes=experts)
    # slots: first choices fill each expert first, second choices after them
    first_slot = torch.cumsum(first, dim=0) - 1
    second_slot = torch.cumsum(second, dim=0) - 1 + first.sum(dim=0, keepdim=True)
    l_aux = _balance_loss(gates, first).mean() * experts * experts
    exp_counts = (first + second).sum(dim=0).detach()
    if drop_tokens:
        slots = capacity(tokens, experts, capacity_factor * 2, min_capacity)
        first = first * (first_slot < slots)
        second = second * (second_slot < slots)
    else:
        slots = _agreed_capacity(exp_counts, ep_group)
    weights = torch.stack([(gates * first).sum(dim=1), (gates * second).sum(dim=1)])
    weights = weights / torch.clamp(weights.sum(dim=0), min=torch.finfo(weights.dtype).eps)
    masks = torch.stack([first, second])
    indices = torch.where(masks.sum(dim=2) > 0, masks.argmax(dim=2),
                          torch.full_like(second_choice, -1))
    locations = torch.stack([(first_slot * first).sum(dim=1), (second_slot * second).sum(dim=1)])
    return Routes(l_aux, slots, experts, indices.to(torch.int32), locations.to(torch.int32),
                  weights, exp_counts)


def topkgating(logits: Tensor, k: int, capacity_factor: float, min_capacity: int,
               drop_tokens: bool = True, ep_group=None, drop_policy: str = "probs",
               sparse_routes: bool = False):
    """DeepSpeed's topkgating (its signature and return values)."""
    return route_topk(logits, k, capacity_factor, min_capacity, drop_tokens, ep_group,
                      drop_policy).as_deepspeed(sparse_routes)


def route_topk(logits: Tensor, k: int, capacity_factor: float, min_capacity: int,
               drop_tokens: bool = True, ep_group=None, drop_policy: str = "probs") -> Routes:
    tokens, experts = logits.shape
    gates = F.softmax(logits, dim=1)
    top_gate, top_idx = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_idx, True)
    exp_counts = mask.sum(dim=0).detach()
    l_aux = _balance_loss(gates, mask).mean() * experts * experts / k
    if not drop_tokens:
        slots = _agreed_capacity(exp_counts, ep_group)
        slot = torch.cumsum(mask, dim=0) - 1
    elif drop_policy == "probs":  # each expert keeps its most confident tokens
        slots = capacity(tokens, experts, capacity_factor * k, min_capacity)
        chosen = torch.zeros_like(gates).scatter(1, top_idx, top_gate)
        keep = torch.topk(chosen, k=min(slots, tokens), dim=0, sorted=False)[1]
        mask &= torch.zeros_like(mask).scatter_(0, keep, True)
        slot = torch.cumsum(mask, dim=0) - 1
    elif drop_policy == "position":  # each expert keeps its first tokens
        slots = capacity(tokens, experts, capacity_factor * k, min_capacity)
        slot = torch.cumsum(mask, dim=0) - 1
        mask &= slot < slots
    else:
        raise ValueError(f"zero: MoE drop_policy={drop_policy!r}; use 'probs' or 'position'")
    weights = gates * mask
    weights = weights / torch.clamp(weights.sum(dim=-1, keepdim=True),
                                    min=torch.finfo(weights.dtype).eps)
    kept = mask.gather(1, top_idx)
    indices = torch.where(kept, top_idx, torch.full_like(top_idx, -1))
    locations = slot.gather(1, top_idx) * kept
    return Routes(l_aux, slots, experts, indices.t().contiguous().to(torch.int32),
                  locations.t().contiguous().to(torch.int32),
                  weights.gather(1, top_idx).t().contiguous(), exp_counts)
