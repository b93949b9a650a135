"""Checkpoints: every rank writes its shard; rank 0 writes the module and engine state.

Layout (DeepSpeed-like names):
    save_dir/latest                              the newest complete tag
    save_dir/<tag>/model_states.pt               rank 0: module, counters, scheduler, scaler,
                                                 client_state, layout fingerprint
    save_dir/<tag>/zero_rank<r>_optim_states.pt  rank r: fp32 master shard + optimizer state
    save_dir/<tag>/layer_<L>_expert_<E>_mp_rank_00_model_states.pt
                                                 MoE: each expert's weights (moe/checkpoint.py)
    save_dir/<tag>/manifest.json                 every file's size and SHA-256, written last
    save_dir/zero_to_fp32.py                     DeepSpeed's command: the fp32 weights from
                                                 the files (checkpoint_export.py)

A model split over pipeline stages or tensor ranks saves one such set per part, under
DeepSpeed's names (checkpoint_mesh.py): mp_rank_XX_model_states.pt from each part's first
data-parallel rank, zero_pp_rank_<d>_mp_rank_XX_optim_states.pt from every rank, one manifest.
It loads at the same pipe x tensor layout part by part, at another one (or whole, and a whole
checkpoint into a split engine) through checkpoint_remesh.py.

Nothing is lost on a crash (checkpoint_files.py): ranks write into save_dir/.<tag>.tmp, each
file fsynced and renamed, rank 0 writes the manifest from every rank's digests, renames the
whole directory into place (an older copy of the same tag moved aside first, and found again
by load if the crash came in between), and only then rewrites `latest`. Every step that can
fail runs on every rank inside one agreement: any failure raises CheckpointError on all ranks.
Load verifies each file it reads against the manifest and its format version, all of them
before anything is written into the engine (at another world size every saved rank's file), and
names the file and rank on a mismatch. A checkpoint saved at another world size or stage (the same dtype, optimizer and
trainable parameters) is resharded on load from the layout it records (checkpoint_layout.py), so
DeepSpeed's `checkpoint.load_universal` needs nothing more for them; with it, a directory
ds_to_universal wrote loads too (checkpoint_universal.py), as does any checkpoint DeepSpeed
itself saved (checkpoint_deepspeed.py).

DeepSpeed's `checkpoint` config block: `tag_validation` compares the ranks' tags before anything
is written; with `use_node_local_storage` every node's local rank 0 writes model_states.pt, the
manifest and `latest` into its node's save_dir (each node then holds its own ranks' shards).
"""
from __future__ import annotations

import functools
import logging
import os
import shutil

import torch
import torch.distributed as dist

from . import checkpoint_files as files
from . import (agreement, checkpoint_deepspeed, checkpoint_layout, checkpoint_mesh,
               checkpoint_remesh, checkpoint_universal, scheduler_groups, sharding)
from .checkpoint_files import LATEST
from .moe import checkpoint as moe_checkpoint
from .moe import ep_checkpoint

logger = logging.getLogger("zero")

# Written beside the tags, as DeepSpeed does: the fp32 weights out of the files, no processes.
RECOVERY_SCRIPT = "zero_to_fp32.py"
_RECOVERY_SCRIPT_TEXT = """#!/usr/bin/env python
# Written by zero beside its checkpoints: the full fp32 weights from the files alone, without a
# process group (needs zero importable). DeepSpeed's flags:
#   python zero_to_fp32.py . OUTPUT_DIR [--safe_serialization] [--max_shard_size 5GB] [-t TAG]
#                          [--exclude_frozen_parameters]
from zero.checkpoint_export import main

if __name__ == "__main__":
    main()
"""


def _atomic_torch_save(obj, path: str) -> dict:
    return files.save_torch(obj, path)


def _fingerprint(engine, part: checkpoint_mesh.Part) -> dict:
    core = engine.core
    return {"stage": engine.stage, "world_size": dist.get_world_size(),
            "dtype": str(engine.dtype), "optimizer": engine.optimizer.spec.label,
            "group_numels": [core.group_numel(g) for g in range(core.group_count)],
            # the ranks each group is sharded over (MiCS: its shard groups', below the world)
            "group_worlds": [core.group_layout(g).world_size for g in range(core.group_count)],
            "mesh": part.mesh}  # None without pipeline or tensor parallelism


