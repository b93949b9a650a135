"""zero.Init: models built already partitioned. Values equal a plain construction with the same
seed (construction, nanoGPT-style post-init, ties), shards are the right slices, parameter
memory never reaches the full model, and the patches it installs are undone exactly."""
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import training
from distributed_harness import free_port, run_distributed
from zero.models.tiny_gpt import GPTConfig

# Odd sizes: most parameters do not divide by 2 or 4, so shards carry padding.
ODD_GPT = GPTConfig(vocab_size=97, block_size=15, n_layer=2, n_head=3, n_embd=33)
THRESHOLD = 40  # LayerNorms and small biases stay whole, everything else is partitioned
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}  # gloo ranks on the CPU, also on a GPU machine


def _config(threshold=THRESHOLD, precision=None):
    config = {"zero_optimization": {"stage": 3,
                                    "stage3_param_persistence_threshold": threshold}}
    if precision:
        config[precision] = {"enabled": True}
    return config


class Mixer(nn.Module):
    """A non-leaf module with a parameter of its own beside its children."""

    def __init__(self, width):
        super().__init__()
        self.gate = nn.Parameter(torch.empty(width, 3))  # 3*width elements, own param
        self.inner = nn.Linear(width, width + 1)
        self.norm = nn.LayerNorm(width)
        nn.init.uniform_(self.gate, -0.5, 0.5)


class PostInitModel(nn.Module):
    """nanoGPT-style: self.apply(self._init_weights) in __init__, then a direct
    torch.nn.init.normal_ loop over named_parameters(), and a head tied to the embedding."""

    def __init__(self, vocab=53, width=21):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Mixer(width) for _ in range(3))
        self.frozen = nn.Linear(width, width)
        self.frozen.weight.requires_grad_(False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.token_embedding.weight
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("inner.weight"):
                nn.init.normal_(param, mean=0.0, std=0.01)
            if name.endswith("gate"):
                nn.init.trunc_normal_(param, std=0.3)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, Mixer):
            nn.init.xavier_uniform_(module.gate)


def _build(kind, seed=0):
    torch.manual_seed(seed)
    if kind == "gpt":
        return training.make_model(ODD_GPT)  # seeds itself with training.SEED
    model = PostInitModel()
    # parameters added to an already built module, outside any __init__
    model.layers[1].late = nn.Parameter(torch.randn(7, 11))
    model.layers[2]._parameters["raw"] = nn.Parameter(torch.randn(5, 13))  # no hook sees it
    return model


def _check_partitioned(model, plain, rank, world, dtype=torch.float32):
    from zero.init import gather_full, is_partitioned, shard_of

    plain_params = dict(plain.named_parameters())
    partitioned = 0
    for name, param in model.named_parameters():
        expected = plain_params[name].detach().to(dtype)
        assert param.requires_grad == plain_params[name].requires_grad, name
        if expected.numel() <= THRESHOLD:
            assert not is_partitioned(param), name
            assert param.dtype == dtype and torch.equal(param.data, expected), name
            continue
        partitioned += 1
        assert is_partitioned(param), name
        assert param.data.numel() == 0 and param.data.dtype == dtype, name
        assert param._zero_shape == expected.shape, name
        size = math.ceil(expected.numel() / world)
        padded = torch.zeros(size * world, dtype=dtype)
        padded[:expected.numel()] = expected.flatten()
        shard = shard_of(param)
        assert shard.dim() == 1 and shard.is_contiguous() and shard.dtype == dtype, name
        assert torch.equal(shard, padded[rank * size:(rank + 1) * size]), name
        assert torch.equal(gather_full(param), expected), name
    assert partitioned >= 5
    return partitioned


def _values(rank, world, kind, rank_seeded):
    from zero.init import Init

    plain = _build(kind)
    # rank_seeded: every rank has its own RNG state; rank 0's weights must win everywhere
    with Init(config_dict_or_path=_config()):
        model = _build(kind, seed=rank if rank_seeded and kind == "post-init" else 0)
    assert model.head.weight is model.token_embedding.weight
    if kind == "post-init":
        assert not model.frozen.weight.requires_grad
    return _check_partitioned(model, plain, rank, world)


