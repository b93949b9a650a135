"""AutoEP, DeepSpeed's `expert_parallel` block (zero/moe/auto_ep.py, ep_experts.py,
ep_checkpoint.py): a Hugging Face Mixtral / Qwen2-MoE / Qwen3-MoE model's experts split over
autoep_size ranks train as the same model without AutoEP does, at ZeRO stages 0-3 (the
losses and weights equal to fp32 rounding: the same computation, the tokens travel), and as one
process holding every expert; its checkpoints resume at the same layout exactly and at any
autoep_size, stage or without AutoEP with every optimizer state as saved; zero_to_fp32 and
save_16bit_model write Hugging Face's own state dict; what is not built is refused on every
rank naming the key."""
import os

import pytest
import torch

import estimate_vs_report
from distributed_harness import run_distributed

transformers = pytest.importorskip("transformers")

STEPS, MICRO, SEQ, VOCAB = 3, 2, 8, 64
STAGE3 = {"stage3_param_persistence_threshold": 0, "stage3_model_persistence_threshold": 0,
          "stage3_gather_16bit_weights_on_model_save": True}


def _model(kind: str = "mixtral", experts: int = 4):
    """A tiny Hugging Face MoE model, the same weights on every rank: 2 layers of `experts`
    experts, top-2; the router's load-balancing loss in the loss."""
    from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig,
                              Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, num_experts_per_tok=2, max_position_embeddings=32,
                  output_router_logits=True, router_aux_loss_coef=0.02)
    if kind == "mixtral":
        return MixtralForCausalLM(MixtralConfig(intermediate_size=32,
                                                num_local_experts=experts, **common))
    if kind == "qwen3_moe":  # normalised top-k weights
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(moe_intermediate_size=32, num_experts=4,
                                                  norm_topk_prob=True, head_dim=8, **common))
    # qwen2_moe: a shared expert beside the routed ones, gated per token (no qkv bias: a key
    # bias's gradient is rounding noise, which Adam scales up to the learning rate)
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(moe_intermediate_size=32, num_experts=4,
                                              shared_expert_intermediate_size=24,
                                              qkv_bias=False, **common))


def _batch(rank: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, VOCAB, (MICRO, SEQ), generator=generator)


def _config(stage: int, autoep_size: int, **extra) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": stage, **(STAGE3 if stage == 3 else {})},
            "expert_parallel": {"enabled": autoep_size > 0, "autoep_size": max(autoep_size, 1)},
            **extra}


def _engine(rank, kind, stage, autoep_size, freeze=False, under_init=False, **extra):
    """`freeze`: the first layer's experts' down_proj frozen. `under_init`: the model built
    under zero.Init, as Hugging Face's from_pretrained builds it at ZeRO-3."""
    import contextlib

    import zero
    config = _config(stage, autoep_size, **extra)
    with zero.Init(config_dict_or_path=config) if under_init else contextlib.nullcontext():
        model = _model(kind)
    assert zero.init.is_partitioned(model.model.layers[0].mlp.experts.gate_up_proj) == under_init
    if freeze:
        model.model.layers[0].mlp.experts.down_proj.requires_grad_(False)
    engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(),
                                 config=config)
    return engine


def _steps(engine, rank, steps) -> list[float]:
    losses = []
    for step in steps:
        ids = _batch(rank, step)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _whole_weights(engine) -> dict:
    """Every parameter whole (AutoEP's experts gathered over the expert-parallel group)."""
    import zero
    from zero.moe import ep_checkpoint
    with zero.GatheredParameters(list(engine.module.parameters())):  # (stage 3)
        mine = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    return ep_checkpoint.gathered(engine.module, mine)


def _train(rank, world, kind, stage, autoep_size, under_init=False):
    engine = _engine(rank, kind, stage, autoep_size, under_init=under_init)
    if autoep_size:
        experts = engine.module.model.layers[0].mlp.experts
        assert getattr(experts.gate_up_proj, "ds_shape", experts.gate_up_proj.shape)[0] == \
            4 // autoep_size  # (ds_shape: stage 3's whole shape)
        assert engine.has_moe_layers and engine.num_experts == [4, 4]
    losses = _steps(engine, rank, range(STEPS))
    return losses, _whole_weights(engine)


