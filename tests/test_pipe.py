"""Pipeline parallelism composed with ZeRO, on 4 gloo ranks against a single-process
reference: 2 stages x 2 data-parallel ranks train like the plain model on the global batch
(tied embedding/head through TiedLayerSpec), GPipe and 1F1B agree, the stages are cut where
the partition method says, the mesh refuses bad sizes, and ZeRO-1 shards each stage's
optimizer state over its data-parallel pair."""
from __future__ import annotations

import pytest
import torch

from distributed_harness import run_distributed
from zero.models.pipe_gpt import cross_entropy, pipe_layers, sequential
from zero.models.tiny_gpt import GPTConfig, synthetic_batches
from zero.parallel import DeviceMesh

MODEL = GPTConfig(vocab_size=61, block_size=8, n_layer=4, n_head=2, n_embd=16)
MICRO_BATCH, MICRO_BATCHES, DATA, STAGES, STEPS = 2, 4, 2, 2, 3
HYPER = {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def config(schedule="1f1b", stage=1, clip=0.0, fp16=None) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_clipping": clip,
            "gradient_accumulation_steps": MICRO_BATCHES,
            "optimizer": {"type": "AdamW", "params": HYPER},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500},
            "pipeline": {"schedule": schedule}, "fp16": fp16 or {"enabled": False}}


def data():
    return synthetic_batches(MODEL, MICRO_BATCH, STEPS * MICRO_BATCHES * DATA, seed=7)


def engine_for(schedule, stage=1, tied=True, partition="uniform", clip=0.0, fp16=None):
    import zero.compat.deepspeed as deepspeed

    module = deepspeed.pipe.PipelineModule(
        layers=pipe_layers(MODEL, tied=tied), num_stages=STAGES, loss_fn=cross_entropy,
        partition_method=partition, seed_layers=True)
    engine, _, _, _ = deepspeed.initialize(model=module,
                                           config=config(schedule, stage, clip, fp16))
    return engine


def train_ranks(rank, world, schedule, stage=1, tied=True, clip=0.0):
    from zero.pipe.engine import PipelineEngine

    engine = engine_for(schedule, stage, tied, clip=clip)
    assert isinstance(engine, PipelineEngine)
    grid = engine.grid
    d = grid.get_data_parallel_id()
    batches = data()
    mine = iter([batches[(s * MICRO_BATCHES + k) * DATA + d]
                 for s in range(STEPS) for k in range(MICRO_BATCHES)])
    losses, norms = [], []
    for _ in range(STEPS):
        losses.append(engine.train_batch(mine).item())
        norms.append(engine.get_global_grad_norm().item())
    params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    layout = (grid.get_stage_id(), d, grid.get_data_parallel_world_size(),
              grid.get_pipe_parallel_world_size(), engine.is_first_stage(),
              engine.is_last_stage(), grid.stage_to_global(1), grid.stage_to_global(0, data=1))
    optimizer_bytes = engine.memory_report()["categories"]["optimizer_state"]["current"]
    numel = sum(p.numel() for p in engine.module.parameters())
    return {"losses": losses, "norms": norms, "params": params, "layout": layout,
            "optimizer_bytes": optimizer_bytes, "numel": numel}