@pytest.mark.parametrize("kind", ["gpt", "post-init"])
@pytest.mark.parametrize("world", [2, 4])
def test_values_equal_a_plain_construction_with_the_same_seed(world, kind):
    counts = run_distributed(_values, world, args=(kind, False), timeout=60, env=CPU_ONLY)
    assert len(set(counts)) == 1


def _hugging_face_values(rank, world):
    """transformers imported before the context, as in every script that builds a model of
    it: its _init_weights calls the torch.nn.init functions it kept at import."""
    import transformers.initialization  # noqa: F401 - (the point of the test)
    from transformers import LlamaConfig, LlamaForCausalLM

    from zero.init import Init

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=32, initializer_range=0.5)
    torch.manual_seed(0)
    plain = LlamaForCausalLM(config)
    with Init(config_dict_or_path=_config()):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return _check_partitioned(model, plain, rank, world)


def test_a_hugging_face_model_gets_its_own_initialisation_as_without_the_context():
    pytest.importorskip("transformers")
    counts = run_distributed(_hugging_face_values, 2, timeout=60, env=CPU_ONLY)
    assert len(set(counts)) == 1


def test_every_rank_starts_from_rank_zeros_weights():
    run_distributed(_values, 2, args=("post-init", True), timeout=60, env=CPU_ONLY)


def _unnamed_files_in(folder) -> int:
    """This process's open files under `folder` that have no name any more."""
    return sum(link.startswith(str(folder)) and link.endswith("(deleted)")
               for link in training.open_files())


def _born_on_nvme(rank, world, kind, folder):
    import gc

    import zero
    from zero.init import Init, is_partitioned, is_spilled

    folder = os.path.join(folder, f"rank{rank}")  # as if each rank had its own drive
    config = _config()
    config["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": folder}
    plain = _build(kind)
    with Init(config_dict_or_path=config) as context:
        model = _build(kind)
    counted = _check_partitioned(model, plain, rank, world)
    partitioned = [p for p in model.parameters() if is_partitioned(p)]
    assert partitioned and all(is_spilled(p) for p in partitioned)
    whole = sum(p.numel() * p.element_size() for p in model.parameters() if not is_partitioned(p))
    assert context.current_bytes == whole  # no shard bytes in memory
    named, unnamed = os.listdir(folder), _unnamed_files_in(folder)
    config["train_micro_batch_size_per_gpu"] = 1
    config["optimizer"] = {"type": "Adam", "params": {"lr": 1e-3}}
    engine, *_ = zero.initialize(model=model, config=config)
    engine.destroy()
    del model, partitioned, engine
    gc.collect()
    return counted, named, unnamed, os.listdir(folder), _unnamed_files_in(folder)


@pytest.mark.parametrize("kind", ["gpt", "post-init"])
def test_with_parameters_on_nvme_every_shard_is_born_in_an_unnamed_file(kind, tmp_path):
    # the same values as a plain construction, no shard in memory, no file name to leave
    # behind on a crash; the engine reads the shards once and the file is gone with them
    results = run_distributed(_born_on_nvme, 2, args=(kind, str(tmp_path)), timeout=90,
                              env=CPU_ONLY)
    for counted, named, unnamed, named_after, unnamed_after in results:
        assert counted >= 5 and named == [] and unnamed == 1
        assert named_after == [] and unnamed_after == 0


def test_a_full_disk_while_writing_shards_names_the_bytes_and_the_fix(tmp_path, monkeypatch):
    import errno

    from zero.init_spill import ShardSpill, SpillFull

    spill = ShardSpill(str(tmp_path))
    spill.put(torch.ones(1000))

    def no_space(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "pwrite", no_space)
    with pytest.raises(SpillFull, match=r"nvme_path '.*' is full: this rank's shards take "
                       r"4000 bytes so far, 4000 more could not be written, \d+ bytes are "
                       r"available .* point nvme_path at a larger device"):
        spill.put(torch.ones(1000))


def _bf16_values(rank, world):
    from zero.init import Init

    plain = _build("post-init")
    with Init(config=_config(precision="bf16")):
        model = _build("post-init")
    # init-time gathers run in the constructed dtype (fp32): the values are a plain fp32
    # construction cast to bf16, bit for bit
    _check_partitioned(model, plain, rank, world, dtype=torch.bfloat16)


