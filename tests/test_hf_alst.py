"""Ulysses for Hugging Face models (DeepSpeed's ALST) on zero: an unmodified Trainer script with
`ParallelismConfig(sp_backend="deepspeed", sp_size=2)` (examples/huggingface/train_alst.py)
launched by `zero --num_procs 2` trains step for step like the same script in one process
without sequence parallelism; `UlyssesSPAttentionHF` in transformers' attention table gives
a Llama the logits and gradients of the whole sequence, also with fewer key/value heads than
ranks; `UlyssesSPDataLoaderAdapter` cuts batches as DeepSpeed's own test expects; the
refusals name the fix."""
import json
from pathlib import Path

import pytest
import torch

from distributed_harness import launcher_argv, run_distributed, run_job

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "huggingface"
SCRIPT = EXAMPLES / "train_alst.py"
ARGS = ["--max_steps", "6", "--per_device_train_batch_size", "1", "--logging_steps", "1",
        "--learning_rate", "3e-3", "--report_to", "none", "--disable_tqdm", "true"]


def steps(out) -> list[float]:
    """Each logged step's loss and gradient norm, in order."""
    history = json.loads((Path(out) / "log_history.json").read_text())["log_history"]
    return [value for entry in history if "loss" in entry
            for value in (entry["loss"], entry["grad_norm"])]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The script in one process, no sequence parallelism, no DeepSpeed config."""
    out = tmp_path_factory.mktemp("one")
    run_job([*launcher_argv(1, "--no_deepspeed_alias", SCRIPT), "--output_dir", out,
             "--use_cpu", "true", *ARGS], 240)
    return steps(out)


@pytest.mark.parametrize("stage", [2, 3])
def test_trainer_with_ulysses_trains_like_one_process(tmp_path, one_process, stage):
    """Each step takes one sample, cut over the two ranks (the Trainer's sampler order, the
    adapter handing the group rank 0's batch, then rank 1's), with the Trainer's gathered
    loss: the losses and gradient norms of the one-process run."""
    run_job(launcher_argv(2, SCRIPT, "--deepspeed", EXAMPLES / f"ds_zero{stage}.json",
                          "--sp_size", "2", "--output_dir", tmp_path, *ARGS), 240)
    ours = steps(tmp_path)
    assert len(ours) == 2 * 6
    assert ours == pytest.approx(one_process, rel=1e-5)


def _llama(kv_heads: int):
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=kv_heads, max_position_embeddings=16)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _attention(rank, world, kv_heads):
    from zero.compat.deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    model = _llama(kv_heads)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(12).expand(2, 12)
    whole = model(input_ids=tokens, position_ids=positions).logits
    whole.sum().backward()
    expected_grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    model.zero_grad()
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, 2)
    mine = slice(6 * rank, 6 * rank + 6)
    logits = model(input_ids=tokens[:, mine], position_ids=positions[:, mine]).logits
    logits.sum().backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    torch.distributed.all_reduce(grad)  # each rank's piece of the sequence's gradient
    groups = model.model.layers[0].self_attn.num_key_value_groups  # as the model set it
    return (mpu.get_sequence_parallel_world_size(), (logits - whole[:, mine]).abs().max().item(),
            (grad - expected_grad).abs().max().item(), groups == 4 // kv_heads)


@pytest.mark.parametrize("kv_heads", [2, 1])  # 1: each rank gets the one key/value head
def test_ulysses_attention_sees_the_whole_sequence(kv_heads):
    for size, logits_apart, grad_apart, groups_kept in run_distributed(
            _attention, world_size=2, args=(kv_heads,), timeout=120):
        assert size == 2 and logits_apart < 1e-5 and grad_apart < 1e-5 and groups_kept


def _adapter(rank, world):
    from zero.compat.deepspeed.runtime.sequence_parallel import parallel_state_sp
    from zero.compat.deepspeed.runtime.sequence_parallel.ulysses_sp import \
        UlyssesSPDataLoaderAdapter

    parallel_state_sp.initialize_sequence_parallel(world)
    ids = torch.tensor([[1, 10, 10, 10, 2, 2], [1, 20, 20, 20, 2, 2]])
    rows = [{"input_ids": i, "position_ids": torch.arange(6), "labels": i.clone()} for i in ids]
    loader = torch.utils.data.DataLoader(rows[rank:rank + 1], batch_size=1)  # a rank's own
    adapted = UlyssesSPDataLoaderAdapter(loader, sp_rank=rank, sp_world_size=world,
                                         sp_group=parallel_state_sp.get_sequence_parallel_group(),
                                         device="cpu")
    return len(adapted), [{k: v.tolist() for k, v in batch.items()} for batch in adapted]


def test_the_adapter_hands_each_rank_its_piece_of_each_batch():
    """DeepSpeed's own test's batches: rank 0 [1, 10, 10] / shift labels [10, 10, 10], rank 1
    [10, 2, 2] / [2, 2, -100]; then the second rank's batch the same way."""
    (length0, batches0), (length1, batches1) = run_distributed(_adapter, world_size=2,
                                                               timeout=60)
    assert length0 == length1 == 2
    assert batches0 == [
        {"input_ids": [[1, 10, 10]], "position_ids": [[0, 1, 2]], "shift_labels": [[10, 10, 10]]},
        {"input_ids": [[1, 20, 20]], "position_ids": [[0, 1, 2]], "shift_labels": [[20, 20, 20]]}]
    assert batches1 == [
        {"input_ids": [[10, 2, 2]], "position_ids": [[3, 4, 5]], "shift_labels": [[2, 2, -100]]},
        {"input_ids": [[20, 2, 2]], "position_ids": [[3, 4, 5]], "shift_labels": [[2, 2, -100]]}]


def _refused(rank, world, attention, configured):
    from zero.compat.deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    model = _llama(2)
    model.config._attn_implementation = configured
    try:
        UlyssesSPAttentionHF.register_with_transformers(model, attention, world, 1)
    except ValueError as error:
        return str(error)


@pytest.mark.parametrize("attention,configured,words", [
    ("eager", "eager", ["'eager' is not built", "use 'sdpa'"]),
    ("sdpa", "eager", ["does not match", "attn_implementation='eager'"]),
])
def test_refusals_name_the_fix(attention, configured, words):
    for message in run_distributed(_refused, world_size=2, args=(attention, configured),
                                   timeout=60):
        assert message is not None and all(word in message for word in words), message


def _retry(rank, world):
    """A refused registration makes no groups: the corrected call goes through."""
    from zero.compat.deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    model = _llama(2)
    try:
        UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, 1,
                                                        seq_length_is_variable=False)
    except ValueError as error:
        refused = str(error)
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, 1)
    return refused, mpu.get_sequence_parallel_world_size()


def test_a_refused_registration_can_be_corrected():
    for refused, size in run_distributed(_retry, world_size=2, timeout=60):
        assert "seq_length" in refused and size == 2
