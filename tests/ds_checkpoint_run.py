"""The run behind tests/deepspeed_checkpoints/: a small GPT trained 3 steps by the real
DeepSpeed 0.19.8 on 2 ranks and saved, then 2 steps more. make.py runs it under DeepSpeed
(build/ds-venv); test_deepspeed_checkpoint.py continues the same run in zero from the saved
checkpoint and compares. Both take model, config and data from here."""
from __future__ import annotations

import dataclasses
import os

import torch

from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deepspeed_checkpoints")
MODEL = GPTConfig(vocab_size=61, block_size=8, n_layer=2, n_head=2, n_embd=10)  # odd sizes
MICRO_BATCH = 2
WORLD = 2           # DeepSpeed's ranks
SAVED_AT = 3        # optimizer steps before the save
MORE = 2            # steps after it
CLIENT_STATE = {"epoch": 7, "note": "saved by DeepSpeed"}


@dataclasses.dataclass(frozen=True)
class Run:
    stage: int
    precision: str
    frozen: bool = False           # position_embedding.weight not trained
    deepspeed_zero: tuple = ()     # DeepSpeed-only zero_optimization keys, (key, value) pairs
    optimizer: str = "AdamW"       # a key of OPTIMIZERS; not AdamW: offloaded (DeepSpeed's CPU op)


RUNS = {"stage1-fp32": Run(1, "fp32"), "stage2-fp32": Run(2, "fp32"),
        "stage3-fp32": Run(3, "fp32"), "stage2-bf16": Run(2, "bf16"),
        "stage3-bf16": Run(3, "bf16"),
        # DeepSpeed's BF16_Optimizer (bf16 at stage 1), which records no stage or frozen shapes
        "stage1-bf16-frozen": Run(1, "bf16", frozen=True),
        # padding after each parameter to 16 bytes, saved as param_alignment_paddings
        "stage2-fp32-aligned": Run(2, "fp32", deepspeed_zero=(("parameter_alignment", True),)),
        # several fp32 sub-groups per rank, frozen parameters saved as rank fragments
        "stage3-fp32-subgroups-frozen": Run(3, "fp32", frozen=True,
                                            deepspeed_zero=(("sub_group_size", 500),)),
        # DeepSpeedCPULion (exp_avg, and an exp_avg_sq it never touches) and
        # DeepSpeedCPUAdagrad (its sum saved as exp_avg_sq)
        "stage2-fp32-lion": Run(2, "fp32", optimizer="Lion"),
        "stage3-fp32-adagrad": Run(3, "fp32", optimizer="Adagrad")}
OPTIMIZERS = {
    "AdamW": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    "Lion": {"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1},
    "Adagrad": {"lr": 0.05, "weight_decay": 1e-3}}
# (DeepSpeed refuses fp16 on its CPU accelerator: "Type fp16 is not supported on your device")
# Runs whose checkpoint DeepSpeed's ds_to_universal also converts, into <name>-universal
UNIVERSAL = ("stage2-fp32-universal", "stage3-fp32-universal", "stage1-bf16-frozen-universal")


def make_model(run: Run) -> TinyGPT:
    torch.manual_seed(0)
    model = TinyGPT(MODEL)
    model.register_buffer("seen_steps", torch.zeros(1))  # a persistent buffer to carry over
    if run.frozen:
        model.position_embedding.weight.requires_grad_(False)
    return model


def config(run: Run, world: int = WORLD, stage: int | None = None,
           deepspeed: bool = False) -> dict:
    """The config of the run (zero's at `stage` when given); at another world size the same
    global batch (the ranks' micro-batches become accumulation steps)."""
    gas = WORLD // world
    stage = run.stage if stage is None else stage
    result = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "train_batch_size": MICRO_BATCH * gas * world,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": run.optimizer, "params": dict(OPTIMIZERS[run.optimizer])},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": 20, "warmup_num_steps": 4}},
        "zero_optimization": {"stage": stage},
    }
    if stage == 3:  # every parameter partitioned, none kept whole
        result["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if run.optimizer != "AdamW":  # DeepSpeed has these on a CPU as its offload ops only
        result["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if deepspeed:
        result["zero_optimization"].update(dict(run.deepspeed_zero))
    if run.precision == "bf16":
        result["bf16"] = {"enabled": True}
    return result


def train(engine, rank: int, world: int, first: int, steps: int) -> list[float]:
    """Optimizer steps first..first+steps-1; step s uses the WORLD micro-batches
    2s, 2s+1 (rank r of WORLD ranks takes 2s+r; one rank takes them as accumulation steps).
    Returns each step's mean loss over the global batch. The batches go to the engine's
    device (a GPU's in tests/test_cuda_engine.py)."""
    import torch.distributed as dist

    data = synthetic_batches(MODEL, MICRO_BATCH, (first + steps) * WORLD, seed=1)
    gas = WORLD // world
    losses = []
    for step in range(first, first + steps):
        total = torch.zeros(1, device=engine.device)
        for micro in range(gas):
            batch = data[step * WORLD + micro * world + rank]
            tokens, targets = (t.to(engine.device) for t in batch)
            loss = engine(tokens, targets)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        engine.module.seen_steps += 1
        dist.all_reduce(total)
        losses.append(total.item() / WORLD)
    return losses


@dataclasses.dataclass(frozen=True)
class ZeroRun:
    """A run zero trains at WORLD ranks and `stage` and saves after SAVED_AT steps; its
    checkpoint converted to DeepSpeed's universal format (zero/checkpoint_to_universal.py)
    is what the real DeepSpeed resumes at `deepspeed_world` ranks and `deepspeed_stage`."""
    run: str                # the RUNS entry: model, precision, config
    stage: int
    deepspeed_world: int
    deepspeed_stage: int


# tests/deepspeed_checkpoints/<name>/: zero's conversion and DeepSpeed's continuation of it
ZERO_TO_DEEPSPEED = {
    "zero-stage3-fp32-universal": ZeroRun("stage3-fp32", 3, 1, 1),
    # bf16, a frozen parameter, a tied one
    "zero-stage2-bf16-frozen-universal": ZeroRun("stage1-bf16-frozen", 2, 2, 3),
    # Lion's one array (DeepSpeed resumes it with its CPU Lion)
    "zero-stage3-fp32-lion-universal": ZeroRun("stage2-fp32-lion", 3, 1, 2)}


def zero_save(rank: int, world: int, zero_run: ZeroRun, save_dir: str) -> None:
    """zero trains `zero_run` from the start for SAVED_AT steps and saves it in save_dir."""
    import zero

    spec = RUNS[zero_run.run]
    engine, _, _, _ = zero.initialize(model=make_model(spec),
                                      config=config(spec, world, zero_run.stage))
    train(engine, rank, world, 0, SAVED_AT)
    engine.save_checkpoint(save_dir, client_state=dict(CLIENT_STATE))
