"""The files of a checkpoint directory, written so that a crash at any instant loses nothing:
each file goes to `<name>.partial`, is fsynced and renamed; its SHA-256 is taken from the bytes
written; `manifest.json` (every file's size and digest, written last) marks the directory
complete. A directory without a manifest was never finished (or predates manifests, see
`verify`).

Publishing a directory under a tag that already exists (re-saving `tag="latest_model"`) moves
the old one aside as `.<tag>.old` first; `find` looks there, and in the finished staging
directory `.<tag>.tmp`, when a crash left the tag itself missing. A nested tag ("run1/step2",
which DeepSpeed accepts) keeps both beside it: `run1/.step2.tmp`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass

import torch

MANIFEST = "manifest.json"
MODEL_FILE = "model_states.pt"  # rank 0: module, counters, scheduler, scaler, layout
LATEST = "latest"               # the newest complete tag
# The version of what the torch files hold; written into each, checked by load_torch.
FORMAT_VERSION = 1


def rank_file(rank: int) -> str:
    """Rank `rank`'s fp32 master shard and optimizer state."""
    return f"zero_rank{rank}_optim_states.pt"


@dataclass(frozen=True)
class PartNames:
    """The files of one part of the model. `mp_rank` None: the whole model on every rank
    (model_states.pt, zero_rank<r>_optim_states.pt). Otherwise the part at that DeepSpeed
    model-parallel rank (pipeline stage x tensor slice, stage-major) under DeepSpeed's
    names: mp_rank_XX_model_states.pt and zero_pp_rank_<d>_mp_rank_XX_optim_states.pt, <d>
    the rank within the part's data-parallel group."""
    mp_rank: int | None = None

    @property
    def model(self) -> str:
        return MODEL_FILE if self.mp_rank is None else f"mp_rank_{self.mp_rank:02d}_model_states.pt"

    def rank(self, data_rank: int) -> str:
        if self.mp_rank is None:
            return rank_file(data_rank)
        return f"zero_pp_rank_{data_rank}_mp_rank_{self.mp_rank:02d}_optim_states.pt"


WHOLE = PartNames()
_PART_MODEL = re.compile(r"mp_rank_(\d+)_model_states\.pt")


def part_names(directory: str) -> list[PartNames]:
    """The parts a checkpoint directory holds, in model-parallel rank order: [WHOLE] when it
    has model_states.pt, else one per mp_rank_XX_model_states.pt (none: an empty list)."""
    if os.path.isfile(os.path.join(directory, MODEL_FILE)):
        return [WHOLE]
    found = [_PART_MODEL.fullmatch(name) for name in os.listdir(directory)]
    return [PartNames(r) for r in sorted(int(m.group(1)) for m in found if m)]


class CorruptCheckpoint(RuntimeError):
    """A checkpoint file is missing, truncated or does not match its manifest."""


def fsync_dir(path: str) -> None:
    """A directory's entries on disk (the files' own data is fsynced as they are written)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """fsync_dir of every directory under `root`, deepest first, `root` last."""
    for where, _, _ in os.walk(root, topdown=False):
        fsync_dir(where)


class _Hashing:
    """A file that hashes what is written through it."""

    def __init__(self, file):
        self.file, self.digest, self.bytes = file, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.digest.update(data)
        self.bytes += memoryview(data).nbytes
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def _write(path: str, write) -> dict:
    """write(file) into `path` through `path.partial`, fsynced, then renamed into place;
    returns the manifest entry of what was written."""
    temporary = path + ".partial"
    with open(temporary, "wb") as out:
        hashing = _Hashing(out)
        write(hashing)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    return {"bytes": hashing.bytes, "sha256": hashing.digest.hexdigest()}


def save_torch(obj, path: str) -> dict:
    """torch.save, crash-safe; returns the file's manifest entry."""
    return _write(path, lambda file: torch.save(obj, file))


