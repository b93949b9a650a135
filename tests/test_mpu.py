"""`initialize(mpu=...)`: a script that builds its own model-parallel groups, as Megatron and
DeepSpeed's AutoTP example (training/tensor_parallel/basic_example/autotp_example.py) do,
hands them over as an mpu; zero shards over its data group, sums the gradient norm over its
model group and names checkpoint parts by its ranks. On 4 gloo ranks with groups laid out
unlike zero's own mesh (tensor groups {0, 2} and {1, 3}), against one process:

  - AutoTP (`tensor_parallel.autotp_size`) over the mpu's tensor group;
  - a model split by the script itself, Megatron's way (its own slices marked
    `tensor_model_parallel` / `partition_dim`, its own all-reduce), clipped by the whole
    model's norm, saved and resumed;
  - what an mpu cannot describe is refused on every rank, naming it."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distributed_harness import run_distributed
from test_tp import HYPER, batches, gathered, reference
from tp_models import build_gpt

TENSOR, DATA, MICRO_BATCH, STEPS = 2, 2, 2, 3
WIDTH, HIDDEN = 8, 16


@dataclass
class ModelParallelUnit:
    """The AutoTP example's own mpu, field for field."""
    tp_group: object
    dp_group: object
    tp_size: int
    dp_size: int
    tp_rank: int
    dp_rank: int

    def get_data_parallel_group(self):
        return self.dp_group

    def get_model_parallel_group(self):
        return self.tp_group

    def get_data_parallel_world_size(self):
        return self.dp_size

    def get_model_parallel_world_size(self):
        return self.tp_size

    def get_data_parallel_rank(self):
        return self.dp_rank

    def get_model_parallel_rank(self):
        return self.tp_rank


class MegatronState:
    """Megatron-LM's parallel_state spelling: tensor_model_parallel and pipeline accessors
    beside the model-parallel ones."""

    def __init__(self, mpu: ModelParallelUnit, pipeline_stages: int = 1):
        self.mpu, self.pipeline_stages = mpu, pipeline_stages

    def get_tensor_model_parallel_group(self):
        return self.mpu.tp_group

    def get_tensor_model_parallel_rank(self):
        return self.mpu.tp_rank

    def get_tensor_model_parallel_world_size(self):
        return self.mpu.tp_size

    def get_pipeline_model_parallel_world_size(self):
        return self.pipeline_stages

    def __getattr__(self, name):  # get_data_parallel_*, get_model_parallel_*
        return getattr(self.__dict__["mpu"], name)


def strided_mpu(rank: int) -> ModelParallelUnit:
    """Tensor groups {0, 2} and {1, 3}, data groups {0, 1} and {2, 3}: zero's own mesh would
    pair the tensor ranks the other way."""
    tensor_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    data_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return ModelParallelUnit(tensor_groups[rank % 2], data_groups[rank // 2], TENSOR, DATA,
                             rank // 2, rank % 2)


def config(stage: int = 1, clip: float = 0.0, **extra) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
            "gradient_clipping": clip, "optimizer": {"type": "AdamW", "params": HYPER},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500}, **extra}


# ---- AutoTP over the script's groups -------------------------------------------------------
def autotp_ranks(rank, world):
    import zero
    from zero.tp import VocabParallelEmbedding

    mpu = strided_mpu(rank)
    model = build_gpt()
    model.embed = VocabParallelEmbedding.from_embedding(model.embed, mpu.tp_group)
    engine, _, _, _ = zero.initialize(
        model=model, mpu=mpu, config=config(
            stage=2, tensor_parallel={"autotp_size": TENSOR}, data_parallel_size=DATA))
    assert engine.mpu.get_data_parallel_group() is mpu.dp_group
    assert engine.world_size == DATA
    data, losses = batches(), []
    for step in range(STEPS * 2):  # test_tp's batches: 2 micro batches per data rank a step
        tokens, targets = data[step * DATA + mpu.dp_rank]
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses, gathered(engine.module, mpu.tp_group)


def test_autotp_runs_over_the_mpus_own_groups_like_one_process():
    runs = run_distributed(autotp_ranks, 4, timeout=90)
    # one optimizer step per micro batch here: the reference's 3 steps of 2 are 6 of 1
    expected_losses, expected = reference(steps=STEPS * 2, micro_batches=1)
    for rank, (losses, whole) in enumerate(runs):
        for name, value in whole.items():
            error = ((value - expected[name]).norm() / expected[name].norm()).item()
            assert error < 1e-5, (rank, name, error)
    assert runs[0][0] == runs[2][0] and runs[1][0] == runs[3][0]  # tensor pairs {0,2}, {1,3}
    mean = [(a + b) / 2 for a, b in zip(runs[0][0], runs[1][0])]  # data ranks 0 and 1
    assert mean == pytest.approx(expected_losses, rel=1e-5)