def _reference(kind: str, world: int) -> tuple[list, dict]:
    """One process holding every expert, every rank's batch in turn (the gradients averaged,
    clipped by the whole model's norm)."""
    model = _model(kind)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        for rank in range(world):
            ids = _batch(rank, step)
            loss = model(input_ids=ids, labels=ids).loss
            (loss / world).backward()
            losses.append((rank, loss.item()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return ([[loss for r, loss in losses if r == rank] for rank in range(world)],
            {n: p.detach() for n, p in model.named_parameters()})


@pytest.mark.parametrize("kind, world, autoep_size, stage", [
    ("mixtral", 2, 2, 0), ("mixtral", 2, 2, 2), ("mixtral", 4, 2, 3),
    ("qwen3_moe", 2, 2, 1), ("qwen2_moe", 4, 4, 3)])
def test_trains_as_the_model_without_autoep(kind, world, autoep_size, stage):
    """4 ranks at autoep_size 2: each expert's gradient also reduced over its expert
    data-parallel group; autoep_size 4 on 4 ranks: each expert on one rank alone."""
    split = run_distributed(_train, world, args=(kind, stage, autoep_size), timeout=240)
    whole = run_distributed(_train, world, args=(kind, stage, 0), timeout=240)
    for rank, ((losses, weights), (want_losses, want)) in enumerate(zip(split, whole)):
        assert losses == pytest.approx(want_losses, abs=1e-6), rank
        for name, value in want.items():  # (an expert's gradient summed in another order:
            # one matmul over every rank's tokens, not a sum of the ranks' own; 1.5e-6 seen)
            torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=5e-6,
                                       msg=f"{name} on rank {rank}")
    losses, weights = _reference(kind, world)
    for rank, (found, _) in enumerate(split):  # (Adam's rounding: zero's fused kernel's)
        assert found == pytest.approx(losses[rank], abs=2e-4), rank
    for name, value in weights.items():
        torch.testing.assert_close(split[0][1][name], value, rtol=1e-3, atol=1e-4, msg=name)


def test_a_model_built_under_zero_init_trains_as_without_autoep():
    """Hugging Face's from_pretrained at ZeRO-3 builds the model under zero.Init: each
    expert weight arrives as this rank's 1/world shard, and AutoEP gathers it whole before
    keeping its rows (DeepSpeed's AutoEP gathers them too)."""
    split = run_distributed(_train, 2, args=("mixtral", 3, 2, True), timeout=240)
    whole = run_distributed(_train, 2, args=("mixtral", 3, 0), timeout=240)
    for rank, ((losses, weights), (want_losses, want)) in enumerate(zip(split, whole)):
        assert losses == pytest.approx(want_losses, abs=1e-6), rank
        for name, value in want.items():
            torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=5e-6,
                                       msg=f"{name} on rank {rank}")


# ---- checkpoints ---------------------------------------------------------------------------
def _states(engine) -> dict:
    """Each parameter's whole fp32 master and Adam moments (AutoEP's experts gathered)."""
    from zero.compat.deepspeed.utils import (safe_get_full_fp32_param,
                                             safe_get_full_optimizer_state)
    from zero.moe import ep_checkpoint
    arrays = {"master": safe_get_full_fp32_param,
              "exp_avg": lambda p: safe_get_full_optimizer_state(p, "exp_avg"),
              "exp_avg_sq": lambda p: safe_get_full_optimizer_state(p, "exp_avg_sq")}
    return {array: ep_checkpoint.gathered(engine.module, {
        n: read(p) for n, p in engine.module.named_parameters() if p.requires_grad})
        for array, read in arrays.items()}


