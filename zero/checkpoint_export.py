"""The full fp32 weights out of a checkpoint's files, without a process group: DeepSpeed's
`zero_to_fp32` (the three functions under their names and arguments, and the command).

Memory stays bounded by one output shard: the rank files are memory-mapped, each parameter is
put together from the ranks' pieces of its unit (checkpoint_layout.py) only when its output
shard is written, and the shard is dropped before the next one is built.

Output, as DeepSpeed and Hugging Face write it: `pytorch_model.bin` (torch.save) or
`model.safetensors`; above `max_shard_size`, numbered shards (`model-00001-of-00003.safetensors`)
and an index (`model.safetensors.index.json`: total size and which file holds each name).
An `output_dir` that names a file (`pytorch_model.bin`, `model.safetensors`: DeepSpeed's older
`output_file` form, still in Hugging Face's docs) gets that one file, never sharded.

A tensor the module holds under several names (tied weights, trainable or frozen, and shared
buffers) is stored once: in the torch files and the state dict under every name (one storage),
in safetensors, which cannot alias, under its first name only, as `save_pretrained` does. A
Hugging Face model's `from_pretrained` ties the other names again (its `tie_weights`); a plain
module loading a safetensors export needs `load_state_dict(..., strict=False)` and the tie
restored by its own code, or the torch export instead.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import checkpoint_deepspeed
from . import checkpoint_files as files
from .checkpoint_files import LATEST, WHOLE, PartNames
from .checkpoint_layout import layout_of, located_arrays, saved_params
from .checkpoint_mesh import check_parts, join_parts, join_slices
from .moe import checkpoint as moe_checkpoint

DEFAULT_MAX_SHARD_SIZE = "5GB"


def tag_path(checkpoint_dir: str, tag=None) -> str:
    """The tag's directory (from `latest` when no tag is given)."""
    if tag is None:
        latest = os.path.join(checkpoint_dir, LATEST)
        if not os.path.isfile(latest):
            raise FileNotFoundError(f"zero: no '{LATEST}' file in {checkpoint_dir}; pass tag= "
                                    "(a directory name such as global_step100)")
        with open(latest) as file:
            tag = file.read().strip()
    return files.find(checkpoint_dir, str(tag))[0]


def open_checkpoint(checkpoint_dir: str, tag=None) -> tuple[str, list[tuple[PartNames, dict]]]:
    """The tag's directory and the model state of each of its parts, mapped: one for a whole
    model, one per pipeline stage x tensor slice for a split one (checkpoint_mesh.py)."""
    path = tag_path(checkpoint_dir, tag)
    return path, _model_states(path)


def _model_states(path: str) -> list[tuple[PartNames, dict]]:
    """Each part's model state in tag directory `path`, verified and mapped."""
    parts = files.part_names(path) or [WHOLE]  # none found: verify names what is missing
    files.verify(path, [names.model for names in parts])
    states = [(names, files.load_torch(os.path.join(path, names.model), mmap=True))
              for names in parts]
    model_state = states[0][1]
    if model_state.get("moe"):  # (a whole model: MoE is built without pipeline or tensor parts)
        experts = moe_checkpoint.expert_files(model_state)
        files.verify(path, experts)
        model_state["module"].update(moe_checkpoint.every_expert(
            path, model_state["moe"], lambda file: files.load_torch(file, mmap=True)))
    return states


@dataclass
class Entry:
    """One tensor of the output under all its names; `build()` makes it."""
    names: list[str]
    shape: torch.Size
    dtype: torch.dtype
    build: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return self.shape.numel() * self.dtype.itemsize


def _fp32(value) -> Callable[[], torch.Tensor]:
    """Builds a located master array whole, in fp32 (a 16-bit master, bf16_master_weights_and_grads,
    widened)."""
    return lambda: value.whole().float()


