"""zero.Init: build a model so that every large parameter is born as this rank's shard.

    with zero.Init(config_dict_or_path=ds_config):
        model = MyModel()            # no rank ever holds the whole model
    engine, *_ = zero.initialize(model=model, config=ds_config)

A partitioned parameter stays the same nn.Parameter (ties and requires_grad survive), with
  param.data        = torch.empty(0, dtype, device)    (the training dtype and device)
  param._zero_shape = torch.Size of the full parameter
  param._zero_shard = 1-D contiguous, s = ceil(numel / world) elements: this rank's slice
                      [rank*s, (rank+1)*s) of the flattened full tensor, zero-padded at the end.
Parameters of at most stage3_param_persistence_threshold elements stay whole (converted to the
training dtype and device). Every full tensor is broadcast from rank 0 before it is sliced, so
all ranks start from rank 0's weights, as the engine does for plainly built models. Buffers
are left as built (the engine broadcasts them, and casts only those zero/model_dtype.py names).

How: while the context is open the __init__ of every nn.Module subclass is wrapped; when the
outermost __init__ of an object returns, the module's own parameters are partitioned (its
children were done when theirs returned). So reset_parameters runs on the whole tensor and
draws from the RNG exactly as a plain construction does. Later init is caught too:
nn.Module.apply gathers each visited module's own parameters while fn(module) runs, and the
public in-place torch.nn.init functions gather a partitioned tensor, apply, re-partition. These
init-time gathers rebuild the tensor in the dtype and on the device it was constructed with
(usually fp32 on the CPU), so values are bit-identical to a plain construction cast later by
the engine; the result is broadcast from rank 0 before it is sliced again (as DeepSpeed does).
Parameters registered outside any __init__ (setattr on a built module) are partitioned when the
context exits, at the latest.

Parameters offloaded to NVMe (the config's zero_optimization.offload_param.device "nvme",
which wins over the remote_device argument as in DeepSpeed): each shard is born in a file
under offload_param.nvme_path (zero/init_spill.py: unnamed, so nothing is left on disk even
after a crash) instead of memory: `param._zero_spilled` replaces `param._zero_shard`, and
`shard_of(param)` reads it. Init-time gathers read and rewrite it in place; the engine reads
each unit's shards once while it writes its own swap files. Building the model then holds no
shard in memory, only one parameter at a time (and the small ones kept whole).

Not caught: other in-place writes to an already partitioned parameter (`p.data.normal_()`,
`p.copy_(...)`, an init function imported by name before the context opened): wrap them in
`zero.GatheredParameters(p, modifier_rank=0)`. A class whose __init__ comes from a non-Module
mixin is partitioned only at exit. Not thread-safe (the patches are process-wide).

`mem_efficient_linear` and `pin_memory` are accepted and ignored: the first is DeepSpeed's
memory-saving autograd function for a partitioned nn.Linear (here the engine gathers a whole
unit before its forward), the second is the engine's (offload_param.pin_memory). With
remote_device "cpu" the shards are born on the training device as without it; the engine moves
them to host memory when it starts.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from offload.progress import SwapWriteProgress

from . import ds_param
from .init_spill import ShardSpill

DEFAULT_PERSISTENCE_THRESHOLD = 100_000
INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
                  "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                  "kaiming_normal_", "orthogonal_", "sparse_")
SPILL_PROGRESS = "zero.Init: writing shards to NVMe"
# all_gather_into_tensor under its new name where torch has it (same op, no deprecation notice)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# ---- the partitioned-parameter contract (the engine uses these) ------------------------------

def is_partitioned(param: torch.Tensor) -> bool:
    return hasattr(param, "_zero_shape")


def is_spilled(param: torch.Tensor) -> bool:
    """Whether a partitioned parameter's shard is in zero.Init's NVMe file, not in memory."""
    return hasattr(param, "_zero_spilled")


def shard_of(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard (1-D, padded): read into a new tensor when it is on NVMe."""
    spilled = getattr(param, "_zero_spilled", None)
    return spilled.read() if spilled is not None else param._zero_shard


def full_shape(param: torch.Tensor) -> torch.Size:
    """The whole shape: a partitioned parameter's, or the parameter's own."""
    return param._zero_shape if is_partitioned(param) else param.shape


def full_numel(param: torch.Tensor) -> int:
    return math.prod(param._zero_shape) if is_partitioned(param) else param.numel()


