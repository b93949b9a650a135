"""zero-mem at stage 3: the estimate of the model states equals the engine's measured bytes
exactly (world sizes 1/2/4, fp32/bf16, persistent parameters apart), the reduce-scatter
buckets and the gathered working-set peak within 5% (they come out exact) for several
settings of (prefetch, reuse distance, max live), and a config the tuner recommends at
stage 3 runs within its budget."""
import dataclasses
import json
import os

import pytest

import training
from distributed_harness import run_distributed
from zero.boundary import as_dict
from zero.reports import cli, tuner
from zero.reports import estimate as est

HERE = os.path.dirname(os.path.abspath(__file__))
FACTORY = os.path.join(HERE, "training.py") + ":make_model"
DEEP_FACTORY = os.path.abspath(__file__) + ":deep_model"
UNTIED_FACTORY = os.path.abspath(__file__) + ":untied_model"
EXTERNAL_FACTORY = os.path.abspath(__file__) + ":external_model"
GAS = 2
PERSISTENCE = 40  # elements: LayerNorm weights/biases and 32-element biases stay whole

# (prefetch, reuse distance, max live): the schedule's bounds, each setting a different
# working set on TinyGPT (root 3,616 elements, two blocks of 12,416).
KNOBS = {
    "defaults": {},  # prefetch 5e7, reuse 1e9, live 1e9: the whole model stays gathered
    "no-prefetch-no-reuse": {"stage3_prefetch_bucket_size": 0,
                             "stage3_max_reuse_distance": 0},  # root + one block
    "prefetch-one-block": {"stage3_prefetch_bucket_size": 13_000,
                           "stage3_max_reuse_distance": 0},
    "live-bound": {"stage3_max_live_parameters": 17_000},  # kept units evicted, less prefetch
    # data_types.grad_accum_dtype fp32: fp32 gradient shard and persistent gradients
    "fp32-grads": {"data_types": {"grad_accum_dtype": "fp32"}},
}
GRID = [(precision, name) for name in KNOBS for precision in ("fp32", "bf16")]
MODEL_STATES = ("param", "gradient", "fp32_master", "optimizer_state")


def deep_model():
    """TinyGPT with eight blocks: big enough that stage 3 beats stage 2 on two ranks."""
    return training.make_model(dataclasses.replace(training.MODEL, n_layer=8))


def untied_model():
    """Three blocks and a head of its own: the root's head gradient arrives at the start of
    backward, its embeddings' at the end."""
    return training.make_model(dataclasses.replace(training.MODEL, n_layer=3,
                                                   tie_embeddings=False))


def external_model():
    """The root reads a weight of blocks.0 (register_external_parameter): gathering the root
    gathers blocks.0 too."""
    return training.make_model(external_use=True)


MODELS = {"tiny": (training.make_model, FACTORY), "deep": (deep_model, DEEP_FACTORY),
          "untied": (untied_model, UNTIED_FACTORY),
          "external": (external_model, EXTERNAL_FACTORY)}


def _config(precision, knobs, gas=GAS):
    zero_extra = {"stage3_param_persistence_threshold": PERSISTENCE, **knobs}
    optimizer = zero_extra.pop("optimizer", "adam")
    sixteen_bit = zero_extra.pop("bf16", None)  # bf16 block keys (a 16-bit master, states)
    data_types = zero_extra.pop("data_types", None)
    config = training.engine_config(3, gas=gas, precision=precision, **zero_extra)
    if data_types:
        config["data_types"] = data_types
    if optimizer == "sgd_momentum":
        config["optimizer"] = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
    if sixteen_bit:
        config["bf16"].update(sixteen_bit)
    return config


