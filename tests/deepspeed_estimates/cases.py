"""DeepSpeed's model-states memory estimate functions, the calls both sides make: each case
is (module, function, arguments), "model" standing for `model()`'s module."""
import contextlib
import io

MODULES = {"stage3": "deepspeed.runtime.zero.stage3",
           "stage2": "deepspeed.runtime.zero.stage_1_and_2"}
CASES = [
    ("stage3", "estimate_zero3_model_states_mem_needs_all_live", ("model",),
     {"num_gpus_per_node": 2, "num_nodes": 1}),
    ("stage3", "estimate_zero3_model_states_mem_needs_all_cold", (3_000_000_000, 32_000_000),
     {"num_gpus_per_node": 8, "num_nodes": 2}),
    ("stage2", "estimate_zero2_model_states_mem_needs_all_live", ("model",),
     {"num_gpus_per_node": 1, "num_nodes": 1}),
    ("stage2", "estimate_zero2_model_states_mem_needs_all_cold", (7_000_000_000,),
     {"num_gpus_per_node": 4, "num_nodes": 1, "additional_buffer_factor": 1.0}),
]


def model():
    """A GPT of 124M parameters (GPT-2 small's sizes), a tied head."""
    from zero.models.tiny_gpt import GPTConfig, TinyGPT

    return TinyGPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12,
                             n_embd=768))


def printed(modules: dict, case) -> list[str]:
    """What one case prints, line by line; `modules`: "stage3"/"stage2" -> the module."""
    module, function, args, kwargs = case
    args = tuple(model() if a == "model" else a for a in args)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        getattr(modules[module], function)(*args, **kwargs)
    return out.getvalue().splitlines()
