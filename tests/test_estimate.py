"""zero-mem estimate and tune: the estimate of every category equals the engine's measured
bytes exactly (stages 0-2, world sizes 1/2/4, fp32/bf16, buckets included), and a tuned
config runs within its budget. Stage 3: tests/test_estimate_stage3.py."""
import json
import os

import pytest

import training
from distributed_harness import run_distributed
from zero.reports import cli, tuner
from zero.reports import estimate as est

FACTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training.py") + ":make_model"

# (stage, precision, overrides of training.engine_config): the brief's grid, plus the
# bucket-pool and optimizer variants the estimate has to get right too.
GRID = [(stage, precision, {}) for stage in (0, 1, 2) for precision in ("fp32", "bf16")] + [
    (2, "bf16", {"overlap_comm": True}),        # two buckets
    (2, "fp32", {"bucket": 500}),               # units smaller than most parameters
    (1, "bf16", {"bucket": 500}),
    (2, "fp32", {"optimizer": "sgd_momentum"}),  # 4 bytes of state per element
    (2, "bf16", {"optimizer": "lion"}),          # 4 too
    (1, "fp32", {"optimizer": "adagrad"}),
    (2, "fp32", {"optimizer": "rmsprop"}),       # a torch.optim type: its arrays, and a master
    # stage 1 accumulating micro-steps in its full gradient buffer (with gas 1 it shards)
    (1, "fp32", {"gas": 2}),
    (1, "bf16", {"gas": 2, "overlap_comm": True}),
    # stage 2 accumulating: after a window's first micro-step each bucket has a 1/N piece
    # (with gas 1 the reduced 1/N goes straight into the gradient shard)
    (2, "bf16", {"gas": 2, "overlap_comm": True}),
    # DeepSpeed's bf16_master_weights_and_grads (no fp32 master) and bf16_optimizer_states
    (1, "bf16", {"master16": True}),
    (2, "bf16", {"master16": True, "states16": True, "optimizer": "sgd_momentum"}),
    # data_types.grad_accum_dtype fp32: fp32 gradient buffers, reduced through bf16 copies
    (0, "bf16", {"grads32": True}),
    (1, "bf16", {"grads32": True}),
    (1, "bf16", {"gas": 2, "grads32": True}),
    (2, "bf16", {"gas": 2, "grads32": True, "overlap_comm": True}),
]


def _config(stage, precision, overrides):
    overrides = dict(overrides)
    optimizer = overrides.pop("optimizer", "adam")
    gas = overrides.pop("gas", 1)
    master16, states16 = overrides.pop("master16", False), overrides.pop("states16", False)
    grads32 = overrides.pop("grads32", False)
    config = training.engine_config(stage, gas=gas, precision=precision, **overrides)
    if grads32:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if master16:
        config["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=states16)
    config["optimizer"] = {"adam": config["optimizer"],
                           "sgd_momentum": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}},
                           "lion": {"type": "Lion", "params": {"lr": 1e-4}},
                           "adagrad": {"type": "Adagrad", "params": {"lr": 0.01}},
                           "rmsprop": {"type": "RMSprop", "params": {"momentum": 0.9}}}[optimizer]
    config["zero_allow_untested_optimizer"] = True
    return config, optimizer