def reference(tied=True, clip=0.0, norms=None):
    model = sequential(pipe_layers(MODEL, tied=tied))
    optimizer = torch.optim.AdamW(model.parameters(), lr=HYPER["lr"], betas=tuple(HYPER["betas"]),
                                  eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                                  foreach=False)
    batches, losses = data(), []
    for step in range(STEPS):
        optimizer.zero_grad()
        total = 0.0
        for k in range(MICRO_BATCHES):
            parts = [batches[(step * MICRO_BATCHES + k) * DATA + d] for d in range(DATA)]
            loss = cross_entropy(model(torch.cat([p[0] for p in parts])),
                                 torch.cat([p[1] for p in parts]))
            (loss / MICRO_BATCHES).backward()
            total += loss.item()
        if clip:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        optimizer.step()
        losses.append(total / MICRO_BATCHES)
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def assert_matches_reference(results, tied=True, clip=0.0):
    norms: list = []
    losses, expected = reference(tied, clip, norms)
    if clip:  # the whole model's norm on every stage, the tied weight counted once
        for result in results:
            assert result["norms"] == pytest.approx(norms, rel=1e-5)
        assert norms[0] > 10 * clip  # the clip acted
    for result in results:
        assert result["losses"] == pytest.approx(losses, rel=1e-5)
    seen = set()
    for rank, result in enumerate(results):
        for name, value in result["params"].items():
            if name == "tied_modules.embed.position" and result["layout"][0] == 1:
                continue  # built on the head's stage too, never used there
            error = ((value - expected[name]).norm() / expected[name].norm()).item()
            assert error < 1e-5, (rank, name, error)
            seen.add(name)
    assert seen == set(expected)


def test_pipeline_2_stages_x_data_2_matches_single_process_with_tied_weights():
    results = run_distributed(train_ranks, 4, args=("1f1b",), timeout=60)
    assert [r["layout"] for r in results] == [
        (0, 0, 2, 2, True, False, 2, 1), (0, 1, 2, 2, True, False, 3, 1),
        (1, 0, 2, 2, False, True, 2, 1), (1, 1, 2, 2, False, True, 3, 1)]
    assert_matches_reference(results)
    # the tied weight is equal on both stages
    assert torch.equal(results[0]["params"]["tied_modules.embed.weight"],
                       results[2]["params"]["tied_modules.embed.weight"])


def test_gradient_clipping_clips_by_the_whole_models_norm_across_stages():
    results = run_distributed(train_ranks, 4, args=("1f1b", 1, True, 0.01), timeout=60)
    assert_matches_reference(results, clip=0.01)


def skip_ranks(rank, world):
    """Step 2 of 3: an infinite gradient on one rank of stage 0 only."""
    engine = engine_for("1f1b")
    d, batches = engine.grid.get_data_parallel_id(), data()
    mine = iter([batches[(s * MICRO_BATCHES + k) * DATA + d]
                 for s in range(STEPS) for k in range(MICRO_BATCHES)])
    engine.train_batch(mine)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    hook = None
    if rank == 0:
        block = next(p for n, p in engine.module.named_parameters()
                     if not n.startswith("tied_modules"))  # not tied: stage 0's alone
        hook = block.register_hook(lambda grad: grad * float("inf"))
    engine.train_batch(mine)
    if hook is not None:
        hook.remove()
    skipped = all(torch.equal(before[n], p) for n, p in engine.module.named_parameters())
    engine.train_batch(mine)
    stepped = not any(torch.equal(before[n], p) for n, p in engine.module.named_parameters())
    return engine.skipped_steps, skipped, stepped


def test_a_non_finite_gradient_on_one_stage_skips_the_step_on_every_stage():
    for rank, (skipped_steps, skipped, stepped) in enumerate(
            run_distributed(skip_ranks, 4, timeout=60)):
        assert (skipped_steps, skipped, stepped) == (1, True, True), rank


def fp16_ranks(rank, world, power):
    engine = engine_for("1f1b", fp16={"enabled": True, "initial_scale_power": power,
                                      "loss_scale_window": 1})
    d, batches = engine.grid.get_data_parallel_id(), data()
    mine = iter([batches[(s * MICRO_BATCHES + k) * DATA + d]
                 for s in range(STEPS) for k in range(MICRO_BATCHES)])
    losses, scales = [], []
    for _ in range(STEPS):
        losses.append(engine.train_batch(mine).item())
        scales.append(engine.optimizer.cur_scale)
    return losses, scales, engine.skipped_steps


