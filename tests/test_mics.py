"""MiCS (mics_shard_size; FSDP2's HSDP) at 4 ranks on gloo, as 2 "nodes" x 2 ranks: shard
groups {0,1} and {2,3}, replicate groups {0,2} and {1,3}. Training matches plain stage 3 to
fp32 rounding, a step's bytes split between the groups as the formula says, checkpoints load
at another world size and layout, and bad sizes are refused."""
import pytest
import torch

import training
from distributed_harness import RankFailed, run_distributed
from zero.boundary import as_dict

WORLD, SHARD = 4, 2
NODES = {"LOCAL_WORLD_SIZE": str(SHARD)}


def _train(rank, world, shard_size, precision):
    import zero

    config = training.engine_config(3, gas=1, precision=precision, scheduler=False,
                                    stage3_param_persistence_threshold=0,
                                    stage3_max_reuse_distance=0, mics_shard_size=shard_size)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, 1, 1)  # warm-up: the order is learned
    engine.core.reset_comm_stats()
    losses += training.train_engine(engine, rank, world, 1, 1, first_step=1)
    stats = {"world": as_dict(engine.core.comm_stats()),
             "shard": as_dict(engine.core.mics_shard_comm_stats()),
             "replicate": as_dict(engine.core.mics_replicate_comm_stats())}
    losses += training.train_engine(engine, rank, world, 4, 1, first_step=2)
    layout = engine.core.group_layout(0)
    state = engine.module_state_dict()
    report = engine.memory_report()
    return {"losses": losses, "stats": stats, "shard_world": layout.world_size,
            "psi_bytes": layout.full_numel * engine.dtype.itemsize,
            "param_bytes": report["categories"]["param"]["current"],
            "weights": {name: value.float() for name, value in state.items()}}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_mics_trains_like_plain_stage3_and_crosses_nodes_only_to_average_gradients(precision):
    """Per step (every unit gathered for forward and backward): the shard groups all-gather
    2*Psi*b and reduce-scatter Psi*b within a node; across nodes only the replicate groups'
    all-reduce of the gradient shards, 2*(Psi/S)*b (paper convention: an all-reduce of B bytes
    moves 2B). The parameter shard is Psi/S per rank, twice plain stage 3's Psi/N."""
    plain = run_distributed(_train, WORLD, args=(-1, precision), env=NODES)
    mics = run_distributed(_train, WORLD, args=(SHARD, precision), env=NODES)
    rel = 1e-5 if precision == "fp32" else 1e-2  # the gradient sums' order differs
    for mine, theirs in zip(mics, plain):
        assert mine["losses"] == pytest.approx(theirs["losses"], rel=rel)
        for name, value in mine["weights"].items():
            assert value.numel() and training.relative_error(value, theirs["weights"][name]) < \
                (1e-5 if precision == "fp32" else 2e-2), name
        assert (mine["shard_world"], theirs["shard_world"]) == (SHARD, WORLD)
        assert mine["param_bytes"] == 2 * theirs["param_bytes"]
        psi = mine["psi_bytes"]
        shard, replicate, world = (mine["stats"][k] for k in ("shard", "replicate", "world"))
        assert shard["all_gather_bytes"] == 2 * psi
        assert shard["reduce_scatter_bytes"] == psi
        assert replicate["all_reduce_bytes"] == 2 * psi // SHARD
        assert world["all_gather_bytes"] == world["reduce_scatter_bytes"] == 0
        assert theirs["stats"]["world"]["all_gather_bytes"] == 2 * theirs["psi_bytes"]


def _steps(rank, world, shard_size, gas, first, steps, load_dir, save_dir):
    config = training.engine_config(3, gas=gas, scheduler=False,
                                    stage3_param_persistence_threshold=10,
                                    mics_shard_size=shard_size)
    return training.resume_and_train(config, rank, world, first, steps, load_dir, save_dir)


