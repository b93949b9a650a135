"""deepspeed.init_inference (zero/inference.py): the model cast to the config's dtype and run
as it is, its linears split over tensor-parallel ranks by AutoTP with the whole model's
outputs and generations, DeepSpeed's config/kwargs merge, and a clear error for every key
whose value needs what is not built."""
import copy
import json

import pytest
import torch

import zero.compat.deepspeed as deepspeed
from distributed_harness import run_distributed
from zero.models.tiny_gpt import GPTConfig, TinyGPT

pytestmark = pytest.mark.timeout(120)


def _tiny():
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))


def test_the_engine_runs_the_models_own_forward_in_the_dtype_asked():
    model = _tiny()
    tokens = torch.randint(0, 64, (2, 16))
    expected = copy.deepcopy(model)(tokens)
    engine = deepspeed.init_inference(model, dtype=torch.float32)
    assert isinstance(engine, deepspeed.InferenceEngine) and engine.module is model
    assert torch.equal(engine(tokens), expected)
    half = deepspeed.init_inference(_tiny(), config={"dtype": "bf16"})  # DeepSpeed's spelling
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    default = deepspeed.init_inference(_tiny())
    assert {p.dtype for p in default.parameters()} == {torch.float16}  # DeepSpeed's default


def _tensor_parallel(rank, world):
    """GPT-2 on every rank (the same weights), split over the 2 ranks by init_inference: its
    logits and greedy generation against the whole model's; a sampled generation after each
    rank seeded differently (the engine shares rank 0's generator)."""
    from tp_models import hf_models

    model = dict(hf_models())["gpt2"]
    whole = copy.deepcopy(model)
    tokens = torch.randint(1, 64, (2, 3), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(100 + rank)
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": 2}, dtype=torch.float32,
                                      replace_with_kernel_inject=True)
    fc = model.transformer.h[0].mlp.c_fc.weight
    split = fc.shape != whole.transformer.h[0].mlp.c_fc.weight.shape
    mask = torch.ones_like(tokens)
    with torch.no_grad():  # (8 positions: 3 given, 5 generated)
        error = (engine(tokens).logits - whole(tokens).logits).abs().max().item()
        greedy = engine.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False)
        whole_greedy = whole.generate(tokens, attention_mask=mask, max_new_tokens=5,
                                      do_sample=False)
        sampled = engine.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=True,
                                  top_k=0)
    return split, error, torch.equal(greedy, whole_greedy), sampled


def test_tensor_parallel_inference_is_the_whole_models():
    pytest.importorskip("transformers")
    ranks = run_distributed(_tensor_parallel, 2)
    for split, error, same_greedy, _ in ranks:
        assert split and error < 1e-5 and same_greedy
    assert torch.equal(ranks[0][3], ranks[1][3])  # one sampling generator for both slices


def test_config_and_keyword_arguments_merge_as_deepspeeds(tmp_path):
    path = tmp_path / "inference.json"
    path.write_text(json.dumps({"dtype": "fp32", "max_tokens": 512}))
    engine = deepspeed.init_inference(_tiny(), config=str(path), keep_module_on_host=True)
    assert {p.dtype for p in engine.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="Conflicting argument 'dtype'"):
        deepspeed.init_inference(_tiny(), config={"dtype": "fp32"}, dtype=torch.float16)
    deepspeed.init_inference(_tiny(), config={"dtype": "fp32"}, dtype="fp32")  # the same: fine


@pytest.mark.parametrize("key,value,message", [
    ("enable_cuda_graph", True, "CUDA graphs are not built"),
    ("checkpoint", "ckpt.json", "load the weights into the model first"),
    ("dtype", torch.int8, "int8 quantization is not built"),
    ("moe", {"ep_size": 2}, "expert parallelism"),
    ("tensor_paralel", {"tp_size": 2}, "unknown init_inference key 'tensor_paralel'"),
    ("tensor_parallel", {"tp_sise": 2}, "unknown init_inference tensor_parallel key"),
])
def test_a_key_zero_cannot_honour_is_an_error_naming_it(key, value, message):
    with pytest.raises(ValueError, match=message):
        deepspeed.init_inference(_tiny(), **{key: value})


def test_tensor_parallel_without_a_process_group_says_what_to_call_first():
    with pytest.raises(RuntimeError, match="init_distributed"):
        deepspeed.init_inference(_tiny(), mp_size=2, dtype=torch.float32)  # DeepSpeed's old name