def _save(rank, world, directory, stage):
    """(the saved states, the next 2 steps' losses, the model's state dict as Accelerate
    takes it at stages 0-2 for the Trainer's save_model: None at stage 3)."""
    from zero.compat.deepspeed.checkpoint.utils import clone_tensors_for_torch_save
    engine = _engine(rank, "mixtral", stage, 2)
    _steps(engine, rank, range(2))
    engine.save_checkpoint(directory, tag="two")
    engine.save_16bit_model(directory, "whole.bin")
    accelerate = clone_tensors_for_torch_save(engine.module.state_dict()) if stage < 3 else None
    return _states(engine), _steps(engine, rank, range(2, 4)), accelerate


def _load(rank, world, directory, stage, autoep_size):
    engine = _engine(rank, "mixtral", stage, autoep_size)
    engine.load_checkpoint(directory, tag="two")
    return _states(engine), _steps(engine, rank, range(2, 4))


@pytest.fixture(scope="module", params=[0, 2, 3], ids=["stage0", "stage2", "stage3"])
def saved(tmp_path_factory, request):
    """2 ranks at autoep_size 2, saved after 2 steps: (directory, stage, per rank what _save
    returns)."""
    directory = str(tmp_path_factory.mktemp(f"autoep{request.param}"))
    return directory, request.param, run_distributed(_save, 2, args=(directory, request.param),
                                                     timeout=240)


@pytest.mark.parametrize("autoep_size, other_stage", [(2, False), (1, False), (0, False),
                                                      (2, True)],
                         ids=["as-saved", "autoep1", "without-autoep", "other-stage"])
def test_a_checkpoint_resumes_at_any_autoep_size_and_stage(saved, autoep_size, other_stage):
    """Every master and moment as saved, bit for bit, and the next steps the saved run's
    (the same sums at any autoep_size)."""
    directory, stage, results = saved
    stage = (3 if stage != 3 else 1) if other_stage else stage
    loaded = run_distributed(_load, 2, args=(directory, stage, autoep_size), timeout=240)
    for rank, ((states, losses), (want_states, want_losses, _)) in enumerate(zip(loaded,
                                                                                 results)):
        assert losses == want_losses, rank
        for array, values in want_states.items():
            assert states[array].keys() == values.keys()
            for name, value in values.items():
                torch.testing.assert_close(states[array][name], value, rtol=0, atol=0,
                                           msg=f"{array} of {name} on rank {rank}")


def test_whole_model_saves_are_hugging_faces_state_dict(saved):
    """zero_to_fp32, save_16bit_model and, at stages 0-2, the module's state dict through
    clone_tensors_for_torch_save on every rank (Accelerate's get_state_dict for the
    Trainer's save_model; DeepSpeed's keeps each rank's rows there)."""
    from zero.checkpoint_export import get_fp32_state_dict_from_zero_checkpoint
    directory, stage, results = saved
    masters = results[0][0]["master"]
    fp32 = get_fp32_state_dict_from_zero_checkpoint(directory, tag="two")
    whole = torch.load(os.path.join(directory, "whole.bin"), weights_only=True)
    accelerate = [state for _, _, state in results if state is not None]
    assert len(accelerate) == (0 if stage == 3 else 2)
    for state in (fp32, whole, *accelerate):
        model = _model()
        model.load_state_dict(state)  # strict: every expert, Hugging Face's names and shapes
        for name, value in masters.items():
            torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)


def _whole_state_dict_on_rank_0_only(rank, world):
    """Rank 0 asks for the whole state dict; rank 1 goes on without it for 5 s."""
    import time

    from zero.compat.deepspeed.checkpoint.utils import clone_tensors_for_torch_save
    from zero.moe import ep_checkpoint
    engine = _engine(rank, "mixtral", 2, 2)
    if rank != 0:
        time.sleep(5)
        return None
    ep_checkpoint.JOIN_TIMEOUT_S = 2.0
    start = time.monotonic()
    try:
        clone_tensors_for_torch_save(engine.module.state_dict())
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return "no error", time.monotonic() - start


def test_a_whole_state_dict_asked_on_one_rank_only_names_the_fix_instead_of_hanging():
    message, seconds = run_distributed(_whole_state_dict_on_rank_0_only, 2, timeout=120)[0]
    assert "'model.layers.0.mlp.experts.gate_up_proj' holds this rank's 2 of 4 experts" \
        in message and "on every rank" in message and "save_16bit_model" in message
    assert seconds < 8


