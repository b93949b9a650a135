"""Checkpoints: every rank writes its shard; rank 0 writes the module and engine state.

Layout (DeepSpeed-like names):
    save_dir/latest                              the newest complete tag
    save_dir/<tag>/model_states.pt               rank 0: module, counters, scheduler, scaler,
                                                 client_state, layout fingerprint
    save_dir/<tag>/zero_rank<r>_optim_states.pt  rank r: fp32 master shard + optimizer state

Nothing is lost on a crash: ranks write into save_dir/.<tag>.tmp, rank 0 renames the whole
directory into place after a barrier (replacing an older copy of the same tag), and only
then rewrites `latest` through a temporary file and os.replace. A crash at any point leaves
the previous checkpoint and `latest` intact.
"""
from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist

MODEL_FILE = "model_states.pt"
LATEST = "latest"


def _rank_file(rank: int) -> str:
    return f"zero_rank{rank}_optim_states.pt"


def _atomic_torch_save(obj, path: str) -> None:
    temporary = path + ".partial"
    with open(temporary, "wb") as out:
        torch.save(obj, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def _atomic_write_text(path: str, text: str) -> None:
    temporary = path + ".partial"
    with open(temporary, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def _fingerprint(engine) -> dict:
    core = engine.core
    return {"stage": engine.stage, "world_size": dist.get_world_size(),
            "dtype": str(engine.dtype), "optimizer": engine.optimizer.spec.kind,
            "group_numels": [core.group_numel(g) for g in range(core.group_count)]}


def save_checkpoint(engine, save_dir, tag, client_state: dict, save_latest: bool) -> bool:
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    rank = dist.get_rank()
    staging = os.path.join(save_dir, f".{tag}.tmp")
    final = os.path.join(save_dir, tag)
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
    dist.barrier()

    with _all_ranks_or_none(f"saving checkpoint {tag} to {save_dir}"):
        _write_files(engine, staging, rank, client_state)
    dist.barrier()  # every shard is on disk before the tag becomes visible
    if rank == 0:
        if os.path.exists(final):
            retired = os.path.join(save_dir, f".{tag}.old")
            shutil.rmtree(retired, ignore_errors=True)
            os.replace(final, retired)
            os.replace(staging, final)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, final)
        if save_latest:
            _atomic_write_text(os.path.join(save_dir, LATEST), tag)
    dist.barrier()
    return True


class CheckpointError(RuntimeError):
    """Raised on every rank when any rank failed to write or read its part."""


class _all_ranks_or_none:
    """Runs a block on every rank, then agrees on the outcome: if any rank failed, every rank
    raises CheckpointError naming the ranks and their errors (instead of the others hanging in
    the next collective or dying of a reset connection)."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        message = None if error is None else f"{type(error).__name__}: {error}"
        messages = [None] * dist.get_world_size()
        dist.all_gather_object(messages, message)
        failures = [f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None]
        if failures:
            raise CheckpointError(f"zero: {self.what} failed ({'; '.join(failures)}); the "
                                  "previous checkpoint and 'latest' are untouched") from error
        return False


def _write_files(engine, staging: str, rank: int, client_state: dict) -> None:
    core = engine.core
    shard = {"fingerprint": _fingerprint(engine), "groups": [
        {"master": core.group_master_shard(g),
         "state": dict(core.group_optimizer_state(g))}  # copies
        for g in range(core.group_count)]}
    _atomic_torch_save(shard, os.path.join(staging, _rank_file(rank)))
    module_state = engine.module_state_dict()  # every rank: stage 3 gathers unit by unit
    if rank == 0:
        _atomic_torch_save({
            "module": module_state,
            "fingerprint": _fingerprint(engine),
            "optimizer": engine.optimizer.state_dict(),
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
            "loss_scaler": engine.loss_scaler.state_dict() if engine.loss_scaler else None,
            "counters": {name: getattr(engine, name) for name in (
                "micro_steps", "global_steps", "global_samples", "skipped_steps", "applied_steps")},
            "client_state": client_state,
        }, os.path.join(staging, MODEL_FILE))


def load_checkpoint(engine, load_dir, tag, load_module_strict, load_optimizer_states,
                    load_lr_scheduler_states, load_module_only):
    if tag is None:
        latest = os.path.join(load_dir, LATEST)
        if not os.path.isfile(latest):
            if dist.get_rank() == 0:
                print(f"zero: no '{LATEST}' file in {load_dir}; nothing loaded. Pass tag= to "
                      "load a specific checkpoint", flush=True)
            return None, None
        with open(latest) as file:
            tag = file.read().strip()
    path = os.path.join(load_dir, str(tag))
    model_file = os.path.join(path, MODEL_FILE)
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"zero: checkpoint {path} has no {MODEL_FILE}; is the tag right?")
    model_state = torch.load(model_file, map_location="cpu", weights_only=False)
    _check_fingerprint(model_state["fingerprint"], _fingerprint(engine), path)

    with _all_ranks_or_none(f"loading checkpoint {path}"):
        engine.load_module_state_dict(model_state["module"], strict=load_module_strict)
        load_shards = load_optimizer_states and not load_module_only
        if load_shards:
            _load_shard(engine, path)
        else:  # keep the fp32 master in step with the weights just loaded
            for g in range(engine.core.group_count):
                engine.core.group_refresh_master(g)
    if not load_module_only:
        if load_optimizer_states:
            engine.optimizer.load_state_dict(model_state["optimizer"])
            if engine.loss_scaler is not None and model_state["loss_scaler"] is not None:
                engine.loss_scaler.load_state_dict(model_state["loss_scaler"])
        if load_lr_scheduler_states and engine.lr_scheduler is not None \
                and model_state["lr_scheduler"] is not None:
            engine.lr_scheduler.load_state_dict(model_state["lr_scheduler"])
        for name, value in model_state["counters"].items():
            setattr(engine, name, value)
    engine.core.zero_grads()
    dist.barrier()
    return path, model_state["client_state"]


def _load_shard(engine, path: str) -> None:
    shard_file = os.path.join(path, _rank_file(dist.get_rank()))
    shard = torch.load(shard_file, map_location="cpu", weights_only=False)
    core = engine.core
    with torch.no_grad():
        for g, saved in enumerate(shard["groups"]):
            core.group_load_master_shard(g, saved["master"])
            for name, tensor in saved["state"].items():
                core.group_load_optimizer_state(g, name, tensor)


def _check_fingerprint(saved: dict, current: dict, path: str) -> None:
    for key in ("stage", "world_size", "dtype", "optimizer", "group_numels"):
        if saved.get(key) != current[key]:
            raise ValueError(
                f"zero: checkpoint {path} was written with {key}={saved[key]!r} but this engine "
                f"has {key}={current[key]!r}; resume with the same {key} (changing the world size "
                "or stage of a checkpoint is not supported yet)")
