"""The tests' FLOP reference beside torch.utils.flop_counter: torch's counter has no formula
for scaled_dot_product_attention on the CPU (its CUDA kernels only), so the reference counts
it by hand; zero's profiler must count it (TinyGPT uses it)."""
import torch


def _attention_by_hand(query, key, value, *args, out_shape=None, **kwargs):
    """Q K^T and the weights times V, 2 FLOPs a multiply-add: 4 b h s_q s_k d."""
    b, h, s_q, d = query
    return 4 * b * h * s_q * key[2] * d


# FlopCounterMode(custom_mapping=CPU_ATTENTION): the forward's FLOPs, attention included
CPU_ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_by_hand}