def gather_full(param: torch.Tensor) -> torch.Tensor:
    """A new tensor of shape _zero_shape. Collective: all ranks gather the same parameters in
    the same order."""
    shard = shard_of(param)
    buffer = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype,
                         device=shard.device)
    _all_gather(buffer, shard)
    numel = math.prod(param._zero_shape)
    full = buffer[:numel].view(param._zero_shape)
    return full if numel == buffer.numel() else full.clone()  # no hidden padding storage


def unpartition(param: torch.Tensor) -> None:
    """Makes a partitioned parameter whole for good (collective)."""
    param.data = gather_full(param)
    release_shard(param)
    ds_param.mark(param, param.shape, persist=True)


def shard_shape(param: torch.Tensor) -> list[int]:
    """The full shape of a partitioned parameter; [] for a whole one."""
    return list(param._zero_shape) if is_partitioned(param) else []


def convert_shard(param: torch.Tensor, device, dtype) -> None:
    """Moves a partitioned parameter's shard to the training device and dtype. A shard on
    NVMe already in them stays there (the engine reads it once, unit by unit)."""
    spilled = getattr(param, "_zero_spilled", None)
    if spilled is not None and spilled.dtype == dtype and spilled.device == torch.device(device):
        return
    param._zero_shard = shard_of(param).to(device=device, dtype=dtype)
    if spilled is not None:
        del param._zero_spilled


def release_shard(param: torch.Tensor) -> None:
    """Forgets a parameter's zero.Init shard: it is whole again, or the engine's shard holds
    its values now (a shard on NVMe: its file is freed with the last one released)."""
    del param._zero_shape
    for name in ("_zero_shard", "_zero_spilled"):
        if hasattr(param, name):
            delattr(param, name)


def _partition(param, full, src=0, dtype=None, device=None, spill=None) -> None:
    """Slices `full`, broadcast from `src` first unless None, into this rank's shard: a new one
    in dtype/device (appended to `spill`, an NVMe file, when given), or, after a gather, the
    existing one overwritten in place."""
    existing = getattr(param, "_zero_spilled", None)
    if existing is None:
        existing = getattr(param, "_zero_shard", None)
    if existing is not None:
        dtype, device = existing.dtype, existing.device
        if full.numel() != math.prod(param._zero_shape):
            raise ValueError(f"zero: a parameter of shape {tuple(param._zero_shape)} holds "
                             f"{full.numel()} elements when re-partitioned")
    full = full.detach().to(device=device, dtype=dtype).contiguous()
    if src is not None:
        dist.broadcast(full, src=src)
    world, rank = dist.get_world_size(), dist.get_rank()
    size = math.ceil(full.numel() / world)
    piece = full.view(-1)[rank * size:(rank + 1) * size]
    if piece.numel() < size:  # the last rank's piece, padded with zeros
        piece = torch.cat([piece, piece.new_zeros(size - piece.numel())])
    with torch.no_grad():
        if isinstance(existing, torch.Tensor):
            existing.copy_(piece)
        elif existing is not None:
            existing.write(piece)
        elif spill is not None:
            param._zero_spilled = spill.put(piece)
        else:
            param._zero_shard = piece.clone()
    param._zero_shape = full.shape
    param.data = torch.empty(0, dtype=full.dtype, device=full.device)
    ds_param.mark(param, full.shape, persist=False)


# id(param) -> (dtype, device) it was constructed with, for init-time gathers
_CONSTRUCTED_AS: dict[int, tuple[torch.dtype, torch.device]] = {}


def kept_whole(param: torch.Tensor) -> bool:
    """A small parameter zero.Init kept whole on every rank (DeepSpeed's persistent ones)."""
    return not is_partitioned(param) and getattr(param, "ds_persist", False)


