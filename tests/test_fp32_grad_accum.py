"""DeepSpeed's data_types.grad_accum_dtype "fp32" under bf16/fp16 training: each micro-step's
16-bit gradient is added into fp32 buffers (stages 0-1 the whole gradients, stages 2-3 each
rank's shard), reductions still go in the training dtype (or communication_data_type).

On 2 ranks against single-process references: the reduced gradients at the boundary equal
the fp32 sums bit for bit at every stage (0-1 sum the window then reduce once, 2-3 reduce
each micro-step and add the result in fp32), with and without an fp32 communication dtype;
training tracks an fp32-accumulating reference closer than 16-bit accumulation does; the
offloaded step (host, NVMe, delayed update) steps the same fp32 gradients; torch-style
backward, offload_states, qgZ and MiCS compose with it; a pipeline sums
its tied weights' fp32 gradients across stages; the memory report counts 4 bytes per
gradient element; bad dtypes are refused naming the key."""
import pytest
import torch

import training
from distributed_harness import run_distributed

WORLD = 2
GAS = 8
STEPS = 10
FP32_GRADS = {"grad_accum_dtype": "fp32"}


def _config(stage, gas=GAS, precision="bf16", communication=None, scheduler=True,
            **zero_extra):
    if stage == 3:  # the test model's parameters partitioned, not kept whole
        zero_extra.setdefault("stage3_param_persistence_threshold", 0)
    config = training.engine_config(stage, gas=gas, precision=precision, scheduler=scheduler,
                                    **zero_extra)
    config["data_types"] = dict(FP32_GRADS)
    if communication:
        config["communication_data_type"] = communication
    return config


# ---- the reduced gradients, bit for bit ------------------------------------------------------
def _boundary_grads(rank, world, configs):
    """Per config: the reduced gradients at the first boundary (before the step), fp32, the
    model's .grad there, get_data_types(), and the report's gradient bytes and element count."""
    from zero.compat.deepspeed.utils import safe_get_full_grad

    torch.set_num_threads(1)  # the reference's matmul sums
    out = []
    for config in configs:
        engine = training.engine_at_boundary(config, rank, world)
        grads = {name: safe_get_full_grad(p).clone()
                 for name, p in engine.module.named_parameters()}
        report = engine.memory_report()
        out.append({"grads": grads, "data_types": engine.get_data_types(),
                    "dot_grad": [p.grad for p in engine.module.parameters()],
                    "gradient_bytes": report["categories"]["gradient"]["current"],
                    "numel": report["numel"]})
        engine.destroy()
    return out


def _micro_grads(world, gas):
    """g[m][r]: rank r's bf16 gradients of micro-step m's loss / gas, on the bf16 model."""
    model = training.make_model().to(torch.bfloat16)
    data = training.batches(world, 1, gas)
    grads = []
    for micro in range(gas):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            (model(*data[micro * world + rank]) / gas).backward()
            per_rank.append({name: p.grad.clone() for name, p in model.named_parameters()})
        grads.append(per_rank)
    return grads


def _average(values, communication):
    """The ranks' average as the reduction computes it: in fp32, or in bf16 (the sum rounded
    once, halved exactly), back in fp32."""
    if communication == "fp32":
        return sum(v.float() for v in values) / len(values)
    return (sum(v.bfloat16().float() for v in values).bfloat16() / len(values)).float()


