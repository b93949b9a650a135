"""Muon, DeepSpeed's "Muon" optimizer type (MuonWithAuxAdam), at every ZeRO stage: the
matrices (2+ dimensions, no "embed" or "lm_head" in the name) get Muon's momentum, the
Nesterov blend orthogonalized by Newton-Schulz over the *whole* matrix although ranks hold
slices of it, and a decoupled-decay step; the other parameters get Adam in groups of their
own. 2 ranks at stages 0-3 (and MiCS) train like a single-process reference; the engine's
per-matrix update equals DeepSpeed 0.19.8's muon_update bit for bit (tests/deepspeed_muon);
gradient clipping scales the updates (their norm is what DeepSpeed's ZeRO clips); the groups
and their settings follow DeepSpeed's split; a checkpoint resumes; the refusals are clear."""
import copy
import os

import pytest
import torch

import training
from distributed_harness import run_distributed

STEPS, GAS, WORLD = 5, 2, 2
MUON = {"type": "Muon", "params": {"lr": 0.02, "weight_decay": 0.1, "adam_lr": 3e-3}}
FIXTURE = os.path.join(os.path.dirname(__file__), "deepspeed_muon", "expected.pt")

# The Newton-Schulz dtypes (_C.DType names) of the engine runs here, whose ranks call
# training.cpu_without_onednn_fp16, and of their reference: gram in fp32 on any CPU.
NS_DTYPES = {"gram": "float32", "standard": "bfloat16"}


def _is_muon(name, param):
    return param.ndim >= 2 and "embed" not in name.lower() and "lm_head" not in name.lower()


def _hyper(method="gram"):
    from zero.boundary import optimizer_hyper

    group = {"lr": 0.02, "momentum": 0.95, "ns_method": method}
    return optimizer_hyper("muon", group, True)


def _orthogonalized(blend, method="gram", dtype=None):
    """The engine's update of one matrix from its blend (in `dtype`, a _C.DType, when given;
    else as the engine picks it on this machine)."""
    from zero import _C

    hyper = _hyper(method)
    if dtype is not None:
        hyper.ns_dtype = dtype
    return _C.muon_orthogonalized(blend.reshape(-1), list(blend.shape), hyper).view(blend.shape)