def test_bf16_config_gives_the_plain_construction_cast_to_bf16():
    run_distributed(_bf16_values, 2, timeout=60, env=CPU_ONLY)


def _gathered_and_unpartition(rank, world):
    from zero.init import Init, full_numel, gather_full, gathered, is_partitioned, unpartition

    with Init(config=_config()):
        layer = nn.Linear(9, 7)  # weight 63 elements: partitioned, padded on 2 ranks
    weight = layer.weight
    assert full_numel(weight) == 63 and weight.numel() == 0
    with gathered([weight, layer.bias], modifier_rank=1):  # the small bias passes through
        assert weight.shape == (7, 9)
        if rank == 1:
            with torch.no_grad():
                weight.fill_(3.0)
    assert weight.numel() == 0 and torch.equal(gather_full(weight), torch.full((7, 9), 3.0))
    with gathered(weight):  # no modifier: each rank keeps its own slice of its own values
        with torch.no_grad():
            weight.fill_(float(rank))
    expected = torch.cat([torch.full((32,), float(r)) for r in range(world)])[:63]
    assert torch.equal(gather_full(weight).flatten(), expected)
    unpartition(weight)
    assert not is_partitioned(weight) and not hasattr(weight, "_zero_shape")
    assert torch.equal(weight.data.flatten(), expected) and layer.weight is weight


def test_gathered_broadcasts_from_the_modifier_and_unpartition_makes_whole():
    run_distributed(_gathered_and_unpartition, 2, timeout=60, env=CPU_ONLY)


# ---- peak parameter memory -------------------------------------------------------------

WIDTH, BLOCKS = 1000, 8  # 8 blocks of 1M parameters (4 MB each in fp32)


def _held_bytes(params) -> int:
    """What parameters hold right now, read from the tensors (independent of Init's books)."""
    seen, total = set(), 0
    for param in params:
        if id(param) not in seen:
            seen.add(id(param))
            total += param.data.numel() * param.data.element_size()
            if hasattr(param, "_zero_shard"):
                total += param._zero_shard.numel() * param._zero_shard.element_size()
    return total


class BigBlock(nn.Module):
    def __init__(self, probe):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(WIDTH, WIDTH))
        self.norm = nn.LayerNorm(WIDTH)  # stays whole
        nn.init.normal_(self.weight, std=0.02)
        probe(self)  # this block is whole here, the earlier ones are shards


class BigModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.peak_held = 0
        self.blocks = nn.ModuleList()
        for _ in range(BLOCKS):
            self.blocks.append(BigBlock(self._probe))
        self.apply(self._init)  # post-init: one module gathered at a time

    def _probe(self, block):
        params = [p for b in [*self.blocks, block] for p in b.parameters()]
        self.peak_held = max(self.peak_held, _held_bytes(params))

    def _init(self, module):
        if isinstance(module, BigBlock):
            nn.init.normal_(module.weight, std=0.01)
            self._probe(module)


def _peak(rank, world, enabled):
    from zero.init import Init, full_numel

    config = _config(threshold=10 * WIDTH)
    with Init(config_dict_or_path=config, enabled=enabled) as init:
        model = BigModel()
    params = list(model.parameters())
    full = sum(full_numel(p) for p in model.parameters()) * 4
    return init.peak_bytes, init.current_bytes, init.full_model_bytes, model.peak_held, \
        _held_bytes(params), full


@pytest.mark.parametrize("world", [2, 4])
def test_parameter_memory_never_reaches_the_full_model(world):
    peak, current, full_model, probed, held, full = run_distributed(
        _peak, world, args=(True,), timeout=60, env=CPU_ONLY)[0]
    block = WIDTH * WIDTH * 4  # the largest module's own parameters, in bytes
    assert full_model == full
    assert current == held  # the books match the tensors at the end
    shards_and_whole = full // world + BLOCKS * 2 * WIDTH * 4 * (world - 1) // world
    assert current == shards_and_whole
    # At any moment: the shards made so far plus one module's own parameters whole (while
    # being built, or gathered by apply() on top of its shard). The maximum is reached in
    # apply(), with every shard made, and the probe in the model sees it too.
    assert probed == peak == current + block
    assert peak < full * (1 / world + 0.2)
    # The probe sees the whole model when nothing is partitioned: it can tell the difference.
    _, _, _, plain_probed, plain_held, _ = run_distributed(
        _peak, world, args=(False,), timeout=60, env=CPU_ONLY)[0]
    assert plain_held == full and plain_probed == full