def _measure(rank, world, grid, knobs=KNOBS, model="tiny"):
    """Per grid entry: one engine, one step, then one more step with the communication
    counted; the registry's report, the bucket pool and the schedule's counters."""
    import zero

    out = []
    for precision, name in grid:
        engine, _, _, _ = zero.initialize(model=MODELS[model][0](),
                                          config=_config(precision, knobs[name]))
        training.train_engine(engine, rank, world, 1, GAS)
        engine.core.reset_comm_stats()
        training.train_engine(engine, rank, world, 1, GAS, first_step=1)
        report = engine.memory_report()
        comm = engine.core.comm_stats()
        groups = range(engine.core.group_count)
        out.append({
            "numel": report["numel"], "persistent_numel": report["persistent_numel"],
            "current": {k: v["current"] for k, v in report["categories"].items()},
            "peak": {k: v["peak"] for k, v in report["categories"].items()},
            "expected": {k: v["expected"] for k, v in report["categories"].items()
                         if "expected" in v},
            "model_state_bytes": report["model_state_bytes"],
            "total": report["total"],
            "bucket_info": sum(engine.core.group_bucket_info(g).bucket_bytes for g in groups),
            "schedule": as_dict(engine.core.schedule_stats()),
            "comm": (comm.total_bytes, comm.calls),
        })
        engine.destroy()
    return out


def _close(estimated, measured, tolerance=0.05):
    return abs(estimated - measured) <= tolerance * max(measured, 1)


def _check(shapes, world, grid, knobs, results):
    for rank_result in results:
        for (precision, name), measured in zip(grid, rank_result):
            setup, stage = est.setup_from_config(_config(precision, knobs[name]), world)
            assert stage == 3
            estimate = est.estimate(shapes, setup, stage)
            label = f"{precision} {name} N={world}"
            assert estimate.status == est.BUILT, label
            # Model states: exactly, category by category, persistent part included, at their
            # peak (the partitioned gradient shard holds memory from backward to the step).
            assert estimate.numel == measured["numel"], label
            assert estimate.persistent_numel == measured["persistent_numel"], label
            for category in MODEL_STATES:
                row = estimate.categories[category]
                assert row["bytes"] == measured["peak"].get(category, 0), (label, category)
                assert row["bytes"] == measured["expected"][category], (label, category)
            assert estimate.model_state_bytes == measured["model_state_bytes"], label
            b, n = setup.param_bytes, world
            # (a bf16 master is the parameters themselves; bf16 states are half the bytes)
            master = 4 if precision == "bf16" and not setup.sixteen_bit_master else 0
            state = est.optimizer_state_bytes(setup)  # Adam 8 (bf16 states: 4)
            g = setup.grad_bytes  # b, or 4 for fp32 gradients
            assert estimate.persistent_bytes == (
                (b + g) * estimate.persistent_numel
                + (master + state) * estimate.persistent_shard_numel), label
            assert estimate.model_state_bytes - estimate.persistent_bytes == \
                (b + g + master + state) * estimate.numel // n, label  # Adam: 16Ψ/N (bf16: 8)
            # Buckets (the peak in backward; none kept between steps) and the gathered
            # working set: within 5%.
            bucket = estimate.categories["bucket"]["bytes"]
            gathered = estimate.categories["gathered_param"]["bytes"]
            assert _close(bucket, measured["peak"].get("bucket", 0)), (label, bucket, measured)
            assert measured["current"].get("bucket", 0) == 0, (label, measured)
            assert measured["bucket_info"] == 0, (label, measured)
            assert _close(gathered, measured["peak"].get("gathered_param", 0)), (label, gathered,
                                                                          measured["peak"])
            # released after the step
            assert measured["current"].get("gathered_param", 0) == 0, label
            # The device peak: the categories' peaks added up, an upper bound by at most the
            # buckets, which live in backward only (the gathered peak may come before them).
            assert 0.95 * measured["total"]["peak"] <= estimate.device_bytes <= \
                1.05 * measured["total"]["peak"] + bucket, (label, measured)
            work = estimate.stage3["working_set"]
            assert _close(work["peak_numel"], measured["schedule"]["peak_gathered_numel"]), label
            # The tuner's communication model for one step once the order is recorded: the
            # engine adds only scalar all-reduces (the gradient norm).
            payload, calls = tuner.communication(3, estimate, b, GAS)
            measured_bytes, measured_calls = measured["comm"]
            assert 0 <= measured_bytes - payload <= 64, (label, measured["comm"], payload)
            assert 0 <= measured_calls - calls <= 2, (label, measured["comm"], calls)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_stage3_estimate_equals_the_engines_measured_bytes(world):
    shapes = est.shapes_from_factory(FACTORY)  # built on meta, units from plan_units
    results = run_distributed(_measure, world, args=(GRID,), timeout=120)
    _check(shapes, world, GRID, KNOBS, results)


