"""Sequence parallelism (DeepSpeed-Ulysses, `sequence_parallel_size`): each rank of a sequence
group holds 1/s of every sample's sequence and its attention trades sequence for heads with
all-to-alls (`deepspeed.sequence.layer.DistributedAttention`). Ranks of one group read the
same samples; ZeRO shards and averages over every rank. Checked (tests/deepspeed_ulysses'
model and runs): training at stages 0-3, with each rank's loss its piece's mean or the
Hugging Face Trainer's gathered loss, matches a single-process reference on whole sequences
(gradients and weights), on 2 ranks (one group) and 4 (two replicas); the groups from the
config or from DeepSpeed's parallel_state_sp as an mpu; against the real DeepSpeed 0.19.8:
equal at ZeRO-3, its stages 0-2 s times the gradient (they divide by w / s), and its
config-only groups leaving a group's ranks apart where zero's agree; the exchange alone; the
batch keys, the data loader, the getters and the refusals."""
import pytest
import torch
import torch.nn.functional as F

from deepspeed_reference import TESTS, cases_of
from distributed_harness import run_distributed

cases = cases_of("ulysses")
EXPECTED = f"{TESTS}/deepspeed_ulysses/expected.pt"


def reference(replicas: int) -> tuple[dict, dict]:
    """Whole sequences in one process: each replica's micro-batch's mean loss, averaged over
    replicas and accumulation steps; AdamW with the cases' clipping. The first step's
    gradients (before clipping) and the last weights."""
    net = cases.make_model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    data, first_grads = cases.samples(replicas), None
    for step in range(cases.STEPS):
        for micro in range(cases.GAS):
            for replica in range(replicas):
                tokens = data[step, micro, replica]
                logits = net(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, cases.VOCAB), tokens[:, 1:].reshape(-1))
                (loss / (cases.GAS * replicas)).backward()
        first_grads = first_grads or {n: p.grad.clone() for n, p in net.named_parameters()}
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return first_grads, {name: p.detach().clone() for name, p in net.named_parameters()}


def _train(rank, world, name):
    import torch.distributed as dist

    import zero
    import zero.compat.deepspeed as deepspeed
    from zero.compat.deepspeed.utils import groups

    engine, losses, grads = cases.train(deepspeed, name)
    with zero.GatheredParameters(list(engine.module.parameters())):
        weights = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
    answers = {"sp": groups._get_sequence_parallel_world_size(),
               "sp_rank": groups._get_sequence_parallel_rank(),
               "dp": groups._get_data_parallel_world_size(),
               "engine": (engine.sequence_parallel_size, engine.dp_world_size,
                          engine.seq_dp_world_size, engine.train_batch_size(),
                          engine.get_data_parallel_rank()),
               "group": dist.get_process_group_ranks(engine.get_sequence_parallel_group()),
               "reduced_in": engine.config.communication_data_type}
    return losses, grads, weights, answers


def _assert_close(actual: dict, expected: dict, what: str, tolerance: float, scale=1.0,
                  rtol=1e-4):
    for name, value in expected.items():
        assert torch.allclose(actual[name] * scale, value, atol=tolerance, rtol=rtol), \
            f"{what} of {name}: {(actual[name] * scale - value).abs().max().item():.3g} apart"


@pytest.mark.parametrize("name", ["stage0", "stage1", "stage2", "stage3", "stage3-gathered",
                                  "stage2-mesh"])
def test_one_sequence_group_trains_like_whole_sequences(name):
    results = run_distributed(_train, world_size=2, args=(name,), timeout=120)
    expected_grads, expected_weights = reference(1)
    for rank, (_, grads, weights, answers) in enumerate(results):
        _assert_close(grads, expected_grads, f"rank {rank}'s gradient", 1e-6)
        _assert_close(weights, expected_weights, f"rank {rank}'s weight", 2e-6)
        assert answers == {"sp": 2, "sp_rank": rank, "dp": 1, "group": [0, 1],
                           "engine": (2, 1, 2, cases.MICRO * cases.GAS, 0), "reduced_in": "fp32"}