class ReferenceMuon(torch.optim.Optimizer):
    """MuonWithAuxAdam in one process: Muon's momentum, Nesterov blend and whole-matrix
    update (the engine's per-matrix function, held to DeepSpeed's by the fixture test) for the
    matrices; Adam (bias-corrected, decoupled decay) for the rest; gradient clipping by the
    norm of the updates and Adam's gradients together, as DeepSpeed's ZeRO clips them (with
    `zero_stage` 0 by the gradients' norm first, as DeepSpeed's engine does without ZeRO).
    `slices` > 1 orthogonalizes each matrix's row blocks apart instead (what a rank holding a
    slice would do without the gather)."""

    def __init__(self, groups, clip=None, slices=1, zero_stage=1, ns_dtypes=None):
        self.clip, self.slices, self.ns_dtypes = clip, slices, ns_dtypes or NS_DTYPES
        self.clips_gradients = zero_stage == 0
        super().__init__(groups, {})

    @torch.no_grad()
    def step(self):
        if self.clip and self.clips_gradients:
            torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]],
                                           self.clip)
        updates = {}
        for group in self.param_groups:
            for p in group["params"]:
                if group["use_muon"]:
                    updates[p] = self._muon_update(p, group)
                else:
                    updates[p] = p.grad.clone()
        coef = 1.0
        if self.clip and not self.clips_gradients:
            norm = torch.stack([u.norm() for u in updates.values()]).norm().item()
            coef = min(1.0, self.clip / (norm + 1e-6))
        for group in self.param_groups:
            for p in group["params"]:
                p.mul_(1 - group["lr"] * group["weight_decay"])
                if group["use_muon"]:
                    p.add_(updates[p], alpha=-group["lr"] * coef)
                else:
                    self._adam(p, updates[p] * coef, group)

    def _muon_update(self, p, group):
        from zero import _C

        state = self.state[p]
        if not state:
            state["momentum"] = torch.zeros_like(p)
        beta = group["momentum"]
        state["momentum"].lerp_(p.grad, 1 - beta)
        blend = p.grad.lerp(state["momentum"], beta)
        method = group["ns_method"]
        dtype = getattr(_C.DType, self.ns_dtypes[method])
        if self.slices == 1:
            return _orthogonalized(blend, method, dtype)
        rows = blend.shape[0] // self.slices
        return torch.cat([_orthogonalized(part, method, dtype) for part in blend.split(rows)])

    def _adam(self, p, grad, group):
        state = self.state[p]
        if not state:
            state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
        state["step"] += 1
        (beta1, beta2), t = group["betas"], state["step"]
        state["m"].lerp_(grad, 1 - beta1)
        state["v"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (state["v"] / (1 - beta2 ** t)).sqrt().add_(group["eps"])
        p.addcdiv_(state["m"], denom, value=-group["lr"] / (1 - beta1 ** t))


def _config(stage, precision="fp32", clip=1.0, **params):
    zero_extra = {"stage3_param_persistence_threshold": 10} if stage == 3 else {}
    config = training.engine_config(stage, gas=GAS, precision=precision, scheduler=False,
                                    clip=clip, **zero_extra)
    config["optimizer"] = copy.deepcopy(MUON)
    config["optimizer"]["params"].update(params)
    return config


def _reference_groups(model, params):
    """DeepSpeed's split of one group, with its settings (MuonWithAuxAdam's defaults under
    the config's)."""
    named = list(model.named_parameters())
    lr = params.get("lr")
    muon = {"params": [p for n, p in named if _is_muon(n, p)], "use_muon": True,
            "lr": params.get("muon_lr", lr or 0.02), "momentum": params.get("momentum", 0.95),
            "weight_decay": params.get("weight_decay", 0.0),
            "ns_method": params.get("ns_method", "gram")}
    adam = {"params": [p for n, p in named if not _is_muon(n, p)], "use_muon": False,
            "lr": params.get("adam_lr", lr or 3e-4),
            "betas": tuple(params.get("betas", (0.9, 0.95))),
            "eps": params.get("eps", 1e-10), "weight_decay": params.get("weight_decay", 0.0)}
    return [muon, adam]


def _reference(config, steps=STEPS, slices=1, ns_dtypes=None):
    model = training.make_model()
    optimizer = ReferenceMuon(_reference_groups(model, config["optimizer"]["params"]),
                              clip=config["gradient_clipping"], slices=slices,
                              zero_stage=config["zero_optimization"]["stage"],
                              ns_dtypes=ns_dtypes)
    losses = training.reference_steps(model, optimizer, training.batches(WORLD, steps, GAS),
                                      WORLD, steps, GAS)
    return losses, training.parameters_of(model)


def _engine(config):
    """A rank's engine of the test model, Newton-Schulz in NS_DTYPES on any CPU."""
    import zero

    training.cpu_without_onednn_fp16()
    return zero.initialize(model=training.make_model(), config=config)[0]


def _train(rank, world, config, steps=STEPS):
    import zero

    engine = _engine(config)
    losses = training.train_engine(engine, rank, world, steps, GAS)
    with zero.GatheredParameters(list(engine.module.parameters())):
        params = training.parameters_of(engine.module)
    groups = [{k: v for k, v in g.items() if k != "params"} | {"count": len(g["params"])}
              for g in engine.optimizer.param_groups]
    state = engine.memory_report()["categories"]["optimizer_state"]
    assert state["current"] == state["expected"] > 0  # one array for Muon's, two for Adam's
    engine.destroy()
    return losses, params, groups, state["current"]


@pytest.mark.parametrize("stage,extra", [(0, {}), (1, {}), (2, {}), (3, {}),
                                         (3, {"mics_shard_size": 1})],
                         ids=["stage0", "stage1", "stage2", "stage3", "stage3-MiCS"])
def test_every_stage_orthogonalizes_each_matrix_whole(stage, extra):
    config = _config(stage)
    config["zero_optimization"].update(extra)
    result = run_distributed(_train, WORLD, args=(config,), env={"LOCAL_WORLD_SIZE": "2"})[0]
    training.assert_run_matches(result, _reference(config))


def _gathered_blends(rank, world, config):
    engine = _engine(config)
    training.train_engine(engine, rank, world, 1, GAS)
    report = engine.memory_report()["categories"].get("other")
    muon_numel = engine.core.group_numel(0)  # the first group: Muon's matrices
    engine.destroy()
    return report, muon_numel


def test_the_gathered_blends_count_in_the_memory_report():
    """Each unit's blends gathered whole for Newton-Schulz are device memory the step holds:
    two units at a time ("other" in the report, none left after the step). The test model's
    two blocks are stage 3's two units of matrices, so the peak is all of them in fp32; at
    stage 0 nothing is gathered."""
    (other, muon_numel), _ = run_distributed(_gathered_blends, WORLD, args=(_config(3),))
    assert other["current"] == 0
    assert other["by_location"]["device"]["peak"] == other["peak"] == 4 * muon_numel
    (other, _), _ = run_distributed(_gathered_blends, WORLD, args=(_config(0),))
    assert other is None


def test_orthogonalizing_each_ranks_slice_alone_would_differ():
    """The check above can fail: the same run with each matrix orthogonalized in two row
    blocks (what a rank holding half of it would do without the gather) is another run."""
    config = _config(2)
    _, whole = _reference(config)
    _, halved = _reference(config, slices=2)
    names = [n for n, p in training.make_model().named_parameters() if _is_muon(n, p)]
    assert min(training.relative_error(halved[n], whole[n]) for n in names) > 1e-3


@pytest.mark.parametrize("stage", [0, 1])
def test_clipping_scales_the_updates_under_zero_and_the_gradients_without(stage):
    """A tight clip acts (the reference with another clip is another run). Under ZeRO the
    engine clips by the norm of Muon's updates and Adam's gradients, as DeepSpeed's ZeRO
    optimizers do; without ZeRO the gradients before Muon, as DeepSpeed's engine does (the
    two differ)."""
    config = _config(stage, clip=0.5)
    reference = _reference(config)
    unclipped = _reference(_config(stage, clip=0.0))
    assert max(training.relative_error(reference[1][n], v) for n, v in unclipped[1].items()) > 1e-3
    other = _reference(_config(1 - stage, clip=0.5))
    assert max(training.relative_error(reference[1][n], v) for n, v in other[1].items()) > 1e-3
    result = run_distributed(_train, WORLD, args=(config,))[0]
    training.assert_run_matches(result, reference)


def test_the_groups_follow_deepspeeds_split():
    """One group split into Muon's matrices and Adam's rest, named as DeepSpeed names them,
    each with its own settings: muon_lr / adam_lr over lr, the half's keys only."""
    config = _config(1, lr=0.05, muon_lr=0.01, momentum=0.9, ns_method="standard",
                     betas=[0.8, 0.9])
    _, _, groups, _ = run_distributed(_train, WORLD, args=(config,), kwargs={"steps": 1})[0]
    named = list(training.make_model().named_parameters())
    assert [g["name"] for g in groups] == ["muon-params", "adam-params"]
    assert groups[0]["count"] == sum(_is_muon(n, p) for n, p in named) == 8
    assert groups[1]["count"] == len(named) - 8
    muon, adam = groups
    assert (muon["lr"], muon["momentum"], muon["ns_method"]) == (0.01, 0.9, "standard")
    assert (adam["lr"], tuple(adam["betas"]), adam["eps"]) == (3e-3, (0.8, 0.9), 1e-10)
    assert "betas" not in groups[0] and "momentum" not in groups[1]


def test_the_standard_iteration_trains_like_the_reference():
    """"standard" iterates in bf16 (gram in fp16, or fp32 on a CPU without oneDNN fp16, as
    DeepSpeed picks): the reduced gradients' last bits (summed in another order than the
    reference's) show in the bf16 rounding, so the tolerance is bf16's."""
    from zero import _C

    standard, gram = _hyper("standard"), _hyper("gram")
    assert (standard.ns_method, standard.ns_dtype) == (_C.NsMethod.standard, _C.DType.bfloat16)
    fp16 = (torch.cuda.get_device_capability()[0] >= 7 if torch.cuda.is_available()
            else torch.ops.mkldnn._is_mkldnn_fp16_supported())
    assert (gram.ns_method, gram.ns_dtype) == (
        _C.NsMethod.gram, _C.DType.float16 if fp16 else _C.DType.float32)
    config = _config(2, ns_method="standard")
    result = run_distributed(_train, WORLD, args=(config,))[0]
    training.assert_run_matches(result, _reference(config), weight_tolerance=2e-3)


@pytest.mark.parametrize("stage,tolerance", [(0, 5e-2), (3, 1e-2)])
def test_bf16_tracks_the_fp32_reference(stage, tolerance):
    """bf16 weights and gradients, an fp32 master and momentum (at stage 0 too, where
    DeepSpeed asks for fp32 gradient accumulation). The matrices moved 3-6% from their start;
    they stay within 1% of the fp32 run at stage 3, where the clip scales the updates down,
    and within bf16's rounding of 5 full steps at stage 0 (2.9% seen, as AdamW's in bf16);
    the biases, which start at 0 and stay small, within 10%."""
    config = _config(stage, precision="bf16")
    losses, params, _, _ = run_distributed(_train, WORLD, args=(config,))[0]
    ref_losses, ref_params = _reference(_config(stage))
    assert losses == pytest.approx(ref_losses, rel=5e-4)
    named = dict(training.make_model().named_parameters())
    for name, expected in ref_params.items():
        limit = tolerance if _is_muon(name, named[name]) else 0.1
        assert training.relative_error(params[name], expected) < limit, name


def test_engine_update_equals_deepspeeds_muon_update():
    """DeepSpeed 0.19.8's muon_update (run by tests/deepspeed_muon/make.py on this CPU, where
    "gram" iterates in fp32 and "standard" in bf16, and gram in fp16 as on a GPU) on random
    matrices, wide, tall, square and batched: the engine's update from the same momentum and
    gradient is the same, bit for bit in 16 bits; in fp32 within 2e-6 (relative norm), as
    CPUs of other kinds run fp32 matrix products with other kernels (8.8e-7 seen on an
    AVX512-FP16 Xeon against the recording's machine, 2026-12-01)."""
    from zero import _C

    cases = torch.load(FIXTURE)
    assert len(cases) == 12
    dtypes = {"gram": _C.DType.float32, "standard": _C.DType.bfloat16,  # the fixture's
              "gram-fp16": _C.DType.float16}
    for (shape, method), (grad, momentum, expected_update, expected_momentum) in cases.items():
        m = momentum.clone()
        m.lerp_(grad, 1 - 0.95)
        assert torch.equal(m, expected_momentum)
        update = _orthogonalized(grad.lerp(m, 0.95), method.split("-")[0], dtypes[method])
        if method == "gram":
            assert training.relative_error(update, expected_update) < 2e-6, (shape, method)
        else:
            assert torch.equal(update, expected_update), (shape, method)


def test_a_convolution_is_orthogonalized_as_its_flattened_matrix():
    """A 4-d weight is [out, in * kh * kw] to Newton-Schulz (DeepSpeed 0.19.8 fails on it)."""
    blend = torch.randn(6, 4, 3, 3)
    flat = _orthogonalized(blend.reshape(6, 36))
    assert torch.equal(_orthogonalized(blend), flat.view(6, 4, 3, 3))
    singular = torch.linalg.svdvals(flat.double())
    assert 0.5 < singular.min() and singular.max() < 1.5  # near-orthogonal rows


def test_a_checkpoint_resumes_the_momentum(tmp_path):
    config = _config(2)
    straight = run_distributed(_train, WORLD, args=(config,), kwargs={"steps": 4})[0]
    save = str(tmp_path / "ckpt")
    first = run_distributed(_resume, WORLD, args=(config, 0, 2, None, save))[0]
    second = run_distributed(_resume, WORLD, args=(_config(3), 2, 2, save, None))[0]
    assert first + second == pytest.approx(straight[0], rel=1e-6)


def _resume(rank, world, config, first, steps, load_dir, save_dir):
    engine = _engine(config)
    return training.load_train_save(engine, rank, world, GAS, first, steps, load_dir, save_dir)


@pytest.mark.parametrize("stage,persistence", [(0, 10), (1, 10), (2, 10), (3, 10), (3, 200)],
                         ids=["stage0", "stage1", "stage2", "stage3", "stage3-persistent"])
def test_the_estimate_counts_what_the_engine_keeps(stage, persistence):
    """zero-mem's estimate of optimizer_state from the model: one array (the momentum) per
    element of Muon's matrices, two (Adam's moments) per element of the rest, each group
    padded as the engine pads it (at stage 3 the small parameters kept whole too): the
    engine's own count, byte for byte."""
    from zero.reports import estimate as est

    config = _config(stage)
    if stage == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = persistence
    setup, _ = est.setup_from_config(config, world_size=WORLD)
    shapes = est.shapes_from_factory(training.__file__ + ":make_model")
    row = est.estimate(shapes, setup, stage).categories["optimizer_state"]
    assert setup.optimizer == "muon"
    assert row["formula"] == ("4Ψm + 8Ψa" if stage == 0 else "4Ψm/N + 8Ψa/N + 8Ψap/N"
                              if persistence == 200 else "4Ψm/N + 8Ψa/N")
    engine_bytes = run_distributed(_train, WORLD, args=(config,), kwargs={"steps": 1})[0][3]
    assert row["bytes"] == engine_bytes
    with pytest.raises(est.EstimateError, match="describe the model with --model"):
        est.estimate(est.shapes_from_count(10_000), setup, stage)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_momentum_offloaded_to_host_memory(stage):
    """offload_optimizer "cpu" (ZeRO-Offload): the master, Adam's moments and Muon's momentum
    in host memory, the momentum read and written back around each unit's transform: the
    same run as on the device, bit for bit, and the reference's; the estimate counts the
    offloaded state, in host memory, as the engine does."""
    from zero.reports import estimate as est

    config = _config(stage)
    offloaded = copy.deepcopy(config)
    offloaded["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    on_device = run_distributed(_train, WORLD, args=(config,))[0]
    result = run_distributed(_train, WORLD, args=(offloaded,))[0]
    assert result[0] == on_device[0]
    for name, value in on_device[1].items():
        assert torch.equal(result[1][name], value), name
    training.assert_run_matches(result, _reference(config))
    setup, _ = est.setup_from_config(offloaded, world_size=WORLD)
    shapes = est.shapes_from_factory(training.__file__ + ":make_model")
    row = est.estimate(shapes, setup, est.option_for(stage, "cpu", "none"))
    assert row.categories["optimizer_state"]["by_location"] == {"host": result[3]}


def _build(rank, world, config):
    import zero

    zero.initialize(model=training.make_model(), config=config)


@pytest.mark.parametrize("change,message", [
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                              "delayed_update": True}}},
     r"delayed_update true\) with optimizer Muon"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
     r"ratio 0.5, .* with optimizer Muon: zero offloads Muon's momentum to host memory only"),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}},
     "bf16.bf16_master_weights_and_grads with optimizer Muon"),
])
def test_what_muon_does_not_do_is_refused_on_every_rank(change, message):
    config = _config(2)
    config.update(change)
    with pytest.raises(AssertionError, match=message):  # RankFailed, naming the key
        run_distributed(_build, WORLD, args=(config,), timeout=60)