def _attention_granularity() -> int:
    attn = training.make_model().blocks[0].attn
    return sum(p.numel() for p in attn.parameters()) // 3  # qkv, proj, itself


# DeepSpeed's split rules (zero/stage3_policy.py): a cap on the elements kept whole, and the
# attentions gathered as units of their own (their granularity) inside their blocks' units.
POLICY_KNOBS = {
    "model-cap": {"stage3_param_persistence_threshold": 5_000,
                  "stage3_model_persistence_threshold": 3_000},
    "granularity": {"stage3_module_granularity_threshold": _attention_granularity()},
    # the same gathers by all-reduce: the same bytes held, twice the gather payload
    "all-reduce-fetch": {"stage3_use_all_reduce_for_fetch_params": True},
    # the MLPs named as leaf modules: units inside their blocks' units
    "leaf-modules": {"leaf_module": {"name_suffixes": [".mlp"]}},
}
POLICY_GRID = [("bf16", name) for name in POLICY_KNOBS]


def test_the_persistence_cap_granularity_units_and_all_reduce_fetch_are_estimated_exactly():
    results = run_distributed(_measure, 2, args=(POLICY_GRID, POLICY_KNOBS), timeout=120)
    capped = est.shapes_from_factory(FACTORY)
    plain = [0, 2]  # the model's own units
    _check(capped, 2, [POLICY_GRID[i] for i in plain], POLICY_KNOBS,
           [[rank[i] for i in plain] for rank in results])
    all_gather, all_reduce = (est.setup_from_config(_config("bf16", POLICY_KNOBS[name]), 2)[0]
                              for name in ("model-cap", "all-reduce-fetch"))
    assert all_reduce.all_reduce_fetch and not all_gather.all_reduce_fetch
    granular, _ = est.setup_from_config(_config("bf16", POLICY_KNOBS["granularity"]), 2)
    fine = est.shapes_from_factory(FACTORY, granular.unit_rules())
    assert fine.unit_names == ("", "blocks.0", "blocks.0.attn", "blocks.1", "blocks.1.attn")
    _check(fine, 2, POLICY_GRID[1:2], POLICY_KNOBS, [rank[1:2] for rank in results])
    leafy, _ = est.setup_from_config(_config("bf16", POLICY_KNOBS["leaf-modules"]), 2)
    nested = est.shapes_from_factory(FACTORY, leafy.unit_rules())
    assert nested.unit_names == ("", "blocks.0", "blocks.0.mlp", "blocks.1", "blocks.1.mlp")
    assert nested.unit_parents == (0, 0, 1, 0, 3)
    _check(nested, 2, POLICY_GRID[3:], POLICY_KNOBS, [rank[3:] for rank in results])
    with pytest.raises(est.EstimateError, match="stage3_module_granularity_threshold"):
        est.estimate(capped, granular, 3)  # units planned without the threshold


# Eight blocks: bounds that keep some units and not others.
DEEP_KNOBS = {
    "reuse-30k": {"stage3_max_reuse_distance": 30_000, "stage3_prefetch_bucket_size": 0},
    "prefetch-2-blocks": {"stage3_prefetch_bucket_size": 26_000, "stage3_max_reuse_distance": 0},
    "prefetch-2-blocks-1-inflight": {"stage3_prefetch_bucket_size": 26_000,
                                     "stage3_max_reuse_distance": 0,
                                     "stage3_max_inflight_gathers": 1},
    "live-45k-reuse-60k": {"stage3_max_live_parameters": 45_000,
                           "stage3_max_reuse_distance": 60_000,
                           "stage3_prefetch_bucket_size": 12_500},
}
DEEP_GRID = [(precision, name) for name in DEEP_KNOBS for precision in ("fp32", "bf16")]


