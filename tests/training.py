"""Shared training loops for the engine tests: the zero engine on N ranks, and the
single-process PyTorch reference that trains the same model on the concatenated global
batch. Both draw the same synthetic batches: micro-batch m of step s on rank r is
batches[(s * gas + m) * world + r]."""
from __future__ import annotations

import copy

import pytest
import torch

from zero.models.lora import add_lora
from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

MODEL = GPTConfig(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=32)
MICRO_BATCH = 2
SEED = 0


def cpu_without_onednn_fp16() -> None:
    """For the rest of this rank process, torch answers that oneDNN has no fp16 here, as on an
    AVX2 or older AVX-512 CPU. Muon's "gram" Newton-Schulz then iterates in fp32 (zero picks
    its dtype as DeepSpeed does: fp16 where the accelerator has it). On a CPU with
    AVX512-FP16 it would iterate in fp16, whose rounding of the ranks' differently summed
    gradients (up to 1e-2 on the test model) hides what the Muon tests look for, and
    DeepSpeed's recorded runs (tests/deepspeed_training) iterated in fp32."""
    from unittest import mock

    mock.patch.object(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False).start()


class ReusedBlockGPT(TinyGPT):
    """TinyGPT whose first block runs twice per forward (a module used more than once)."""

    def forward(self, tokens, targets=None):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        x = self.blocks[0](x)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 targets.view(-1))


class ExternalUseGPT(TinyGPT):
    """TinyGPT whose root forward also reads a weight of the first block directly (outside
    that block's own forward), declared with register_external_parameter as DeepSpeed
    requires."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        import zero

        zero.register_external_parameter(self, self.blocks[0].attn.proj.weight)

    def forward(self, tokens, targets=None):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        x = x + 0.5 * x @ self.blocks[0].attn.proj.weight.t()
        logits = self.head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 targets.view(-1))


class CheckpointedGPT(TinyGPT):
    """TinyGPT whose blocks run under activation checkpointing (recomputed in backward):
    "reentrant" / "non_reentrant" (torch.utils.checkpoint), "deepspeed"
    (deepspeed.checkpointing.checkpoint) or "deepspeed_non_reentrant" (its
    non_reentrant_checkpoint). Its head is tied to the token embedding."""

    def __init__(self, config: GPTConfig, checkpointing: str):
        super().__init__(config)
        self.checkpointing = checkpointing

    def forward(self, tokens, targets=None):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = self._checkpointed(block, x)
        logits = self._checkpointed(self._logits, x)  # the tied head, recomputed too
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 targets.view(-1))

    def _logits(self, x):
        return self.head(self.ln_f(x))

    def _checkpointed(self, block, x):
        if self.checkpointing.startswith("deepspeed"):
            import zero.compat.deepspeed as deepspeed

            if self.checkpointing == "deepspeed_non_reentrant":
                return deepspeed.checkpointing.non_reentrant_checkpoint(block, x)
            return deepspeed.checkpointing.checkpoint(block, x)
        from torch.utils.checkpoint import checkpoint

        return checkpoint(block, x, use_reentrant=self.checkpointing == "reentrant")


def make_model(config: GPTConfig = MODEL, freeze_position_embedding: bool = False,
               reuse_block: bool = False, external_use: bool = False,
               checkpointing: str | None = None, lora: bool = False) -> TinyGPT:
    torch.manual_seed(SEED)
    if checkpointing is not None:
        model = CheckpointedGPT(config, checkpointing)
    else:
        kind = ExternalUseGPT if external_use else ReusedBlockGPT if reuse_block else TinyGPT
        model = kind(config)
    if freeze_position_embedding:
        model.position_embedding.weight.requires_grad_(False)
    return add_lora(model) if lora else model  # PEFT-style adapters, the rest frozen


def engine_config(stage: int, gas: int = 2, clip: float = 1.0, precision: str = "fp32",
                  scheduler: bool = True, bucket: int = 3000, **zero_extra) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket, **zero_extra},
    }
    if scheduler:
        config["scheduler"] = {"type": "WarmupCosineLR",
                               "params": {"total_num_steps": 40, "warmup_num_steps": 5}}
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
    return config


def batches(world: int, steps: int, gas: int):
    return synthetic_batches(MODEL, MICRO_BATCH, steps * gas * world, seed=SEED + 1)


def train_engine(engine, rank: int, world: int, steps: int, gas: int, first_step: int = 0,
                 on_step=None, data=None) -> list[float]:
    """Runs `steps` optimizer steps; returns the global mean loss of each step. `data`: the
    micro-batches, micro-batch m of step s on rank r at (s * gas + m) * world + r (default:
    batches(world, ...) of the test model)."""
    import torch.distributed as dist

    data = batches(world, first_step + steps, gas) if data is None else data
    device = getattr(engine, "device", torch.device("cpu"))  # the batches go where the model is
    losses = []
    for step in range(first_step, first_step + steps):
        total = torch.zeros(1, device=device)
        for micro in range(gas):
            tokens, targets = (t.to(device) for t in data[(step * gas + micro) * world + rank])
            loss = engine(tokens, targets)
            if on_step is not None:
                loss = on_step(step, loss)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        losses.append(total.item() / (gas * world))
    return losses


def resume_and_train(config: dict, rank: int, world: int, first: int, steps: int,
                     load_dir=None, save_dir=None) -> list[float]:
    """An engine of `config` on the test model: loads `load_dir`'s checkpoint when given,
    trains `steps` steps from step `first`, saves into `save_dir` when given; the losses."""
    import zero

    engine, _, _, _ = zero.initialize(model=make_model(), config=config)
    return load_train_save(engine, rank, world, config["gradient_accumulation_steps"], first,
                           steps, load_dir, save_dir)


def parameters_of(module) -> dict[str, torch.Tensor]:
    """Copies of the module's parameters in fp32 on the CPU (where the references are, and
    what a rank hands back across processes)."""
    return {name: p.detach().float().cpu().clone() for name, p in module.named_parameters()}


def reference_adamw(params, config: dict) -> torch.optim.Optimizer:
    """The references' optimizer, with the config's hyperparameters: torch's AdamW (or
    Adagrad; for "Lion" the torch implementation in zero's deepspeed.ops.lion)."""
    kind, hyper = config["optimizer"]["type"], dict(config["optimizer"]["params"])
    if kind == "Adagrad":
        return torch.optim.Adagrad(params, foreach=False, **hyper)
    if kind == "Lion":
        from zero.compat.deepspeed.ops.lion import FusedLion
        return FusedLion(params, **hyper)
    if kind not in ("Adam", "AdamW"):  # a torch.optim type
        return getattr(torch.optim, kind)(params, **hyper)
    return torch.optim.AdamW(params, lr=hyper["lr"], betas=tuple(hyper["betas"]),
                             eps=hyper["eps"], weight_decay=hyper["weight_decay"], foreach=False)


