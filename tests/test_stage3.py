"""ZeRO-3: partitioned parameters gathered just in time, trained like single-process PyTorch;
memory as the formula says; checkpoints, 16-bit save and GatheredParameters."""
import pytest
import torch

import training
from distributed_harness import run_distributed
from zero.boundary import as_dict

STEPS = 20
GAS = 2
PERSISTENCE = 40  # elements: LayerNorm weights and biases stay whole, everything else shards


def _config(**extra):
    return training.engine_config(3, gas=GAS, stage3_param_persistence_threshold=PERSISTENCE,
                                  **extra)


def _make(rank, prefetch=0, **extra):
    import zero

    model = training.make_model(freeze_position_embedding=True, reuse_block=True)
    config = _config(stage3_prefetch_bucket_size=prefetch, **extra)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return engine


def _train(rank, world, prefetch):
    engine = _make(rank, prefetch)
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    state = engine.module_state_dict()
    released = all(p.numel() == 0 for group in engine.groups if group.stage == 3
                   for p in group.params)
    stats = as_dict(engine.core.schedule_stats())
    return losses, ({k: v.float() for k, v in state.items()} if rank == 0 else None), stats, released


@pytest.mark.parametrize("prefetch", [0, 10**8], ids=["no-prefetch", "prefetch"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_stage3_matches_single_process_adamw(world, prefetch):
    """Tied embeddings, a frozen parameter and a block used twice per forward."""
    ref_losses, ref_params = training.train_reference(world, STEPS, GAS, _config(),
                                                      freeze_position_embedding=True,
                                                      reuse_block=True)
    results = run_distributed(_train, world, args=(prefetch,), timeout=240)
    for losses, _, stats, released in results:
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        assert released  # outside forward/backward no rank holds a whole partitioned parameter
        assert (stats["prefetches"] > 0) == (prefetch > 0)
        assert stats["notice"] == ""  # the order never changed
    state = results[0][1]
    for name, expected in ref_params.items():
        assert training.relative_error(state[name], expected) < 1e-5, name
    assert torch.equal(state["head.weight"], state["token_embedding.weight"])  # still tied
    # ... and one tensor under both names, as in the module (HF's save_pretrained then stores
    # it once, and from_pretrained under zero.Init ties it the same way on every rank)
    assert state["head.weight"].untyped_storage().data_ptr() == \
        state["token_embedding.weight"].untyped_storage().data_ptr()
    assert ref_losses[-1] < ref_losses[0] - 0.2


def _memory(rank, world, prefetch=0, **extra):
    engine = _make(rank, prefetch, **extra)
    training.train_engine(engine, rank, world, 2, GAS)
    report = engine.memory_report()
    from zero.stage3 import plan_units

    fresh = training.make_model(freeze_position_embedding=True, reuse_block=True)
    plan = plan_units(fresh)
    units = [(name, sum(p.numel() for p in fresh.parameters() if plan.unit_of_param[id(p)] == u))
             for u, (name, _) in enumerate(plan.modules)]
    groups = range(engine.core.group_count)
    partitioned = [g for g in groups if engine.groups[g].stage == 3]
    psi = sum(engine.core.group_numel(g) for g in partitioned)
    persistent = sum(engine.core.group_numel(g) for g in groups if g not in partitioned)
    buckets = sum(engine.core.group_bucket_info(g).bucket_bytes for g in groups)
    frozen = sum(engine.core.frozen_group_layout(g).full_numel
                 for g in range(engine.core.frozen_group_count))
    return report, psi, persistent, buckets, units, frozen


@pytest.mark.parametrize("world", [2, 4])
def test_model_states_are_16_psi_over_n_plus_the_persistent_and_frozen_parts(world):
    report, psi, persistent, buckets, _, frozen = run_distributed(_memory, world)[0]
    assert psi % world == 0
    # fp32 training: 4 (param) + 4 (grad) + 8 (Adam) bytes per element, all divided by N; the
    # master is the parameter shard itself. Persistent parameters follow stage 1; the frozen
    # position embedding is partitioned too, its shard alone (4 bytes per element / N).
    partitioned_bytes = 16 * psi // world
    persistent_bytes = 4 * persistent + 4 * persistent + 8 * persistent // world
    frozen_bytes = 4 * frozen // world
    assert frozen >= training.MODEL.block_size * training.MODEL.n_embd
    assert report["frozen_numel"] == frozen
    assert report["model_state_bytes"] == partitioned_bytes + persistent_bytes + frozen_bytes
    assert report["model_state_expected_bytes"] == \
        partitioned_bytes + persistent_bytes + frozen_bytes
    assert report["model_state_formula"] == "16Ψ/N + persistent: 8Ψ + 8Ψ/N + frozen: 4Ψ/N"
    assert report["categories"]["gathered_param"]["current"] == 0
    # Between steps the partitioned gradient shard (4Ψ/N) holds no memory: it is taken at
    # the first backward of a window and given back at the step, as FSDP2 frees its grads.
    gradient = report["categories"]["gradient"]
    assert gradient["peak"] == 4 * psi // world + 4 * persistent
    assert gradient["current"] == 4 * persistent
    assert report["total"]["current"] == \
        partitioned_bytes - 4 * psi // world + persistent_bytes + frozen_bytes + buckets


def test_without_prefetch_or_reuse_the_working_set_is_the_root_plus_one_block():
    report, psi, persistent, _, units, _ = run_distributed(
        _memory, 2, kwargs={"stage3_max_reuse_distance": 0})[0]
    peak = report["categories"]["gathered_param"]["peak"]
    root, blocks = units[0][1], [numel for _, numel in units[1:]]
    # fp32: 4 bytes per element. Units are padded to the world size and persistent (small)
    # parameters are not gathered, so the peak sits between one block and root + one block.
    assert 4 * max(blocks) * 0.9 <= peak <= 4 * (root + max(blocks) + 2 * 8 * 2)


def test_prefetch_stays_within_its_bound():
    bound = 13_000  # elements: room to prefetch one block (12,416 + padding), not two
    report, psi, persistent, _, units, frozen = run_distributed(
        _memory, 2, args=(bound,), kwargs={"stage3_max_reuse_distance": 0})[0]
    peak = report["categories"]["gathered_param"]["peak"]
    root, blocks = units[0][1], [numel for _, numel in units[1:]]
    assert peak <= 4 * (root + max(blocks) + bound)
    assert peak > 4 * (root + max(blocks) + 64)  # it did prefetch a block ahead
    assert peak < 4 * (psi + persistent + frozen)  # never the whole model


def _live_bound(rank, world, bound):
    import zero

    config = _config(stage3_max_live_parameters=bound)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, 2, GAS)
    stats = engine.core.schedule_stats()
    return losses, stats.notice, stats.peak_gathered_numel


def test_a_live_parameter_bound_below_the_units_in_use_bounds_only_the_rest():
    """DeepSpeed-Chat writes stage3_max_live_parameters 3e7, below one layer of any model of
    1.3B parameters or more; DeepSpeed bounds prefetching and kept units with it and never
    refuses. Neither does zero now: the units in use are gathered (it raised), the step is
    the unbounded one, and the schedule's notice names the bound."""
    for (losses, notice, peak), (free, _, free_peak) in zip(
            run_distributed(_live_bound, 2, args=(1000,)),
            run_distributed(_live_bound, 2, args=(10**9,))):
        assert losses == free
        assert "above zero_optimization.stage3_max_live_parameters = 1000" in notice
        assert 1000 < peak <= free_peak


def _resume(rank, world, save_dir, phase):
    engine = _make(rank)
    if phase == "full":
        losses = training.train_engine(engine, rank, world, 6, GAS)
    elif phase == "first":
        losses = training.train_engine(engine, rank, world, 3, GAS)
        engine.save_checkpoint(save_dir)
    else:
        engine.load_checkpoint(save_dir)
        losses = training.train_engine(engine, rank, world, 3, GAS, first_step=3)
    state = engine.module_state_dict()
    return losses, state if rank == 0 else None


def test_stage3_resume_is_bit_for_bit(tmp_path):
    training.check_resume_bit_for_bit(_resume, 2, str(tmp_path))




def _gathered_edit(rank, world):
    import zero.compat.deepspeed as deepspeed

    engine = _make(rank)
    weight = engine.module.blocks[1].mlp[0].weight
    assert weight.numel() == 0  # partitioned and released
    with deepspeed.zero.GatheredParameters([weight], modifier_rank=0):
        shape = tuple(weight.shape)
        if rank == 0:
            with torch.no_grad():
                weight.fill_(0.5)
    assert weight.numel() == 0
    state = engine.module_state_dict()
    return shape, bool((state["blocks.1.mlp.0.weight"] == 0.5).all()) if rank == 0 else None


def test_gathered_parameters_shows_whole_tensors_and_broadcasts_edits():
    results = run_distributed(_gathered_edit, 2)
    assert results[0][0] == results[1][0] == (128, 32)
    assert results[0][1] is True


def _kept_from_inside(rank, world, save_path):
    import zero.compat.deepspeed as deepspeed

    engine = _make(rank)
    weight = engine.module.blocks[1].mlp[0].weight
    with deepspeed.zero.GatheredParameters([weight]):
        kept = weight.data.cpu()  # on a CPU machine the same tensor (DeepSpeed-Chat's save)
        expected = weight.data.clone()
    training.train_engine(engine, rank, world, 6, GAS)  # gathers that unit again, and changes it
    with deepspeed.zero.GatheredParameters([weight]):
        trained = weight.data.clone()
    if rank == 0:
        torch.save({"weight": kept}, save_path)
    return torch.equal(kept, expected), torch.equal(kept, trained), tuple(kept.shape)


def test_a_tensor_kept_from_inside_gathered_parameters_stays_whole_and_apart(tmp_path):
    """DeepSpeed frees nothing a script still holds: a tensor taken inside the block keeps the
    values it had there, after the block and after later gathers of its unit (it was emptied
    in place, then filled with other values, and could not be saved)."""
    results = run_distributed(_kept_from_inside, 2, args=(str(tmp_path / "kept.pt"),))
    for same_as_inside, same_as_trained, shape in results:
        assert same_as_inside and not same_as_trained and shape == (128, 32)
    assert torch.load(tmp_path / "kept.pt")["weight"].shape == (128, 32)


def _two_engines(rank, world):
    import zero.compat.deepspeed as deepspeed

    actor, ema = _make(rank), _make(rank)  # DeepSpeed-Chat's actor and its EMA copy
    pairs = list(zip(actor.module.parameters(), ema.module.parameters()))
    expected = 0.0
    with torch.no_grad():
        for param, copy in pairs:  # its moving_average, the edit kept (modifier_rank)
            with deepspeed.zero.GatheredParameters([param, copy], modifier_rank=0):
                assert param.shape == copy.shape and param.numel() == copy.numel() > 0
                copy.data.copy_(torch.lerp(param.data, copy.data, 0.5) + 1)
                expected += float(copy.sum())
    released = all(param.numel() == 0 or param.ds_persist for param, _ in pairs)
    with deepspeed.zero.GatheredParameters(list(ema.module.parameters())):
        return released, float(sum(copy.sum() for _, copy in pairs)), expected


def test_gathered_parameters_over_two_engines_gathers_each_engines_own():
    """GatheredParameters([an actor's parameter, its EMA copy's]) gathered only the first
    engine's; the copy stayed empty. Now each engine gathers its own, and writes back its own."""
    for released, total, expected in run_distributed(_two_engines, 2):
        assert released
        assert total == pytest.approx(expected, rel=1e-5)


def _save_16bit_model(rank, world, save_dir):
    import zero

    config = _config(stage3_gather_16bit_weights_on_model_save=True)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    training.train_engine(engine, rank, world, 2, GAS)
    saved = engine.save_16bit_model(save_dir)
    state = engine.module_state_dict()  # a collective: every rank calls it
    return saved, state if rank == 0 else None


def test_save_16bit_model_writes_the_whole_model_once(tmp_path):
    results = run_distributed(_save_16bit_model, 2, args=(str(tmp_path),))
    assert results[0][0] and results[1][0]
    written = torch.load(tmp_path / "pytorch_model.bin")
    for name, value in results[0][1].items():
        assert torch.equal(written[name], value), name


class _Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 64)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(3))
        self.head = torch.nn.Linear(64, 1)

    def forward(self, x, branch):
        x = self.blocks[branch](self.blocks[0](self.embed(x)))
        return self.head(x).pow(2).mean()


