"""DeepSpeed-MoE's layer: `MoE` (`deepspeed.moe.layer.MoE`, its arguments, attribute paths and
return values), the gate `TopKGate`, the experts `Experts` and `MOELayer`, which sends each
token to its experts and back.

One forward, on `ep_size` ranks that split the `num_experts` experts among them:
1. the gate routes each token (gating.py): k experts, a slot within each one's capacity;
2. the tokens are laid out as [experts, capacity, hidden] (an unused slot is zeros);
3. an all-to-all over the expert-parallel group hands each rank its experts' slots from every
   rank, [ep, local experts, capacity, hidden]; its experts run; a second all-to-all returns
   the results (the backward is the same two exchanges, reversed);
4. each token's results are summed, weighted by its gates (in fp32).

The experts' parameters carry DeepSpeed's marks, `allreduce = False` and `group_name`
("ep_size_{n}"): the engine reduces and shards them over their expert data-parallel group
(groups.py) and averages their gradients over the whole world, as DeepSpeed does.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from . import gating
from .groups import EXPERT_GROUPS, group_name

NOISY_GATE_POLICIES = (None, "None", "Jitter", "RSample")


class _AllToAll(torch.autograd.Function):
    """Equal pieces of dim 0 to each rank of `group`; the backward sends the gradients back."""

    @staticmethod
    def forward(ctx, group, input: Tensor) -> Tensor:
        ctx.group = group
        input = input.contiguous()
        output = torch.empty_like(input)
        dist.all_to_all_single(output, input, group=group)
        return output

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, _AllToAll.apply(ctx.group, grad)


class TopKGate(nn.Module):
    """DeepSpeed's gate: a bias-free linear layer to one logit per expert, in fp32, then the
    top-1, top-2 or top-k routing of gating.py."""

    def __init__(self, model_dim: int, num_experts: int, k: int = 1,
                 capacity_factor: float = 1.0, eval_capacity_factor: float = 1.0,
                 min_capacity: int = 8, noisy_gate_policy: str | None = None,
                 drop_tokens: bool = True, use_rts: bool = True, ep_group=None,
                 top2_2nd_expert_sampling: bool = True) -> None:
        super().__init__()
        if k < 1 or k > num_experts:
            raise ValueError(f"zero: MoE k={k} must be between 1 and num_experts={num_experts}")
        self.wg = nn.Linear(model_dim, num_experts, bias=False)
        self.ep_group = ep_group
        self.k = k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        self.wall_clock_breakdown = False
        self.gate_time = 0.0

    def _set_ep_group(self, ep_group) -> None:
        self.ep_group = ep_group

    def routes(self, input: Tensor, used_token: Tensor | None = None) -> gating.Routes:
        tokens = input.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            tokens = gating.multiplicative_jitter(tokens)
        logits = F.linear(tokens, self.wg.weight.float())
        capacity_factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return gating.route_top1(
                logits, capacity_factor, self.min_capacity, used_token,
                self.noisy_gate_policy if self.training else None, self.drop_tokens,
                self.use_rts, self.ep_group)
        if self.k == 2:
            return gating.route_top2(logits, capacity_factor, self.min_capacity,
                                     self.drop_tokens, self.ep_group,
                                     self.top2_2nd_expert_sampling)
        return gating.route_topk(logits, self.k, capacity_factor, self.min_capacity,
                                 self.drop_tokens, self.ep_group)

    def forward(self, input: Tensor, used_token: Tensor | None = None,
                sparse_routes: bool = False, use_tutel: bool = False):
        return self.routes(input, used_token).as_deepspeed(sparse_routes)


class Experts(nn.Module):
    """This rank's experts: `num_local_experts` copies of `expert`, each fed its own slice
    of dim 1 of the dispatched tokens."""

    def __init__(self, expert: nn.Module, num_local_experts: int = 1,
                 expert_group_name: str | None = None) -> None:
        super().__init__()
        self.deepspeed_experts = nn.ModuleList(
            [copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for one in self.deepspeed_experts:
            for param in one.parameters():
                param.allreduce = False  # DeepSpeed's mark of an expert parameter
                param.group_name = expert_group_name

    def forward(self, inputs: Tensor) -> Tensor:
        outputs = []
        for chunk, expert in zip(inputs.chunk(self.num_local_experts, dim=1),
                                 self.deepspeed_experts):
            out = expert(chunk)
            outputs.append(out[0] if isinstance(out, tuple) else out)  # (a bias term dropped)
        return torch.cat(outputs, dim=1)


class MOELayer(nn.Module):
    """The gate, the exchange and the experts (the module docstring's steps 1-4)."""

    def __init__(self, gate: TopKGate, experts: Experts, ep_group_name: str, ep_size: int,
                 num_local_experts: int, use_tutel: bool = False) -> None:
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.ep_group = None
        self.ep_size = ep_size
        self.ep_group_name = ep_group_name
        self.num_local_experts = num_local_experts
        self.use_tutel = False  # (Tutel's kernels are not used)
        self.wall_clock_breakdown = False
        self.time_falltoall = self.time_salltoall = self.time_moe = 0.0
        self.l_aux = None
        self.exp_counts = None

    def _set_ep_group(self, ep_group) -> None:
        self.ep_group = ep_group
        self.gate._set_ep_group(ep_group)

    def forward(self, *input: Tensor, **kwargs) -> Tensor:
        hidden = input[0]
        model_dim = hidden.shape[-1]
        tokens = hidden.reshape(-1, model_dim)
        # through the module, so its hooks run (DeepSpeed's sparse answer: the routes)
        routes = gating.Routes(*self.gate(tokens, input[1] if len(input) > 1 else None, True))
        self.l_aux, self.exp_counts = routes.l_aux, routes.exp_counts
        slots = _slots(routes)
        dispatched = _dispatch(tokens, slots, routes.num_experts, routes.capacity)
        dispatched = self._exchange(dispatched)
        out = self.experts(dispatched.reshape(self.ep_size, self.num_local_experts, -1,
                                              model_dim))
        out = self._exchange(out.reshape(self.ep_size * self.num_local_experts, -1, model_dim))
        combined = _combine(out.reshape(-1, model_dim), slots, routes.gates, tokens.shape[0])
        return combined.reshape(hidden.shape)

    def _exchange(self, tensor: Tensor) -> Tensor:
        if self.ep_size == 1:
            return tensor.contiguous()
        if self.ep_group is None:
            raise RuntimeError(
                f"zero: this MoE layer (ep_size={self.ep_size}) has no expert-parallel group "
                "yet: build the engine over the model first (zero.initialize / "
                "deepspeed.initialize makes the groups), or call "
                "moe.set_deepspeed_parallelism()")
        return _AllToAll.apply(self.ep_group, tensor)


def _slots(routes: gating.Routes) -> Tensor:
    """Each route's row in the flat [experts * capacity] buffer; a dropped route's is one
    spare row past the end."""
    flat = routes.indices.long() * routes.capacity + routes.locations.long()
    spare = routes.num_experts * routes.capacity
    return torch.where(routes.indices >= 0, flat, torch.full_like(flat, spare))


def _dispatch(tokens: Tensor, slots: Tensor, experts: int, capacity: int) -> Tensor:
    """[experts, capacity, hidden]: each slot holds its token, an unused one zeros."""
    count, model_dim = tokens.shape
    source = torch.full((experts * capacity + 1,), count, dtype=torch.long, device=tokens.device)
    source.scatter_(0, slots.reshape(-1),
                    torch.arange(count, device=tokens.device).repeat(slots.shape[0]))
    padded = torch.cat([tokens, tokens.new_zeros(1, model_dim)])
    return padded.index_select(0, source[:-1]).view(experts, capacity, model_dim)


def _combine(expert_out: Tensor, slots: Tensor, gates: Tensor, count: int) -> Tensor:
    """Each token's expert results weighted by its gates and summed (in fp32)."""
    model_dim = expert_out.shape[-1]
    padded = torch.cat([expert_out, expert_out.new_zeros(1, model_dim)])
    routed = padded.index_select(0, slots.reshape(-1)).view(slots.shape[0], count, model_dim)
    return (routed * gates.unsqueeze(-1)).sum(dim=0).to(expert_out.dtype)


class MoE(nn.Module):
    """DeepSpeed's MoE layer: `num_experts` copies of `expert` split over `ep_size` ranks,
    k of them per token. forward(hidden_states, used_token=None) returns (output, l_aux,
    exp_counts): add l_aux (times a small coefficient) to the loss."""

    def __init__(self, hidden_size: int, expert: nn.Module, num_experts: int = 1,
                 ep_size: int = 1, k: int = 1, capacity_factor: float = 1.0,
                 eval_capacity_factor: float = 1.0, min_capacity: int = 4,
                 use_residual: bool = False, noisy_gate_policy: str | None = None,
                 drop_tokens: bool = True, use_rts: bool = True, use_tutel: bool = False,
                 enable_expert_tensor_parallelism: bool = False,
                 top2_2nd_expert_sampling: bool = True) -> None:
        super().__init__()
        _check(num_experts, ep_size, noisy_gate_policy, enable_expert_tensor_parallelism)
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        self.ep_size = ep_size
        self.expert_group_name = group_name(ep_size)
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        gate = TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor,
                        min_capacity, noisy_gate_policy, drop_tokens, use_rts, None,
                        top2_2nd_expert_sampling)
        self.deepspeed_moe = MOELayer(gate, experts, self.expert_group_name, ep_size,
                                      self.num_local_experts, use_tutel=use_tutel)
        if use_residual:  # Residual MoE: a dense MLP beside the experts, mixed per token
            self.mlp = expert
            self.coefficient = nn.Linear(hidden_size, 2)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        """Makes (once per ep_size) and takes this layer's process groups (groups.py)."""
        groups = EXPERT_GROUPS.create(self.ep_size, use_data_before_expert_parallel_)
        self.deepspeed_moe._set_ep_group(groups.expert_group)

    def expert_buffers(self) -> list[Tensor]:
        return list(self.deepspeed_moe.experts.buffers())

    def forward(self, hidden_states: Tensor, used_token: Tensor | None = None):
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            dense = dense[0] if isinstance(dense, tuple) else dense
            mix = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * mix[..., 0:1] + dense * mix[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts


def _check(num_experts: int, ep_size: int, noisy_gate_policy, expert_tensor_parallel: bool):
    if num_experts < 1 or ep_size < 1 or num_experts % ep_size:
        raise ValueError(f"zero: MoE num_experts={num_experts} must be a multiple of "
                         f"ep_size={ep_size} (each expert-parallel rank holds "
                         "num_experts / ep_size experts)")
    if noisy_gate_policy not in NOISY_GATE_POLICIES:
        raise ValueError(f"zero: MoE noisy_gate_policy={noisy_gate_policy!r}; use one of "
                         "None, 'Jitter' or 'RSample'")
    if expert_tensor_parallel:
        raise NotImplementedError(
            "zero: MoE enable_expert_tensor_parallelism is not built (MoE composes with ZeRO "
            "stages 0-3 and data parallelism here); leave it False")