def moment_steps(optimizer: torch.optim.Optimizer):
    """(group, parameter, state) for every parameter of `optimizer`, the state's step counted
    and Adam's moments m and v made at the first: the loop of the tests' reference optimizers."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if not state:
                state.update(step=0, m=torch.zeros_like(param), v=torch.zeros_like(param))
            state["step"] += 1
            yield group, param, state


def reference_grads(world: int, gas: int) -> dict[str, torch.Tensor]:
    """The single-process reference's gradients of the first step on the global batch (the
    micro-steps' losses divided by gas, as the engine scales them)."""
    model = make_model()
    data = batches(world, 1, gas)
    for micro in range(gas):
        parts = [data[micro * world + r] for r in range(world)]
        (model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
         / gas).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def engine_at_boundary(config: dict, rank: int, world: int):
    """An engine of `config` on the test model, its first step's micro-batches run up to the
    boundary's backward: the reduced gradients are in it, the step not yet taken."""
    import zero

    engine, _, _, _ = zero.initialize(model=make_model(), config=config)
    gas = config["gradient_accumulation_steps"]
    data = batches(world, 1, gas)
    for micro in range(gas):
        engine.backward(engine(*(t.to(engine.device) for t in data[micro * world + rank])))
        if micro < gas - 1:
            engine.step()
    return engine


def train_reference(world: int, steps: int, gas: int, config: dict, make_optimizer=None,
                    **model_options):
    """Single process, global batch, the config's optimizer (torch.optim.AdamW, ...; or
    `make_optimizer(params)`), clip_grad_norm_, zero's scheduler: (losses, parameters); with
    make_optimizer also the optimizer."""
    from zero.schedulers import build_scheduler

    model = make_model(**model_options)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params) if make_optimizer else reference_adamw(params, config)
    scheduler = None
    if "scheduler" in config:
        scheduler = build_scheduler(config["scheduler"]["type"],
                                    copy.deepcopy(config["scheduler"]["params"]), optimizer)
    losses = reference_steps(model, optimizer, batches(world, steps, gas), world, steps, gas,
                             config.get("gradient_clipping"), scheduler)
    if make_optimizer:
        return losses, parameters_of(model), optimizer
    return losses, parameters_of(model)