def test_stage3_working_set_on_a_deeper_model():
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    results = run_distributed(_measure, 2, args=(DEEP_GRID, DEEP_KNOBS, "deep"), timeout=120)
    _check(shapes, 2, DEEP_GRID, DEEP_KNOBS, results)
    # The settings really differ: part of the model, not all of it and not one block.
    setup, _ = est.setup_from_config(_config("bf16", DEEP_KNOBS["reuse-30k"]), 2)
    work = est.estimate(shapes, setup, 3).stage3["working_set"]
    assert work["live_at_peak"] == ["<root>", "blocks.5", "blocks.6", "blocks.7"]


# The root's bucket fills over the whole backward when some of its partitioned parameters are
# used after the blocks (a final norm that is not persistent, an untied head): with one
# bucket (overlap off) the pool grows by one for the backward. Also: everything persistent
# (the default threshold on a small model), and SGD with momentum (4 bytes of state).
ROOT_KNOBS = {
    "overlap-off": {"overlap_comm": False},
    "overlap-off-nothing-persistent": {"overlap_comm": False,
                                       "stage3_param_persistence_threshold": 0},
    "overlap-on-nothing-persistent": {"stage3_param_persistence_threshold": 0},
    "all-persistent": {"stage3_param_persistence_threshold": 100_000},
    "sgd-momentum": {"optimizer": "sgd_momentum"},
    # bf16_master_weights_and_grads and bf16_optimizer_states: no fp32 master, 2-byte moments
    "bf16-master-states": {"bf16": {"bf16_master_weights_and_grads": True,
                                    "bf16_optimizer_states": True}},
    # external: the root keeps blocks.0 with it, so blocks.1 in use makes the whole model
    "no-prefetch-no-reuse": {"stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0},
}
ROOT_GRID = [("bf16", name) for name in ROOT_KNOBS]


@pytest.mark.parametrize("model", ["tiny", "untied", "external"])
def test_stage3_buckets_root_persistence_and_optimizer_variants(model):
    shapes = est.shapes_from_factory(MODELS[model][1])
    assert bool(shapes.externals) == (model == "external")
    results = run_distributed(_measure, 2, args=(ROOT_GRID, ROOT_KNOBS, model), timeout=120)
    _check(shapes, 2, ROOT_GRID, ROOT_KNOBS, results)
    grown = {name: est.estimate(shapes, est.setup_from_config(
        _config("bf16", ROOT_KNOBS[name]), 2)[0], 3) for name in ROOT_KNOBS}
    # Buckets are made per unit and freed after its reduce-scatter (the persistent group's
    # pieces too, counted apart here). A tied head with persistent norms (tiny, external):
    # the root's partitioned gradients (the embeddings) all come at the end, one bucket at a
    # time suffices; an untied head's gradient comes first, and so does a partitioned final
    # norm's: the root's bucket and a block's live together.
    def in_backward(name):
        estimate = grown[name]
        return (estimate.categories["bucket"]["bytes"]
                - estimate.stage3["persistent_bucket_bytes"])

    root, blocks = _bucket_sizes(shapes, grown["overlap-off"])  # bf16: (U + U/N)·2 bytes
    assert in_backward("overlap-off") == (max([root, *blocks]) if model != "untied"
                                          else root + max(blocks))
    assert grown["overlap-off-nothing-persistent"].stage3["persistent_bucket_bytes"] == 0
    root, blocks = _bucket_sizes(shapes, grown["overlap-off-nothing-persistent"])
    assert in_backward("overlap-off-nothing-persistent") == root + max(blocks)
    live = grown["no-prefetch-no-reuse"].stage3["working_set"]["live_at_peak"]
    if model != "untied":  # (three blocks there)
        external = ["blocks.1"] if model == "external" else []
        assert live == ["<root>", "blocks.0", *external], live


def test_the_working_set_rule_on_unit_sizes():
    root, block = 3_616, 12_416
    units = [root, block, block]
    rule = est.simulate_stage3_schedule
    # No prefetch, no reuse: the root (in use for the whole forward and backward) + one block.
    plain = rule(units, 0, 10**9, 0)
    assert plain.peak_numel == root + block and plain.live_at_peak == (0, 1)
    assert plain.gathers == 6 and plain.reuses == 0  # forward 3, backward 3
    # Reuse (the default distance): every unit's next use comes soon, the model stays whole.
    kept = rule(units, 0, 10**9, 10**9)
    assert kept.peak_numel == root + 2 * block and kept.gathers == 3
    # A live bound evicts what reuse keeps; prefetch never passes it.
    bounded = rule(units, 5 * 10**7, 17_000, 10**9)
    assert bounded.peak_numel == root + block and bounded.gathers == 4
    # Prefetch one block ahead: the block in use + the next one + the root.
    ahead = rule(units, 13_000, 10**9, 0)
    assert ahead.peak_numel == root + 2 * block and ahead.prefetches == 4
    assert ahead.first_peak_numel == root + block  # the first micro-step records the order
    # A bound below the units in use bounds nothing else: they are gathered (as DeepSpeed's).
    too_small = rule(units, 5 * 10**7, 10_000, 10**9)
    assert too_small.peak_numel == root + block and too_small.prefetches == 0


def test_stage3_needs_units_and_says_what_it_assumes_for_a_count():
    shapes = est.shapes_from_factory(FACTORY)
    assert shapes.unit_names == ("", "blocks.0", "blocks.1")
    setup = est.Setup(world_size=4, precision="bf16", reduce_bucket_size=3000,
                      persistence_threshold=PERSISTENCE)
    rows = {e.name: e for e in est.estimate_all(shapes, setup)}
    assert rows["stage 3"].status == est.BUILT
    assert rows["stage 3 + offload optimizer"].status == est.BUILT  # test_estimate_offload.py
    assert rows["stage 3 + offload optimizer + params (NVMe)"].status == est.BUILT
    formula = est.location_formula(rows["stage 3"], "device")
    # one micro-step per step: each reduced 1/N goes straight into the gradient shard
    assert formula == "16Ψ/N + 4Ψp + 12Ψp/N + (U1 + U2)·2 + 2·Up/N·2 + W·2", formula
    accumulating = est.estimate(shapes, dataclasses.replace(setup, gradient_accumulation_steps=2),
                                3)
    assert est.location_formula(accumulating, "device") == \
        "16Ψ/N + 4Ψp + 12Ψp/N + (U1 + U1/N + U2 + U2/N)·2 + 2·Up/N·2 + W·2"
    # By hand, without units: the old formula, labelled as such.
    bare = est.ModelShapes(groups=shapes.groups, description="bare")
    assert est.estimate(bare, setup, 3).status == est.STAGE3_FORMULA
    # --params: units assumed (equal blocks with --units), labelled as assumed.
    count = est.shapes_from_count(7_000_000, units=4)
    assert count.units == ((1, 2, 3, 4),) and "4 equal gather unit(s)" in count.note
    row = est.estimate(count, setup, 3)
    assert row.status == est.STAGE3_ASSUMED_UNITS and row.unit_count == 4
    assert 1_750_000 <= row.max_unit_numel < 1_750_000 + 4 * setup.alignment  # padded
    per_tensor = est.shapes_from_count(7_000_000, tensor_numel=1_000_000, units=2)
    assert per_tensor.units == ((1, 1, 1, 1, 2, 2, 2),)


def test_cli_stage3_flags_and_json(capsys, tmp_path):
    assert cli.main(["estimate", "--model", FACTORY, "--world-size", "2", "--precision", "bf16",
                     "--reduce-bucket-size", "3000", "--persistence-threshold", "40",
                     "--max-reuse-distance", "0", "--prefetch-bucket-size", "0",
                     "--stage", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stage3 = next(o for o in out["options"] if o["option"] == "stage 3")
    assert stage3["status"] == est.BUILT
    assert stage3["stage3"]["working_set"]["live_at_peak"] == ["<root>", "blocks.0"]
    assert stage3["categories"]["gathered_param"]["bytes"] == 2 * (3_616 + 12_416)
    assert stage3["persistent_numel"] > 0 and stage3["stage3"]["error"] == ""
    assert cli.main(["estimate", "--params", "7B", "--units", "32", "--world-size", "64",
                     "--precision", "bf16"]) == 0
    text = capsys.readouterr().out
    assert est.STAGE3_ASSUMED_UNITS in text and "32 equal gather unit(s)" in text
    assert cli.main(["estimate", "--model", FACTORY, "--units", "4"]) == 2


def test_schema_defaults_match():
    from zero.config.schema import ZERO_OPTIMIZATION

    setup = est.Setup()
    for key, name in est.STAGE3_KEYS.items():
        assert ZERO_OPTIMIZATION.get(key).default == getattr(setup, name), key


# ---- the tuner --------------------------------------------------------------------------------

def _setup():
    return est.Setup(world_size=2, precision="bf16", reduce_bucket_size=3000,
                     persistence_threshold=PERSISTENCE)


def _run_tuned(rank, world, config_path):
    import zero

    engine, _, _, _ = zero.initialize(model=deep_model(), config=config_path)
    training.train_engine(engine, rank, world, 2, engine.gradient_accumulation_steps())
    report = engine.memory_report()
    return (report["stage"], report["total"], report["categories"]["gathered_param"]["peak"],
            as_dict(engine.core.schedule_stats()))


def test_the_tuner_recommends_stage3_when_only_stage3_fits_and_it_runs_within(tmp_path, capsys):
    shapes = est.shapes_from_factory(DEEP_FACTORY)
    setup = _setup()
    stage2 = min(est.estimate(shapes, setup, 2, overlap_comm=ov).device_bytes
                 for ov in (True, False))
    defaults = est.estimate(shapes, setup, 3)  # whole model kept gathered (reuse)
    smallest = est.estimate(shapes, dataclasses.replace(
        setup, overlap_comm=False, max_live_parameters=3_616 + 12_416), 3)
    assert smallest.runs and smallest.device_bytes < stage2 < defaults.device_bytes
    budget = (smallest.device_bytes + stage2) // 2  # stage 3 only, and only with a live bound
    rec = tuner.tune(shapes, setup, budget)
    assert rec.chosen is not None and rec.chosen.stage == 3
    assert all(c.stage == 3 or not c.fits for c in rec.tried)
    assert rec.chosen.stage3["stage3_max_live_parameters"] < 10**9
    # One micro-step per step: the engine's first backward may hold more buckets (below).
    assert any("first backward" in note for note in rec.notes)
    assert not tuner.tune(shapes, setup, budget, gradient_accumulation_steps=2).notes

    # A stage-3 config with the defaults (does not fit). Two micro-steps per step: with one,
    # the first backward's bucket pool grows (see the xfail test below).
    base = _config("bf16", {}, gas=2)
    base_path = tmp_path / "base.json"
    base_path.write_text(json.dumps(base))
    out = tmp_path / "tuned.json"
    assert cli.main(["tune", "--model", DEEP_FACTORY, "--config", str(base_path),
                     "--world-size", "2", "--budget", str(budget), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recommended: stage 3" in text and "stage 3 working set" in text
    tuned = json.loads(out.read_text())
    zero_block = tuned["zero_optimization"]
    assert zero_block["stage"] == 3
    # the config's two micro-steps: its buckets carry 1/N pieces
    rec = tuner.tune(shapes, dataclasses.replace(setup, gradient_accumulation_steps=2), budget)
    assert zero_block["stage3_max_live_parameters"] == rec.chosen.stage3[
        "stage3_max_live_parameters"]
    assert zero_block["stage3_param_persistence_threshold"] == PERSISTENCE
    chosen = rec.chosen.estimate
    for stage, total, gathered_peak, schedule in run_distributed(_run_tuned, 2,
                                                                 args=(str(out),)):
        assert stage == 3
        assert total["peak"] <= budget, (total, budget)
        assert _close(chosen.device_bytes, total["peak"]), (total, chosen.device_bytes)
        assert _close(chosen.categories["gathered_param"]["bytes"], gathered_peak)
        assert schedule["peak_gathered_numel"] <= zero_block["stage3_max_live_parameters"]


def _bucket_sizes(shapes, estimate) -> tuple[int, list[int]]:
    """Bytes of the root unit's bucket and of each block's, (U + U/N)·b (one partitioned
    group)."""
    setup = estimate.setup
    [rows] = est.stage3_layout(shapes, setup).group_units
    size = {unit: (numel + numel // setup.world_size) * setup.param_bytes
            for unit, numel, _ in rows}
    return size[0], [value for unit, value in size.items() if unit != 0]


def _first_boundary_buckets(rank, world):
    import zero

    config = _config("bf16", {"overlap_comm": False}, gas=1)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, 1)
    bucket = engine.memory_report()["categories"]["bucket"]
    return bucket["current"], bucket["peak"]


def test_the_first_boundary_backward_keeps_the_bucket_pool_at_its_slots():
    # Regression: stage 3's persistent (stage-1) group used to come first in the default
    # launch order; its unit completes only in the first block's backward, so every block's
    # reduce-scatter waited and the pool grew to one bucket per block in the first backward.
    shapes = est.shapes_from_factory(FACTORY)
    setup, _ = est.setup_from_config(_config("bf16", {"overlap_comm": False}, gas=1), 2)
    estimate = est.estimate(shapes, setup, 3)
    bucket = estimate.categories["bucket"]["bytes"]
    for current, peak in run_distributed(_first_boundary_buckets, 2):
        assert current == 0
        # one unit's bucket at a time in backward (measured: 2 when TinyGPT's 2 blocks held
        # theirs at once)
        assert peak == bucket, (peak, bucket)


NO_REUSE = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}
LAYOUT_KNOBS = {"mics-2": {"mics_shard_size": 2},
                "mics-2-no-reuse": {"mics_shard_size": 2, **NO_REUSE},
                "hpz-2-no-reuse": {"zero_hpz_partition_size": 2, **NO_REUSE},
                "hpz-2": {"zero_hpz_partition_size": 2}}
LAYOUT_GRID = [(precision, name) for name in LAYOUT_KNOBS for precision in ("fp32", "bf16")]


def test_the_estimate_and_the_report_know_mics_and_hpz():
    """At 4 ranks as 2 nodes x 2. MiCS with shard groups of 2: the model states are Ψ/S per
    rank, exactly, in the estimate and the engine's own formula. hpZ with groups of 2: the
    gathered peak holds every unit's secondary copy too (Ψ/H). Buckets and the gathered peak
    within 5%."""
    shapes = est.shapes_from_factory(FACTORY)
    results = run_distributed(_measure, 4, args=(LAYOUT_GRID, LAYOUT_KNOBS),
                              env={"LOCAL_WORLD_SIZE": "2"}, timeout=120)
    for rank_result in results:
        for (precision, name), measured in zip(LAYOUT_GRID, rank_result):
            setup, _ = est.setup_from_config(_config(precision, LAYOUT_KNOBS[name]), 4)
            assert setup.partition_world == (2 if name.startswith("mics") else 4)
            assert setup.hpz_world == (2 if name.startswith("hpz") else None)
            estimate = est.estimate(shapes, setup, 3)
            label = f"{precision} {name}"
            for category in MODEL_STATES:
                row = estimate.categories[category]
                assert row["bytes"] == measured["peak"].get(category, 0), (label, category)
                assert row["bytes"] == measured["expected"][category], (label, category)
            b = setup.param_bytes
            master = 4 if precision == "bf16" else 0
            assert estimate.model_state_bytes - estimate.persistent_bytes == \
                (2 * b + master + 8) * estimate.numel // setup.partition_world, label  # 16Ψ/S
            assert _close(estimate.categories["bucket"]["bytes"], measured["peak"].get("bucket", 0))
            assert _close(estimate.categories["gathered_param"]["bytes"],
                          measured["peak"].get("gathered_param", 0)), label