def _save_as(rank, world, directory, stage, autoep_size, freeze):
    engine = _engine(rank, "mixtral", stage, autoep_size, freeze=freeze)
    _steps(engine, rank, range(2))
    engine.save_checkpoint(directory, tag="two")
    engine.save_16bit_model(directory, "trainable.bin", exclude_frozen_parameters=True)
    return _states(engine), _steps(engine, rank, range(2, 4))


def _load_as(rank, world, directory, stage, autoep_size, freeze, data_before_expert):
    engine = _engine(rank, "mixtral", stage, autoep_size, freeze=freeze,
                     use_data_before_expert_parallelism=data_before_expert)
    engine.load_checkpoint(directory, tag="two")
    return _states(engine), _steps(engine, rank, range(2, 4))


@pytest.mark.parametrize("world, saved_as, loaded_as", [
    (2, (2, 0, False), (2, 2, False)),  # (stage, autoep_size, D + E)
    (4, (2, 4, False), (3, 2, True))], ids=["without-autoep-to-autoep2",
                                            "autoep4-to-autoep2-data-before-expert-stage3"])
def test_a_checkpoint_loads_across_autoep_layouts_with_frozen_experts(tmp_path, world, saved_as,
                                                                      loaded_as):
    """The first layer's experts' down_proj frozen (whole in the model file, no optimizer
    state); on 4 ranks "D + E" holds other experts on each rank than "E + D"."""
    directory = str(tmp_path)
    saved = run_distributed(_save_as, world, args=(directory, *saved_as[:2], True), timeout=240)
    loaded = run_distributed(_load_as, world, args=(directory, *loaded_as[:2], True,
                                                    loaded_as[2]), timeout=240)
    for rank, ((states, losses), (want_states, want_losses)) in enumerate(zip(loaded, saved)):
        assert losses == pytest.approx(want_losses, abs=1e-6), rank
        for array, values in want_states.items():
            assert states[array].keys() == values.keys()
            for name, value in values.items():
                torch.testing.assert_close(states[array][name], value, rtol=0, atol=0,
                                           msg=f"{array} of {name} on rank {rank}")
    trainable = torch.load(os.path.join(directory, "trainable.bin"), weights_only=True)
    assert "model.layers.0.mlp.experts.down_proj" not in trainable
    assert trainable["model.layers.1.mlp.experts.down_proj"].shape[0] == 4


class _Inverse:
    """A learning-rate factor with state, as transformers' schedules are (functools.partial
    objects): LambdaLR saves each group's `offset`, and loading puts it back."""

    def __init__(self, offset: float):
        self.offset = offset

    def __call__(self, step: int) -> float:
        return 1.0 / (self.offset + step)