def load_torch(path: str, mmap: bool = False) -> dict:
    """A checkpoint's torch file (memory-mapped with `mmap`: tensors are read when touched),
    refused when a newer zero wrote a format this one does not know."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except Exception as error:
        raise CorruptCheckpoint(f"zero: cannot read {path}: {error}") from error
    version = obj.get("format_version", 1) if isinstance(obj, dict) else None
    if version is None or version > FORMAT_VERSION:
        raise CorruptCheckpoint(
            f"zero: {path} is in checkpoint format {version!r}, but this zero reads format "
            f"{FORMAT_VERSION} and older; load it with the zero version that wrote it")
    return obj


def write_text(path: str, text: str) -> None:
    _write(path, lambda file: file.write(text.encode()))


def write_manifest(directory: str, entries: dict[str, dict]) -> None:
    write_text(os.path.join(directory, MANIFEST), json.dumps(entries, indent=1, sort_keys=True))
    fsync_dir(directory)


def read_manifest(directory: str) -> dict[str, dict] | None:
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as file:
        try:
            return json.load(file)
        except json.JSONDecodeError as error:
            raise CorruptCheckpoint(f"zero: {path} is damaged ({error}); the checkpoint cannot "
                                    "be verified: load an earlier tag") from error


# Names the checkpoint directory itself holds beside the tags (checkpoint.py's recovery
# script, checkpoint_universal.py's latest_universal): a tag of that name would replace them.
RESERVED_NAMES = (LATEST, "latest_universal", "zero_to_fp32.py")


def checked_tag(tag: str) -> str:
    """`tag` as a path below the checkpoint directory ("run1//step2/" -> "run1/step2"); a
    tag that would leave it (absolute, or with a '..' part), or take the place of a file
    the directory holds (`latest`, ...; a `.partial` being written), is a ValueError."""
    parts = tag.replace(os.sep, "/").split("/")
    if not tag or os.path.isabs(tag) or ".." in parts or os.path.normpath(tag) == ".":
        raise ValueError(f"zero: checkpoint tag {tag!r} does not name a directory inside the "
                         "checkpoint directory; use a relative name such as 'global_step100' "
                         "or 'run1/step100'")
    names = os.path.normpath(tag).replace(os.sep, "/").split("/")
    staging = names[-1].startswith(".") and names[-1].endswith((".tmp", ".old"))
    if names[0] in RESERVED_NAMES or staging or any(n.endswith(".partial") for n in names):
        raise ValueError(f"zero: checkpoint tag {tag!r} is a name the checkpoint directory uses "
                         f"itself ({', '.join(RESERVED_NAMES)}, *.partial, a save's .<tag>.tmp "
                         "or .<tag>.old): saved under it, the "
                         "checkpoint would take the place of that file (a 'latest' tag leaves "
                         "no 'latest' file, and the next load starts from nothing); use "
                         "another name, such as 'global_step100'")
    return os.path.normpath(tag)


def beside(save_dir: str, tag: str, suffix: str) -> str:
    """The hidden directory `.<name><suffix>` next to the tag's own (`suffix` ".tmp": the
    staging directory, ".old": the copy publish() retires)."""
    parent, name = os.path.split(checked_tag(tag))
    return os.path.join(save_dir, parent, f".{name}{suffix}")


def publish(save_dir: str, staging: str, tag: str) -> str:
    """Renames the finished staging directory to `tag`, replacing an older copy; returns it."""
    final = os.path.join(save_dir, checked_tag(tag))
    retired = beside(save_dir, tag, ".old")
    parent = os.path.dirname(final)
    if os.path.exists(final):
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(final, retired)  # until the next line, find() recovers the tag from here
        os.replace(staging, final)
    else:
        os.replace(staging, final)
    fsync_dir(parent)
    if parent != os.path.normpath(save_dir):
        fsync_dir(save_dir)  # (the nested tag's parent may be new)
    shutil.rmtree(retired, ignore_errors=True)  # (also what a crash that recover() undid left)
    return final


def recover(save_dir: str, tag: str) -> None:
    """Before saving `tag` again: if a crash in publish() left the tag missing, puts back the
    newest complete copy (the finished staging directory, else the old one), so the next
    save's clean-up of its staging directory never deletes it."""
    final = os.path.join(save_dir, checked_tag(tag))
    if os.path.exists(final):
        return
    for suffix in (".tmp", ".old"):
        candidate = beside(save_dir, tag, suffix)
        if os.path.isdir(candidate) and read_manifest(candidate) is not None:
            os.replace(candidate, final)
            fsync_dir(os.path.dirname(final))
            return


def find(load_dir: str, tag: str) -> tuple[str, str | None]:
    """The directory holding `tag`, and a note when it was recovered after a crash in the
    middle of publishing (the new copy when its staging directory was finished, else the old
    one). A missing tag is FileNotFoundError naming what was looked for."""
    path = os.path.join(load_dir, checked_tag(tag))
    if os.path.isdir(path):
        return path, None
    for suffix, what in ((".tmp", "the finished new copy"), (".old", "the old copy")):
        candidate = beside(load_dir, tag, suffix)
        if os.path.isdir(candidate) and read_manifest(candidate) is not None:
            return candidate, (f"zero: checkpoint {path} is missing (a save was interrupted "
                               f"while publishing it); loading {what} from {candidate}")
    name = os.path.basename(path)
    raise FileNotFoundError(f"zero: no checkpoint {path}; is the tag right? (no finished "
                            f".{name}.tmp or .{name}.old next to it either)")


def verify(directory: str, names: list[str]) -> None:
    """Checks `names` against the directory's manifest (size and SHA-256); a directory without
    one is accepted only when it has every name (written before manifests existed)."""
    manifest = read_manifest(directory)
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise CorruptCheckpoint(f"zero: checkpoint {directory} has no {name}")
        if manifest is None:
            continue
        if name not in manifest:
            raise CorruptCheckpoint(f"zero: {path} is not in the checkpoint's manifest")
        expected = manifest[name]
        size, digest = _digest(path)
        if size != expected["bytes"] or digest != expected["sha256"]:
            raise CorruptCheckpoint(
                f"zero: {path} is corrupt: {size} bytes whose SHA-256 does not match the "
                f"manifest's ({expected['bytes']} bytes); restore it from a copy or load "
                "another tag")


def _digest(path: str, block: int = 1 << 20) -> tuple[int, str]:
    """Size and SHA-256 of a file, read through one reused 1 MiB buffer (reading 16 MiB
    chunks as new bytes objects held two of them at once: 32 MiB for every check)."""
    digest, size = hashlib.sha256(), 0
    buffer = bytearray(block)
    view = memoryview(buffer)
    with open(path, "rb") as file:
        while count := file.readinto(buffer):
            digest.update(view[:count])
            size += count
    return size, digest.hexdigest()


def low_space_hint(directory: str, below: int = 1 << 30) -> str:
    """A sentence for a failed write when `directory`'s file system has less than `below`
    bytes free (a full disk makes torch.save fail with "unexpected pos"), else ""."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return ""
    if free >= below:
        return ""
    return (f". The file system holding {directory} has {free / 2**20:.1f} MiB free: a full "
            "disk is the likely cause; free space or save elsewhere")