# ---- a model the script split itself (Megatron's way) ---------------------------------------
class _SumOverTensorRanks(torch.autograd.Function):
    """Megatron's reduce-from-model-parallel region: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class SplitMLP(nn.Module):
    """A column-parallel then row-parallel MLP holding this tensor rank's slices of `whole`
    (fc1: rows, fc2: columns; fc2's bias whole), marked as Megatron marks them (fc2's weight
    with the older `model_parallel`)."""

    def __init__(self, whole: dict, tensor_rank: int, group):
        super().__init__()
        rows = slice(tensor_rank * HIDDEN // TENSOR, (tensor_rank + 1) * HIDDEN // TENSOR)
        self.group = group
        self.fc1_weight = nn.Parameter(whole["fc1_weight"][rows].clone())
        self.fc1_bias = nn.Parameter(whole["fc1_bias"][rows].clone())
        self.fc2_weight = nn.Parameter(whole["fc2_weight"][:, rows].clone())
        self.fc2_bias = nn.Parameter(whole["fc2_bias"].clone())
        for param, dim in ((self.fc1_weight, 0), (self.fc1_bias, 0)):
            param.tensor_model_parallel, param.partition_dim = True, dim
        self.fc2_weight.model_parallel, self.fc2_weight.partition_dim = True, 1  # Megatron v1

    def forward(self, x, y):
        hidden = F.gelu(F.linear(x, self.fc1_weight, self.fc1_bias))
        out = _SumOverTensorRanks.apply(F.linear(hidden, self.fc2_weight), self.group)
        return F.mse_loss(out + self.fc2_bias, y)


def whole_mlp() -> dict:
    generator = torch.Generator().manual_seed(11)
    return {"fc1_weight": torch.randn(HIDDEN, WIDTH, generator=generator),
            "fc1_bias": torch.randn(HIDDEN, generator=generator) * 0.1,
            "fc2_weight": torch.randn(WIDTH, HIDDEN, generator=generator) * 0.3,
            "fc2_bias": torch.randn(WIDTH, generator=generator)}


def mlp_batches() -> list:
    generator = torch.Generator().manual_seed(12)
    return [(torch.randn(MICRO_BATCH, WIDTH, generator=generator),
             torch.randn(MICRO_BATCH, WIDTH, generator=generator))
            for _ in range((STEPS + 1) * DATA)]


def split_ranks(rank, world, clip, save_dir):
    import zero

    mpu = strided_mpu(rank)

    def build():
        model = SplitMLP(whole_mlp(), mpu.tp_rank, mpu.tp_group)
        return zero.initialize(model=model, mpu=MegatronState(mpu), config=config(clip=clip))[0]

    engine, data = build(), mlp_batches()

    def train_step(on, step):
        loss = on(*data[step * DATA + mpu.dp_rank])
        on.backward(loss)
        on.step()
        return loss.item()

    losses = [train_step(engine, step) for step in range(STEPS)]
    norms = engine.get_global_grad_norm().item()
    engine.save_checkpoint(save_dir, tag="t")
    resumed = build()
    resumed.load_checkpoint(save_dir, tag="t")
    after = (train_step(engine, STEPS), train_step(resumed, STEPS))
    same = all(torch.equal(a, b) for a, b in zip(engine.module.parameters(),
                                                  resumed.module.parameters()))
    local = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    return losses, norms, after, same, local


def mlp_reference(clip: float, steps: int):
    whole = {k: nn.Parameter(v.clone()) for k, v in whole_mlp().items()}
    optimizer = torch.optim.AdamW(whole.values(), lr=HYPER["lr"], betas=tuple(HYPER["betas"]),
                                  eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                                  foreach=False)
    data, losses, norm = mlp_batches(), [], None
    for step in range(steps):
        optimizer.zero_grad()
        x = torch.cat([data[step * DATA + d][0] for d in range(DATA)])
        y = torch.cat([data[step * DATA + d][1] for d in range(DATA)])
        hidden = F.gelu(F.linear(x, whole["fc1_weight"], whole["fc1_bias"]))
        loss = F.mse_loss(F.linear(hidden, whole["fc2_weight"], whole["fc2_bias"]), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(whole.values(), clip or float("inf")).item()
        optimizer.step()
        losses.append(loss.item())
    return losses, norm, {k: v.detach() for k, v in whole.items()}


def test_a_model_split_by_the_script_trains_clips_and_resumes_with_its_mpu(tmp_path):
    clip = 0.05
    runs = run_distributed(split_ranks, 4, args=(clip, str(tmp_path)), timeout=90)
    losses, norm, whole = mlp_reference(clip, STEPS + 1)
    assert norm > 10 * clip  # the clip acted
    for rank, (ranks_losses, ranks_norm, after, same, local) in enumerate(runs):
        # the whole model's norm on every rank: fc2's bias (whole on both tensor ranks) once
        assert ranks_norm == pytest.approx(mlp_reference(clip, STEPS)[1], rel=1e-5)
        assert after[0] == after[1] and same, rank  # the resumed engine steps identically
        tensor_rank = rank // 2
        rows = slice(tensor_rank * HIDDEN // TENSOR, (tensor_rank + 1) * HIDDEN // TENSOR)
        for name, expected in (("fc1_weight", whole["fc1_weight"][rows]),
                               ("fc1_bias", whole["fc1_bias"][rows]),
                               ("fc2_weight", whole["fc2_weight"][:, rows]),
                               ("fc2_bias", whole["fc2_bias"])):
            assert torch.allclose(local[name], expected, rtol=1e-5, atol=1e-6), (rank, name)
    # the data ranks' mean loss is the single process's on the global batch
    for step in range(STEPS):
        assert (runs[0][0][step] + runs[1][0][step]) / 2 == pytest.approx(losses[step], rel=1e-5)
    checkpoint = sorted(p.name for p in (tmp_path / "t").iterdir())
    assert "mp_rank_00_model_states.pt" in checkpoint and "mp_rank_01_model_states.pt" in checkpoint


# ---- what an mpu cannot describe -------------------------------------------------------------
class _NoDataGroup:
    def get_model_parallel_world_size(self):
        return 1


def refusal_ranks(rank, world):
    import zero
    from zero.config.validate import ConfigError
    from zero.parallel.mpu_grid import MpuError

    mpu = strided_mpu(rank)
    errors = {}

    def attempt(key, model, error_type, **kwargs):
        try:
            zero.initialize(model=model, **kwargs)
        except error_type as error:
            errors[key] = str(error)

    def unmarked(drop_dim=False):
        model = SplitMLP(whole_mlp(), mpu.tp_rank, mpu.tp_group)
        for param in model.parameters():
            if drop_dim and hasattr(param, "partition_dim"):
                del param.partition_dim
            else:
                param.tensor_model_parallel = param.model_parallel = False
        return model

    attempt("methods", build_gpt(), MpuError, mpu=_NoDataGroup(), config=config())
    lying = ModelParallelUnit(mpu.tp_group, mpu.dp_group, TENSOR, 1, mpu.tp_rank, 0)
    attempt("sizes", build_gpt(), MpuError, mpu=lying, config=config())
    crossed = ModelParallelUnit(mpu.dp_group, mpu.dp_group, TENSOR, DATA, mpu.tp_rank,
                                mpu.dp_rank)
    crossed.get_tensor_model_parallel_group = lambda: mpu.tp_group
    crossed.get_tensor_model_parallel_rank = lambda: mpu.tp_rank
    crossed.get_tensor_model_parallel_world_size = lambda: TENSOR
    attempt("crossed", build_gpt(), MpuError, mpu=crossed, config=config())
    attempt("pipeline", build_gpt(), MpuError, mpu=MegatronState(mpu, pipeline_stages=2),
            config=config())
    attempt("autotp", build_gpt(), ValueError, mpu=mpu,
            config=config(tensor_parallel={"autotp_size": 4}))
    attempt("stage3", SplitMLP(whole_mlp(), mpu.tp_rank, mpu.tp_group), NotImplementedError,
            mpu=mpu, config=config(stage=3))
    attempt("unmarked", unmarked(), ValueError, mpu=mpu, config=config())
    attempt("no_dim", unmarked(drop_dim=True), ValueError, mpu=mpu, config=config())
    attempt("data_size", build_gpt(), ConfigError, mpu=mpu, config=config(data_parallel_size=4))
    # an mpu of tensor size 1 is the data-parallel world
    world = dist.new_group(list(range(4)))
    alone = [dist.new_group([r]) for r in range(4)][rank]
    engine = zero.initialize(model=build_gpt(), config=config(data_parallel_size=4),
                             mpu=ModelParallelUnit(alone, world, 1, 4, 0, rank))[0]
    # deepspeed.checkpointing.configure reads a tensor-parallel config at its data ranks
    from zero import activation_checkpointing

    activation_checkpointing.configure(deepspeed_config=config(
        tensor_parallel={"autotp_size": TENSOR}, data_parallel_size=DATA,
        train_batch_size=MICRO_BATCH * DATA, activation_checkpointing={"profile": True}))
    return errors, engine.world_size, activation_checkpointing.settings().profile


def test_what_an_mpu_cannot_describe_is_refused_on_every_rank_naming_it():
    for errors, data_ranks, configured in run_distributed(refusal_ranks, 4, timeout=60):
        assert data_ranks == 4 and configured
        assert "get_data_parallel_group" in errors["methods"]
        assert "data-parallel size 1 x model-parallel size 2 is not the world size 4" in \
            errors["sizes"]
        assert "tensor group" in errors["crossed"] and "is not its model-parallel group" in \
            errors["crossed"]
        assert "get_pipeline_model_parallel_world_size() is 2" in errors["pipeline"]
        assert "= 4 but the mpu passed to initialize has tensor size 2" in errors["autotp"]
        assert "stage 3" in errors["stage3"] and "an mpu of tensor size 2" in errors["stage3"]
        assert "no parameter of the model is marked as a slice" in errors["unmarked"]
        assert "fc1_weight is marked tensor_model_parallel but has no partition_dim" in \
            errors["no_dim"]
        assert "data_parallel_size = 4" in errors["data_size"] and "2 data-parallel" in \
            errors["data_size"]
