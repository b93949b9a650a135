"""Start-up agreement: before the engine's first collective, every rank checks that the others
were given the same config and built the same model.

Ranks started with different configs (another stage, bucket size, dtype, learning rate) or
different models otherwise hang or abort deep inside a collective, fail late, or train
silently apart. Here each rank hashes the config as given (every key and value) and the
model's parameters (name, full shape, requires_grad; not the dtype, which the engine sets);
host-local keys (NVMe paths, aio tuning) are left out. One all-gather of the hashes
compares them. On a mismatch a second all-gather brings every rank's values, and every rank
raises the same StartupMismatch naming the differing keys or parameters and the ranks.
"""
from __future__ import annotations

import hashlib
import json

import torch.distributed as dist
from torch import nn

from . import init as zero_init

MAX_LISTED = 10  # differences named in the message
HOST_LOCAL = ("nvme_path", "aio")  # may differ between nodes or ranks


class StartupMismatch(RuntimeError):
    """The ranks were started with different configs or models."""


def fingerprint(raw_config, model: nn.Module | None) -> dict[str, str]:
    """What must be equal on every rank: "config <key.path>" and "parameter <name>" entries
    (no parameters without a model)."""
    entries: dict[str, str] = {}
    _flatten("config", raw_config, entries)
    for name, param in (model.named_parameters() if model is not None else ()):
        shape = zero_init.shard_shape(param) or list(param.shape)
        entries[f"parameter {name}"] = f"shape {tuple(shape)}, requires_grad={param.requires_grad}"
    return entries


def agree(raw_config, model: nn.Module, group=None) -> None:
    """Collective over `group` (default the world: the ranks that must hold the same config
    and model). Returns when every rank has the same fingerprint; raises StartupMismatch
    on every rank otherwise."""
    _agree(fingerprint(raw_config, model), group)


def agree_config(raw_config) -> None:
    """Collective over the world: the config alone. With pipeline or tensor parallelism the
    ranks hold different parts of the model, but every stage and slice must run the same
    schedule (micro-batches, precision, ZeRO stage, mesh sizes), or their exchanges hang."""
    _agree(fingerprint(raw_config, None), None)


def _agree(mine: dict[str, str], group) -> None:
    digest = hashlib.sha256(json.dumps(sorted(mine.items())).encode()).hexdigest()
    world = dist.get_world_size(group)
    digests = [None] * world
    dist.all_gather_object(digests, digest, group=group)
    if len(set(digests)) == 1:
        return
    everyone = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    raise StartupMismatch(describe(everyone))


def describe(fingerprints: list[dict[str, str]]) -> str:
    keys = sorted(set().union(*fingerprints))
    differing = [key for key in keys
                 if len({f.get(key, "<absent>") for f in fingerprints}) > 1]
    lines = []
    for key in differing[:MAX_LISTED]:
        values = "; ".join(f"rank {r}: {f.get(key, '<absent>')}"
                           for r, f in enumerate(fingerprints))
        lines.append(f"  {key}: {values}")
    if len(differing) > MAX_LISTED:
        lines.append(f"  ... and {len(differing) - MAX_LISTED} more")
    return ("zero: the ranks were started with different configs or models, so training would "
            "hang or drift apart; nothing was trained. Differences:\n" + "\n".join(lines) +
            "\nStart every rank with the same config file and the same model code.")


def _flatten(prefix: str, value, out: dict[str, str]) -> None:
    if isinstance(value, dict) or hasattr(value, "items"):
        for key, item in value.items():
            if key in HOST_LOCAL:
                continue
            _flatten(f"{prefix}.{key}" if prefix != "config" else f"config {key}", item, out)
    else:
        out[prefix] = json.dumps(value, default=repr, sort_keys=True)


def on_every_rank(run, errors: type[Exception], what: str) -> list:
    """run()'s result from every rank of the world (one all-gather), or, when it raised
    `errors` on any rank, an error on every rank: that error itself where it was raised,
    `errors` naming the ranks and their messages on the others, which would otherwise wait
    in their next collective. `what` says what did not happen ("nothing was loaded")."""
    result, error = None, None
    try:
        result = run()
    except errors as raised:
        error = raised
    outcomes = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, (result, None if error is None else str(error)))
    if error is not None:
        raise error
    failed = [f"rank {rank}: {message}" for rank, (_, message) in enumerate(outcomes) if message]
    if failed:
        raise errors(f"zero: {what}: " + "; ".join(failed[:4]))
    return [value for value, _ in outcomes]
