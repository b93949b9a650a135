"""Make docs/images/memory_report.png: a real 2-process ZeRO stage-3 run with the optimizer
offloaded to host memory, its memory reports rendered by `zero-mem report --png`.

    python scripts/memory_report_image.py                      # -> docs/images/memory_report.png
    python scripts/memory_report_image.py --out /tmp/mem.png --steps 8 --keep runs/mem

Two gloo ranks on this machine (CPU is enough: the registry tags every buffer with where it
lives, so the device / host split is the engine's own). Each rank appends one JSON line per
optimizer step to <run>/mem.rank<r>.jsonl and a final one (`engine.final_memory_report()`);
the image is then `python -m zero.reports.cli report <run> --png <out>`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile

import torch
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches  # noqa: E402

MODEL = GPTConfig(vocab_size=512, block_size=64, n_layer=6, n_head=4, n_embd=128)
MICRO_BATCH, GAS = 4, 2


def config(run_dir: str, every: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3, "reduce_bucket_size": 200_000, "overlap_comm": True,
            "stage3_param_persistence_threshold": 1_000,  # norms and biases stay whole
            "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 300_000,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "sub_group_size": 100_000,
        },
        "memory_report": {"path": os.path.join(run_dir, "mem.jsonl"), "every_n_steps": every},
    }


def worker(rank: int, world: int, port: int, run_dir: str, steps: int, every: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import warnings

    import zero

    torch.manual_seed(0)
    with warnings.catch_warnings():  # a CPU build of torch cannot pin: said once, not here
        warnings.simplefilter("ignore")
        engine, _, _, _ = zero.initialize(model=TinyGPT(MODEL), config=config(run_dir, every))
    data = synthetic_batches(MODEL, MICRO_BATCH, steps * GAS * world, seed=1)
    for step in range(steps):
        for micro in range(GAS):
            tokens, targets = data[(step * GAS + micro) * world + rank]
            engine.backward(engine(tokens, targets))
            engine.step()
    engine.final_memory_report()
    engine.destroy()
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "images", "memory_report.png"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--every", type=int, default=1, help="memory_report.every_n_steps")
    parser.add_argument("--keep", help="keep the JSON lines in this folder")
    args = parser.parse_args(argv)
    run_dir = args.keep or tempfile.mkdtemp(prefix="zero-mem-")
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):  # one run per folder
            if name.startswith("mem.rank"):
                os.remove(os.path.join(run_dir, name))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(worker, args=(2, port, run_dir, args.steps, args.every), nprocs=2,
                       start_method="spawn")
    from zero.reports import cli

    code = cli.main(["report", run_dir, "--png", args.out, "--table"])
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