def _same_tensor(tensor: torch.Tensor) -> tuple:
    """What identifies one saved tensor however many names point at it (torch.save keeps the
    storage shared between tied names)."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def _entries(path: str, model_state: dict, exclude_frozen_parameters: bool,
             names: PartNames = WHOLE) -> list[Entry]:
    """The module's state dict in its own order: trainable parameters in fp32 from the master
    weights, buffers and frozen parameters as saved; one entry per tensor, with every name the
    module has for it."""
    layout = layout_of(model_state, path)
    # each trainable parameter read from the memory-mapped rank files when its entry is built
    located = located_arrays(path, model_state, "master", names=names)
    frozen = {name for saved in layout["frozen"]
              for name in moe_checkpoint.on_every_expert_rank(model_state.get("moe") or [],
                                                              saved)}
    first_name = {}
    trainable = {}
    # MoE: each expert-parallel rank's experts, under their global ids
    for g, _, names in saved_params(model_state, path):
        trainable[names[0]] = (names, located[g][names[0]])
        first_name.update((name, names[0]) for name in names)
    entries = []
    saved_entries = {}  # _same_tensor -> the entry of a frozen parameter or buffer
    for name, saved in model_state["module"].items():
        if name in first_name:
            if first_name[name] == name:
                names, value = trainable[name]
                entries.append(Entry(names, value.shape, torch.float32, _fp32(value)))
        elif not (exclude_frozen_parameters and name in frozen):
            key = _same_tensor(saved)
            if key in saved_entries:  # another name of a tensor already listed
                saved_entries[key].names.append(name)
                continue
            saved_entries[key] = Entry([name], saved.shape, saved.dtype,
                                       lambda t=saved: t.clone())
            entries.append(saved_entries[key])
    return entries


def checkpoint_entries(checkpoint_dir, tag=None, exclude_frozen_parameters: bool = False
                       ) -> tuple[list[Entry], list[str]]:
    """Every tensor of the whole model (a split model's parts put together), and the names
    in state-dict order; of a checkpoint DeepSpeed wrote too (checkpoint_deepspeed.py)."""
    path = tag_path(checkpoint_dir, tag)
    if checkpoint_deepspeed.is_deepspeed_checkpoint(path):
        return _deepspeed_entries(checkpoint_deepspeed.read(path), exclude_frozen_parameters)
    parts = _model_states(path)
    if parts[0][0] == WHOLE:
        model_state = parts[0][1]
        return _entries(path, model_state, exclude_frozen_parameters), list(model_state["module"])
    return _joined_parts(path, parts, exclude_frozen_parameters)


def _deepspeed_entries(saved: checkpoint_deepspeed.DeepSpeedCheckpoint,
                       exclude_frozen_parameters: bool) -> tuple[list[Entry], list[str]]:
    """A DeepSpeed checkpoint's module in its saved order: the trainable parameters' fp32
    master (each read when its entry is built), buffers and frozen parameters as saved; tied
    names on one entry."""
    saved_module = saved.model_state["module"]
    order = [name for name in saved_module if name in saved.master or name in saved.frozen
             or name in saved.model_state.get("buffer_names", [])]
    order = [name for name in order if not (exclude_frozen_parameters and name in saved.frozen)]
    entries: dict[int, Entry] = {}  # by the value's identity: tied names share one
    for name in order:
        value = saved.master.get(name, saved.frozen.get(name, saved_module.get(name)))
        if id(value) in entries:
            entries[id(value)].names.append(name)
        elif name in saved.master:
            entries[id(value)] = Entry([name], value.shape, torch.float32, _fp32(value))
        else:
            entries[id(value)] = Entry([name], value.shape, value.dtype, lambda t=value: t.clone())
    return list(entries.values()), order


def _joined_parts(path: str, parts: list[tuple[PartNames, dict]],
                  exclude_frozen_parameters: bool) -> tuple[list[Entry], list[str]]:
    """The parts of a split model as one (checkpoint_mesh.join_parts): each parameter the
    tensor ranks split rebuilt from their slices, the others from tensor rank 0; a tied layer
    from its first stage."""
    mesh = parts[0][1]["fingerprint"]["mesh"]
    pipe, tensor = mesh["pipe"], mesh["tensor"]
    check_parts(path, [names.mp_rank for names, _ in parts], pipe, tensor)
    per_part = [{e.names[0]: e for e in _entries(path, state, exclude_frozen_parameters, names)}
                for names, state in parts]
    entries = list(join_parts(per_part, [state.get("tensor_split", {}) for _, state in parts],
                              pipe, tensor, _joined).values())
    return entries, [name for entry in entries for name in entry.names]


def _joined(pieces: list[Entry], split: dict) -> Entry:
    """The whole parameter from the tensor ranks' slices (checkpoint_mesh.join_slices), built
    when asked."""
    shape = list(pieces[0].shape)
    shape[split["dim"]] *= len(pieces)
    shape = torch.Size(shape[::-1] if split["transposed"] else shape)
    return Entry(pieces[0].names, shape, pieces[0].dtype,
                 lambda: join_slices([piece.build() for piece in pieces], split))


class LazyTensor:
    """One tensor of a lazy_mode state dict (DeepSpeed's GatheredTensor): `shape` and `dtype`
    now, the values (read from the memory-mapped rank files) on `.contiguous()`. Tied names
    share one LazyTensor."""

    def __init__(self, build: Callable[[], torch.Tensor], shape: torch.Size, dtype: torch.dtype):
        self._build, self.shape, self.dtype = build, shape, dtype

    def contiguous(self) -> torch.Tensor:
        return self._build()

    def __repr__(self) -> str:
        return f"LazyTensor(shape={tuple(self.shape)}, dtype={self.dtype})"


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters=False,
                                             lazy_mode=False) -> dict:
    """DeepSpeed's function of the same name: the model's state dict with every trainable
    parameter in fp32 from the checkpoint's master weights, buffers (and, unless excluded,
    frozen parameters) as saved, tied names sharing one tensor. With `lazy_mode` the values
    are LazyTensors, each built (and held) only when its `.contiguous()` is called, as
    DeepSpeed's lazy mode does: memory for one tensor at a time."""
    entries, order = checkpoint_entries(checkpoint_dir, tag, exclude_frozen_parameters)
    state = {}
    for entry in entries:
        if lazy_mode:
            value = LazyTensor(entry.build, entry.shape, entry.dtype)
        else:
            value = entry.build()
        for name in entry.names:
            state[name] = value
    return {name: state[name] for name in order if name in state}


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """DeepSpeed's function of the same name: loads the fp32 weights into `model` (moved to
    the CPU) and returns it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def parse_size(size) -> int:
    """Bytes in `size`: an int, or digits and a unit as Hugging Face writes them ("5GB" is
    5*10**9 bytes, "5GiB" 5*2**30)."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B)\s*", str(size), re.IGNORECASE)
    if match is None:
        raise ValueError(f"zero: max_shard_size={size!r} is not a size; write bytes as an int "
                         "or digits and a unit, e.g. \"5GB\", \"500MB\" or \"2GiB\"")
    unit = match.group(2).upper()
    power = "KMGT".index(unit[0]) + 1
    return int(float(match.group(1)) * ((1024 if "I" in unit else 1000) ** power))