def _measure(rank, world, grid):
    """Every grid entry: one engine, one training step, the report's per-category bytes."""
    import zero

    out = []
    for stage, precision, overrides in grid:
        config, _ = _config(stage, precision, overrides)
        engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
        engine.core.reset_comm_stats()
        training.train_engine(engine, rank, world, 1, config["gradient_accumulation_steps"])
        report = engine.memory_report()
        comm = engine.core.comm_stats()
        out.append({"numel": report["numel"],
                    "current": {k: v["current"] for k, v in report["categories"].items()},
                    "peak": {k: v["peak"] for k, v in report["categories"].items()},
                    "peak_total": report["total"]["peak"],
                    "comm": (comm.total_bytes, comm.calls),
                    "expected": {k: v["expected"] for k, v in report["categories"].items()
                                 if "expected" in v}})
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
def test_estimate_equals_the_engines_measured_bytes_exactly(world):
    shapes = est.shapes_from_factory(FACTORY)  # built on meta: the estimator's own path
    results = run_distributed(_measure, world, args=(GRID,), timeout=120)
    for rank_result in results:
        for (stage, precision, overrides), measured in zip(GRID, rank_result):
            config, optimizer = _config(stage, precision, overrides)
            zero_cfg = config["zero_optimization"]
            # a torch.optim type: the arrays setup_from_config's probe names
            external = est.setup_from_config(config, world_size=world)[0] \
                if optimizer == "rmsprop" else None
            setup = est.Setup(world_size=world, precision=precision,
                              optimizer=external.optimizer if external else optimizer,
                              external_arrays=external.external_arrays if external else (),
                              sixteen_bit_master=bool(overrides.get("master16")),
                              sixteen_bit_states=bool(overrides.get("states16")),
                              fp32_grads=bool(overrides.get("grads32")),
                              reduce_bucket_size=zero_cfg["reduce_bucket_size"],
                              overlap_comm=zero_cfg.get("overlap_comm"),
                              gradient_accumulation_steps=config["gradient_accumulation_steps"])
            estimate = est.estimate(shapes, setup, stage)
            label = f"stage {stage} {precision} {overrides} N={world}"
            assert estimate.numel == measured["numel"], label
            estimated = {k: v["bytes"] for k, v in estimate.categories.items()}
            # Model states at their peak (stage 2's gradient shard holds memory from the
            # first gradient of a window to the step); the buckets, made per unit and freed
            # once reduced, at the backward's peak (`slots` neighbouring units), and nothing
            # between steps.
            held = {name: measured["peak" if name in measured["expected"] else "current"]
                    .get(name, 0) for name in set(estimated) | set(measured["current"])}
            assert held.pop("bucket", 0) == 0, label
            buckets = estimated.pop("bucket", 0)
            assert measured["peak"].get("bucket", 0) == buckets, (label, measured["peak"], buckets)
            for name, value in held.items():
                assert estimated.get(name, 0) == value, (label, name)
            for name, value in measured["expected"].items():  # the engine's own formula
                assert estimated[name] == value, (label, name)
            assert estimate.device_bytes == sum(held.values()) + buckets, label
            assert estimate.device_bytes == measured["peak_total"], label  # no hidden peak
            # The tuner's communication model: gradient and parameter payload exactly; the
            # engine adds only scalar all-reduces (the gradient norm for clipping).
            payload, calls = tuner.communication(stage, estimate, setup.param_bytes,
                                                 setup.gradient_accumulation_steps)
            measured_bytes, measured_calls = measured["comm"]
            assert 0 <= measured_bytes - payload <= 64, (label, measured["comm"], payload)
            assert 0 <= measured_calls - calls <= 2, (label, measured["comm"], calls)


def test_the_meta_device_factory_gives_the_real_models_shapes():
    meta = est.build_on_meta(training.make_model)
    assert all(p.device.type == "meta" for p in meta.parameters())
    assert est.shapes_from_factory(FACTORY).groups == \
        est.shapes_from_module(training.make_model()).groups
    # Tied parameters once; frozen ones are not managed but are reported.
    frozen = est.shapes_from_module(training.make_model(freeze_position_embedding=True))
    assert frozen.frozen_numel == training.MODEL.block_size * training.MODEL.n_embd
    assert frozen.trainable_numel == sum(
        p.numel() for p in training.make_model().parameters()) - frozen.frozen_numel


def test_alignment_matches_the_engine():
    from zero import engine

    assert est.ALIGNMENT_BYTES == engine.ALIGNMENT_BYTES