def _reference(stage, grads, communication):
    """Stages 0-1: each rank sums its window in fp32, then one reduction; stages 2-3: every
    micro-step is reduced and the result added in fp32."""
    names = grads[0][0].keys()
    world = len(grads[0])
    if stage < 2:
        sums = [{n: sum(micro[r][n].float() for micro in grads) for n in names}
                for r in range(world)]
        return {n: _average([s[n] for s in sums], communication) for n in names}
    return {n: sum(_average([g[n] for g in micro], communication) for micro in grads)
            for n in names}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_reduced_gradients_are_the_fp32_sums_bit_for_bit(stage):
    configs = [_config(stage), _config(stage, communication="fp32")]
    results = run_distributed(_boundary_grads, WORLD, args=(configs,), timeout=120)[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        grads = _micro_grads(WORLD, GAS)
    finally:
        torch.set_num_threads(threads)
    bf16_sums = {n: sum(micro[0][n] for micro in grads) for n in grads[0][0]}  # (rank 0's)
    fp32_sums = {n: sum(micro[0][n].float() for micro in grads) for n in grads[0][0]}
    # the test can tell the two apart: 16-bit accumulation rounds at every micro-step
    assert any(not torch.equal(bf16_sums[n].float(), fp32_sums[n]) for n in bf16_sums)
    for result, communication in zip(results, (None, "fp32")):
        expected = _reference(stage, grads, communication)
        for name, value in expected.items():
            assert torch.equal(result["grads"][name], value), (stage, communication, name)
        assert result["data_types"] == (torch.bfloat16, torch.float32)  # DeepSpeed's getter
        sharded = stage >= 2
        assert result["gradient_bytes"] == 4 * result["numel"] // (WORLD if sharded else 1)
        if stage < 2:  # added into the fp32 buffer and released, as DeepSpeed's BF16 optimizer
            assert all(g is None for g in result["dot_grad"])


# ---- training --------------------------------------------------------------------------------
def _train(rank, world, config, steps=STEPS):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, steps, config["gradient_accumulation_steps"])
    with zero.GatheredParameters(list(engine.module.parameters())):  # stage 3: whole
        params = training.parameters_of(engine.module)
    engine.destroy()
    return losses, params