def plan_shards(entries: list[Entry], limit: int) -> list[list[Entry]]:
    """Consecutive entries in files of at most `limit` bytes (an entry larger than that gets a
    file of its own), each entry counted once however many names it has."""
    shards, current, used = [], [], 0
    for entry in entries:
        if current and used + entry.nbytes > limit:
            shards.append(current)
            current, used = [], 0
        current.append(entry)
        used += entry.nbytes
    return shards + [current] if current else shards


# An output path ending so names a file (DeepSpeed's older output_file form), not a directory.
WEIGHT_FILE_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors")


def _output_file(output) -> str | None:
    """The file `output` names, or None when it is a directory (an existing one, or a name
    without a weights file's suffix)."""
    output = os.fspath(output)
    if os.path.isdir(output) or not output.endswith(WEIGHT_FILE_SUFFIXES):
        return None
    return output


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir=None,
                                               max_shard_size=DEFAULT_MAX_SHARD_SIZE,
                                               safe_serialization=False, tag=None,
                                               exclude_frozen_parameters=False,
                                               output_file=None) -> list[str]:
    """DeepSpeed's function of the same name: writes the fp32 state dict into `output_dir` as
    `pytorch_model.bin` or, with `safe_serialization`, `model.safetensors`; sharded with an
    index JSON above `max_shard_size` (None: one file). Returns the files written (names in
    `output_dir`).

    DeepSpeed's older form, `output_dir` (or `output_file=`) naming a file ending in .bin, .pt,
    .pth or .safetensors, writes that one file, whole whatever `max_shard_size` says; a
    .safetensors name writes safetensors."""
    from tqdm import tqdm

    if output_file is not None and output_dir is not None:
        raise TypeError("zero: give output_dir or output_file, not both")
    output = output_file if output_file is not None else output_dir
    if output is None:
        raise TypeError("zero: convert_zero_checkpoint_to_fp32_state_dict needs output_dir "
                        "(a directory, or the file to write)")
    single = _output_file(output) if output_file is None else os.fspath(output_file)
    if single is not None:
        if safe_serialization and not single.endswith(".safetensors"):
            raise ValueError(f"zero: safe_serialization writes safetensors but {single} is named "
                             "as a torch file; name it *.safetensors or drop safe_serialization")
        safe_serialization = single.endswith(".safetensors")
    if safe_serialization:
        from safetensors.torch import save_file
    entries, _ = checkpoint_entries(checkpoint_dir, tag, exclude_frozen_parameters)
    total = sum(entry.nbytes for entry in entries)
    if single is not None:
        output_dir, names, shards = os.path.dirname(single) or ".", [os.path.basename(single)], \
            [entries]
    else:
        limit = parse_size(max_shard_size) if max_shard_size is not None else total
        shards = plan_shards(entries, max(limit, 1))
        names = _shard_names("model.safetensors" if safe_serialization else "pytorch_model.bin",
                             len(shards))
    os.makedirs(output_dir, exist_ok=True)
    weight_map = {}
    for file_name, shard in tqdm(list(zip(names, shards)), desc="zero: writing fp32 shards",
                                 disable=len(shards) < 2):
        state = {}
        for entry in shard:
            value = entry.build()
            for name in entry.names[:1] if safe_serialization else entry.names:
                state[name] = value
                weight_map[name] = file_name
        target = os.path.join(output_dir, file_name)
        if safe_serialization:
            save_file(state, target, metadata={"format": "pt"})
        else:
            torch.save(state, target)
        del state
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        index_name = names[0].split("-00001-")[0] + (
            ".safetensors.index.json" if safe_serialization else ".bin.index.json")
        with open(os.path.join(output_dir, index_name), "w") as file:
            file.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        names = names + [index_name]
    return names


