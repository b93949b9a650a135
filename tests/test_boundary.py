"""The typed contract between Python and C++ (zero/boundary.py, csrc/bindings/options.cpp and
reports.cpp): a misspelled or unknown field is an error, never a silent default, every C++
default that has a config key agrees with the schema's, and what the engine reports back is a
read-only struct whose fields as_dict turns into a dict."""
import pytest

from zero import _C
from zero.boundary import as_dict, typed
from zero.config import schema

STRUCTS = [_C.OffloadOptions, _C.ParamOffloadOptions, _C.AioConfig, _C.GroupOptions,
           _C.ScheduleOptions, _C.OptimizerHyper]

# (struct, field, schema block, key, how the config value becomes the field)
SAME_DEFAULT = [
    (_C.OffloadOptions, "pin_memory", schema.OFFLOAD_OPTIMIZER, "pin_memory", bool),
    (_C.OffloadOptions, "delayed_update", schema.OFFLOAD_OPTIMIZER, "delayed_update", bool),
    (_C.OffloadOptions, "ratio", schema.OFFLOAD_OPTIMIZER, "ratio", float),
    (_C.ParamOffloadOptions, "pin_memory", schema.OFFLOAD_PARAM, "pin_memory", bool),
    (_C.ParamOffloadOptions, "max_in_cpu", schema.OFFLOAD_PARAM, "max_in_cpu", int),
    (_C.ParamOffloadOptions, "buffer_count", schema.OFFLOAD_PARAM, "buffer_count", int),
    (_C.ParamOffloadOptions, "buffer_numel", schema.OFFLOAD_PARAM, "buffer_size", int),
    (_C.AioConfig, "block_size", schema.AIO, "block_size", int),
    (_C.AioConfig, "queue_depth", schema.AIO, "queue_depth", int),
    (_C.AioConfig, "intra_op_parallelism", schema.AIO, "intra_op_parallelism", int),
    (_C.GroupOptions, "unit_numel", schema.ZERO_OPTIMIZATION, "reduce_bucket_size", int),
    (_C.ScheduleOptions, "prefetch_numel", schema.ZERO_OPTIMIZATION,
     "stage3_prefetch_bucket_size", int),
    (_C.ScheduleOptions, "max_live_numel", schema.ZERO_OPTIMIZATION,
     "stage3_max_live_parameters", int),
    (_C.ScheduleOptions, "max_reuse_distance", schema.ZERO_OPTIMIZATION,
     "stage3_max_reuse_distance", int),
    (_C.ScheduleOptions, "max_inflight", schema.ZERO_OPTIMIZATION,
     "stage3_max_inflight_gathers", int),
]


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda cls: cls.__name__)
def test_a_misspelled_field_is_an_error_naming_it(cls):
    with pytest.raises(AttributeError, match="pin_memroy"):
        typed(cls, pin_memroy=True)
    with pytest.raises(AttributeError):  # straight on the struct too: no dynamic attributes
        setattr(cls(), "pin_memroy", True)


def test_a_value_of_the_wrong_type_is_an_error():
    with pytest.raises(TypeError):
        typed(_C.OffloadOptions, tile_numel="4M")
    with pytest.raises(KeyError):
        from zero.boundary import optimizer_hyper
        optimizer_hyper("adamw", {"lr": 1.0, "betas": (0.9, 0.99), "eps": 1e-8}, True)


@pytest.mark.parametrize("cls, field, block, key, convert", SAME_DEFAULT,
                         ids=[f"{row[0].__name__}.{row[1]}" for row in SAME_DEFAULT])
def test_cpp_defaults_agree_with_the_schema(cls, field, block, key, convert):
    assert getattr(cls(), field) == convert(block.get(key).default)


def test_fields_survive_the_crossing():
    options = typed(_C.GroupOptions, stage=2, alignment=8, overlap_comm=False,
                    optimizer=_C.OptimizerKind.sgd,
                    offload=typed(_C.OffloadOptions, enabled=True, nvme_path="/tmp/x",
                                  aio=typed(_C.AioConfig, queue_depth=32)))
    assert (options.stage, options.alignment, options.overlap_comm) == (2, 8, False)
    assert options.optimizer == _C.OptimizerKind.sgd
    assert options.offload.enabled and options.offload.nvme_path == "/tmp/x"
    assert options.offload.aio.queue_depth == 32


def test_a_reported_struct_is_read_only_and_a_misspelled_field_is_an_error():
    usage = _C.MemoryRegistry().total()

    assert (usage.current, usage.peak) == (0, 0)
    with pytest.raises(AttributeError):
        usage.curent  # noqa: B018 -- the misspelling is the point
    with pytest.raises(AttributeError):
        usage.current = 1


def test_as_dict_gives_every_field_of_a_reported_struct():
    stats = _C.CommStats() + _C.CommStats()

    assert as_dict(stats) == {"all_gather_bytes": 0, "reduce_scatter_bytes": 0,
                              "all_reduce_bytes": 0, "broadcast_bytes": 0, "total_bytes": 0,
                              "calls": 0, "control_bytes": 0, "control_calls": 0}
    assert set(as_dict(_C.MemoryRegistry().total())) == {"current", "peak"}
