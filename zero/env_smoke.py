"""The environment report's smoke test, run in its own process (zero/env_report.py starts it,
so a crash is seen, not suffered): a small GPT trains three steps at ZeRO stage 3 on one
rank of the given device and backend (world 1). Prints one line,
`loss <first> -> <last> in <seconds> s`; exit status 0 when the losses are finite.

    python -m zero.env_smoke --device cpu --backend gloo --port 29511
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist

STEPS = 3


def train(device: str) -> list[float]:
    import zero
    from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

    model_config = GPTConfig(vocab_size=128, block_size=32, n_layer=2, n_head=2, n_embd=64)
    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    if device == "cuda":
        config["bf16"] = {"enabled": True}
    engine, _, _, _ = zero.initialize(model=TinyGPT(model_config), config=config)
    if engine.device.type != device:
        raise RuntimeError(f"zero: the engine chose {engine.device}, not {device} (for the CPU "
                           "run, CUDA_VISIBLE_DEVICES must be empty)")
    losses = []
    for tokens, targets in synthetic_batches(model_config, 4, STEPS, seed=1):
        loss = engine(tokens.to(engine.device), targets.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.destroy()
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zero.env_smoke")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args.port))
    start = time.perf_counter()
    dist.init_process_group(args.backend, rank=0, world_size=1)
    try:
        losses = train(args.device)
    finally:
        dist.destroy_process_group()
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {time.perf_counter() - start:.1f} s")
    return 0 if all(math.isfinite(loss) for loss in losses) else 1


if __name__ == "__main__":
    sys.exit(main())
