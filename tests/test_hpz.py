"""ZeRO++ hpZ (zero_hpz_partition_size) at 4 ranks on gloo, as 2 "nodes" x 2 ranks
(LOCAL_WORLD_SIZE=2): training equals plain stage 3, a step's all-gather bytes split between
the world and the secondary groups as the formula says, and bad sizes are refused."""
import pytest

import training
from distributed_harness import RankFailed, run_distributed
from zero.boundary import as_dict

WORLD, PER_NODE, GAS = 4, 2, 2
NODES = {"LOCAL_WORLD_SIZE": str(PER_NODE)}


def _train(rank, world, hpz, precision):
    import zero

    config = training.engine_config(3, gas=GAS, precision=precision, scheduler=False,
                                    stage3_param_persistence_threshold=0,
                                    stage3_max_reuse_distance=0, zero_hpz_partition_size=hpz)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, 1, GAS)  # warm-up: the order is learned
    engine.core.reset_comm_stats()
    losses += training.train_engine(engine, rank, world, 1, GAS, first_step=1)
    world_stats = as_dict(engine.core.comm_stats())
    secondary = as_dict(engine.core.secondary_comm_stats())
    losses += training.train_engine(engine, rank, world, 3, GAS, first_step=2)
    padded = sum(engine.core.group_numel(g) for g in range(engine.core.group_count))
    state = engine.module_state_dict()
    return {"losses": losses, "world": world_stats, "secondary": secondary,
            "psi_bytes": padded * engine.dtype.itemsize,
            "weights": {name: value.float() for name, value in state.items()}}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_hpz_trains_exactly_like_plain_stage3_and_keeps_backward_gathers_in_the_node(precision):
    """The same parameters travel, only by another route: losses and weights are identical.
    Per step (2 micro-batches, every unit gathered for each forward and backward: 4 gathers of
    Psi), only the step's first forward crosses nodes: the world all-gathers Psi*b, the
    secondary groups 3*Psi*b (paper convention: a gather of B bytes moves B)."""
    plain = run_distributed(_train, WORLD, args=(1, precision), env=NODES)
    hpz = run_distributed(_train, WORLD, args=(PER_NODE, precision), env=NODES)
    for mine, theirs in zip(hpz, plain):
        assert mine["losses"] == theirs["losses"]
        assert mine["weights"].keys() == theirs["weights"].keys()
        for name, value in mine["weights"].items():
            assert value.numel() and value.equal(theirs["weights"][name]), name
        psi = mine["psi_bytes"]
        assert theirs["world"]["all_gather_bytes"] == 2 * GAS * psi
        assert theirs["secondary"]["all_gather_bytes"] == 0
        assert mine["world"]["all_gather_bytes"] == psi
        assert mine["secondary"]["all_gather_bytes"] == (2 * GAS - 1) * psi
        assert mine["world"]["reduce_scatter_bytes"] == theirs["world"]["reduce_scatter_bytes"]


def _engine(rank, world, hpz):
    import zero

    config = training.engine_config(3, gas=1, stage3_param_persistence_threshold=0,
                                    zero_hpz_partition_size=hpz)
    zero.initialize(model=training.make_model(), config=config)


def test_a_secondary_group_that_would_span_nodes_is_refused_on_every_rank():
    with pytest.raises(RankFailed) as failed:
        run_distributed(_engine, WORLD, args=(4 // 2,), env={"LOCAL_WORLD_SIZE": "1"},
                        timeout=30)
    message = str(failed.value)
    assert "zero_hpz_partition_size = 2" in message and "LOCAL_WORLD_SIZE = 1" in message


def test_a_size_that_does_not_divide_the_world_names_the_key():
    with pytest.raises(RankFailed) as failed:
        run_distributed(_engine, WORLD, args=(3,), timeout=30)
    assert "zero_hpz_partition_size = 3: does not divide the world size 4" in str(failed.value)



def _steps(rank, world, hpz, gas, first, steps, load_dir, save_dir):
    config = training.engine_config(3, gas=gas, scheduler=False,
                                    stage3_param_persistence_threshold=10,
                                    stage3_max_reuse_distance=0, zero_hpz_partition_size=hpz)
    return training.resume_and_train(config, rank, world, first, steps, load_dir, save_dir)


def test_an_hpz_checkpoint_loads_at_another_world_size_and_layout(tmp_path):
    """hpZ keeps plain stage 3's shards: a checkpoint saved at 4 ranks (2 nodes x 2) with hpZ
    resumes at 2 ranks without it exactly as one saved without hpZ does, and a checkpoint saved
    without it resumes at 4 ranks with hpZ exactly as without (the same global batch on both
    sides: 4 ranks x 1 micro-batch, 2 ranks x 2)."""
    resumed = {}
    for hpz in (1, PER_NODE):
        folder = tmp_path / f"hpz{hpz}"
        run_distributed(_steps, 4, args=(hpz, 1, 0, 2, None, str(folder)), env=NODES)
        resumed[hpz] = run_distributed(_steps, 2, args=(1, 2, 2, 2, str(folder), None))[0]
    assert resumed[PER_NODE] == resumed[1]
    with_hpz, without = (run_distributed(_steps, 4, args=(hpz, 1, 2, 2, str(tmp_path / "hpz1"),
                                                           None), env=NODES)[0]
                         for hpz in (PER_NODE, 1))
    assert with_hpz == without