def _diverge(rank, world):
    import zero

    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 10}}
    engine, _, _, _ = zero.initialize(model=_Branchy(), config=config)
    x = torch.randn(2, 8)
    try:
        for step in range(3):
            branch = 1 if step == 0 else 1 + rank  # step 1: rank 0 -> blocks.1, rank 1 -> blocks.2
            engine.backward(engine(x, branch))
            engine.step()
    except RuntimeError as error:
        return str(error)
    return None


def test_divergent_ranks_fail_with_the_module_and_step_named_instead_of_hanging():
    import time

    start = time.monotonic()
    messages = run_distributed(_diverge, 2, timeout=60)
    assert time.monotonic() - start < 60
    for message in messages:
        assert message is not None
        assert "ranks diverged at stage 3 (step 1)" in message
        assert "synced_gpus=True" in message  # the fix for generate, named
        assert "rank 0 is at forward of 'blocks.1'" in message
        assert "rank 1 is at forward of 'blocks.2'" in message


class _EightLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256, bias=False) for _ in range(8))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.square().mean()


def _held_by_autograd(rank, world):
    import zero

    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0,
                                    "stage3_param_persistence_threshold": 1000}}
    engine, _, _, _ = zero.initialize(model=_EightLayers(), config=config)
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr(), id(storage)] = storage  # the live storage object
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = engine(torch.randn(1, 256))
    unit_bytes = 256 * 256 * 4
    held = sum(s.nbytes() for s in saved.values() if s.nbytes() >= unit_bytes)
    counted = engine.memory_report()["categories"]["gathered_param"]["current"]
    engine.backward(loss)  # backward re-fills the same storages the saved views point at
    engine.step()
    return held, counted