def save_checkpoint(engine, save_dir, tag, client_state: dict, save_latest: bool,
                    exclude_frozen: bool = False) -> bool:
    settings = engine.config.checkpoint
    part = checkpoint_mesh.part_of(engine)
    tag = _agreed_tag(str(tag) if tag is not None else f"global_step{engine.global_steps}",
                      settings.tag_validation,
                      None if settings.use_node_local_storage else save_dir)
    # The files every rank shares (manifest, latest) are written by rank 0, or with node-local
    # storage by each node's local rank 0 into its node's save_dir; so is model_states.pt,
    # except that each part of a split model has its own (checkpoint_mesh.py).
    writer = engine.local_rank == 0 if settings.use_node_local_storage else dist.get_rank() == 0
    if settings.use_node_local_storage:
        if engine.moe is not None:
            moe_checkpoint.refuse_node_local()
        if part.mesh is not None:
            raise NotImplementedError(
                "zero: checkpoint.use_node_local_storage with pipeline stages or tensor "
                "parallelism is not built (each node would hold other parts of the model); set "
                "it to false and save to a directory every rank sees")
        _check_node_local(save_dir, writer)
    tag = files.checked_tag(tag)  # (a bad tag is named here, on every rank)
    staging = files.beside(save_dir, tag, ".tmp")
    with _all_ranks_or_none(f"preparing checkpoint {tag} in {save_dir}"):
        if writer:
            files.recover(save_dir, tag)  # an earlier save of this tag died while publishing
            shutil.rmtree(staging, ignore_errors=True)
            os.makedirs(staging)
    try:
        with _all_ranks_or_none(f"saving checkpoint {tag} to {save_dir}"):
            model_writer = part.writes_model if part.mesh is not None else writer
            written = _write_files(engine, staging, part, model_writer, client_state,
                                   exclude_frozen)
    except CheckpointError as error:
        # Every rank is past its writes (the agreement comes after them): the unfinished copy
        # goes, so that its space is free for the next save.
        if writer:
            shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(f"{error}{files.low_space_hint(save_dir)}") from error
    entries = [None] * dist.get_world_size()
    dist.all_gather_object(entries, written)  # every shard is on disk before the tag appears
    with _all_ranks_or_none(f"publishing checkpoint {tag} in {save_dir}",
                            "'latest' names a complete checkpoint (the previous or this one)"):
        if writer:
            # every rank's files; with node-local storage this writer's own model_states.pt
            manifest = {k: v for rank_written in entries for k, v in rank_written.items()}
            manifest.update(written)
            files.write_manifest(staging, manifest)
            files.publish(save_dir, staging, tag)
            if save_latest:
                files.write_text(os.path.join(save_dir, LATEST), tag)
            files.write_text(os.path.join(save_dir, RECOVERY_SCRIPT), _RECOVERY_SCRIPT_TEXT)
    return True


def _agreed_tag(tag: str, validation: str, save_dir: str | None) -> str:
    """The one tag every rank saves under: the ranks' tags are compared (checkpoint.
    tag_validation): when they differ, "Fail" raises on every rank, "Warn" logs them and, like
    "Ignore", saves under rank 0's tag. `save_dir` (None: node-local storage, one per node)
    must be one directory on every rank: its parts are written into it."""
    places = [None] * dist.get_world_size()
    here = os.path.abspath(save_dir) if save_dir is not None else None
    dist.all_gather_object(places, (tag, here))
    if any(other != here for _, other in places):
        named = "; ".join(f"rank {r}: {d!r}" for r, (_, d) in enumerate(places))
        raise CheckpointError(f"zero: save_checkpoint was given different directories ({named});"
                              " nothing was saved. Every rank writes its part of one checkpoint "
                              "into one directory: pass the same save_dir on every rank")
    tags = [t for t, _ in places]
    if all(t == tags[0] for t in tags):
        return tag
    differing = [f"rank {r}: {t!r}" for r, t in enumerate(tags) if t != tags[0]]
    message = (f"zero: save_checkpoint was given different tags (rank 0: {tags[0]!r}; "
               + "; ".join(differing[:4]) + (f"; and {len(differing) - 4} more" if
                                             len(differing) > 4 else "") + ")")
    if validation == "Fail":
        raise CheckpointError(f"{message}; nothing was saved (checkpoint.tag_validation is "
                              "\"Fail\"). Pass the same tag on every rank: a tag holding a rank's "
                              "own information cannot be found again at another world size")
    if validation == "Warn" and dist.get_rank() == 0:
        logger.warning("%s; saving under rank 0's tag %r (checkpoint.tag_validation \"Warn\"; "
                       "\"Fail\" stops instead, \"Ignore\" says nothing)", message, tags[0])
    return tags[0]


