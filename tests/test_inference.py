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


def _device_of(engine):
    return next(engine.parameters()).device


def test_the_engine_runs_the_models_own_forward_in_the_dtype_asked():
    model = _tiny()
    tokens = torch.randint(0, 64, (2, 16))
    expected = copy.deepcopy(model)(tokens)
    engine = deepspeed.init_inference(model, dtype=torch.float32)
    assert isinstance(engine, deepspeed.InferenceEngine) and engine.module is model
    assert engine.mp_group is None
    assert torch.equal(engine(tokens.to(_device_of(engine))).cpu(), expected)
    bf16 = deepspeed.init_inference(_tiny(), config={"dtype": "bf16"})  # DeepSpeed's spelling
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    default = deepspeed.init_inference(_tiny(), dtype="auto", keep_module_on_host="auto")
    assert {p.dtype for p in default.parameters()} == {torch.float16}  # DeepSpeed's default


def test_only_floating_point_tensors_are_cast_and_a_meta_model_is_refused():
    model = _tiny()
    model.register_buffer("rotary", torch.polar(torch.ones(4), torch.arange(4.0)))
    model.register_buffer("steps", torch.tensor([3]))
    engine = deepspeed.init_inference(model, dtype=torch.float16, keep_module_on_host=True)
    assert engine.module.rotary.dtype == torch.complex64  # DeepSpeed's .half() leaves them
    assert engine.module.steps.dtype == torch.int64
    assert _device_of(engine).type == "cpu"  # keep_module_on_host
    with torch.device("meta"):
        meta = _tiny()
    with pytest.raises(ValueError, match="load the weights into the model first"):
        deepspeed.init_inference(meta)


def _tensor_parallel(rank, world):
    """GPT-2 on every rank (the same weights), split over pairs of ranks by init_inference: its
    logits and greedy generation against the whole model's; a sampled generation after each
    rank seeded differently (the engine shares global rank 0's generator)."""
    from tp_models import hf_models

    model = dict(hf_models())["gpt2"]
    whole = copy.deepcopy(model)
    tokens = torch.randint(1, 64, (2, 3), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(100 + rank)
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": 2}, dtype=torch.float32,
                                      replace_with_kernel_inject=True)
    assert dist_size(engine.mp_group) == 2 and engine.config is model.config
    fc = model.transformer.h[0].mlp.c_fc.weight
    split = fc.shape != whole.transformer.h[0].mlp.c_fc.weight.shape
    whole.to(_device_of(engine))  # (a GPU's with CUDA: tests/test_cuda_engine.py)
    tokens = tokens.to(_device_of(engine))
    mask = torch.ones_like(tokens)
    with torch.no_grad():  # (8 positions: 3 given, 5 generated)
        error = (engine(tokens).logits - whole(tokens).logits).abs().max().item()
        greedy = engine.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False)
        whole_greedy = whole.generate(tokens, attention_mask=mask, max_new_tokens=5,
                                      do_sample=False)
        sampled = engine.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=True,
                                  top_k=0)
    return split, error, torch.equal(greedy, whole_greedy), sampled.cpu()


def dist_size(group):
    import torch.distributed as dist

    return dist.get_world_size(group)


def test_tensor_parallel_inference_is_the_whole_models():
    """4 ranks: two tensor-parallel pairs."""
    pytest.importorskip("transformers")
    ranks = run_distributed(_tensor_parallel, 4, timeout=180)
    for split, error, same_greedy, _ in ranks:
        assert split and error < 1e-5 and same_greedy
    for _, _, _, sampled in ranks[1:]:
        assert torch.equal(sampled, ranks[0][3])  # one sampling generator for every slice


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
    ("tensor_parallel", 2, "tensor_parallel must be a dict"),
    ("tensor_parallel", {"tp_size": 2.5}, "tp_size must be an integer >= 1"),
    ("zero", {"stage": 3}, "zero_optimization.stage 3"),
    ("keep_module_on_host", "yes", "keep_module_on_host must be true or false"),
])
def test_a_key_zero_cannot_honour_is_an_error_naming_it(key, value, message):
    with pytest.raises(ValueError, match=message):
        deepspeed.init_inference(_tiny(), **{key: value})


def _two_slices_on_one_rank(rank, world):
    with pytest.raises(ValueError, match="tensor 2 does not divide the world size 1"):
        deepspeed.init_inference(_tiny(), mp_size=2, dtype=torch.float32)  # DeepSpeed's old name
    with pytest.raises(ValueError, match="both the deprecated mp_size"):
        deepspeed.init_inference(_tiny(), mp_size=2, tensor_parallel={"tp_size": 2})


def test_a_tensor_parallel_size_the_world_cannot_hold_is_named():
    run_distributed(_two_slices_on_one_rank, 1)