def _lambda_lr(optimizer, first_offset: float):
    """Each group's factor its own: offsets first_offset, first_offset + 1, ..."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, [_Inverse(first_offset + g) for g in range(len(optimizer.param_groups))])


def _scheduled(rank, world, directory, autoep_size, load):
    """2 steps and a save, or a load and 2 steps, with a torch LambdaLR (saved group g's
    offset 1 + g; the loading run's own offsets 10 + g, which the load replaces): then each
    group's lr after each step."""
    import functools

    import zero
    model = _model()
    engine, *_ = zero.initialize(
        model=model, model_parameters=model.parameters(),
        lr_scheduler=functools.partial(_lambda_lr, first_offset=10 if load else 1),
        config=_config(2, autoep_size))
    if load:
        engine.load_checkpoint(directory, tag="two")
    lrs = []
    for step in range(2, 4) if load else range(2):
        _steps(engine, rank, [step])
        lrs.append([group["lr"] for group in engine.optimizer.param_groups])
    if not load:
        engine.save_checkpoint(directory, tag="two")
    return len(engine.optimizer.param_groups), lrs


@pytest.mark.parametrize("saved_as, loaded_as", [(0, 2), (2, 0)],
                         ids=["without-autoep-to-autoep2", "autoep2-to-without-autoep"])
def test_a_torch_scheduler_resumes_across_autoep_layouts(tmp_path, saved_as, loaded_as):
    """AutoEP's experts are an optimizer group of their own: the scheduler's per-group lists
    (base_lrs, _last_lr, lr_lambdas) are laid out as the new groups, each group's from the
    saved group its first parameter came from, the dense one (zero/scheduler_groups.py).
    Loaded as saved, torch's LambdaLR failed at the next step (zip() argument 2 is shorter
    than argument 1) or at the load (IndexError: an lr_lambdas entry past the groups)."""
    directory = str(tmp_path)
    saved = run_distributed(_scheduled, 2, args=(directory, saved_as, False), timeout=120)
    loaded = run_distributed(_scheduled, 2, args=(directory, loaded_as, True), timeout=120)
    (saved_groups, before), (groups, after) = saved[0], loaded[0]
    assert {saved_groups, groups} == {1, 2}  # (the layout change this is about)
    # LambdaLR after each step: the saved run's group g with offset 1 + g; after the load,
    # every group with the dense group's (saved group 0's) offset 1
    assert before == [pytest.approx([1e-2 / (1 + g + step) for g in range(saved_groups)],
                                    rel=1e-12) for step in (1, 2)]
    assert after == [pytest.approx([1e-2 / (1 + step)] * groups, rel=1e-12) for step in (3, 4)]
    assert loaded[1] == loaded[0]


# ---- memory: the estimate is what the engine holds ---------------------------------------
def _held(rank, world, config):
    import zero
    model = _model()
    engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(2):
        ids = _batch(rank, step)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        if step == 0:  # (the first backward's default launch order, as in test_moe.py)
            engine.core.registry().reset_peaks()
    found = estimate_vs_report.held(engine)
    engine.destroy()
    return found


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_estimate_is_what_each_rank_holds(stage):
    """zero-mem estimate with the config's expert_parallel block counts each rank's rows of
    the experts, their states sharded over world / autoep_size ranks."""
    from zero.reports import estimate as est
    config = _config(stage, 2)
    config["zero_optimization"]["reduce_bucket_size"] = 4000
    setup, _ = est.setup_from_config(config, world_size=2)
    shapes = est.shapes_from_module(_model(), expert_parallel=setup.expert_parallel)
    assert shapes.group_ep == (1, 2)
    estimate = est.estimate(shapes, setup, stage)
    results = run_distributed(_held, 2, args=(config,), timeout=120)
    estimate_vs_report.assert_held_as_estimated(estimate, results, stage)


# ---- refusals -----------------------------------------------------------------------------
def _refused(rank, world, expert_parallel, model_type=None, experts=4):
    import zero
    model = _model("mixtral", experts)
    if model_type:
        model.config.model_type = model_type
    config = _config(2, 0)
    config["expert_parallel"] = expert_parallel
    try:
        zero.initialize(model=model, model_parameters=model.parameters(), config=config)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("expert_parallel, model_type, experts, message", [
    ({"enabled": True, "autoep_size": 3}, None, 3, "autoep_size=3 does not divide the world of 2"),
    ({"enabled": True, "autoep_size": 2}, None, 3,
     "cannot split MoE block model.layers.0.mlp: its 3 experts do not split over "
     "expert_parallel.autoep_size=2"),
    ({"enabled": True, "autoep_size": 2, "moe_layer_pattern": r"model\.nothing"}, None, 4,
     "has no MoE block"),
    ({"enabled": True, "autoep_size": 2}, "llama_moe", 4, "no preset for model type 'llama_moe'"),
    ({"enabled": True, "autoep_size": 2, "route_norm": False}, None, 4,
     "expert_parallel.route_norm"),
    ({"enabled": True, "autoep_size": 2, "preset_model": "deepseek_v3"}, None, 4,
     "expert_parallel.preset_model"),
], ids=["world", "experts", "pattern", "model-type", "routing-key", "preset"])
def test_what_is_not_built_is_refused_on_every_rank(expert_parallel, model_type, experts,
                                                    message):
    errors = run_distributed(_refused, 2, args=(expert_parallel, model_type, experts),
                             timeout=120)
    assert all(error and message in error for error in errors), errors
