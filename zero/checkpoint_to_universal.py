"""DeepSpeed's `ds_to_universal`, for zero's checkpoints and DeepSpeed's own: one tag directory
made into DeepSpeed's universal checkpoint, which DeepSpeed 0.19.8 loads at any world size and
ZeRO stage with `"checkpoint": {"load_universal": true}`, and zero too. A run trained under zero
goes back to DeepSpeed this way; a DeepSpeed checkpoint converts without DeepSpeed installed.

    python -m deepspeed.checkpoint.ds_to_universal --input_folder ckpt/global_step10 \\
        --output_folder ckpt/global_step10_universal        (zero's deepspeed alias)
    python -m zero.checkpoint_to_universal ...                (the same flags)

What is written: what DeepSpeed's universal load reads, and what checkpoint_universal.py reads.
    <output>/../latest_universal           the output folder's name, written last
    <output>/mp_rank_00_model_states.pt    counters, scheduler, client state (top-level keys,
                                           as DeepSpeed saves them), the whole module (its
                                           16-bit weights, frozen parameters, buffers),
                                           param_shapes and buffer_names
    <output>/zero_pp_rank_0_mp_rank_00_model_states.pt   the same: DeepSpeed's stage 3 opens
                                           this name, stages 1-2 the other, so the checkpoint
                                           loads at every stage (ds_to_universal copies only
                                           the source's own)
    <output>/zero/optimizer_state.pt       param_groups, and the step as stage 3 reads it
    <output>/zero/<name>/fp32.pt           {"param": the whole fp32 master, "cat_dim": 0}
    <output>/zero/<name>/<state>.pt        each optimizer-state array, whole (Adam: exp_avg,
                                           exp_avg_sq)
    <output>/zero/<name>/step.pt           the optimizer's step: an int (DeepSpeed's fused and
                                           CPU Adam), a tensor with torch_adam (torch's Adam)
A frozen parameter, a second name of a tied one and a buffer get an fp32.pt from the module,
as ds_to_universal writes them. DeepSpeed's universal load restores none of them (it loads no
module); zero's does.

What DeepSpeed 0.19.8 resumes from it: Adam or AdamW at any stage and world size; at its
stage 3 only Adam's files are read and every optimizer group takes the first group's
hyperparameters (its loader's rules). Not carried: an fp16 run's dynamic loss scale
(DeepSpeed keeps it as a pickled DeepSpeed object; the load starts from the config's initial
scale), and a split model's layout (a checkpoint saved with pipeline stages or tensor slices
is joined into the whole model's, for a DeepSpeed run without tensor parallelism).

The output appears whole or not at all: it is written into `.<name>.tmp` beside it, every
file and directory synced, and renamed into place; `latest_universal` is written last. An
existing output folder is replaced only when it holds an older conversion, and the input
is never touched.
"""
from __future__ import annotations

import argparse
import os
import shutil

import torch

from . import checkpoint_deepspeed, checkpoint_layout, checkpoint_remesh, checkpoint_universal
from . import checkpoint_files as files
from .checkpoint_deepspeed import WHOLE_MODEL_FILE, DeepSpeedCheckpoint, rank_model_file
from .checkpoint_pieces import Located
from .moe import checkpoint as moe_checkpoint

# The DeepSpeed version whose loader reads this (its stage 1-2 load asserts a ds_version).
DEEPSPEED_VERSION = "0.19.8"


def convert(input_folder: str, output_folder: str, torch_adam: bool = False) -> str:
    """Writes the universal checkpoint of tag directory `input_folder` (zero's or DeepSpeed's
    ZeRO checkpoint) into `output_folder` and names it in the parent's latest_universal;
    returns the output folder. `torch_adam`: the steps as tensors, for a DeepSpeed run with
    optimizer.params.torch_adam true (torch's Adam refuses an int step). An output folder
    that exists is replaced only when it holds a universal checkpoint (an older conversion)."""
    _check_output(input_folder, output_folder)
    saved = read(input_folder)
    output_folder = os.path.abspath(output_folder)
    parent, tag = os.path.split(output_folder)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{tag}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _write(saved, staging, torch_adam)
        files.fsync_tree(staging)
        files.publish(parent, staging, tag)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files.write_text(os.path.join(parent, checkpoint_universal.LATEST_UNIVERSAL), tag)
    files.fsync_dir(parent)
    return output_folder


def _check_output(input_folder: str, output_folder: str) -> None:
    """The output is neither the input nor above or inside it, and replaces nothing but an
    older conversion (a ValueError saying what to pass instead)."""
    source, target = os.path.realpath(input_folder), os.path.realpath(output_folder)
    if target == source or source.startswith(target + os.sep) or \
            target.startswith(source + os.sep):
        raise ValueError(f"zero: --output_folder {output_folder} is the input checkpoint "
                         f"{input_folder}, holds it or lies inside it; pass a new folder "
                         f"beside it, e.g. {source}_universal")
    if os.path.exists(target) and not (os.path.isdir(target) and (
            not os.listdir(target) or checkpoint_universal.is_universal_checkpoint(target))):
        raise ValueError(f"zero: --output_folder {output_folder} exists and is not a universal "
                         "checkpoint; the conversion would replace it: pass a new folder")