@contextlib.contextmanager
def gathered(params, modifier_rank: int | None = None, *, as_constructed: bool = False):
    """Whole data for the partitioned `params` inside the block (collective). On exit they are
    re-sliced from modifier_rank's values (broadcast) if set, else from each rank's own (right
    when every rank ran the same code); with modifier_rank, the ones zero.Init kept whole
    take that rank's values too, as DeepSpeed broadcasts every parameter it manages (Hugging
    Face's from_pretrained at ZeRO-3 loads on rank 0 alone). Other whole or already gathered
    parameters pass through. as_constructed (init-time gathers): in the dtype/device the
    parameter was built with."""
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    todo = list({id(p): p for p in params  # skip whole and already gathered ones
                 if p is not None and is_partitioned(p) and p.data.numel() == 0}.values())
    whole = list({id(p): p for p in params if p is not None and kept_whole(p)}.values())
    extra = 0
    for param in todo:
        full = gather_full(param)
        if as_constructed and id(param) in _CONSTRUCTED_AS:
            dtype, device = _CONSTRUCTED_AS[id(param)]
            full = full.to(dtype=dtype, device=device)
        param.data = full
        extra += full.numel() * full.element_size()
    books = _STACK[-1] if _STACK else None
    if books is not None:
        books._add(extra)
    failed = True
    try:
        yield
        failed = False
    finally:  # after an error ranks may disagree: re-slice without a collective
        for param in todo:
            _partition(param, param.data, src=None if failed else modifier_rank)
        if not failed and modifier_rank is not None:
            with torch.no_grad():
                for param in whole:
                    dist.broadcast(param.data, src=modifier_rank)
        if books is not None:
            books._add(-extra)


# ---- the context ------------------------------------------------------------------------------

_STACK: list["Init"] = []   # open enabled contexts; the patches report to the innermost
_IN_INIT: set[int] = set()  # ids of modules whose outermost __init__ is running
_PATCHES: list = []         # what undoes each patch, called last first