def _check_node_local(save_dir: str, writer: bool) -> None:
    """With checkpoint.use_node_local_storage every node's local rank 0 writes its own copy of
    the shared files; two of them in one shared directory would overwrite each other's work.
    Each writer leaves a marker in save_dir, then looks for the others' markers."""
    import uuid

    marker = f".zero-node-local-{dist.get_rank()}-{uuid.uuid4().hex}" if writer else None
    with _all_ranks_or_none(f"preparing node-local save_dir {save_dir}", "nothing was saved"):
        if writer:
            os.makedirs(save_dir, exist_ok=True)
            files.write_text(os.path.join(save_dir, marker), "")
    markers = [None] * dist.get_world_size()
    dist.all_gather_object(markers, marker)
    try:
        with _all_ranks_or_none(f"checking that save_dir {save_dir} is node-local",
                                "nothing was saved"):
            seen = [r for r, other in enumerate(markers) if other is not None and other != marker
                    and writer and os.path.exists(os.path.join(save_dir, other))]
            if seen:
                raise ValueError(
                    f"checkpoint.use_node_local_storage is true but {save_dir} is shared: ranks "
                    f"{dist.get_rank()} and {', '.join(map(str, seen))} (local rank 0 of their "
                    "nodes) both see it; set use_node_local_storage to false (rank 0 then writes "
                    "the shared files once) or give each node a local save_dir")
    finally:
        if writer:
            try:
                os.remove(os.path.join(save_dir, marker))
            except OSError:
                pass


class CheckpointError(RuntimeError):
    """Raised on every rank when any rank failed to write or read its part."""


class _all_ranks_or_none:
    """Runs a block on every rank, then agrees on the outcome: if any rank failed, every rank
    raises CheckpointError naming the ranks and their errors (instead of the others hanging in
    the next collective or dying of a reset connection)."""

    def __init__(self, what: str, after: str = "the previous checkpoint and 'latest' are untouched"):
        self.what, self.after = what, after

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        message = None if error is None else f"{type(error).__name__}: {error}"
        messages = [None] * dist.get_world_size()
        dist.all_gather_object(messages, message)
        failures = [f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None]
        if failures:
            raise CheckpointError(f"zero: {self.what} failed ({'; '.join(failures)}); "
                                  f"{self.after}") from error
        return False