@pytest.mark.parametrize("name", ["stage1", "stage3"])  # torch's gathered loss fails on gloo
def test_two_replicas_of_one_group_each(name):               # subgroups: the piece's mean
    results = run_distributed(_train, world_size=4, args=(name,), timeout=180)
    expected_grads, expected_weights = reference(2)
    for rank, (_, grads, weights, answers) in enumerate(results):
        _assert_close(grads, expected_grads, f"rank {rank}'s gradient", 1e-6)
        _assert_close(weights, expected_weights, f"rank {rank}'s weight", 2e-6)
        assert answers["group"] == [rank // 2 * 2, rank // 2 * 2 + 1]
        assert answers["engine"] == (2, 2, 4, 2 * cases.MICRO * cases.GAS, rank // 2)


@pytest.fixture(scope="module")
def deepspeed_runs():
    return torch.load(EXPECTED)


@pytest.mark.parametrize("name", ["stage3", "stage3-gathered", "stage3-bf16"])
def test_zero3_equals_deepspeed(name, deepspeed_runs):
    expected = deepspeed_runs[name]
    losses, grads, weights, _ = run_distributed(_train, world_size=2, args=(name,),
                                                timeout=120)[0]
    if name.endswith("bf16"):  # bf16 roundings apart; Adam moves a near-zero gradient's
        # element by +-lr whichever side it rounds to, so the weights are not compared
        _assert_close(grads, expected["grads"], "gradient", 1e-2, rtol=2 ** -7)
        assert losses == pytest.approx(expected["losses"], abs=5e-3)
        return
    _assert_close(grads, expected["grads"], "gradient", 1e-6)
    _assert_close(weights, expected["weights"], "weight", 2e-6)
    assert losses == pytest.approx(expected["losses"], abs=1e-6)


@pytest.mark.parametrize("name", ["stage0", "stage1", "stage2"])
def test_deepspeeds_stages_0_to_2_take_s_times_the_gradient(name, deepspeed_runs):
    """DeepSpeed's stages 0-2 divide the summed gradients by w / s, not w: s times what its
    ZeRO-3 and zero take (its own Ulysses test holds stages 1-2 only to a loose tolerance)."""
    _, grads, _, _ = run_distributed(_train, world_size=2, args=(name,), timeout=120)[0]
    _assert_close(grads, deepspeed_runs[name]["grads"], "gradient", 1e-6, scale=cases.SIZE)


def test_deepspeeds_config_only_groups_drift_apart(deepspeed_runs):
    """From sequence_parallel_size beside data_parallel_size DeepSpeed 0.19.8 shards and
    reduces over the data dimension alone: its two ranks end with other weights. zero's agree
    with each other and with the reference (test above, "stage2-mesh")."""
    run = deepspeed_runs["stage2-mesh"]
    apart = max((run["weights"][k] - run["rank1_weights"][k]).abs().max().item()
                for k in run["weights"])
    assert apart > 1e-3


def _exchange(rank, world, batch_dim):
    import torch.distributed as dist

    from zero.compat.deepspeed.sequence.layer import DistributedAttention

    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 8, 4, 3, requires_grad=True) for _ in range(3))  # [b, s, h, d]
    whole = cases.LocalAttention()(q, k, v)
    whole.backward(torch.ones_like(whole) * torch.arange(8.).view(1, 8, 1, 1))
    mine = slice(rank * 4, rank * 4 + 4)
    pieces = [t.detach()[:, mine].clone().requires_grad_() for t in (q, k, v)]
    if batch_dim == 1:  # [s, b, h, d]
        pieces = [p.detach().transpose(0, 1).clone().requires_grad_() for p in pieces]

    class SeqFirst(torch.nn.Module):
        def forward(self, q, k, v):
            return cases.LocalAttention()(*(t.transpose(0, 1) for t in (q, k, v))).transpose(0, 1)

    local = cases.LocalAttention() if batch_dim == 0 else SeqFirst()
    out = DistributedAttention(local, dist.group.WORLD, 2, 1 - batch_dim)(*pieces, batch_dim)
    weight = torch.arange(8.)[mine].view(1, 4, 1, 1)
    out.backward(torch.ones_like(out) * (weight if batch_dim == 0 else weight.transpose(0, 1)))
    back = (lambda t: t) if batch_dim == 0 else (lambda t: t.transpose(0, 1))
    return (back(out).detach(), whole.detach()[:, mine],
            [back(p.grad) for p in pieces], [t.grad[:, mine] for t in (q, k, v)])


def _uneven_heads(rank, world):
    import torch.distributed as dist

    from zero.parallel.ulysses import DistributedAttention

    attention = DistributedAttention(cases.LocalAttention(), dist.group.WORLD, 2, 1)
    q = torch.zeros(1, 4, 3, 2)  # 3 heads over 2 ranks
    try:
        attention(q, q, q, 0)
    except NotImplementedError as error:
        return str(error)


class _Attention(torch.nn.Module):  # here, not in cases (dynamo imports modules by name)
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                              is_causal=True).transpose(1, 2)


def _compiled(rank, world):
    import torch.distributed as dist

    from zero.compat.deepspeed.sequence.layer import DistributedAttention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 4, 3, requires_grad=True) for _ in range(3))
    attention = DistributedAttention(_Attention(), dist.group.WORLD, 2, 1)

    def loss(q, k, v):
        return (attention(q, k, v, 0) * torch.arange(12.).view(1, 1, 4, 3)).sum()

    grads = []
    for run in (loss, torch.compile(loss)):
        run(q, k, v).backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    return [(a - b).abs().max().item() for a, b in zip(*grads)] + \
        [min(g.abs().max().item() for g in grads[1])]


