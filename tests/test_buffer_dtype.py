"""A bf16 engine casts the model's parameters, not its buffers (as DeepSpeed 0.19): a rotary
`inv_freq` stays fp32, in the forward and in the saved weights, with tensor parallelism too.
Batch norms' running statistics follow their weights, which their kernels need (DeepSpeed
0.19.8 fails there: "expected scalar type BFloat16 but found Float"). zero used to cast every
buffer to bf16; `data_types.buffer_dtype` still does, and a forward that mixes dtypes because
of a buffer kept is told so (zero/model_dtype.py)."""
import pytest
import torch

from distributed_harness import run_distributed

WIDTH = 8
INV_FREQ = [1.0, 0.1, 0.01, 0.001] * 2  # 0.1 is 0.10009765625 in bf16


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.out = torch.nn.Linear(WIDTH, WIDTH)
        self.register_buffer("inv_freq", torch.tensor(INV_FREQ))

    def forward(self, x):
        h = self.norm(self.inp(x))
        return self.out(torch.cos(h.float() * self.inv_freq).to(h.dtype)).float().pow(2).mean()


def _inputs(rank):
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(rank))


def _reference_loss(rank):
    """The first forward in one process: parameters and norm statistics in bf16, inv_freq fp32."""
    model = _Net()
    for module in (model.inp, model.norm, model.out):
        module.to(torch.bfloat16)
    return model(_inputs(rank).to(torch.bfloat16)).item()


def _train(rank, world, stage):
    import zero

    config = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": stage,
                                    "stage3_gather_16bit_weights_on_model_save": True}}
    engine, _, _, _ = zero.initialize(model=_Net(), config=config)
    dtypes = {name: buffer.dtype for name, buffer in engine.module.named_buffers()}
    losses = []
    for _ in range(2):
        loss = engine(_inputs(rank).to(torch.bfloat16))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    saved = engine.module_state_dict()  # (stage 3: gathered on rank 0)
    return dtypes, losses, saved["inv_freq"] if rank == 0 else None


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_casts_parameters_and_norm_statistics_but_not_other_buffers(stage):
    runs = run_distributed(_train, 2, timeout=60, args=(stage,))
    saved = runs[0][2]
    assert saved.dtype == torch.float32 and saved.tolist() == pytest.approx(INV_FREQ, rel=1e-7)
    for rank, (dtypes, losses, _) in enumerate(runs):
        assert dtypes["inv_freq"] == torch.float32
        assert dtypes["norm.running_mean"] == dtypes["norm.running_var"] == torch.bfloat16
        assert dtypes["norm.num_batches_tracked"] == torch.int64
        assert losses[0] == _reference_loss(rank)
        assert all(torch.isfinite(torch.tensor(losses)))


class _PositionalEncoding(torch.nn.Module):
    """The PyTorch tutorial's `x + self.pe`: an fp32 buffer turns bf16 activations fp32."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.out = torch.nn.Linear(WIDTH, WIDTH)
        self.mlp = torch.nn.Module()  # (AutoTP splits these two)
        self.mlp.up_proj = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.mlp.down_proj = torch.nn.Linear(2 * WIDTH, WIDTH)
        self.register_buffer("pe", torch.linspace(0, 1, WIDTH))

    def forward(self, x):
        h = self.mlp.down_proj(torch.relu(self.mlp.up_proj(self.inp(x) + self.pe)))
        return self.out(h).float().pow(2).mean()


def _positional(rank, world, data_types, tensor_parallel):
    import zero

    config = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 1}, "data_types": data_types}
    if tensor_parallel:
        config["tensor_parallel"] = {"autotp_size": 2}
    engine, _, _, _ = zero.initialize(model=_PositionalEncoding(), config=config)
    try:
        # (the tensor ranks of a group see one batch)
        loss = engine(_inputs(0 if tensor_parallel else rank).to(torch.bfloat16))
    except RuntimeError as error:
        return engine.module.pe.dtype, str(error)
    engine.backward(loss)
    engine.step()
    return engine.module.pe.dtype, None


@pytest.mark.parametrize("tensor_parallel", [False, True], ids=["data", "tensor-parallel"])
def test_a_forward_that_mixes_dtypes_through_a_kept_buffer_names_buffer_dtype(tensor_parallel):
    for dtype, error in run_distributed(_positional, 2, timeout=60, args=({}, tensor_parallel)):
        assert dtype == torch.float32
        assert error is not None and "must have the same dtype" in error
        assert "(pe not torch.bfloat16)" in error
        assert '"data_types": {"buffer_dtype": "bf16"}' in error


@pytest.mark.parametrize("tensor_parallel", [False, True], ids=["data", "tensor-parallel"])
def test_buffer_dtype_casts_every_buffer_as_deepspeeds(tensor_parallel):
    for dtype, error in run_distributed(_positional, 2, timeout=60,
                                        args=({"buffer_dtype": "bf16"}, tensor_parallel)):
        assert (dtype, error) == (torch.bfloat16, None)