def _write_files(engine, staging: str, part: checkpoint_mesh.Part, model_writer: bool,
                 client_state: dict, exclude_frozen: bool) -> dict[str, dict]:
    """Writes this rank's shard (and its part's model file on a model writer); returns their
    manifest entries. `exclude_frozen`: the module state without the frozen parameters."""
    # The one collective first (stage 3 gathers unit by unit), so that a write failing on one
    # rank cannot leave the others waiting in it.
    module_state = engine.gathered_module_state(keep=model_writer)
    if exclude_frozen:
        frozen = sharding.frozen_names(engine.module)
        module_state = {name: value for name, value in module_state.items()
                        if name not in frozen}
    expert_files = {}
    if engine.moe is not None:  # AutoEP's experts whole (a collective); DeepSpeed-MoE's in
        # files of their own, by global id
        module_state = ep_checkpoint.gathered(engine.module, module_state, dst=0)
        module_state, expert_files = moe_checkpoint.split(engine.module, module_state)
    core = engine.core
    groups = [{"master": core.group_master_shard(g),
               "state": dict(core.group_optimizer_state(g))}  # copies
              for g in range(core.group_count)]
    fingerprint = _fingerprint(engine, part)
    shard = {"format_version": files.FORMAT_VERSION, "fingerprint": fingerprint,
             "groups": groups}
    shard_file = part.names.rank(part.data_rank)
    written = {shard_file: _atomic_torch_save(shard, os.path.join(staging, shard_file))}
    for name, experts in expert_files.items():
        written[name] = _atomic_torch_save(experts, os.path.join(staging, name))
    if model_writer:
        written[part.names.model] = _atomic_torch_save({
            "format_version": files.FORMAT_VERSION,
            "module": module_state,
            "fingerprint": fingerprint,
            "layout": checkpoint_layout.describe(engine),
            "tensor_split": checkpoint_mesh.tensor_split(engine.module),
            "moe": moe_checkpoint.describe(engine.module),
            "optimizer": engine.optimizer.state_dict(),
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
            "loss_scaler": engine.loss_scaler.state_dict() if engine.loss_scaler else None,
            "counters": {name: getattr(engine, name) for name in (
                "micro_steps", "global_steps", "global_samples", "skipped_steps", "applied_steps")},
            "client_state": client_state,
        }, os.path.join(staging, part.names.model))
    return written


def load_checkpoint(engine, load_dir, tag, load_module_strict, load_optimizer_states,
                    load_lr_scheduler_states, load_module_only, custom_load_fn=None):
    tag = _agreed_load_tag(engine, load_dir, tag)
    if tag is None:
        if dist.get_rank() == 0:
            print(f"zero: no '{LATEST}' file in {load_dir}; nothing loaded. Pass tag= to "
                  "load a specific checkpoint", flush=True)
        return None, None
    part = checkpoint_mesh.part_of(engine)
    load_shards = load_optimizer_states and not load_module_only
    # how the module's weights are written (DeepSpeed's custom_load_fn instead of
    # load_state_dict); the masters come from the files or follow the module after
    load_module = functools.partial(engine.load_module_weights, strict=load_module_strict,
                                    custom_load_fn=custom_load_fn)
    with _all_ranks_or_none(f"checking checkpoint {tag} in {load_dir}", "nothing was loaded"):
        path, note = files.find(load_dir, str(tag))
        deepspeed_reader = _deepspeed_reader(path)
        same_layout = deepspeed_reader is not None or \
            checkpoint_mesh.same_layout(_saved_mesh(path), part.mesh)
    if note and dist.get_rank() == 0:
        logger.warning(note)
    if deepspeed_reader is not None:
        return _load_deepspeed(engine, path, deepspeed_reader, load_module,
                               load_optimizer_states, load_lr_scheduler_states, load_module_only)
    if same_layout:
        model_state = _load_own_part(engine, path, part, load_shards, load_module)
    else:
        model_state = _load_other_layout(engine, path, load_shards, load_module)
    if not load_module_only:
        load_scheduler = load_lr_scheduler_states and engine.lr_scheduler is not None \
            and model_state["lr_scheduler"] is not None
        sources = checkpoint_layout.saved_group_sources(engine, model_state, path) \
            if load_optimizer_states or load_scheduler else None
        if load_optimizer_states:
            engine.optimizer.load_state_dict(
                checkpoint_layout.optimizer_state_for(model_state["optimizer"], sources))
            if engine.loss_scaler is not None and model_state["loss_scaler"] is not None:
                engine.loss_scaler.load_state_dict(model_state["loss_scaler"])
        if load_scheduler:
            scheduler = model_state["lr_scheduler"]
            if sources is not None:  # (an MoE layout change: other optimizer groups)
                saved_groups = len(model_state["optimizer"]["param_groups"])
                scheduler = scheduler_groups.regrouped(scheduler, sources, saved_groups)
            engine.lr_scheduler.load_state_dict(scheduler)
        for name, value in model_state["counters"].items():
            setattr(engine, name, value)
        _restart_accumulation(engine)
    engine.core.zero_grads()
    dist.barrier()
    return path, model_state["client_state"]