class Init:
    """deepspeed.zero.Init (the module docstring has the contract and what is not caught).

    Books, in bytes on this rank: `current_bytes` = parameters registered in the context and
    still whole + shards + tensors gathered for init; `peak_bytes` its maximum;
    `full_model_bytes` = full size, in the training dtype, of every live parameter partitioned
    or kept whole."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True,
                 remote_device=None, pin_memory=False, config_dict_or_path=None, config=None,
                 enabled=True, dtype=None, mpu=None):
        del mem_efficient_linear, pin_memory  # accepted and ignored: see the module docstring
        _refuse_unsupported(data_parallel_group, mpu)
        if config is not None and config_dict_or_path is not None:
            raise ValueError("zero.Init: pass config_dict_or_path or config, not both")
        raw = _read_config(config_dict_or_path if config is None else config)
        # NVMe: the folder for this context's shard file, made while the context is open (the
        # shards then hold it: it goes with the last of them)
        self._spill_folder = _spill_folder(raw, remote_device) if enabled else None
        self._spill: ShardSpill | None = None
        self._progress = SwapWriteProgress(enabled=self._spill_folder is not None)
        self._showing = contextlib.ExitStack()
        zero_block = raw.get("zero_optimization") or {}
        threshold = zero_block.get("stage3_param_persistence_threshold",  # or DeepSpeed's
                                   zero_block.get("param_persistence_threshold", "auto"))
        # "auto": the HF Trainer's config is not finalised yet when from_pretrained runs
        # zero.Init; DeepSpeed's config then uses its default, and so does zero.
        self.threshold = DEFAULT_PERSISTENCE_THRESHOLD if threshold == "auto" else int(threshold)
        self.dtype = dtype or _config_dtype(raw)
        if not self.dtype.is_floating_point:
            raise ValueError(f"zero.Init: dtype={self.dtype} is not a floating-point type")
        self.device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                       if torch.cuda.is_available() else torch.device("cpu"))
        self.enabled = enabled
        self.current_bytes = self.peak_bytes = 0
        self._live: dict[int, tuple[int, int]] = {}  # id(param) -> (bytes held, full bytes)
        self._finalizers: list[weakref.finalize] = []
        self._modules: dict[int, weakref.ref] = {}   # built in the context, in build order
        self._registered: list[weakref.ref] = []     # registered in the context, in order
        self._whole: dict[int, weakref.ref] = {}     # kept whole (converted, broadcast)
        self._own: list[int] = []                    # ids this context partitioned
        if enabled:
            if not dist.is_initialized():
                from .distributed import init_distributed
                init_distributed()
            if module is not None:  # like DeepSpeed: partition a built module right away
                with self._progress.shown(SPILL_PROGRESS):
                    self._open_spill()
                    for param in module.parameters():
                        self._convert(param)
                    self._spill = None
                self._forget_construction()  # no context yet: no init-time gathers

    @property
    def full_model_bytes(self) -> int:
        return sum(full for _, full in self._live.values())

    def __enter__(self):
        if self.enabled:
            if not _STACK:  # nested contexts reuse the outermost one's patches
                _install()
            _STACK.append(self)
            self._showing.enter_context(self._progress.shown(SPILL_PROGRESS))
            self._open_spill()
        return self

    def _open_spill(self) -> None:
        if self._spill_folder is not None:
            self._spill = ShardSpill(self._spill_folder)
            self._spill.on_write = self._progress.add

    def __exit__(self, exc_type, exc, tb):
        if not self.enabled:
            return False
        try:
            if exc_type is None:  # after an error ranks may disagree: no more collectives
                for ref in list(self._modules.values()):  # e.g. setattr after __init__
                    if (module := ref()) is not None:
                        self._convert_direct(module)
                for ref in self._registered:  # also on modules built before the context
                    if (param := ref()) is not None:
                        self._convert(param)
        finally:
            _STACK.remove(self)
            if not _STACK:
                _uninstall()
            for finalizer in self._finalizers:  # the books freeze at exit
                finalizer.detach()
            self._forget_construction()
            self._showing.close()
            self._spill = None
        return False

    def _convert_direct(self, module) -> None:
        # Registration order is the same on every rank: each conversion is a broadcast.
        for param in list(module._parameters.values()):
            if param is not None:
                self._convert(param)

    def _convert(self, param) -> None:
        """Partitions a large parameter; converts and broadcasts a small one (once)."""
        if is_partitioned(param):
            return
        self._count(param)
        if param.numel() > max(self.threshold, 0):
            _CONSTRUCTED_AS[id(param)] = (param.dtype, param.device)
            self._own.append(id(param))
            _partition(param, param.data, dtype=self.dtype, device=self.device, spill=self._spill)
            self._set(param, 0 if is_spilled(param) else
                      param._zero_shard.numel() * param._zero_shard.element_size())
        elif (ref := self._whole.get(id(param))) is None or ref() is not param:
            with torch.no_grad():
                param.data = param.data.to(dtype=self.dtype, device=self.device)
                dist.broadcast(param.data, src=0)
            ds_param.mark(param, param.shape, persist=True)
            self._whole[id(param)] = weakref.ref(param)
            self._set(param, param.numel() * param.element_size())

    def _forget_construction(self) -> None:
        for key in self._own:
            _CONSTRUCTED_AS.pop(key, None)
        self._own.clear()

    # -- the books: every parameter is counted at first sight and forgotten when it dies --
    def _count(self, param) -> None:
        if id(param) not in self._live:
            self._live[id(param)] = (0, 0)
            self._finalizers.append(weakref.finalize(param, self._forget, id(param)))
            self._set(param, param.numel() * param.element_size())

    def _set(self, param, held: int) -> None:
        self._add(held - self._live[id(param)][0])
        self._live[id(param)] = (held, full_numel(param) * _element_size(self.dtype))

    def _forget(self, key: int) -> None:
        self._add(-self._live.pop(key, (0, 0))[0])

    def _add(self, delta: int) -> None:
        self.current_bytes += delta
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)


def _refuse_unsupported(data_parallel_group, mpu) -> None:
    if mpu is not None:
        raise NotImplementedError("zero.Init: mpu= (model parallelism) is not supported; "
                                  "leave mpu unset: zero is data parallel only")
    if data_parallel_group is not None and data_parallel_group is not dist.group.WORLD:
        raise NotImplementedError("zero.Init: data_parallel_group= other than the world group "
                                  "is not supported; leave it unset")


def _spill_folder(raw: dict, remote_device) -> str | None:
    """Where the shards go, as in DeepSpeed: the config's offload_param.device wins over the
    remote_device argument. "nvme": an unnamed file under offload_param.nvme_path; None
    (in memory on the training device) for "none" and "cpu" (the engine moves the shards to
    host memory when it starts)."""
    offload = (raw.get("zero_optimization") or {}).get("offload_param") or {}
    device = offload.get("device", remote_device)
    device = "none" if device is None else str(device).lower()
    if device not in ("none", "cpu", "nvme"):
        raise ValueError(f"zero.Init: remote_device={device!r} is not one of None, 'none', "
                         "'cpu', 'nvme'; leave it unset")
    if device != "nvme":
        return None
    if not offload.get("nvme_path"):
        raise ValueError("zero.Init: remote_device 'nvme' needs "
                         "zero_optimization.offload_param.nvme_path in the config (the folder "
                         "for the shards); set it, or leave remote_device unset")
    return str(offload["nvme_path"])


def _read_config(config) -> dict:
    if config is None or isinstance(config, dict):
        return config or {}
    if isinstance(config, (str, os.PathLike)):
        with open(config) as handle:
            return json.load(handle)
    raise TypeError("zero.Init: the config must be a dict or the path of a JSON file, not "
                    f"{type(config).__name__}")


def _config_dtype(raw: dict) -> torch.dtype:
    bf16 = (raw.get("bf16") or raw.get("bfloat16") or {}).get("enabled") is True
    fp16 = (raw.get("fp16") or {}).get("enabled") is True
    if bf16 and fp16:
        raise ValueError("zero.Init: the config enables both bf16 and fp16; enable one")
    return torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


# ---- the patches: installed by the outermost open Init, undone exactly when it closes ----------

def _patch(owner, name, value) -> None:
    if name in vars(owner):
        _PATCHES.append(functools.partial(setattr, owner, name, vars(owner)[name]))
    else:
        _PATCHES.append(functools.partial(delattr, owner, name))
    setattr(owner, name, value)


def _patch_item(mapping, key, value) -> None:
    _PATCHES.append(functools.partial(mapping.__setitem__, key, mapping[key]))
    mapping[key] = value


def _wrap_init(cls) -> None:
    original = cls.__dict__.get("__init__")
    if not callable(original) or getattr(original, "_zero_wrapped", False):
        return

    @functools.wraps(original)
    def __init__(module, *args, **kwargs):
        outermost = id(module) not in _IN_INIT  # super().__init__() calls nest
        _IN_INIT.add(id(module))
        try:
            original(module, *args, **kwargs)
        finally:
            if outermost:
                _IN_INIT.discard(id(module))
        if outermost and _STACK:  # the object is finished: shard its own parameters
            _STACK[-1]._modules.setdefault(id(module), weakref.ref(module))
            _STACK[-1]._convert_direct(module)
    __init__._zero_wrapped = True
    _patch(cls, "__init__", __init__)


def _install() -> None:
    seen, todo = set(), [nn.Module]
    while todo:  # every existing subclass, at any depth
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                _wrap_init(sub)
    previous = nn.Module.__dict__.get("__init_subclass__")

    def __init_subclass__(cls, **kwargs):  # classes defined while the context is open
        (previous.__get__(None, cls) if previous is not None
         else super(nn.Module, cls).__init_subclass__)(**kwargs)
        _wrap_init(cls)
    _patch(nn.Module, "__init_subclass__", classmethod(__init_subclass__))

    original_apply = nn.Module.apply

    def apply(module, fn):
        if getattr(fn, "_zero_gathers", False):  # apply's own recursion into the children
            return original_apply(module, fn)

        @functools.wraps(fn)
        def gathering(child):
            with gathered(list(child._parameters.values()), 0, as_constructed=True):
                fn(child)
        gathering._zero_gathers = True
        return original_apply(module, gathering)
    _patch(nn.Module, "apply", apply)

    for name in INIT_FUNCTIONS:  # modules call them as init.name(...): found at call time
        _patch(nn.init, name, _gathering_init(getattr(nn.init, name)))
    # transformers.initialization keeps torch's functions from its import on (its init.normal_
    # etc., which its _init_weights call, and which replace torch's during initialize_weights):
    # imported before this context, as in every Hugging Face script, it would bypass the above.
    hf_init = sys.modules.get("transformers.initialization")
    for name, function in getattr(hf_init, "TORCH_INIT_FUNCTIONS", {}).items():
        if not getattr(function, "_zero_gathers", False):
            _patch_item(hf_init.TORCH_INIT_FUNCTIONS, name, _gathering_init(function))

    def on_register(_module, _name, param):  # counts parameters as they appear
        if _STACK and param is not None and not is_partitioned(param):
            _STACK[-1]._registered.append(weakref.ref(param))
            _STACK[-1]._count(param)
    _PATCHES.append(register_module_parameter_registration_hook(on_register).remove)


def _gathering_init(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        tensor = args[0] if args else kwargs.get("tensor")
        if not isinstance(tensor, torch.Tensor) or not is_partitioned(tensor):
            return function(*args, **kwargs)
        with gathered([tensor], 0, as_constructed=True):
            return function(*args, **kwargs)
    wrapper._zero_gathers = True
    return wrapper


def _uninstall() -> None:
    while _PATCHES:  # last in, first out
        _PATCHES.pop()()
    _IN_INIT.clear()