def test_a_mics_checkpoint_loads_at_another_world_size_and_layout(tmp_path):
    """Saved at 4 ranks with shard groups of 2 (ranks 0 and 1 write the shards, as a 2-rank
    layout), resumed at 2 ranks without MiCS and at 4 ranks with it: both continue as the run
    saved and resumed at 4 ranks without MiCS does (same global batch: 4 x 1 = 2 x 2)."""
    plain_dir, mics_dir = tmp_path / "plain", tmp_path / "mics"
    run_distributed(_steps, 4, args=(-1, 1, 0, 2, None, str(plain_dir)), env=NODES)
    run_distributed(_steps, 4, args=(SHARD, 1, 0, 2, None, str(mics_dir)), env=NODES)
    expected = run_distributed(_steps, 4, args=(-1, 1, 2, 2, str(plain_dir), None), env=NODES)[0]
    at_2 = run_distributed(_steps, 2, args=(-1, 2, 2, 2, str(mics_dir), None))[0]
    at_4 = run_distributed(_steps, 4, args=(SHARD, 1, 2, 2, str(mics_dir), None), env=NODES)[0]
    from_plain = run_distributed(_steps, 4, args=(SHARD, 1, 2, 2, str(plain_dir), None),
                                 env=NODES)[0]
    for losses in (at_2, at_4, from_plain):
        assert losses == pytest.approx(expected, rel=1e-5)


def _with_init(rank, world):
    import zero

    config = training.engine_config(3, gas=1, mics_shard_size=SHARD,
                                    stage3_param_persistence_threshold=10)
    with zero.Init(config_dict_or_path=config):
        model = training.make_model()
    zero.initialize(model=model, config=config)


def test_zero_init_with_mics_is_refused_naming_the_key():
    with pytest.raises(RankFailed) as failed:
        run_distributed(_with_init, WORLD, timeout=30)
    assert "mics_shard_size with a model built under zero.Init" in str(failed.value)


def _engine(rank, world, extra):
    import zero

    zero.initialize(model=training.make_model(),
                    config=training.engine_config(3, gas=1, **extra))


@pytest.mark.parametrize("extra,message", [
    ({"mics_shard_size": 3}, "mics_shard_size = 3: does not divide the world size 4"),
    ({"mics_shard_size": 2, "zero_hpz_partition_size": 2}, "hpZ together with MiCS"),
])
def test_bad_layouts_name_the_key(extra, message):
    with pytest.raises(RankFailed) as failed:
        run_distributed(_engine, WORLD, args=(extra,), timeout=30)
    assert message in str(failed.value)


@pytest.mark.parametrize("names,shard_size", [
    ({"dp_shard_size": 2}, 2), ({"dp_replicate_size": 2}, 4),
    ({"dp_shard_size": 4, "dp_replicate_size": 2}, 4), ({"mics_shard_size": 2}, 2),
    ({"dp_shard_size": 2, "mics_shard_size": 2}, 2)])
def test_fsdp2_names_for_the_layout_resolve_to_the_shard_size(names, shard_size):
    """Accelerate / FSDP2's HSDP names (dp_shard_size, dp_replicate_size) mean MiCS too."""
    from zero.config import load_config

    config = load_config({"train_micro_batch_size_per_gpu": 1,
                          "zero_optimization": {"stage": 3, **names}}, 8)
    assert config.zero_optimization.mics_shard_size == shard_size


@pytest.mark.parametrize("names,message", [
    ({"dp_replicate_size": 3}, "dp_replicate_size = 3: does not divide the world size 8"),
    ({"dp_shard_size": 2, "dp_replicate_size": 2}, "times dp_replicate_size (2) must be the "
                                                   "world size 8"),
    ({"dp_shard_size": 2, "mics_shard_size": 4}, "mics_shard_size = 4: disagrees with")])
def test_contradicting_layout_names_are_refused(names, message):
    from zero.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config({"train_micro_batch_size_per_gpu": 1,
                     "zero_optimization": {"stage": 3, **names}}, 8)