def test_released_units_free_their_memory_even_while_autograd_holds_views():
    """A weight's transpose saved for backward must not keep a released unit's memory alive
    (it did: the registry said 0 while every unit stayed allocated until backward)."""
    for held, counted in run_distributed(_held_by_autograd, 2):
        assert counted == 0
        assert held == 0


def _schedule_run(rank, world, **extra):
    engine = _make(rank, **extra)
    losses = training.train_engine(engine, rank, world, 4, GAS)
    report = engine.memory_report()
    return losses, as_dict(engine.core.schedule_stats()), report["categories"]["gathered_param"]["peak"]


def test_reuse_distance_keeps_units_for_their_next_use_and_saves_gathers():
    # Default stage3_max_reuse_distance (1e9): a unit whose next use comes soon stays gathered
    # (the last block between forward and backward, the reused block between its two calls).
    kept = run_distributed(_schedule_run, 2, kwargs={"stage3_max_reuse_distance": 10**9})
    released = run_distributed(_schedule_run, 2, kwargs={"stage3_max_reuse_distance": 0})
    assert kept[0][0] == released[0][0]  # same arithmetic, bit for bit
    assert kept[0][1]["reuses"] > 0 and released[0][1]["reuses"] == 0
    assert kept[0][1]["gathers"] < released[0][1]["gathers"]
    assert kept[0][2] > released[0][2]  # the price: a bigger working set