@pytest.mark.parametrize("params,message", [
    ({"per_head_muon": True}, "optimizer.params.per_head_muon"),
    ({"ns_method": "quintic"}, "optimizer.params.ns_method"),
    ({"momentum": 1.5}, "optimizer.params.momentum"),
])
def test_config_errors_name_the_key(params, message):
    from zero.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config({"train_micro_batch_size_per_gpu": 1,
                     "optimizer": {"type": "muon", "params": params}}, world_size=1)


PIPE_STEPS, PIPE_MICRO, PIPE_GAS = 3, 2, 2


def _pipe_layers():
    """Stage 0: two LayerNorms (no matrix: Adam only); stage 1: two Linear layers."""
    torch.manual_seed(5)
    return [torch.nn.LayerNorm(16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 16),
            torch.nn.Linear(16, 4)]


def _pipe_data():
    torch.manual_seed(6)
    count = PIPE_STEPS * PIPE_GAS * 2
    return [(torch.randn(PIPE_MICRO, 16), torch.randint(0, 4, (PIPE_MICRO,)))
            for _ in range(count)]


def _pipe_config():
    return {"train_micro_batch_size_per_gpu": PIPE_MICRO, "gradient_clipping": 0.5,
            "gradient_accumulation_steps": PIPE_GAS,
            "optimizer": {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3}},
            "zero_optimization": {"stage": 1}}