def test_the_exchange_compiles():
    """torch.compile of a loss through the exchange gives the eager gradients (DeepSpeed
    moved its exchange into a custom op because a compiled one once lost them)."""
    for *apart, smallest in run_distributed(_compiled, world_size=2, timeout=300):
        assert max(apart) < 1e-6 and smallest > 0


@pytest.mark.parametrize("batch_dim", [0, 1])
def test_the_exchange_is_attention_over_the_whole_sequence(batch_dim):
    for out, expected, grads, expected_grads in run_distributed(
            _exchange, world_size=2, args=(batch_dim,), timeout=60):
        assert torch.allclose(out, expected, atol=1e-6)
        for grad, expected_grad in zip(grads, expected_grads):
            assert torch.allclose(grad, expected_grad, atol=1e-6)


def _samples_read(rank, world):
    import zero

    config = {**cases.config(1), "sequence_parallel_size": 2}
    engine, _, loader, _ = zero.initialize(model=cases.make_model(), config=config,
                                           training_data=list(range(16)))
    return [int(x) for batch in loader for x in batch]


def test_a_groups_ranks_read_the_same_samples():
    read = run_distributed(_samples_read, world_size=4, timeout=60)
    assert read[0] == read[1] and read[2] == read[3]
    assert sorted(read[0] + read[2]) == list(range(16))


def _refused(rank, world, config):
    import zero

    try:
        zero.initialize(model=cases.make_model(), config=config)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("extra,words", [
    ({"sequence_parallel_size": 3}, ["sequence_parallel_size = 3 does not divide the world size 2",
                                     "[1, 2]"]),
    ({"sequence_parallel_size": 2, "communication_data_type": "bf16"},
     ["seq_parallel_communication_data_type to 'bf16'"]),
    ({"sequence_parallel_size": 2, "tensor_parallel": {"autotp_size": 2}},
     ["tensor parallelism (size 2) is not built"]),
    ({"sequence_parallel_size": 2, "data_parallel_size": 2}, ["data_parallel_size", "1"]),
])
def test_refusals_name_the_key_on_every_rank(extra, words):
    for message in run_distributed(_refused, world_size=2, args=({**cases.config(2), **extra},),
                                   timeout=60):
        assert message is not None and all(word in message for word in words), message


def test_the_exchange_refuses_what_it_does_not_build():
    from zero.parallel.ulysses import DistributedAttention, single_all_to_all

    with pytest.raises(NotImplementedError, match="sp_stream"):
        DistributedAttention(cases.LocalAttention(), None, sp_stream=object())
    with pytest.raises(ValueError, match="4-d"):
        single_all_to_all(torch.zeros(2, 3), 2, 1, 0, None)
    for message in run_distributed(_uneven_heads, world_size=2, timeout=60):
        assert "heads (3)" in message and "2 ranks" in message, message


def test_the_estimate_reads_a_sequence_parallel_config(tmp_path, capsys):
    """The batch keys count world / sequence replicas; the model states shard over every rank
    (the same per-rank bytes as without sequence parallelism)."""
    import json

    from zero.reports.cli import main

    def estimate(**extra):
        path = tmp_path / "ds_config.json"
        path.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                                    "gradient_accumulation_steps": 1,
                                    "zero_optimization": {"stage": 3}, **extra}))
        code = main(["estimate", "--params", "1000000", "--world-size", "4", "--config",
                     str(path), "--json"])
        captured = capsys.readouterr()
        return code, captured

    code, sequence = estimate(sequence_parallel_size=2)
    assert code == 0, sequence.err
    code, plain = estimate(train_batch_size=8)
    assert code == 0, plain.err
    assert json.loads(sequence.out)["options"] == json.loads(plain.out)["options"]
    code, wrong = estimate(sequence_parallel_size=2, train_batch_size=8)  # 4 ranks' batch
    assert code == 2 and "train_batch_size" in wrong.err
    # bf16 gradients reduced in fp32, as the engine reduces them under sequence parallelism
    code, bf16 = estimate(sequence_parallel_size=2, bf16={"enabled": True})
    code, fp32_sums = estimate(train_batch_size=8, bf16={"enabled": True},
                               communication_data_type="fp32")
    code, bf16_sums = estimate(train_batch_size=8, bf16={"enabled": True})
    assert json.loads(bf16.out)["options"] == json.loads(fp32_sums.out)["options"] != \
        json.loads(bf16_sums.out)["options"]
    code, conflict = estimate(sequence_parallel_size=2, communication_data_type="bf16")
    assert code == 2 and "seq_parallel_communication_data_type" in conflict.err