def test_offload_rows_are_built_and_move_what_the_formula_says():
    # Checked against the engine in tests/test_estimate_offload.py; here the formulas.
    shapes = est.shapes_from_factory(FACTORY)
    setup = est.Setup(world_size=4, precision="bf16", reduce_bucket_size=3000,
                      persistence_threshold=40)
    rows = {e.name: e for e in est.estimate_all(shapes, setup)}
    for name, row in rows.items():
        assert row.option.built and row.status == est.BUILT, name
    stage3 = rows["stage 3"]  # checked against the engine in test_estimate_stage3.py
    assert stage3.model_state_bytes - stage3.persistent_bytes == 16 * stage3.shard_numel  # 16Ψ/N
    offload = rows["stage 2 + offload optimizer"]
    # master + Adam moved, and the gradient shard with the whole step on the host
    assert offload.model_state_at("host") == 14 * offload.shard_numel
    moved = offload.host_bytes - offload.categories["staging"]["bytes"]
    # a GPU model's host shard takes each reduced 1/N through a piece beside its bucket
    pieces = (offload.categories["bucket"]["bytes"]
              - rows["stage 2"].categories["bucket"]["bytes"])
    assert pieces > 0
    assert offload.device_bytes == rows["stage 2"].device_bytes - moved + pieces
    nvme = rows["stage 2 + offload optimizer (NVMe)"]
    assert nvme.nvme_bytes == 12 * nvme.shard_numel
    assert nvme.model_state_at("host") == 2 * nvme.shard_numel  # the gradient shard
    everything = rows["stage 3 + offload optimizer + params"]
    # the partitioned parameter and gradient shards go to the host, the persistent
    # parameters stay
    assert everything.model_state_at("host") == (16 * everything.shard_numel
                                                 + 12 * everything.persistent_shard_numel)
    assert everything.categories["param"]["by_location"] == {
        "host": 2 * everything.shard_numel, "device": 2 * everything.persistent_numel}


def test_a_bare_parameter_count_is_approximate_but_close():
    count, world = 10_000_019, 8
    shapes = est.shapes_from_count(count, reduce_bucket_size=1_000_000)
    assert not shapes.exact and shapes.trainable_numel == count and "approximate" in shapes.note
    setup = est.Setup(world_size=world, precision="bf16", reduce_bucket_size=1_000_000)
    stage2 = est.estimate(shapes, setup, 2)
    units = stage2.unit_count
    assert count <= stage2.numel < count + units * world * setup.alignment
    assert stage2.max_unit_numel < 1_000_000 + world * setup.alignment
    assert stage2.categories["param"]["bytes"] == 2 * stage2.numel


def test_sizes_parse_and_print_with_units():
    assert est.parse_bytes("2GiB") == 2 * 1024 ** 3
    assert est.parse_bytes("1.5GB") == 1_500_000_000
    assert est.parse_bytes("512 MiB") == 512 * 1024 ** 2
    assert est.parse_count("7B") == 7_000_000_000 and est.parse_count("5e8") == 500_000_000
    assert est.format_bytes(3 * 1024 ** 3) == "3.00 GiB"
    assert est.format_bytes(5 * 1024 ** 2) == "5.000 MiB"
    with pytest.raises(est.EstimateError, match="cannot read the size"):
        est.parse_bytes("lots")


