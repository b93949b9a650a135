"""Short DeepSpeed-MoE runs the zero.moe tests compare with the real DeepSpeed 0.19.8: a
Linear -> MoE -> Linear net (4 experts, top-1 or top-2 gating, expert parallel size 1 or 2)
trained STEPS steps on 2 ranks with the config of the case. Shared by make.py (DeepSpeed writes
expected.pt: every rank's losses and final fp32 weights, plus its gating functions' answers on
fixed logits) and the tests (zero on the same), so nothing here imports deepspeed or zero: the
MoE class comes in as `moe_cls` (deepspeed.moe.layer.MoE or zero's, the same signature, the
same `(output, l_aux, exp_counts)` answer and the same module path to the experts).
Regenerate, from the project root, after scripts/deepspeed_cpu.sh:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu build/ds-venv/bin/python tests/deepspeed_moe/make.py

What DeepSpeed does with these runs (its engine.py, moe/, zero/stage_1_and_2.py):
  * given model_parameters as plain parameters and the optimizer in the config, the engine
    splits them itself (configure_moe_param_groups): a "dense-params" group and an
    "ep_size_<N>" group with moe=True holding every expert parameter (param.allreduce False);
  * ranks [0, N), [N, 2N), ... form the expert-parallel groups, so rank r holds experts
    (r % N) * (4 // N) ...; ranks r, r + N, ... form the expert-data-parallel group;
  * expert gradients are summed over the expert-data-parallel group but divided by the whole
    data-parallel world size, at stage 0 (engine._reduce_expert_gradients) as at stages 1-2
    (average_tensor): with N = 2 on 2 ranks an expert's gradient is its own rank's over 2;
  * the gate (moe.deepspeed_moe.gate.wg) is a dense parameter, averaged over all ranks;
  * an expert's parameters are named moe.deepspeed_moe.experts.deepspeed_experts.<local>.fc1.weight
    and so on: the local index, not the global expert id.
The ep_size 1 and 2 runs of a case agree to fp32 rounding (rank 0: ~6e-8), stages 0-2 bitwise;
no case here was refused by DeepSpeed."""
import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, NUM_EXPERTS = 16, 4
MICRO, SEQ = 2, 8  # each rank's batch: 16 tokens, so capacity 4 per expert at top-1
STEPS = 4


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    """inp -> MoE -> out; forward(x, y) is the mean squared error plus 0.01 * the gate's
    load-balancing loss."""

    def __init__(self, moe_cls, ep_size: int, k: int, **moe_kwargs):
        super().__init__()
        self.inp = nn.Linear(HIDDEN, HIDDEN)
        self.moe = moe_cls(hidden_size=HIDDEN, expert=Expert(), num_experts=NUM_EXPERTS,
                           ep_size=ep_size, k=k, use_rts=False, min_capacity=0, **moe_kwargs)
        self.out = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x, y):
        x = x.to(self.inp.weight.dtype)  # DeepSpeed casts no inputs under bf16
        hidden, l_aux, _ = self.moe(self.inp(x))
        return F.mse_loss(self.out(hidden).float(), y.float()) + 0.01 * l_aux


def build(moe_cls, rank: int, ep_size: int, k: int, **kw) -> Net:
    """The net of `rank`: the same dense weights everywhere, and each local expert's weights
    drawn from its global expert id (DeepSpeed's default layout: expert-parallel rank
    rank % ep_size), so the experts differ and a rank holding experts 2, 3 has their weights."""
    torch.manual_seed(0)
    net = Net(moe_cls, ep_size, k, **kw)
    local = net.moe.deepspeed_moe.experts.deepspeed_experts
    with torch.no_grad():
        for index, expert in enumerate(local):
            expert_id = (rank % ep_size) * len(local) + index
            generator = torch.Generator().manual_seed(1000 + expert_id)
            for param in expert.parameters():
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return net


class PyramidNet(nn.Module):
    """PR-MoE: two MoE layers over 4 experts each, the first split over `eps[0]` ranks, the
    second a Residual MoE (use_residual: a dense MLP mixed in per token) over `eps[1]`."""

    def __init__(self, moe_cls, eps):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(HIDDEN, HIDDEN)
        self.first = moe_cls(HIDDEN, Expert(), num_experts=4, ep_size=eps[0], use_rts=False,
                             min_capacity=0)
        self.second = moe_cls(HIDDEN, Expert(), num_experts=4, ep_size=eps[1], use_rts=False,
                              min_capacity=0, use_residual=True)

    def forward(self, x, y):
        h, aux1, _ = self.first(self.inp(x))
        h, aux2, _ = self.second(h)
        return F.mse_loss(h, y) + 0.01 * (aux1 + aux2)