# ---- the patches and errors ----------------------------------------------------------

def _module_classes():
    seen, todo = {}, [nn.Module]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen[sub] = sub.__dict__.get("__init__")
                todo.append(sub)
    return seen


def _patched_state():
    from torch.nn.modules import module as module_module
    from zero.init import INIT_FUNCTIONS

    hf_init = sys.modules.get("transformers.initialization")  # (the harness preloads it)
    return (_module_classes(), {n: getattr(nn.init, n) for n in INIT_FUNCTIONS},
            nn.Module.__dict__["apply"], "__init_subclass__" in nn.Module.__dict__,
            dict(module_module._global_parameter_registration_hooks),
            dict(getattr(hf_init, "TORCH_INIT_FUNCTIONS", {})))


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(100, 100))
        raise RuntimeError("construction failed")


def _restores(rank, world):
    import zero.init as zinit

    before = _patched_state()
    linear_init = nn.Linear.__dict__["__init__"]
    with pytest.raises(RuntimeError, match="construction failed"):
        with zinit.Init(config=_config()):
            assert nn.Linear.__dict__["__init__"] is not linear_init  # really patched
            assert all(getattr(f, "_zero_gathers", False) for f in _patched_state()[5].values())
            outer = nn.Linear.__dict__["__init__"], nn.init.normal_, nn.Module.apply
            with zinit.Init(config=_config()):  # nested: no double wrapping
                assert (nn.Linear.__dict__["__init__"], nn.init.normal_,
                        nn.Module.apply) == outer
                inner_model = nn.Linear(10, 10)

                class Defined(nn.Module):  # defined inside: wrapped, then restored
                    def __init__(self):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(50, 2))
                defined = Defined()
            assert nn.Linear.__dict__["__init__"] is outer[0]  # still open: still patched
            assert zinit.is_partitioned(inner_model.weight)
            assert zinit.is_partitioned(defined.weight)
            Broken()
    after = _patched_state()
    for cls, original in before[0].items():
        assert after[0][cls] is original, cls
    assert after[1:] == before[1:]
    assert zinit._STACK == [] and zinit._IN_INIT == set() and zinit._PATCHES == []
    assert Defined.__dict__["__init__"].__name__ == "__init__"
    assert not getattr(Defined.__dict__["__init__"], "_zero_wrapped", False)
    plain = nn.Linear(200, 200)  # after exit: plain again
    assert not zinit.is_partitioned(plain.weight) and plain.weight.numel() == 40000


def test_exceptions_and_nesting_restore_every_patch_exactly():
    run_distributed(_restores, 1, timeout=60, env=CPU_ONLY)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"remote_device": "nvme"}, ValueError,
     "remote_device 'nvme' needs zero_optimization.offload_param.nvme_path in the config"),
    ({"remote_device": "tpu"}, ValueError, "remote_device='tpu'"),
    ({"mpu": object()}, NotImplementedError, "mpu= .*leave mpu unset"),
    ({"data_parallel_group": object()}, NotImplementedError, "data_parallel_group="),
    ({"config": {}, "config_dict_or_path": {}}, ValueError, "not both"),
    ({"config": {"bf16": {"enabled": True}, "fp16": {"enabled": True}}}, ValueError,
     "both bf16 and fp16"),
    ({"dtype": torch.int32}, ValueError, "floating-point"),
])
def test_unsupported_arguments_are_named(kwargs, error, match):
    import torch.distributed as dist
    from zero.init import Init

    with pytest.raises(error, match=match):
        Init(**kwargs)
    assert not dist.is_initialized()  # refused before touching torch.distributed