def test_kept_units_are_evicted_to_respect_the_live_parameter_bound():
    # Room for the root and one block (a block is ~12.4k elements, the root ~3.7k): units kept
    # for reuse must make way instead of tripping the bound.
    bound = 17_000
    losses, stats, peak = run_distributed(
        _schedule_run, 2, kwargs={"stage3_max_reuse_distance": 10**9,
                                  "stage3_max_live_parameters": bound})[0]
    free = run_distributed(_schedule_run, 2, kwargs={"stage3_max_reuse_distance": 0})[0]
    assert losses == free[0]
    assert stats["peak_gathered_numel"] <= bound
    assert peak <= 4 * bound


@pytest.mark.parametrize("inflight", [1, 2])
def test_in_flight_gathers_are_bounded(inflight):
    losses, stats, _ = run_distributed(
        _schedule_run, 2, kwargs={"prefetch": 10**8, "stage3_max_reuse_distance": 0,
                                  "stage3_max_inflight_gathers": inflight})[0]
    assert stats["prefetches"] > 0
    assert stats["max_inflight_seen"] == inflight


def _plain_backward(rank, world):
    engine = _make(rank)
    tokens, targets = training.batches(world, 1, 1)[rank]
    with pytest.raises(RuntimeError, match=r"without the engine: compute the loss from the "
                                           r"engine's forward \(engine\(...\), not engine.module"):
        engine.module(tokens, targets).backward()
    return True


def test_a_backward_around_the_engine_at_stage_3_is_a_named_error():
    assert run_distributed(_plain_backward, 1) == [True]