def read(path: str) -> DeepSpeedCheckpoint:
    """Checkpoint tag directory `path`, zero's or DeepSpeed's, as one record by parameter name;
    a ValueError saying what a directory holding neither is."""
    if not os.path.isdir(path):
        raise ValueError(f"zero: --input_folder {path} is not a directory; pass a checkpoint's "
                         "tag directory (e.g. checkpoints/global_step100)")
    if checkpoint_universal.is_universal_checkpoint(path):
        raise ValueError(f"zero: {path} is a universal checkpoint already; load it with "
                         '"checkpoint": {"load_universal": true}')
    if checkpoint_deepspeed.is_deepspeed_checkpoint(path):
        saved = checkpoint_deepspeed.read(path)
        if saved.moe_layers:  # (its experts' states differ from rank to rank)
            moe_checkpoint.refuse_split_experts(path, {"moe": saved.moe_layers},
                                                "ds_to_universal")
        return saved
    if files.part_names(path):
        return _read_zero(path)
    latest = os.path.join(path, files.LATEST)
    hint = "pass a checkpoint's tag directory"
    if os.path.isfile(latest):
        with open(latest) as file:
            hint = f"its 'latest' names {os.path.join(path, file.read().strip())}: pass that"
    raise ValueError(f"zero: {path} holds no checkpoint (neither zero's model_states.pt nor "
                     f"DeepSpeed's {WHOLE_MODEL_FILE} / {rank_model_file(0)}); {hint}")


def _read_zero(path: str) -> DeepSpeedCheckpoint:
    """A zero checkpoint (of the whole model, or of its pipeline x tensor parts joined) as the
    record DeepSpeed's checkpoints are read into, its model state in DeepSpeed's keys."""
    saved = checkpoint_remesh.SavedParts(path)
    saved.read_shards()
    first = saved.states[0]
    master = _arrays(saved, "master")
    module = saved.whole("module")
    frozen = {name for state in saved.states for name in state["layout"]["frozen"]}
    aliases = {alias: names[0] for state in saved.states for group in state["layout"]["groups"]
               for names, _ in group["params"] for alias in names[1:]}
    counters, world = first["counters"], first["fingerprint"]["world_size"]
    model_state = {
        **(first.get("client_state") or {}),
        "param_shapes": [{name: master[name].shape for name in group}
                         for group in _optimizer_groups(saved, path)],
        "shared_params": aliases, "optimizer": None, "lr_scheduler": first.get("lr_scheduler"),
        "data_sampler": None, "random_ltd": None,
        "global_steps": counters["global_steps"], "global_samples": counters["global_samples"],
        "skipped_steps": counters["skipped_steps"],
        "dp_world_size": world // (saved.pipe * saved.tensor),
        "ds_version": DEEPSPEED_VERSION, "module": module}
    return DeepSpeedCheckpoint(
        path=path, model_state=model_state, stage=first["fingerprint"]["stage"],
        world_size=model_state["dp_world_size"], master=master,
        moments={array: _arrays(saved, array) for array in saved.state_arrays()},
        step=counters["applied_steps"], param_groups=list(first["optimizer"]["param_groups"]),
        frozen={name: module[name] for name in frozen if name in module}, loss_scale=None)


def _arrays(saved: checkpoint_remesh.SavedParts, array: str) -> dict[str, Located]:
    """Where each parameter's value of `array` lies, by every name (none for a parameter
    whose optimizer keeps no such array): mapped from the rank files for the whole model,
    held whole for a model saved in parts (joined)."""
    if len(saved.names) > 1:
        return {name: Located.of(value) for name, value in saved.whole(array).items()}
    state = saved.states[0]
    located = checkpoint_layout.located_arrays(path=saved.path, model_state=state, array=array,
                                               shards=saved.shards[0])
    by_first = {name: value for group in located for name, value in group.items()}
    return {name: by_first[names[0]] for group in state["layout"]["groups"]
            for names, _ in group["params"] for name in names if names[0] in by_first}


