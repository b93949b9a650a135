"""DeepSpeed's engine getters on zero (zero/engine_getters.py, and was_step_applied /
empty_partition_cache on the engine) against what the real DeepSpeed 0.19.8 answered for the
same configs (tests/deepspeed_getters/: cases.py, expected.json written by make.py). Where
DeepSpeed's own getter fails without Megatron's groups, or returns its getters uncalled,
zero answers what the getter's docstring says."""
import pytest

from deepspeed_reference import fixture
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(180)
cases, EXPECTED = fixture("getters")
# DeepSpeed asserts without Megatron's groups; one rank of the world is rank 0 of each.
WHEN_DEEPSPEED_FAILS = {"get_data_parallel_rank": 0, "get_model_parallel_rank": 0,
                        "get_tensor_parallel_rank": 0}


def _getters(rank, world):
    import zero

    return cases.answers(zero.initialize)


def _expected(name, getter, deepspeeds, zeros):
    if isinstance(deepspeeds, dict) and "error" in deepspeeds:
        return WHEN_DEEPSPEED_FAILS[getter]
    if isinstance(deepspeeds, list) and deepspeeds and isinstance(deepspeeds[0], dict):
        return [zeros[function["function"]] for function in deepspeeds]  # get_batch_info
    return deepspeeds


def test_every_getter_answers_what_deepspeed_answers():
    assert EXPECTED["deepspeed"] == "0.19.8"
    [found] = run_distributed(_getters, 1)
    for name in cases.CASES:
        for getter, deepspeeds in EXPECTED[name].items():
            expected = _expected(name, getter, deepspeeds, found[name])
            assert found[name][getter] == expected, (name, getter)


def _cache_emptied(rank, world):
    """Stage 3 keeping units for their reuse in backward: after a forward whose backward
    never comes (a loss computed, then dropped) they stay gathered; empty_partition_cache
    gives them back, and training goes on as without it."""
    import zero
    from zero.models.tiny_gpt import synthetic_batches

    import training

    losses = {}
    for empty in (False, True):
        config = training.engine_config(3, gas=1, stage3_param_persistence_threshold=40,
                                        stage3_max_reuse_distance=10**9)
        engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
        training.train_engine(engine, rank, world, 1, 1)
        tokens, targets = synthetic_batches(training.MODEL, 2, 1, seed=7)[0]
        engine(tokens, targets)  # no backward
        held = engine.core.schedule_stats().gathered_numel
        if empty:
            engine.empty_partition_cache()
            emptied = engine.core.schedule_stats().gathered_numel
        losses[empty] = training.train_engine(engine, rank, world, 2, 1, first_step=1)
        engine.destroy()
    return held, emptied, losses


def test_empty_partition_cache_releases_what_stage_3_kept():
    for held, emptied, losses in run_distributed(_cache_emptied, 2):
        assert held > 0 and emptied == 0
        assert losses[True] == losses[False]