def _agreed_load_tag(engine, load_dir: str, tag) -> str | None:
    """The tag every rank loads: `tag`, or the one `latest` names (None: no `latest`). The
    ranks' are compared, so that none loads another checkpoint (a tag computed per rank, a
    node whose local `latest` is older or missing) or returns while the others load."""
    def read() -> str | None:
        if tag is not None:
            return str(tag)
        latest = _latest_file(engine, load_dir)
        if not os.path.isfile(latest):
            return None
        try:
            with open(latest) as file:
                named = file.read().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise CheckpointError(f"zero: cannot read {latest}: {error}") from error
        if not named:
            raise CheckpointError(f"zero: {latest} is empty (a save that could not write it); "
                                  "pass tag= to name the checkpoint to load")
        return named

    tags = agreement.on_every_rank(read, CheckpointError,
                                   f"reading the checkpoint tag in {load_dir}")
    if any(t != tags[0] for t in tags):
        named = "; ".join(f"rank {r}: {'no ' + LATEST + ' file' if t is None else repr(t)}"
                          for r, t in enumerate(tags) if t != tags[0])
        first = f"no {LATEST} file" if tags[0] is None else repr(tags[0])
        raise CheckpointError(
            f"zero: load_checkpoint({load_dir}) would load different checkpoints (rank 0: "
            f"{first}; {named}); nothing was loaded. Every rank must load the same tag: pass "
            "the same tag= everywhere, and give every rank the same directory (a node-local "
            "copy must hold the same checkpoints)")
    return tags[0]


def _restart_accumulation(engine) -> None:
    """After a load, zero's checkpoint or DeepSpeed's: the accumulation restarts at a boundary
    of this engine's count (a part-done one's gradients are not saved, and at another world
    size the count may differ; DeepSpeed saves no micro_steps and starts again from 0)."""
    engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()


def _latest_file(engine, load_dir: str) -> str:
    """`latest`, or with checkpoint.load_universal DeepSpeed's `latest_universal` when there
    is one (ds_to_universal's output; zero's own checkpoints load through `latest`)."""
    if engine.config.checkpoint.load_universal:
        universal = os.path.join(load_dir, checkpoint_universal.LATEST_UNIVERSAL)
        if os.path.isfile(universal):
            return universal
    return os.path.join(load_dir, LATEST)


def _deepspeed_reader(path: str):
    """The reader of a checkpoint DeepSpeed wrote (a ZeRO checkpoint, or one converted to
    its universal format), None for zero's own."""
    if checkpoint_universal.is_universal_checkpoint(path):
        return checkpoint_universal.read
    if checkpoint_deepspeed.is_deepspeed_checkpoint(path):
        return checkpoint_deepspeed.read
    return None


def _load_deepspeed(engine, path: str, read, load_module, load_optimizer_states: bool,
                    load_lr_scheduler_states: bool, load_module_only: bool):
    """A checkpoint DeepSpeed wrote, read by `read` (checkpoint_deepspeed.py,
    checkpoint_universal.py), at any world size and stage."""
    load_shards = load_optimizer_states and not load_module_only
    with _all_ranks_or_none(f"reading DeepSpeed checkpoint {path}", "nothing was loaded"):
        saved = read(path)
    _agreed_check(lambda: checkpoint_deepspeed.check_fits(engine, saved, load_shards))
    with _all_ranks_or_none(f"loading DeepSpeed checkpoint {path}",
                            "the engine may be partly loaded: load a checkpoint again"):
        checkpoint_deepspeed.load_into(engine, saved, load_shards, load_module, load_module_only)
    if not load_module_only:
        checkpoint_deepspeed.restore_engine_state(engine, saved, load_shards,
                                                  load_lr_scheduler_states)
        _restart_accumulation(engine)
    engine.core.zero_grads()
    if dist.get_rank() == 0:
        logger.info("zero: loaded DeepSpeed %s checkpoint %s (ZeRO stage %d, %d ranks)",
                    saved.model_state.get("ds_version"), path, saved.stage, saved.world_size)
    dist.barrier()
    return path, saved.client_state(dist.get_rank(), load_optimizer_states,
                                    load_lr_scheduler_states, load_module_only)