def _save_and_resume(rank, world, save_dir):
    import zero
    import zero.compat.deepspeed as deepspeed

    engine, _, _ = cases.train(deepspeed, "stage2")
    engine.save_checkpoint(save_dir, tag="sp")
    saved = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    plain, *_ = zero.initialize(model=cases.make_model(), config=cases.config(3))  # no groups
    plain.load_checkpoint(save_dir, tag="sp")
    with zero.GatheredParameters(list(plain.module.parameters())):
        loaded = {n: p.detach().clone() for n, p in plain.module.named_parameters()}
    return max((saved[n] - loaded[n]).abs().max().item() for n in saved), plain.global_steps


def test_a_checkpoint_of_a_sequence_parallel_run_loads_without_it(tmp_path):
    """ZeRO shards over every rank either way: a checkpoint saved with sequence groups resumes
    in an engine without them (here at stage 3)."""
    for apart, steps in run_distributed(_save_and_resume, world_size=2, args=(str(tmp_path),),
                                        timeout=120):
        assert apart == 0.0 and steps == cases.STEPS


class MegatronStyleMpu:
    """Megatron-DeepSpeed's parallel_state as DeepSpeed reads it: sequence groups of
    `sequence` consecutive ranks inside tensor groups of `tensor`, no
    initialize_sequence_parallel."""

    def __init__(self, sequence: int, tensor: int):
        import torch.distributed as dist

        world, rank = dist.get_world_size(), dist.get_rank()
        self.sequence, self.tensor = sequence, tensor

        def groups(partition):
            mine = None
            for ranks in partition:
                group = dist.new_group(ranks)
                mine = group if rank in ranks else mine
            return mine

        # rank = (data * sequence + s) * tensor + t
        span = sequence * tensor
        self.tp = groups([list(range(i, i + tensor)) for i in range(0, world, tensor)])
        self.sp = groups([[base + s * tensor + t for s in range(sequence)]
                          for base in range(0, world, span) for t in range(tensor)])
        self.seq_data = groups([list(range(t, world, tensor)) for t in range(tensor)])
        self.data = groups([[d * span + s * tensor + t for d in range(world // span)]
                            for s in range(sequence) for t in range(tensor)])
        for kind, group in (("sequence", self.sp), ("data", self.data), ("model", self.tp)):
            setattr(self, f"get_{kind}_parallel_group", lambda group=group: group)
            setattr(self, f"get_{kind}_parallel_rank", lambda group=group: dist.get_rank(group))
            setattr(self, f"get_{kind}_parallel_world_size",
                    lambda group=group: dist.get_world_size(group))
        self.get_sequence_data_parallel_group = lambda: self.seq_data


def _megatron(rank, world, tensor):
    import zero

    mpu = MegatronStyleMpu(sequence=2, tensor=tensor)
    try:
        engine, *_ = zero.initialize(model=cases.make_model(), config=cases.config(2), mpu=mpu)
    except ValueError as error:
        return str(error)
    return engine.sequence_parallel_size, engine.dp_world_size


def test_a_megatron_mpus_sequence_groups():
    """Without tensor parallelism they are zero's sequence groups; beside it (which zero does
    not build with sequence parallelism) a refusal, not ranks whose gradients stay apart."""
    assert run_distributed(_megatron, world_size=2, args=(1,), timeout=60) == [(2, 1)] * 2
    for message in run_distributed(_megatron, world_size=4, args=(2,), timeout=60):
        assert "sequence data parallel group is ranks" in message and "not built" in message


def _mesh(rank, world, mesh_param):
    import zero

    try:
        engine, *_ = zero.initialize(model=cases.make_model(), config=cases.config(2),
                                     mesh_param=mesh_param)
    except ValueError as error:
        return str(error)
    return engine.sequence_parallel_size, engine.dp_world_size


def test_initialize_takes_deepspeeds_mesh_param_and_argument_order():
    """deepspeed.initialize(..., mesh_param=(data, sequence)) makes the sequence groups;
    its arguments in DeepSpeed 0.19.8's order (distributed_port before mpu)."""
    import inspect

    import zero

    assert list(inspect.signature(zero.initialize).parameters) == [
        "args", "model", "optimizer", "model_parameters", "training_data", "lr_scheduler",
        "distributed_port", "mpu", "dist_init_required", "collate_fn", "config", "mesh_param",
        "config_params"]
    assert run_distributed(_mesh, world_size=2, args=((1, 2),), timeout=60) == [(2, 1)] * 2
    for message in run_distributed(_mesh, world_size=2, args=((2, 2),), timeout=60):
        assert "mesh_param=(2, 2)" in message and "world size 2" in message