def test_cli_estimate_json_and_table(capsys, tmp_path):
    assert cli.main(["estimate", "--model", FACTORY, "--world-size", "4", "--num-nodes", "2",
                     "--precision", "bf16", "--reduce-bucket-size", "3000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["option"] for o in out["options"]][:3] == ["stage 0", "stage 1", "stage 2"]
    for option in out["options"]:
        assert option["per_node"]["ranks"] == 2
        for where in ("device", "host", "nvme"):
            assert option["per_node"][f"{where}_bytes"] == 2 * option[f"{where}_bytes"]
        assert option["status"] == "built"
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(training.engine_config(2, precision="bf16")))
    assert cli.main(["estimate", "--model", FACTORY, "--config", str(config),
                     "--world-size", "2"]) == 0
    text = capsys.readouterr().out
    assert "*stage 2 " in text and "MiB" in text and "formula only" not in text
    assert "2Ψ + 14Ψ/N + 1·(U + U/N)·2" in text
    assert "12Ψ/N + 2·C·(2+2)" in text  # stage 2 + offload optimizer, on the host


def test_hf_config_without_transformers_says_so(tmp_path, capsys):
    try:
        import transformers  # noqa: F401
        pytest.skip("transformers is installed here")
    except ImportError:
        pass
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2"}))
    assert cli.main(["estimate", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "transformers" in err and "--model" in err


def test_a_stage3_config_is_read_and_a_budget_nothing_fits_writes_nothing(tmp_path, capsys):
    config = training.engine_config(3, precision="bf16", stage3_param_persistence_threshold=40,
                                    stage3_max_live_parameters=20_000)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    setup, stage = est.setup_from_config(str(path), world_size=2)
    assert stage == 3 and setup.overlap_comm is None and setup.precision == "bf16"
    assert setup.persistence_threshold == 40 and setup.max_live_parameters == 20_000
    # A budget nothing fits, offload included: the tuner says so and writes nothing.
    out = tmp_path / "tuned.json"
    assert cli.main(["tune", "--model", FACTORY, "--config", str(path), "--world-size", "2",
                     "--budget", "20KiB", "--out", str(out)]) == 3
    text = capsys.readouterr().out
    assert "nothing fits" in text and "no option, offload included, fits" in text
    assert "stage 3, reduce_bucket_size" in text  # stage 3 was tried, with its bounds
    assert "stage 3 + optimizer on the host + params on the host" in text
    assert not out.exists()
    # Without offload (--no-offload) a budget only offload fits names what would.
    stage1 = est.estimate(est.shapes_from_factory(FACTORY), setup,
                          est.option_for(1, "cpu")).device_bytes
    assert cli.main(["tune", "--model", FACTORY, "--config", str(path), "--world-size", "2",
                     "--budget", str(stage1), "--no-offload", "--out", str(out)]) == 3
    assert "nothing fits" in capsys.readouterr().out and not out.exists()


# ---- the tuner ------------------------------------------------------------------------------
def test_the_tuner_reads_deepspeeds_short_stage3_names_and_refuses_a_mesh(tmp_path, capsys):
    """A base config with DeepSpeed's field names (`prefetch_bucket_size`, no stage3_ prefix)
    tunes as with the documented names; a tensor-parallel one is refused up front."""
    config = training.engine_config(3, precision="bf16", prefetch_bucket_size=100)
    path, out = tmp_path / "ds.json", tmp_path / "tuned.json"
    path.write_text(json.dumps(config))
    assert cli.main(["tune", "--model", FACTORY, "--config", str(path), "--world-size", "2",
                     "--budget", "1GiB", "--out", str(out)]) == 0
    tuned = json.loads(out.read_text())["zero_optimization"]
    assert "prefetch_bucket_size" not in tuned  # dropped below stage 3, or written prefixed
    capsys.readouterr()
    path.write_text(json.dumps({**config, "tensor_parallel": {"autotp_size": 2},
                                "zero_optimization": {"stage": 1}}))
    assert cli.main(["tune", "--model", FACTORY, "--config", str(path), "--world-size", "2",
                     "--budget", "1GiB", "--out", str(out)]) == 2
    assert "does not search a mesh" in capsys.readouterr().err



def _setup(overlap=None, gas=2):
    """training.engine_config's set-up: two micro-steps per step (stage 1 accumulates)."""
    return est.Setup(world_size=2, precision="bf16", reduce_bucket_size=3000,
                     overlap_comm=overlap, gradient_accumulation_steps=gas)


def test_the_tuner_takes_the_least_communication_that_fits():
    shapes = est.shapes_from_factory(FACTORY)
    totals = {stage: est.estimate(shapes, _setup(), stage).device_bytes for stage in (0, 1, 2)}
    assert totals[0] > totals[1] > totals[2]
    # one micro-step per step: stage 1 shards its gradients, as much memory as stage 2, and
    # both reduce straight into the gradient shard (no 1/N pieces beside the buckets)
    one_micro_step = est.estimate(shapes, _setup(gas=1), 2).device_bytes
    assert est.estimate(shapes, _setup(gas=1), 1).device_bytes == one_micro_step < totals[2]
    assert tuner.tune(shapes, _setup(), totals[0]).chosen.stage == 0
    assert tuner.tune(shapes, _setup(), totals[0] - 1).chosen.stage == 1
    assert tuner.tune(shapes, _setup(), totals[1] - 1).chosen.stage == 2
    assert tuner.tune(shapes, _setup(), totals[1] + 100, reserve=101).chosen.stage == 2
    # Below stage 2 (no stage 3 here: a bare count has no units) only offload fits; without
    # offload nothing does.
    shapes_no_units = est.ModelShapes(groups=shapes.groups, description="bare")
    offload = tuner.tune(shapes_no_units, _setup(), totals[2] - 1)
    assert offload.chosen.stage == 1 and offload.chosen.option.offload_optimizer == "cpu"
    nothing = tuner.tune(shapes_no_units, _setup(), totals[2] - 1, offload=False)
    assert nothing.chosen is None
    # stage 3 would: a formula without the model's units, named as such
    assert [e.name for e in nothing.not_built] == ["stage 3"]
    assert "gather units are unknown" in tuner.why_not(nothing.not_built[0], None)


def test_bucket_sizes_halve_down_to_the_largest_parameter():
    assert tuner.bucket_sizes(1000, 100) == [1000, 500, 250, 125, 100]
    assert tuner.bucket_sizes(100, 400) == [100]


def _run_tuned(rank, world, config_path):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config_path)
    training.train_engine(engine, rank, world, 3, engine.gradient_accumulation_steps())
    report = engine.memory_report()
    return report["stage"], report["total"], engine.config.zero_optimization.overlap_comm


def test_a_tuned_config_runs_within_its_budget(tmp_path, capsys):
    base = training.engine_config(0, precision="bf16", overlap_comm=True)
    base_path = tmp_path / "base.json"
    base_path.write_text(json.dumps(base))
    shapes = est.shapes_from_factory(FACTORY)
    # Between stage 2 with one bucket and stage 2 with two: the tuner must leave stage 0
    # and 1 and turn overlap_comm off.
    one = est.estimate(shapes, _setup(), 2, overlap_comm=False).device_bytes
    two = est.estimate(shapes, _setup(), 2, overlap_comm=True).device_bytes
    assert one < two
    budget = (one + two) // 2
    out = tmp_path / "tuned.json"
    assert cli.main(["tune", "--model", FACTORY, "--config", str(base_path), "--world-size", "2",
                     "--budget", str(budget), "--out", str(out)]) == 0
    assert "recommended: stage 2" in capsys.readouterr().out
    tuned = json.loads(out.read_text())
    assert tuned["zero_optimization"]["overlap_comm"] is False
    assert tuned["train_micro_batch_size_per_gpu"] == base["train_micro_batch_size_per_gpu"]
    # Stage 2's gradient shard and bucket hold memory in backward (the shard until the
    # step): at the peak only.
    chosen = est.estimate(shapes, _setup(), 2, overlap_comm=False).categories
    for stage, total, overlap in run_distributed(_run_tuned, 2, args=(str(out),)):
        assert stage == 2 and overlap is False
        assert total["peak"] == one <= budget
        assert total["current"] == one - chosen["gradient"]["bytes"] - chosen["bucket"]["bytes"]