def pyramid(moe_cls, rank: int, eps) -> PyramidNet:
    """The PyramidNet of `rank` (the default layout), each local expert drawn from its layer
    and global id."""
    net = PyramidNet(moe_cls, eps)
    with torch.no_grad():
        for index, (layer, ep) in enumerate(((net.first, eps[0]), (net.second, eps[1]))):
            local = layer.deepspeed_moe.experts.deepspeed_experts
            for i, expert in enumerate(local):
                generator = torch.Generator().manual_seed(
                    100 * index + (rank % ep) * len(local) + i)
                for param in expert.parameters():
                    param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return net


def batch(rank: int, step: int):
    """This rank's (x, y) at `step`, each [MICRO, SEQ, HIDDEN]."""
    generator = torch.Generator().manual_seed(10_000 + 100 * step + rank)
    x = torch.randn(MICRO, SEQ, HIDDEN, generator=generator)
    return x, torch.randn(MICRO, SEQ, HIDDEN, generator=generator)


def config(stage: int, dtype: str = "fp32") -> dict:
    # No clipping: DeepSpeed's MoE gradient norm is per expert-parallel rank.
    found = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
             "gradient_clipping": 0.0,
             "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.0}},
             "zero_optimization": {"stage": stage}}
    if dtype == "bf16":
        found["bf16"] = {"enabled": True}
    return found


def _case(ep_size, k, stage, dtype="fp32", **moe_kwargs):
    if k == 2:  # DeepSpeed's default samples the second expert (Gumbel noise)
        moe_kwargs.setdefault("top2_2nd_expert_sampling", False)
    name = f"ep{ep_size}-k{k}-stage{stage}" + ("" if dtype == "fp32" else f"-{dtype}")
    if moe_kwargs.get("drop_tokens") is False:
        name += "-nodrop"
    return {"name": name, "world": 2, "ep_size": ep_size, "k": k, "stage": stage,
            "dtype": dtype, "moe_kwargs": moe_kwargs}


CASES = [_case(ep, k, stage) for ep in (1, 2) for k in (1, 2) for stage in (0, 1, 2)] + [
    _case(2, 1, 2, "bf16"),
    # no capacity: each expert takes every token routed to it, the capacity the largest count
    # over the expert-parallel group (an all-reduce MAX in DeepSpeed's gate)
    _case(2, 1, 2, drop_tokens=False),
]


def case_named(name: str) -> dict:
    return next(case for case in CASES if case["name"] == name)


def train(deepspeed, moe_cls, rank: int, case: dict, device=None, zero_extra=None) -> dict:
    """`case` trained STEPS steps by `deepspeed` (the real one or zero's compat package) on
    this rank, the data on `device` (default the CPU): {"losses", "params", "engine"}. As a
    DeepSpeed MoE user with the optimizer in the config passes them: plain parameters, which
    the engine splits into shared and expert groups itself (configure_moe_param_groups)."""
    net = build(moe_cls, rank, case["ep_size"], case["k"], **case["moe_kwargs"])
    settings = config(case["stage"], case["dtype"])
    settings["zero_optimization"].update(zero_extra or {})  # (zero's tests: stage-3 keys)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                      config=settings)
    losses = []
    for step in range(STEPS):
        loss = engine(*(t.to(device or "cpu") for t in batch(rank, step)))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):  # (stage 3)
        params = {k: v.detach().float().cpu().clone()
                  for k, v in engine.module.named_parameters()}
    return {"losses": losses, "params": params, "engine": engine}


def global_name(name: str, rank: int, ep_size: int, world: int = 0,
                data_before_expert: bool = False) -> str:
    """A rank's parameter name as in a model holding every expert (ep_size 1): a local expert
    index becomes its global id (DeepSpeed's default layout; use_data_before_expert_parallelism's
    on `world` ranks with `data_before_expert`)."""
    marker = "deepspeed_experts."
    if marker not in name:
        return name
    head, tail = name.split(marker)
    local, rest = tail.split(".", 1)
    expert_rank = rank // (world // ep_size) if data_before_expert else rank % ep_size
    return f"{head}{marker}{expert_rank * (NUM_EXPERTS // ep_size) + int(local)}.{rest}"