def _pipe_train(rank, world):
    import zero.compat.deepspeed as deepspeed

    training.cpu_without_onednn_fp16()
    module = deepspeed.pipe.PipelineModule(layers=_pipe_layers(), num_stages=2,
                                           loss_fn=torch.nn.functional.cross_entropy,
                                           partition_method="uniform")
    engine, _, _, _ = deepspeed.initialize(model=module, config=_pipe_config())
    d = engine.grid.get_data_parallel_id()
    batches = _pipe_data()
    mine = iter([batches[(s * PIPE_GAS + k) * 2 + d]
                 for s in range(PIPE_STEPS) for k in range(PIPE_GAS)])
    losses = [engine.train_batch(mine).item() for _ in range(PIPE_STEPS)]
    uses_muon = any(g["use_muon"] for g in engine.optimizer.param_groups)
    return losses, engine.grid.get_stage_id(), uses_muon


def test_a_pipeline_stage_without_matrices_steps_with_the_others():
    """2 stages x 2 data ranks, stage 0 holding no matrix (Adam alone): every stage takes the
    norm of Muon's updates together (no rank waits on another's extra collective), and the
    run is the single-process reference's."""
    results = run_distributed(_pipe_train, 4, timeout=120)
    assert {(stage, muon) for _, stage, muon in results} == {(0, False), (1, True)}
    model = torch.nn.Sequential(*_pipe_layers())
    named = list(model.named_parameters())
    groups = [{"params": [p for _, p in named if p.ndim >= 2], "use_muon": True, "lr": 0.02,
               "momentum": 0.95, "weight_decay": 0.0, "ns_method": "gram"},
              {"params": [p for _, p in named if p.ndim < 2], "use_muon": False, "lr": 3e-3,
               "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}]
    optimizer = ReferenceMuon(groups, clip=0.5)
    batches, losses = _pipe_data(), []
    for step in range(PIPE_STEPS):
        optimizer.zero_grad()
        total = 0.0
        for k in range(PIPE_GAS):
            parts = [batches[(step * PIPE_GAS + k) * 2 + d] for d in range(2)]
            loss = torch.nn.functional.cross_entropy(model(torch.cat([p[0] for p in parts])),
                                                     torch.cat([p[1] for p in parts]))
            (loss / PIPE_GAS).backward()
            total += loss.item()
        optimizer.step()
        losses.append(total / PIPE_GAS)
    for result in results:
        assert result[0] == pytest.approx(losses, rel=1e-5)
    assert losses[-1] < losses[0]


def _save_and_convert(rank, world, config, save_dir):
    engine = _engine(config)
    training.load_train_save(engine, rank, world, GAS, 0, 2, None, save_dir)


def test_a_universal_checkpoint_resumes_each_groups_arrays(tmp_path):
    """zero's checkpoint converted to DeepSpeed's universal form (Muon's parameters with
    momentum_buffer.pt, Adam's with exp_avg.pt and exp_avg_sq.pt) loads at another stage
    with its optimizer state and continues the straight run."""
    from zero.checkpoint_to_universal import convert

    straight = run_distributed(_train, WORLD, args=(_config(2),), kwargs={"steps": 4})[0]
    save = str(tmp_path / "ckpt")
    run_distributed(_save_and_convert, WORLD, args=(_config(2), save))
    tag = open(os.path.join(save, "latest")).read().strip()
    universal = os.path.join(str(tmp_path / "universal"), f"{tag}_universal")
    convert(os.path.join(save, tag), universal)
    root = os.path.join(universal, "zero")
    saved = {n: sorted(os.listdir(os.path.join(root, n))) for n in os.listdir(root)
             if os.path.isdir(os.path.join(root, n))}
    assert saved["blocks.0.mlp.0.weight"] == ["fp32.pt", "momentum_buffer.pt", "step.pt"]
    assert saved["blocks.0.ln1.bias"] == ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"]
    config = _config(3)
    config["checkpoint"] = {"load_universal": True}
    resumed = run_distributed(_resume, WORLD, args=(config, 2, 2, str(tmp_path / "universal"),
                                                     None))[0]
    assert resumed == pytest.approx(straight[0][2:], rel=1e-6)