def test_fp16_pipeline_applies_and_agrees_on_the_loss_scale():
    losses, _ = reference()
    # scale 2^8: no overflow, the scale grows (loss_scale_window 1: after the second clean
    # step, as DeepSpeed), and the losses follow fp32 training to fp16 rounding
    for result_losses, scales, skipped in run_distributed(fp16_ranks, 4, args=(8,), timeout=60):
        assert skipped == 0 and scales == [2.0 ** 8, 2.0 ** 9, 2.0 ** 10]
        assert result_losses == pytest.approx(losses, rel=5e-3)
    # scale 2^24 overflows fp16 gradients: every stage skips the same steps and halves
    results = run_distributed(fp16_ranks, 4, args=(24,), timeout=60)
    assert all(r[1:] == results[0][1:] for r in results) and results[0][2] >= 1
    assert results[0][1][-1] < 2.0 ** 24


def ramp_ranks(rank, world):
    """set_train_batch_size halves the micro-batches of each step (DeepSpeed's pipeline
    engine follows it): train_batch then reads and counts two, not four."""
    engine = engine_for("1f1b")
    engine.set_train_batch_size(engine.train_batch_size() // 2)
    batches, read = data(), []

    def counted():
        for batch in batches:
            read.append(1)
            yield batch

    engine.train_batch(counted())
    return engine.micro_batches, len(read), engine.global_samples


def test_set_train_batch_size_changes_the_micro_batches_of_a_pipeline_step():
    for micro_batches, read, samples in run_distributed(ramp_ranks, STAGES * DATA):
        assert micro_batches == MICRO_BATCHES // 2
        assert read in (0, MICRO_BATCHES // 2)  # the stages that read data read two
        assert samples == MICRO_BATCH * (MICRO_BATCHES // 2) * DATA


def train_both(rank, world):
    return [train_ranks(rank, world, schedule) for schedule in ("1f1b", "gpipe")]


def test_gpipe_and_1f1b_give_the_same_losses_and_weights():
    for one_f_one_b, gpipe in run_distributed(train_both, 4, timeout=90):
        assert one_f_one_b["losses"] == gpipe["losses"]
        for name, value in one_f_one_b["params"].items():
            assert torch.equal(value, gpipe["params"][name]), name


def test_zero_stage_2_inside_stages_matches_reference_untied():
    results = run_distributed(train_ranks, 4, args=("gpipe", 2, False), timeout=60)
    assert_matches_reference(results, tied=False)


def train_stage0_and_1(rank, world):
    return [train_ranks(rank, world, "1f1b", stage) for stage in (0, 1)]


def test_zero_1_inside_each_stage_shards_the_optimizer_state():
    for rank, (plain, sharded) in enumerate(run_distributed(train_stage0_and_1, 4, timeout=90)):
        assert plain["losses"] == pytest.approx(sharded["losses"], rel=1e-5)
        assert plain["optimizer_bytes"] >= 8 * plain["numel"]  # m and v, whole
        # ZeRO-1 over the stage's 2 ranks: half of m and v (plus padding of the shards)
        assert sharded["optimizer_bytes"] <= 8 * plain["numel"] / 2 + 8 * 64, rank
        assert sharded["optimizer_bytes"] >= 8 * plain["numel"] / 2, rank


LAYER_NAMES = ["EmbeddingPipe", "Block", "Block", "Block", "Block", "LayerNorm", "EmbeddingPipe"]


def build_partitions(rank, world):
    from zero.pipe import PipelineModule

    cuts = {}
    for method in ("uniform", "parameters", "type:Block"):
        module = PipelineModule(layers=pipe_layers(MODEL), num_stages=4, loss_fn=cross_entropy,
                                partition_method=method)
        built = sorted({name.split(".")[0] for name, _ in module.named_parameters()}
                       - {"tied_modules"})
        cuts[method] = (module.parts, built, sorted(module.tied_modules))
    errors = []
    for bad in (3, 0):
        try:
            PipelineModule(layers=pipe_layers(MODEL), num_stages=bad)
        except ValueError as error:
            errors.append(str(error))
    import zero

    try:
        module = PipelineModule(layers=pipe_layers(MODEL, tied=False), num_stages=2,
                                loss_fn=cross_entropy)
        zero.initialize(model=module, config=config(stage=3))
    except NotImplementedError as error:
        errors.append(str(error))
    return cuts, errors


def test_partition_methods_cut_where_expected_and_bad_sizes_are_named():
    results = run_distributed(build_partitions, 4, timeout=60)
    for rank, (cuts, errors) in enumerate(results):
        # 7 layers over 4 stages: 2, 2, 2, 1
        assert cuts["uniform"][0] == [0, 2, 4, 6, 7]
        # parameters: the embeddings (61*16 + 8*16) and blocks (~3.2k) weigh most
        assert cuts["parameters"][0] == [0, 2, 3, 4, 7]
        # one Block per stage: the first stage takes the embedding, the last norm and head
        assert cuts["type:Block"][0] == [0, 2, 3, 4, 7]
        parts = cuts["uniform"][0]
        expected_local = sorted(str(i) for i in range(parts[rank], parts[rank + 1])
                                if LAYER_NAMES[i] != "EmbeddingPipe")
        assert cuts["uniform"][1] == expected_local
        assert cuts["uniform"][2] == (["embed"] if rank in (0, 3) else [])
        assert "pipe 3" in errors[0] and "world size 4" in errors[0]
        assert "pipe = 0" in errors[1] and "world size 4" in errors[1]
        assert "stage 3 inside a pipeline stage" in errors[2]


def test_mesh_layout_and_invalid_sizes():
    mesh = DeviceMesh.build(8, pipe=2, data=4)
    assert mesh.data_parallel_partition() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.pipeline_partition() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.coord(6).pipe == 1 and mesh.coord(6).data == 2
    assert DeviceMesh.build(6, pipe=3).data == 2
    with pytest.raises(ValueError, match=r"pipe 2 x data 3 x tensor 1 = 6 ranks, but the world "
                                         r"size is 8"):
        DeviceMesh.build(8, pipe=2, data=3)
    with pytest.raises(ValueError, match="pipe 3 x tensor 1 does not divide the world size 8"):
        DeviceMesh.build(8, pipe=3)
    with pytest.raises(ValueError, match="data = -1"):
        DeviceMesh.build(8, pipe=2, data=-1)
    # tensor varies fastest (DeepSpeed's PipeModelDataParallelTopology): 2 x 2 x 2
    mesh = DeviceMesh.build(8, pipe=2, tensor=2)
    assert mesh.tensor_parallel_partition() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.data_parallel_partition() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.pipeline_partition() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def _tied_over_sharded_gradients(rank, world, zero_stage, gas):
    import zero.compat.deepspeed as deepspeed

    module = deepspeed.pipe.PipelineModule(layers=pipe_layers(MODEL), num_stages=STAGES,
                                           loss_fn=cross_entropy)
    try:
        deepspeed.initialize(model=module, config=dict(config(stage=zero_stage),
                                                       gradient_accumulation_steps=gas))
    except NotImplementedError as error:
        return str(error)
    return None


@pytest.mark.parametrize("zero_stage,gas", [(2, MICRO_BATCHES), (1, 1)])
def test_layers_tied_across_stages_over_sharded_gradients_are_refused(zero_stage, gas):
    """Stage 2, and stage 1 with one micro-batch per step (its gradients sharded as at stage
    2), reduce before the tied sum: refused on every rank, naming both keys, not trained
    with two copies of the weight drifting apart."""
    for message in run_distributed(_tied_over_sharded_gradients, STAGES,
                                   args=(zero_stage, gas), timeout=60):
        assert message is not None and "tied layers across pipeline stages" in message
        assert f"stage {zero_stage} with gradient_accumulation_steps {gas}" in message


DEEPSPEED_PIPELINE_BLOCK = {  # as DeepSpeed's pipeline examples write it, defaults and all
    "stages": "auto", "partition": "best", "seed_layers": False, "pipe_partitioned": True,
    "grad_partitioned": True, "use_reentrant": True, "activation_checkpoint_interval": 1}


def _with_deepspeeds_block(rank, world):
    import zero.compat.deepspeed as deepspeed

    results = []
    for block in (DEEPSPEED_PIPELINE_BLOCK, {}):
        module = deepspeed.pipe.PipelineModule(
            layers=pipe_layers(MODEL, tied=False), num_stages=STAGES, loss_fn=cross_entropy,
            partition_method="uniform", seed_layers=True)
        engine, _, _, _ = deepspeed.initialize(model=module, config={
            **config(), "pipeline": block})
        batches = iter(data()[:MICRO_BATCHES])
        loss = engine.train_batch(batches).item()
        results.append((module.activation_checkpoint_interval, loss,
                        {n: p.detach().clone() for n, p in module.named_parameters()}))
        engine.destroy()
    return results


@pytest.mark.timeout(180)
def test_deepspeeds_pipeline_block_is_taken_and_its_interval_recomputes_the_same():
    """The block DeepSpeed's examples write was refused key by key; its
    activation_checkpoint_interval now reaches the module, as in DeepSpeed's engine."""
    for (interval, loss, params), (plain_interval, plain_loss, plain_params) in \
            run_distributed(_with_deepspeeds_block, STAGES):
        assert (interval, plain_interval) == (1, 0)
        assert loss == pytest.approx(plain_loss, rel=1e-6)
        assert all(torch.allclose(params[n], plain_params[n], atol=1e-7) for n in params)


def _from_training_data(rank, world):
    import zero.compat.deepspeed as deepspeed

    tokens, targets = (torch.cat(t) for t in zip(*data()[:2 * MICRO_BATCHES]))
    samples = list(zip(tokens, targets))  # a map-style dataset of single samples
    losses, loaders = [], []
    for given in ("training_data", "data_iter"):
        module = deepspeed.pipe.PipelineModule(
            layers=pipe_layers(MODEL, tied=False), num_stages=STAGES, loss_fn=cross_entropy,
            partition_method="uniform", seed_layers=True)
        engine, _, loader, _ = deepspeed.initialize(
            model=module, config=config(), training_data=samples if given == "training_data"
            else None)
        in_order = iter([(tokens[i:i + MICRO_BATCH], targets[i:i + MICRO_BATCH])
                         for i in range(0, len(samples), MICRO_BATCH)])
        losses.append([engine.train_batch(None if loader is not None else in_order).item()
                       for _ in range(2)])
        loaders.append(type(loader).__name__)
        engine.destroy()
    return losses, loaders


@pytest.mark.timeout(180)
def test_a_pipeline_reads_its_training_data_in_order_as_deepspeeds():
    """DeepSpeed's pipeline engine reads initialize's training_data without shuffling (its own
    DistributedSampler) and returns a RepeatingLoader; zero shuffled it."""
    for (from_data, from_iterator), loaders in run_distributed(_from_training_data, STAGES):
        assert from_data == pytest.approx(from_iterator, rel=1e-6)
        assert loaders == ["RepeatingLoader", "NoneType"]


def _evaluated(rank, world):
    engine = engine_for("1f1b", tied=False)
    batches = data()[:MICRO_BATCHES]
    loss = engine.eval_batch(iter(batches))
    again, logits = engine.eval_batch(iter(batches), return_logits=True)
    return loss.item(), again.item(), logits, engine.is_last_stage()


@pytest.mark.timeout(180)
def test_eval_batch_gives_the_mean_loss_everywhere_and_the_last_logits_on_the_last_stage():
    """DeepSpeed's eval_batch, and its return_logits (the last micro-batch's model output on
    the last stage, None elsewhere), which zero refused."""
    model = sequential(pipe_layers(MODEL, tied=False))
    batches = data()[:MICRO_BATCHES]
    with torch.no_grad():
        expected = sum(cross_entropy(model(x), y).item() for x, y in batches) / MICRO_BATCHES
        last_logits = model(batches[-1][0])
    for loss, again, logits, last in run_distributed(_evaluated, STAGES):
        assert loss == pytest.approx(expected, rel=1e-5) and again == loss
        if last:
            assert torch.allclose(logits, last_logits, atol=1e-5)
        else:
            assert logits is None


def _evaluated_as_asked(rank, world):
    engine = engine_for("1f1b", tied=False)
    batches = data()[:MICRO_BATCHES]
    outputs = engine.eval_batch(iter(batches), compute_loss=False, reduce_output=None)
    unbroadcast = engine.eval_batch(iter(batches), bcast_loss=False)
    return outputs, unbroadcast, engine.is_last_stage()


@pytest.mark.timeout(180)
def test_eval_batch_without_loss_or_reduction_or_broadcast_as_deepspeeds():
    """eval_batch(compute_loss=False, reduce_output=None) gives each micro-batch's model
    output on the last stage (Megatron-DeepSpeed's generation), bcast_loss=False keeps the
    loss on the last stage: None elsewhere in both. zero refused them."""
    model = sequential(pipe_layers(MODEL, tied=False))
    batches = data()[:MICRO_BATCHES]
    with torch.no_grad():
        logits = [model(x) for x, _ in batches]
        expected = sum(cross_entropy(out, y).item() for out, (_, y) in zip(logits, batches))
    for outputs, unbroadcast, last in run_distributed(_evaluated_as_asked, STAGES):
        if last:
            assert len(outputs) == MICRO_BATCHES
            assert all(torch.allclose(o, e, atol=1e-5) for o, e in zip(outputs, logits))
            assert unbroadcast.item() == pytest.approx(expected / MICRO_BATCHES, rel=1e-5)
        else:
            assert outputs is None and unbroadcast is None


def _statistics(x):
    """A last layer that returns two losses of its own (the pipeline has no loss_fn)."""
    return x.float().mean(), x.float().pow(2).mean()


def _with_two_losses(rank, world, train):
    import zero.compat.deepspeed as deepspeed

    module = deepspeed.pipe.PipelineModule(
        layers=pipe_layers(MODEL, tied=False) + [_statistics], num_stages=STAGES,
        partition_method="uniform", seed_layers=True)
    engine, _, _, _ = deepspeed.initialize(model=module, config=config())
    batches = data()[:MICRO_BATCHES]
    if train:
        engine.train_batch(iter(batches))
    return engine.eval_batch(iter(batches))


@pytest.mark.timeout(180)
def test_a_tuple_of_losses_is_averaged_by_place_on_every_stage_and_refused_by_train_batch():
    """Without a loss_fn the last layer's output is the loss. A tuple of them: eval_batch
    averages each place and broadcasts the tuple to every stage; train_batch names the fix
    (it needs one tensor to run backward on). Both raised AttributeError."""
    from distributed_harness import RankFailed

    model = sequential(pipe_layers(MODEL, tied=False) + [_statistics])
    batches = data()[:MICRO_BATCHES]
    with torch.no_grad():
        each = [model(x) for x, _ in batches]
    expected = [sum(e[i].item() for e in each) / MICRO_BATCHES for i in range(2)]
    for means in run_distributed(_with_two_losses, STAGES, args=(False,)):
        assert isinstance(means, tuple) and len(means) == 2
        assert [m.item() for m in means] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(RankFailed, match="loss_fn"):
        run_distributed(_with_two_losses, STAGES, args=(True,), timeout=60)


def _named(x):
    return {"mean": x.float().mean()}


def _evaluated_dict(rank, world):
    import zero.compat.deepspeed as deepspeed

    module = deepspeed.pipe.PipelineModule(
        layers=pipe_layers(MODEL, tied=False) + [_named], num_stages=STAGES,
        partition_method="uniform", seed_layers=True)
    engine, _, _, _ = deepspeed.initialize(model=module, config=config())
    try:
        engine.eval_batch(iter(data()[:MICRO_BATCHES]))
    except TypeError as error:
        return str(error)
    return None


@pytest.mark.timeout(180)
def test_an_eval_result_that_cannot_be_averaged_stops_every_stage():
    """A dict from the last layer cannot be averaged: the last stage says so and the other
    stage, waiting for the broadcast, raises too instead of waiting on."""
    last, first = run_distributed(_evaluated_dict, STAGES, timeout=60)[::-1]
    assert "reduce_output=None" in last and "cannot be sent" in first
