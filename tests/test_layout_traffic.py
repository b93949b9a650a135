"""The bytes a stage-3 step sends across nodes and within one (zero/reports/traffic.py)
against the engine's Communicators, for each layout at 4 ranks as 2 nodes x 2."""
import os

import pytest

import training
from distributed_harness import run_distributed
from zero.reports import estimate as est
from zero.reports.estimate.traffic import stage3_traffic

FACTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training.py") + ":make_model"
GAS = 2
LAYOUTS = {
    "plain": {},
    "qwZ": {"zero_quantized_weights": True},
    "qgZ": {"zero_quantized_gradients": True},
    "hpZ": {"zero_hpz_partition_size": 2},
    "qwZ+qgZ+hpZ": {"zero_quantized_weights": True, "zero_quantized_gradients": True,
                    "zero_hpz_partition_size": 2},
    "MiCS": {"mics_shard_size": 2},
    "MiCS+qwZ+qgZ": {"mics_shard_size": 2, "zero_quantized_weights": True,
                     "zero_quantized_gradients": True},
}


def _config(layout, precision):
    return training.engine_config(3, gas=GAS, precision=precision,
                                  stage3_param_persistence_threshold=40,
                                  stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0,
                                  **LAYOUTS[layout])


def _measure(rank, world, precision):
    import zero

    out = {}
    for layout in LAYOUTS:
        engine, _, _, _ = zero.initialize(model=training.make_model(),
                                          config=_config(layout, precision))
        training.train_engine(engine, rank, world, 1, GAS)  # the order is recorded
        engine.core.reset_comm_stats()
        training.train_engine(engine, rank, world, 1, GAS, first_step=1)
        core = engine.core
        out[layout] = {"cross": (core.comm_stats() + core.mics_replicate_comm_stats()).total_bytes,
                       "in": (core.secondary_comm_stats() + core.mics_shard_comm_stats()).total_bytes}
        engine.destroy()
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_bytes_across_and_within_nodes_match_the_model(precision):
    """Within 0.2% (the int8 code's per-unit rounding) plus 64 bytes (the norm's scalars)."""
    shapes = est.shapes_from_factory(FACTORY)
    measured = run_distributed(_measure, 4, args=(precision,), env={"LOCAL_WORLD_SIZE": "2"},
                               timeout=120)[0]
    for layout, seen in measured.items():
        setup, _ = est.setup_from_config(_config(layout, precision), 4)
        traffic = stage3_traffic(est.estimate(shapes, setup, 3), setup, GAS)
        for where, modelled in (("cross", traffic.cross_node), ("in", traffic.in_node)):
            assert abs(seen[where] - modelled) <= 0.002 * modelled + 64, (layout, where, seen,
                                                                          traffic)
    assert measured["MiCS"]["cross"] < measured["hpZ"]["cross"] < measured["plain"]["cross"]