def _train_external(rank, world):
    import zero

    model = training.make_model(external_use=True)
    engine, _, _, _ = zero.initialize(model=model, config=_config())
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    state = engine.module_state_dict()
    return losses, ({k: v.float() for k, v in state.items()} if rank == 0 else None)


def test_a_registered_external_parameter_is_gathered_with_its_user():
    """The root's forward reads blocks.0.attn.proj.weight after blocks.0 was released."""
    ref_losses, ref_params = training.train_reference(2, STEPS, GAS, _config(), external_use=True)
    results = run_distributed(_train_external, 2, timeout=240)
    for losses, _ in results:
        assert losses == pytest.approx(ref_losses, rel=1e-5)
    for name, expected in ref_params.items():
        assert training.relative_error(results[0][1][name], expected) < 1e-5, name


def _train_built_under_init(rank, world):
    import zero
    from zero import init as zero_init

    config = _config()
    with zero.Init(config_dict_or_path=config) as init:
        model = training.make_model(freeze_position_embedding=True, reuse_block=True)
    born_partitioned = sum(zero_init.is_partitioned(p) for p in model.parameters())
    engine, _, _, _ = zero.initialize(model=model, config=config)
    leftovers = sum(hasattr(p, "_zero_shard") for p in model.parameters())
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    state = engine.module_state_dict()
    return (losses, ({k: v.float() for k, v in state.items()} if rank == 0 else None),
            born_partitioned, leftovers, init.peak_bytes, init.full_model_bytes)


@pytest.mark.parametrize("world", [2, 4])
def test_a_model_built_under_zero_init_trains_like_the_plainly_built_one(world):
    ref_losses, ref_params = training.train_reference(world, STEPS, GAS, _config(),
                                                      freeze_position_embedding=True,
                                                      reuse_block=True)
    results = run_distributed(_train_built_under_init, world, timeout=240)
    for losses, _, born_partitioned, leftovers, peak, full in results:
        assert born_partitioned > 0 and leftovers == 0
        assert peak < full  # no rank held the whole model while building it
        assert losses == pytest.approx(ref_losses, rel=1e-5)
    for name, expected in ref_params.items():
        assert training.relative_error(results[0][1][name], expected) < 1e-5, name


def _train_with_named_units(rank, world):
    import zero
    from zero.models.tiny_gpt import CausalSelfAttention

    model = training.make_model(freeze_position_embedding=True, reuse_block=True)
    zero.set_z3_leaf_modules(model, [CausalSelfAttention])  # every attention is a unit
    zero.gather_unit(model.blocks[1].mlp)                    # and one MLP
    engine, _, _, _ = zero.initialize(model=model, config=_config())
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    return losses, [name for name, _ in engine.stage3_hooks.plan.modules]


def test_units_can_be_named_by_module_or_class():
    ref_losses, _ = training.train_reference(2, STEPS, GAS, _config(),
                                             freeze_position_embedding=True, reuse_block=True)
    losses, units = run_distributed(_train_with_named_units, 2, timeout=240)[0]
    # a block holding marked modules is still a unit for the rest of it (its MLP; the
    # LayerNorms are persistent): the marked ones are units inside it
    assert units == ["", "blocks.0", "blocks.0.attn", "blocks.1", "blocks.1.attn",
                     "blocks.1.mlp"]
    assert losses == pytest.approx(ref_losses, rel=1e-5)


class _CoreWithoutExplicitFlush:
    """The engine's core, except that engine.backward's own finish_backward call does
    nothing: only the end-of-backward callback queued on autograd's engine can flush."""

    def __init__(self, core):
        self._core = core
        self.flushed_before_return = []

    def finish_backward(self, boundary):
        self.flushed_before_return.append(not self._core.backward_pending)

    def __getattr__(self, name):
        return getattr(self._core, name)


def _callback_flushes(rank, world):
    engine = _make(rank)
    proxy = _CoreWithoutExplicitFlush(engine._core)
    engine._core = proxy
    losses = training.train_engine(engine, rank, world, 3, GAS)
    return losses, proxy.flushed_before_return


def test_the_end_of_backward_callback_flushes_every_backward():
    ref_losses, _ = training.train_reference(2, 3, GAS, _config(),
                                             freeze_position_embedding=True, reuse_block=True)
    for losses, flushed in run_distributed(_callback_flushes, 2):
        assert flushed == [True] * (3 * GAS)
        assert losses == pytest.approx(ref_losses, rel=1e-5)