def test_disabled_is_a_no_op():
    import torch.distributed as dist
    from zero.init import Init

    linear_init = nn.Linear.__dict__["__init__"]
    with Init(enabled=False, config=_config()):
        assert nn.Linear.__dict__["__init__"] is linear_init
        model = _build("post-init")
    plain = _build("post-init")
    for (name, param), expected in zip(model.named_parameters(), plain.parameters()):
        assert not hasattr(param, "_zero_shard") and torch.equal(param, expected), name
    assert not dist.is_initialized()


def _module_argument(rank, world, path):
    from zero.init import Init

    model = _build("post-init")
    plain = _build("post-init")
    init = Init(module=model, config_dict_or_path=path)  # partitions right away, no `with`
    assert init.full_model_bytes == sum(p.numel() for p in plain.parameters()) * 4
    count = _check_partitioned(model, plain, rank, world)
    # A parameter registered in a context on a module built before it: counted whole when
    # registered, partitioned when the context exits.
    with Init(config_dict_or_path=path) as init:
        model.extra = nn.Parameter(torch.ones(10, 10))
        assert init.current_bytes == 400  # counted whole from its registration
    assert init.peak_bytes == 400 and init.current_bytes == 400 // world
    assert model.extra._zero_shard.numel() == 100 // world
    return count


def test_module_argument_partitions_an_existing_model(tmp_path):
    import json

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(_config()))
    run_distributed(_module_argument, 2, args=(str(path),), timeout=60, env=CPU_ONLY)


INIT_WITHOUT_PROCESS_GROUP = """
import torch, torch.distributed as dist
from zero.init import Init, is_partitioned
assert not dist.is_initialized()
with Init(config={"zero_optimization": {"stage3_param_persistence_threshold": 10}}):
    layer = torch.nn.Linear(8, 8)
assert dist.is_initialized() and dist.get_world_size() == 1
assert is_partitioned(layer.weight) and layer.weight._zero_shard.numel() == 64
print("ok")
"""


def test_init_joins_the_process_group_itself_when_none_exists():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": root}
    result = subprocess.run([sys.executable, "-c", INIT_WITHOUT_PROCESS_GROUP], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def _edit_before_initialize(rank, world):
    import zero
    from zero import init as zero_init

    with zero.Init(config_dict_or_path={"zero_optimization": {"stage3_param_persistence_threshold": 10}}):
        layer = torch.nn.Linear(8, 8)
    with zero.GatheredParameters(layer.weight, modifier_rank=0):
        assert layer.weight.shape == (8, 8)
        if rank == 0:
            with torch.no_grad():
                layer.weight.fill_(float(rank + 7))
    assert zero_init.is_partitioned(layer.weight)
    return zero_init.gather_full(layer.weight)


def test_gathered_parameters_edits_a_zero_init_model_before_initialize():
    for full in run_distributed(_edit_before_initialize, 2, timeout=60):
        assert torch.equal(full, torch.full((8, 8), 7.0))


def _load_on_rank_0_alone(rank, world):
    """Hugging Face's from_pretrained at ZeRO-3: rank 0 alone writes the values inside
    GatheredParameters(modifier_rank=0), a partitioned weight and a bias kept whole."""
    import zero

    with zero.Init(config_dict_or_path={"zero_optimization": {"stage3_param_persistence_threshold": 10}}):
        layer = torch.nn.Linear(8, 8)
    assert not zero.init.is_partitioned(layer.bias)
    with zero.GatheredParameters([layer.weight, layer.bias], modifier_rank=0):
        if rank == 0:
            with torch.no_grad():
                layer.weight.fill_(3.0)
                layer.bias.fill_(5.0)
    with zero.GatheredParameters([layer.bias]):  # no modifier: each rank's own edit stays
        with torch.no_grad():
            layer.bias[0] = float(rank)
    return zero.init.gather_full(layer.weight), layer.bias.detach().clone()


def test_gathered_parameters_gives_rank_0s_values_to_the_parameters_kept_whole_too():
    for rank, (weight, bias) in enumerate(run_distributed(_load_on_rank_0_alone, 2, timeout=60)):
        assert torch.equal(weight, torch.full((8, 8), 3.0))
        assert torch.equal(bias, torch.tensor([float(rank)] + [5.0] * 7)), rank