def _load_own_part(engine, path: str, part: checkpoint_mesh.Part, load_shards: bool,
                   load_module) -> dict:
    """A checkpoint of this engine's pipeline x tensor layout: each part reads its own files
    (resharded when the data-parallel size or stage differs). Returns its model state."""
    with _all_ranks_or_none(f"checking checkpoint {path}", "nothing was loaded"):
        files.verify(path, [part.names.model] + moe_checkpoint.own_files(engine.module))
        model_state = files.load_torch(os.path.join(path, part.names.model))
        model_state["module"].update(moe_checkpoint.read_own(engine.module, path,
                                                             files.load_torch))

    def check() -> bool:
        moe_checkpoint.check_layers(model_state, engine.module, path)
        checkpoint_layout.check_same_model(  # (AutoEP's experts: this rank's rows)
            f"checkpoint {os.path.join(path, part.names.model)}",
            ep_checkpoint.localized(engine.module, model_state["module"]), engine.full_shapes)
        if not load_shards:
            # The module's weights alone (load_module_only, or no optimizer states): they load
            # at any layout, into any dtype (as a state dict does), whatever the optimizer or
            # the frozen set; nothing saved is resharded.
            return False
        # each rank's shard holds other experts at another ep_size or expert layout
        return _check_fingerprint(model_state, engine, part, path, force=bool(
            model_state.get("moe"))
            and not moe_checkpoint.same_expert_layout(model_state, engine.module))

    # Each part reads its own file: one part's mismatch is raised on every rank.
    reshard = _agreed_check(check)
    shards = None
    with _all_ranks_or_none(f"checking checkpoint {path}", "nothing was loaded"):
        # Every rank file this rank will read, before anything is written into the engine:
        # present, equal to the manifest, in a format this zero reads (mapped, not read).
        if load_shards and reshard:
            shards = _read_every_shard(engine, path, model_state, part.names)
            # where every parameter lies, checked against the files (nothing read yet)
            checkpoint_layout.located_arrays(path, model_state, "master", shards, part.names)
        elif load_shards:
            shard_file = part.names.rank(part.data_rank)
            files.verify(path, [shard_file])
            shards = files.load_torch(os.path.join(path, shard_file), mmap=True)["groups"]
    with _all_ranks_or_none(f"loading checkpoint {path}",
                            "the engine may be partly loaded: load a checkpoint again"):
        load_module(model_state["module"])
        if load_shards and reshard:
            checkpoint_layout.reshard_into(engine, path, model_state, shards)
        elif load_shards:
            _load_shard(engine, shards)
        else:
            checkpoint_layout.refresh_masters(engine.core)
    return model_state


def _load_other_layout(engine, path: str, load_shards: bool, load_module) -> dict:
    """A checkpoint of another pipeline x tensor layout (or of the whole model, into a split
    one): the parts joined, this rank's part cut out (checkpoint_remesh.py). Returns the
    first part's model state (counters, optimizer, scheduler: the same in every part)."""
    with _all_ranks_or_none(f"checking checkpoint {path}", "nothing was loaded"):
        saved = checkpoint_remesh.SavedParts(path)
        if load_shards:
            saved.read_shards()

    def check() -> None:
        if not load_shards:
            return  # the module's weights alone: any dtype and optimizer (_load_own_part)
        fingerprint = saved.states[0]["fingerprint"]
        for key, value in (("dtype", str(engine.dtype)),
                           ("optimizer", engine.optimizer.spec.label)):
            if fingerprint.get(key) != value:
                raise ValueError(f"zero: checkpoint {path} was written with {key}="
                                 f"{fingerprint.get(key)!r} but this engine has {key}={value!r}; "
                                 f"resume with the same {key}")

    _agreed_check(check)
    with _all_ranks_or_none(f"loading checkpoint {path} (saved with another pipeline x tensor "
                            "layout)", "the engine may be partly loaded: load a checkpoint again"):
        checkpoint_remesh.load_into(engine, saved, load_shards, load_module)
    return saved.states[0]


def _agreed_check(check):
    """check()'s result, its ValueError raised on every rank (agreement.on_every_rank)."""
    return agreement.on_every_rank(check, ValueError, "nothing was loaded")[dist.get_rank()]