def _scale_loss_in_place(step, loss):
    loss *= 1.0  # the HF Trainer's `loss *= loss_scale` (trainer.py's compute_loss)
    return loss


def _train_scaling_in_place(rank, world):
    engine = _make(rank)
    return training.train_engine(engine, rank, world, 4, GAS, on_step=_scale_loss_in_place)


def test_a_units_output_can_be_modified_in_place():
    """The model's loss comes out of the root unit's backward hook; an in-place op on it
    raised ("a view of a function that returns multiple views") and must train as before."""
    ref_losses, _ = training.train_reference(2, 4, GAS, _config(), freeze_position_embedding=True,
                                             reuse_block=True)
    for losses in run_distributed(_train_scaling_in_place, 2):
        assert losses == pytest.approx(ref_losses, rel=1e-5)


def _load_bad_state(rank, world, bad_ranks, change):
    engine = _make(rank)
    before = training.make_model(freeze_position_embedding=True, reuse_block=True).state_dict()
    state = {k: v.clone() for k, v in before.items()}  # the engine's own start values
    if rank in bad_ranks:
        change(state)
    try:
        engine.load_module_state_dict(state)
    except RuntimeError as error:
        message = str(error)
    else:
        message = ""
    after = engine.module_state_dict()  # a gather: every rank is still in step; rank 0 keeps it
    return message, all(torch.equal(after[k], v) for k, v in before.items()) if rank == 0 \
        else not after


def _broadcastable_weight(state):
    state["blocks.0.mlp.0.weight"] = state["blocks.0.mlp.0.weight"][:1].clone()


def _missing_weight(state):
    del state["blocks.0.attn.qkv.weight"]


@pytest.mark.parametrize("change,bad_ranks,expected", [
    (_broadcastable_weight, (0, 1), "size mismatch for blocks.0.mlp.0.weight"),
    (_broadcastable_weight, (1,), "size mismatch for blocks.0.mlp.0.weight"),
    (_missing_weight, (0, 1), "missing keys ['blocks.0.attn.qkv.weight']"),
], ids=["shape", "shape-on-one-rank", "missing"])
def test_a_state_dict_the_model_cannot_take_is_refused_on_every_rank_before_loading(
        change, bad_ranks, expected):
    """A weight that would broadcast into its partitioned parameter (copy_ took it), or a
    missing one, is refused before any gather, on every rank, even when only one rank's state
    is wrong: nothing is loaded and the ranks stay in step."""
    results = run_distributed(_load_bad_state, 2, args=(bad_ranks, change), timeout=120)
    for message, unchanged in results:
        assert expected in message and "nothing was loaded" in message
        assert unchanged
    assert ("rank 1: " in results[0][0]) == (bad_ranks == (1,))  # rank 0 names the other


class _BlockWithSharedLayer(torch.nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.own, self.shared = torch.nn.Linear(16, 16), shared

    def forward(self, x):
        return torch.tanh(self.shared(self.own(x)))


class _SharedLayerNet(torch.nn.Module):
    """Two blocks that both hold (and run) one shared layer, as Zamba's hybrid layers share
    one transformer: the shared layer's parameters belong to one block's unit."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        shared = torch.nn.Linear(16, 16)
        self.blocks = torch.nn.ModuleList(_BlockWithSharedLayer(shared) for _ in range(2))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _shared_layer_data():
    generator = torch.Generator().manual_seed(3)
    return torch.randn(4, 8, 16, generator=generator), torch.randn(4, 8, 1, generator=generator)


def _train_shared_layer(rank, world):
    import zero

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = zero.initialize(model=_SharedLayerNet(), config=config)
    losses = []
    for x, y in zip(*_shared_layer_data()):
        loss = torch.nn.functional.mse_loss(engine(x[rank * 4:(rank + 1) * 4]),
                                            y[rank * 4:(rank + 1) * 4])
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def test_a_layer_shared_by_two_blocks_is_gathered_for_each():
    """Each block's unit gathers the unit owning the shared layer with it (a link), so both
    blocks run it whole; the model trains like single-process torch."""
    model = _SharedLayerNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    expected = []
    for x, y in zip(*_shared_layer_data()):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        expected.append(loss.item())
    for losses in run_distributed(_train_shared_layer, 2, timeout=120):
        assert losses == pytest.approx(expected, rel=1e-4)  # (Adam on two ranks' sums)