def _optimizer_groups(saved: checkpoint_remesh.SavedParts, path: str) -> list[list[str]]:
    """Each optimizer group's trainable parameters (first names), from the engine groups each
    part's layout records with the optimizer group that owns them."""
    count = len(saved.states[0]["optimizer"]["param_groups"])
    groups: list[list[str]] = [[] for _ in range(count)]
    for state in saved.states:
        for group in state["layout"]["groups"]:
            owner = group.get("owner", 0 if count == 1 else None)
            if owner is None:
                raise ValueError(f"zero: checkpoint {path} was saved before checkpoints "
                                 "recorded which optimizer group owns each parameter, with "
                                 f"{count} optimizer groups; load it into an engine and save "
                                 "it again, then convert that")
            groups[owner] += [names[0] for names, _ in group["params"]
                              if names[0] not in groups[owner]]
    return groups


def _write(saved: DeepSpeedCheckpoint, directory: str, torch_adam: bool) -> None:
    zero_dir = os.path.join(directory, "zero")
    step = torch.tensor(float(saved.step)) if torch_adam else int(saved.step)
    trainable = [name for group in saved.model_state["param_shapes"] for name in group]
    for name in trainable:
        _save_param(zero_dir, name, "fp32", saved.master[name])
        for array, values in saved.moments.items():
            if name in values:  # (the arrays its optimizer group keeps)
                _save_param(zero_dir, name, array, values[name])
        files.save_torch(step, os.path.join(zero_dir, name, "step.pt"))
    module = saved.module_state(_module_dtype(saved))
    for name, value in module.items():  # as ds_to_universal: the module's value, in fp32
        if name not in trainable:
            os.makedirs(os.path.join(zero_dir, name), exist_ok=True)
            files.save_torch({"param": value.float()}, os.path.join(zero_dir, name, "fp32.pt"))
    groups = [{**group, "params": [0]} for group in saved.param_groups]
    files.save_torch({"ds_version": DEEPSPEED_VERSION, "zero_stage": saved.stage,
                      "param_groups": groups,
                      "optimizer_state_dict": {"state": {0: {"step": step}},
                                               "param_groups": groups}},
                     os.path.join(zero_dir, "optimizer_state.pt"))
    model_state = {**saved.model_state, "module": module, "frozen_param_shapes": None,
                   "frozen_param_fragments": None, "mp_world_size": 1,
                   "buffer_names": [n for n in module if n not in saved.master
                                    and n not in saved.frozen]}
    whole, stage3 = (os.path.join(directory, name) for name in (WHOLE_MODEL_FILE,
                                                                rank_model_file(0)))
    files.save_torch(model_state, whole)
    try:  # the same file under DeepSpeed's stage-3 name
        os.link(whole, stage3)
    except OSError:  # a file system without hard links
        shutil.copyfile(whole, stage3)


def _save_param(zero_dir: str, name: str, array: str, value: Located) -> None:
    os.makedirs(os.path.join(zero_dir, name), exist_ok=True)
    files.save_torch({"cat_dim": 0, "param": value.whole().float()},
                     os.path.join(zero_dir, name, f"{array}.pt"))


def _module_dtype(saved: DeepSpeedCheckpoint) -> torch.dtype:
    """The dtype the run trained its weights in (DeepSpeed's stage 3 saves empty placeholders
    of it)."""
    module = saved.model_state["module"]
    first = next((name for group in saved.model_state["param_shapes"] for name in group
                  if name in module), None)
    return module[first].dtype if first is not None else torch.float32


def parse_arguments(argv=None) -> argparse.Namespace:
    """DeepSpeed's `ds_to_universal` flags; its tuning flags are accepted and have nothing to
    tune here (one pass, every value read once)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input_folder", required=True,
                        help="a checkpoint's tag directory (zero's or DeepSpeed's)")
    parser.add_argument("--output_folder", required=True,
                        help="the universal checkpoint's directory; its parent gets "
                             "latest_universal naming it")
    parser.add_argument("--torch_adam", action="store_true",
                        help="steps as tensors: for a DeepSpeed run configured with "
                             "optimizer.params.torch_adam true")
    for flag in ("--num_extract_workers", "--num_merge_workers"):
        parser.add_argument(flag, type=int, default=None, help="accepted, no effect")
    for flag in ("--keep_temp_folder", "--inject_missing_state"):
        parser.add_argument(flag, action="store_true", help="accepted, no effect")
    parser.add_argument("--no_strict", dest="strict", action="store_false",
                        help="accepted, no effect")
    return parser.parse_args(argv)


def main(args: argparse.Namespace | None = None) -> None:
    """DeepSpeed's `main(args)`: converts, or exits 1 saying what is wrong with the input or
    the output folder."""
    args = args if args is not None else parse_arguments()
    try:
        written = convert(args.input_folder, args.output_folder,
                          torch_adam=getattr(args, "torch_adam", False))
    except (ValueError, files.CorruptCheckpoint) as error:
        raise SystemExit(f"{error}") from None
    print(f"zero: wrote the universal checkpoint {written} (named in "
          f"{os.path.join(os.path.dirname(written), checkpoint_universal.LATEST_UNIVERSAL)})")


if __name__ == "__main__":
    main()