def _fp32_accumulating_reference(config, steps=STEPS):
    """One process, the global batch: the bf16 model's gradients of each micro-step added
    into fp32 gradients of an fp32 master, clipped and stepped by torch's AdamW with the
    config's scheduler, the model set to the rounded master: (losses, parameters)."""
    from zero.schedulers import build_scheduler

    model = training.make_model().to(torch.bfloat16)
    master = [p.detach().float().requires_grad_() for p in model.parameters()]
    optimizer = training.reference_adamw(master, config)
    scheduler = build_scheduler(config["scheduler"]["type"], dict(config["scheduler"]["params"]),
                                optimizer)
    gas = config["gradient_accumulation_steps"]
    data = training.batches(WORLD, steps, gas)
    losses = []
    for step in range(steps):
        for weight in master:
            weight.grad = torch.zeros_like(weight)
        total = 0.0
        for micro in range(gas):
            parts = [data[(step * gas + micro) * WORLD + r] for r in range(WORLD)]
            loss = model(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            (loss / gas).backward()
            total += loss.item()
            for weight, param in zip(master, model.parameters()):
                weight.grad += param.grad.float()
                param.grad = None
        torch.nn.utils.clip_grad_norm_(master, config["gradient_clipping"])
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            for weight, param in zip(master, model.parameters()):
                param.copy_(weight)
        losses.append(total / gas)
    return losses, {name: p.detach().float() for name, p in model.named_parameters()}


def _weight_error(params, expected):
    return max(training.relative_error(params[name], value) for name, value in expected.items())


@pytest.mark.parametrize("stage", [1, 3])
def test_training_tracks_fp32_accumulation_closer_than_bf16_accumulation(stage):
    config = _config(stage)
    sixteen = {k: v for k, v in config.items() if k != "data_types"}
    losses, expected = _fp32_accumulating_reference(config)
    (fp32_losses, fp32_params), = run_distributed(_train, WORLD, args=(config,), timeout=300)[:1]
    (_, bf16_params), = run_distributed(_train, WORLD, args=(sixteen,), timeout=300)[:1]
    assert fp32_losses == pytest.approx(losses, rel=1e-4)
    error = _weight_error(fp32_params, expected)
    assert error < 2e-2  # a few bf16 roundings of the weights
    assert error < _weight_error(bf16_params, expected)


def test_fp16_training_with_fp32_accumulation_scales_and_tracks_the_reference():
    """fp16: the scaled 16-bit gradients are added in fp32; the loss scale unscales them."""
    config = _config(2, precision="fp16")
    fp32 = training.engine_config(2, gas=GAS)
    (losses, _), = run_distributed(_train, WORLD, args=(config,), timeout=300)[:1]
    reference, _ = training.train_reference(WORLD, STEPS, GAS, fp32)
    assert losses == pytest.approx(reference, rel=5e-3)


@pytest.mark.parametrize("offload", [{"device": "cpu"}, {"device": "cpu", "delayed_update": True},
                                     {"device": "nvme"}], ids=["cpu", "delayed", "nvme"])
@pytest.mark.parametrize("stage", [1, 2])
def test_the_offloaded_step_reads_the_same_fp32_gradients(tmp_path, stage, offload):
    """The host shard (stage 2), the NVMe chunks and the delayed update's copy hold fp32
    gradients: the run equals the one without offload (the delayed update's one step later)."""
    offload = dict(offload, pin_memory=False)
    if offload["device"] == "nvme":
        offload["nvme_path"] = str(tmp_path)
    config = _config(stage, gas=2, offload_optimizer=offload)
    plain = _config(stage, gas=2)
    steps = 4
    (losses, params), = run_distributed(_train, WORLD, args=(config, steps), timeout=300)[:1]
    (plain_losses, plain_params), = run_distributed(_train, WORLD, args=(plain, steps),
                                                    timeout=300)[:1]
    if offload.get("delayed_update"):  # the first step's update lands one step late
        assert losses[:2] == plain_losses[:2] and losses[2:] != plain_losses[2:]
        return
    assert losses == plain_losses
    for name, value in plain_params.items():
        assert torch.equal(params[name], value), name


def _styles(rank, world, config, style, steps=4, gas=2):
    """`steps` steps: engine.backward, torch's loss.backward() ("torch"), or engine.backward
    with offload_states / reload_states after every step ("sleep"); the micro-steps' losses."""
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    data = training.batches(world, steps, gas)
    losses = []
    for step in range(steps):
        for micro in range(gas):
            loss = engine(*data[(step * gas + micro) * world + rank])
            loss.backward() if style == "torch" else engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        if style == "sleep":
            engine.offload_states()
            engine.reload_states()
    engine.destroy()
    return losses


@pytest.mark.parametrize("stage,extra", [(0, {}), (1, {}), (3, {"zero_quantized_gradients": True}),
                                         (3, {"mics_shard_size": 1})],
                         ids=["stage0", "stage1", "stage3-qgZ", "stage3-MiCS"])
def test_torch_style_backward_and_offload_states_compose_bit_for_bit(stage, extra):
    """loss.backward() (the hooks alone) and the gradients parked in host memory between steps
    train exactly as engine.backward does; ZeRO++'s int8 reduce-scatter and MiCS reduce the
    16-bit copies of fp32 gradients too."""
    config = _config(stage, gas=2, scheduler=False, **extra)
    runs = {style: run_distributed(_styles, WORLD, args=(config, style),
                                   env={"LOCAL_WORLD_SIZE": "2"})[0]
            for style in ("engine", "torch", "sleep")}
    assert runs["torch"] == runs["engine"] and runs["sleep"] == runs["engine"]
    assert runs["engine"][-1] < runs["engine"][0]


# ---- a pipeline's tied weights ---------------------------------------------------------------
def _pipeline(rank, world, zero_stage):
    import zero.compat.deepspeed as deepspeed
    from test_pipe import MODEL, MICRO_BATCHES, STEPS as PIPE_STEPS, config, data
    from zero.models.pipe_gpt import cross_entropy, pipe_layers

    module = deepspeed.pipe.PipelineModule(layers=pipe_layers(MODEL), num_stages=2,
                                           loss_fn=cross_entropy, seed_layers=True)
    ds_config = dict(config(stage=zero_stage), bf16={"enabled": True}, data_types=dict(FP32_GRADS))
    engine, _, _, _ = deepspeed.initialize(model=module, config=ds_config)
    grid = engine.grid
    d = grid.get_data_parallel_id()
    batches = data()
    mine = iter([batches[(s * MICRO_BATCHES + k) * grid.get_data_parallel_world_size() + d]
                 for s in range(PIPE_STEPS) for k in range(MICRO_BATCHES)])
    losses = [engine.train_batch(mine).item() for _ in range(PIPE_STEPS)]
    tied = [p for n, p in engine.module.named_parameters() if n == "tied_modules.embed.weight"]
    return losses, tied[0].detach().float().clone(), grid.get_stage_id()


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_a_pipeline_sums_tied_weights_fp32_gradients_across_stages(zero_stage):
    """2 stages x 2 data ranks, the embedding tied to the head (Megatron-DeepSpeed's bf16 GPT
    with ZeRO 0 or 1): each stage adds its part of the tied gradient in fp32, the stages sum
    them (DeepSpeed sums _hp_grad), so both copies take the same step and the run tracks the
    single-process fp32 model."""
    from test_pipe import reference

    results = run_distributed(_pipeline, 4, args=(zero_stage,), timeout=120)
    stage0 = [r for r in results if r[2] == 0]
    stage1 = [r for r in results if r[2] == 1]
    assert torch.equal(stage0[0][1], stage1[0][1])  # both stages' copies stepped alike
    losses, expected = reference()
    assert results[0][0] == pytest.approx(losses, rel=2e-2)
    assert training.relative_error(stage0[0][1], expected["tied_modules.embed.weight"]) < 3e-2


# ---- config ------------------------------------------------------------------------------------
def test_grad_accum_dtype_is_the_training_dtype_or_fp32():
    """Any of DeepSpeed's spellings of the training dtype or of fp32; another 16-bit dtype, or a
    16-bit one under fp32 training, is refused naming the key and the fix."""
    from zero.boundary import fp32_grads
    from zero.config import ConfigError, load_config

    for stage in (0, 1, 2, 3):
        config = training.engine_config(stage, precision="bf16")
        for spelling in ("torch.bfloat16", "bf16", "torch.float32", "fp32", "float"):
            config["data_types"] = {"grad_accum_dtype": spelling}
            loaded = load_config(config, world_size=WORLD)
            assert fp32_grads(loaded) == (spelling in ("torch.float32", "fp32", "float"))
        config["data_types"] = {"grad_accum_dtype": "fp16"}
        with pytest.raises(ConfigError, match='data_types.grad_accum_dtype = "fp16": bf16 '
                                              "training accumulates its gradients in bf16 or fp32"):
            load_config(config, world_size=WORLD)
    config = training.engine_config(1, precision="bf16")  # BF16_Optimizer's knob: either value
    config["bf16"]["immediate_grad_update"] = True
    config["data_types"] = {"grad_accum_dtype": "fp32"}
    assert load_config(config, world_size=WORLD).bf16.immediate_grad_update is True
    config = training.engine_config(2)  # fp32 training: fp32 is what it does anyway
    config["data_types"] = {"grad_accum_dtype": "fp32"}
    assert not fp32_grads(load_config(config, world_size=WORLD))
    config["data_types"] = {"grad_accum_dtype": "bf16"}
    with pytest.raises(ConfigError, match='set it to "fp32"'):
        load_config(config, world_size=WORLD)
    config["data_types"] = {"grad_accum_dtype": "FP32"}  # (DeepSpeed's spellings are lower case)
    with pytest.raises(ConfigError, match="must be one of"):
        load_config(config, world_size=WORLD)


def test_zero_mem_estimate_counts_fp32_gradients(capsys):
    """zero-mem estimate --fp32-grads: 4 bytes per gradient element, the rest unchanged."""
    import json

    from zero.reports import cli

    rows = {}
    for flag in ("--no-fp32-grads", "--fp32-grads"):
        assert cli.main(["estimate", "--params", "1e8", "--precision", "bf16", "--stage", "2",
                         "--world-size", "4", flag, "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        rows[flag] = {r["stage"]: r["categories"] for r in result["options"]
                      if r["offload_optimizer"] == "none" and r["offload_param"] == "none"}
    for stage, categories in rows["--fp32-grads"].items():
        plain = rows["--no-fp32-grads"][stage]
        assert categories["gradient"]["bytes"] == 2 * plain["gradient"]["bytes"], stage
        assert categories["param"] == plain["param"], stage


def test_zero_mem_tune_writes_the_gradient_dtype_it_estimated(tmp_path):
    """--fp32-grads / --no-fp32-grads win over the config's key in the config written."""
    import json

    from zero.reports import cli

    config = tmp_path / "in.json"
    config.write_text(json.dumps(_config(2)))
    for flag, expected in (("--no-fp32-grads", None), ("--fp32-grads", "fp32")):
        out = tmp_path / f"out{flag}.json"
        assert cli.main(["tune", "--model", training.__file__ + ":make_model", "--config",
                         str(config), "--world-size", "2", flag, "--budget", "1GiB",
                         "--out", str(out)]) == 0
        written = json.loads(out.read_text())
        assert (written.get("data_types") or {}).get("grad_accum_dtype") == expected, flag