def _saved_mesh(path: str) -> dict | None:
    """The mesh a checkpoint directory was saved with (None: the whole model on every rank),
    from the names of its model files; a split one's first part records it."""
    parts = files.part_names(path)
    if not parts or parts[0] == files.WHOLE:
        return None
    # mapped, not hashed: each rank verifies its own part's file next
    return files.load_torch(os.path.join(path, parts[0].model), mmap=True)["fingerprint"]["mesh"]


def _read_every_shard(engine, path: str, model_state: dict,
                      names: files.PartNames) -> list[list[dict]]:
    try:
        return checkpoint_layout.read_shards(path, model_state, names)
    except files.CorruptCheckpoint as error:
        if not engine.config.checkpoint.use_node_local_storage:
            raise
        raise files.CorruptCheckpoint(
            f"{error} (checkpoint.use_node_local_storage is true: each node's copy holds its own "
            "ranks' files only; to load at another world size, copy every node's "
            "zero_rank*_optim_states.pt into one directory)") from error


def _load_shard(engine, groups: list[dict]) -> None:
    """This rank's own shard, saved at the same layout (its groups, verified and mapped)."""
    core = engine.core
    with torch.no_grad():
        for g, saved in enumerate(groups):
            core.group_load_master_shard(g, saved["master"])
            for name, tensor in saved["state"].items():
                core.group_load_optimizer_state(g, name, tensor)


def _check_fingerprint(model_state: dict, engine, part: checkpoint_mesh.Part, path: str,
                       force: bool = False) -> bool:
    """Whether the checkpoint fits this engine as saved (False) or must be resharded (True:
    another world size or stage, or `force`, the same dtype, optimizer and trainable
    parameters); raises naming the difference otherwise."""
    saved, current = model_state["fingerprint"], _fingerprint(engine, part)
    for key in ("dtype", "optimizer"):
        if saved.get(key) != current[key]:
            raise ValueError(
                f"zero: checkpoint {path} was written with {key}={saved[key]!r} but this engine "
                f"has {key}={current[key]!r}; resume with the same {key}, or take the weights "
                "alone (load_checkpoint(..., load_module_only=True), or "
                "load_optimizer_states=False)")
    # Saved before group_worlds was recorded: every group was sharded over the world.
    saved_worlds = saved.get("group_worlds", [saved["world_size"]] * len(saved["group_numels"]))
    if not force and saved_worlds == current["group_worlds"] and all(
            saved[key] == current[key] for key in ("stage", "world_size", "group_numels")):
        return False
    layout = model_state.get("layout")
    differ = None if layout is None else _other_trainable(model_state, engine, path)
    if layout is None or differ:
        raise ValueError(
            f"zero: checkpoint {path} was written with stage={saved['stage']}, "
            f"world_size={saved['world_size']} and groups of {saved['group_numels']} elements "
            f"but this engine has stage={current['stage']}, world_size={current['world_size']} "
            f"and {current['group_numels']}"
            + ("; it was saved before checkpoints recorded their layout: resume with the same "
               "stage, world size and model" if layout is None else
               f" with other trainable parameters ({differ}); resume the same model with the "
               "same parameters frozen"))
    return True


def _other_trainable(model_state: dict, engine, path: str) -> str | None:
    """How this engine's trainable parameters differ from the checkpoint's (None: the same),
    an MoE expert's by its global id: each rank's must be among the saved ones, and every
    saved kind trained here (an expert's names without their id, moe/checkpoint.generic)."""
    saved = checkpoint_layout.saved_param_names(model_state, path)
    mine = {n for group in checkpoint_layout.global_param_names(engine) for n in group}
    generic = moe_checkpoint.generic
    not_saved = sorted(mine - saved)
    not_trained = sorted({generic(n) for n in saved} - {generic(n) for n in mine})
    for names, what in ((not_saved, "trainable here, not in the checkpoint"),
                        (not_trained, "trainable in the checkpoint, not here")):
        if names:
            return f"{what}: {', '.join(names[:5])}" + (
                f" and {len(names) - 5} more" if len(names) > 5 else "") + (
                " (MoE experts by their global ids)"
                if any(moe_checkpoint.is_expert_key(n) for n in names) else "")
    return None