def _shard_names(weights_name: str, count: int) -> list[str]:
    if count == 1:
        return [weights_name]
    stem, ext = weights_name.split(".", 1)
    return [f"{stem}-{i:05d}-of-{count:05d}.{ext}" for i in range(1, count + 1)]


def main(argv=None) -> None:
    """`python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR [...]`, DeepSpeed's flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint_dir", help="the directory holding 'latest' and the tags")
    parser.add_argument("output_dir", help="where the fp32 state dict files go, or the one "
                        "file to write (a name ending in .bin, .pt, .pth or .safetensors)")
    parser.add_argument("--max_shard_size", default=DEFAULT_MAX_SHARD_SIZE,
                        help="largest output file before sharding (default 5GB)")
    parser.add_argument("--safe_serialization", action="store_true",
                        help="write safetensors instead of torch.save files")
    parser.add_argument("-t", "--tag", default=None, help="the tag, e.g. global_step100 "
                        "(default: the one named in 'latest')")
    parser.add_argument("--exclude_frozen_parameters", action="store_true")
    parser.add_argument("-d", "--debug", action="store_true", help="accepted, no effect")
    args = parser.parse_args(argv)
    written = convert_zero_checkpoint_to_fp32_state_dict(
        args.checkpoint_dir, args.output_dir, max_shard_size=args.max_shard_size,
        safe_serialization=args.safe_serialization, tag=args.tag,
        exclude_frozen_parameters=args.exclude_frozen_parameters)
    where = os.path.dirname(args.output_dir) if _output_file(args.output_dir) else args.output_dir
    print(f"zero: wrote {', '.join(written)} to {where or '.'}")


if __name__ == "__main__":
    main()