def reference_steps(model, optimizer, data, world: int, steps: int, gas: int, clip=None,
                    scheduler=None) -> list[float]:
    """`steps` optimizer steps in one process on the global batch: micro-step m of step s
    takes the ranks' micro-batches (s * gas + m) * world + r together, its loss divided by
    gas; clipping at `clip` when given. The mean loss of each step."""
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        total = 0.0
        for micro in range(gas):
            parts = [data[(step * gas + micro) * world + r] for r in range(world)]
            loss = model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            (loss / gas).backward()
            total += loss.item()
        if clip:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                           clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(total / gas)
    return losses


def load_train_save(engine, rank: int, world: int, gas: int, first: int, steps: int,
                    load_dir=None, save_dir=None) -> list[float]:
    """Loads `load_dir`'s checkpoint (saved after `first` steps) when given, trains `steps`
    steps from step `first`, saves into `save_dir` when given; the losses."""
    if load_dir:
        engine.load_checkpoint(load_dir)
        assert engine.global_steps == first
    losses = train_engine(engine, rank, world, steps, gas, first_step=first)
    if save_dir:
        engine.save_checkpoint(save_dir)
    return losses


def check_resume_bit_for_bit(resume, world: int, save_dir: str) -> list:
    """`resume(rank, world, save_dir, phase)` -> (losses, rank 0's module state) for the
    phases "full" (one run), "first" (its first part, saved) and "second" (loaded, the rest):
    the two parts' losses are the full run's and the final states equal, bit for bit. Returns
    the "first" results (the saved state: rank 0's [1])."""
    from distributed_harness import run_distributed

    full, first, second = (run_distributed(resume, world, args=(save_dir, phase))
                           for phase in ("full", "first", "second"))
    for rank in range(world):
        assert first[rank][0] + second[rank][0] == full[rank][0]
    for name, value in full[0][1].items():
        assert torch.equal(second[0][1][name], value), name
    return first


def assert_run_matches(result, reference, weight_tolerance=1e-5, loss_tolerance=1e-5) -> None:
    """A run's (losses, parameters, ...) against a reference's (losses, parameters, ...):
    the losses within `loss_tolerance`, every parameter within `weight_tolerance`."""
    losses, params = result[:2]
    ref_losses, ref_params = reference[:2]
    assert losses == pytest.approx(ref_losses, rel=loss_tolerance)
    for name, expected in ref_params.items():
        assert relative_error(params[name], expected) < weight_tolerance, name


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-12)).item()


def open_files() -> list[str]:
    """What this process's open descriptors point at (/proc/self/fd): a file that has lost
    its name reads "<path> (deleted)"."""
    import os

    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return links


def open_path(swap_file: str) -> str:
    """A path that opens this process's swap file `swap_file` (unlinked once created, so it is
    only reachable through its descriptor): /proc/self/fd/<fd>."""
    import os

    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == f"{swap_file} (deleted)":
                return f"/proc/self/fd/{fd}"
        except OSError:
            continue
    raise FileNotFoundError(f"no open descriptor of the swap file {swap_file}")


def assert_same_states(path: str, other: str) -> None:
    """Two checkpoints of one model (any layouts) hold the same whole fp32 master and Adam
    moments, name by name."""
    from zero.checkpoint_export import open_checkpoint
    from zero.checkpoint_remesh import SavedParts

    arrays = []
    for root in (path, other):
        saved = SavedParts(open_checkpoint(root)[0])
        saved.read_shards()
        arrays.append({array: saved.whole(array) for array in ("master", "exp_avg",
                                                               "exp_avg_sq")})
    for array, values in arrays[0].items():
        assert values.keys() == arrays[1][array].keys(), array
        for name, value in values.items():
            assert torch.equal(value, arrays[1][array][name]), (array, name)


def universal_values(directory: str) -> dict:
    """A universal checkpoint's zero/ folder: each file's value by its path below zero/ (a
    parameter file's tensor, the rest as saved)."""
    import os

    from zero.checkpoint_deepspeed import load_file

    root, values = os.path.join(directory, "zero"), {}
    for where, _, names in os.walk(root):
        for name in names:
            value = load_file(os.path.join(where, name))
            if isinstance(value, dict) and "param" in value:
                value = value["param"]
            values[os.path.relpath(os.path.join(where, name), root)] = value
    return values
