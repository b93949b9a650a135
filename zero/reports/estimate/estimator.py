"""estimate(): one option, by the rules of its stage; estimate_all(): every option."""
from __future__ import annotations

from .errors import EstimateError
from .estimate_stage3 import estimate_stage3
from .estimate_stages_0_2 import estimate_stages_0_2
from .options import OPTIONS, Option, option_for
from .result import Estimate
from .shapes import ModelShapes, for_muon
from .training_setup import EXTERNAL, Setup

EXTERNAL_OFFLOAD = ("zero_optimization.offload_optimizer: an optimizer zero runs as torch's own "
                    "on the shards (a torch.optim type or a client's) is not offloaded; use Adam, "
                    "AdamW, Adagrad, Lion or SGD to offload")
QUANTIZED_FROZEN_ON_NVME = ("zero_optimization.zero_quantized_nontrainable_weights with "
                            "offload_param.device \"nvme\" is not supported: keep the frozen "
                            "shard in host memory (device \"cpu\") or set "
                            "zero_quantized_nontrainable_weights to false")

SIXTEEN_BIT_STAGE_0 = ("bf16.bf16_master_weights_and_grads (fp16.fp16_master_weights_and_grads) "
                       "is only supported with ZeRO stage 1, 2 or 3")
SIXTEEN_BIT_EXTERNAL = ("an optimizer zero does not build itself steps an fp32 master; set "
                        "bf16_master_weights_and_grads / fp16_master_weights_and_grads to false, "
                        "or use Adam, AdamW, Adagrad, Lion or SGD")


def estimate(shapes: ModelShapes, setup: Setup, option: Option | int = 0,
             reduce_bucket_size: int | None = None, overlap_comm: bool | None = None,
             strict: bool = True) -> Estimate:
    """Per-rank bytes by category for one option: an Option, or a stage number (then with the
    setup's offload devices, none by default). Parameters on NVMe that the engine would
    refuse to build (a unit above offload_param.buffer_size) raise an EstimateError naming
    the key; strict=False returns the row with `error` set instead (`runs` is False), as
    for a stage-3 live bound that is too small."""
    if isinstance(option, int):
        option = option_for(option, setup.offload_optimizer, setup.offload_param)
    if setup.optimizer == "muon":  # its groups: the matrices' (Muon) and the rest (Adam)
        shapes = for_muon(shapes)
    if shapes.group_ep is not None and setup.optimizer == "lamb":  # (the engine refuses it)
        raise EstimateError("optimizer LAMB with MoE layers is not built (zero.moe); use Adam")
    if option.stage == 3 and shapes.units is not None:
        result = estimate_stage3(shapes, setup, option, reduce_bucket_size, overlap_comm)
    else:  # stages 0-2, and stage 3 without gather units (a formula)
        result = estimate_stages_0_2(shapes, setup, option, reduce_bucket_size, overlap_comm)
    if setup.optimizer == EXTERNAL and option.offload_optimizer != "none":
        result.refused = EXTERNAL_OFFLOAD
    if setup.sixteen_bit_master and option.stage == 0:
        result.refused = SIXTEEN_BIT_STAGE_0
    if setup.sixteen_bit_master and setup.optimizer == EXTERNAL:
        result.refused = SIXTEEN_BIT_EXTERNAL
    result.refused = _device_only_refusal(setup, option) or result.refused
    if shapes.group_ep is not None and option.stage == 3:
        result.refused = _moe_stage3_refusal(setup, option) or result.refused
    if option.stage == 3 and option.offload_param == "nvme" and setup.quantized_nontrainable \
            and result.frozen_numel:
        result.refused = QUANTIZED_FROZEN_ON_NVME
    params = (result.offload or {}).get("param_nvme") or {}
    if strict and (result.refused or params.get("error")):
        raise EstimateError(f"{option.name}: {result.refused or params['error']}")
    return result


def _moe_stage3_refusal(setup: Setup, option: Option) -> str | None:
    """What the engine refuses with MoE layers at stage 3 (zero/moe/engine_layout.py)."""
    for key, on in (("mics_shard_size", setup.mics_shard_size > 0),
                    ("zero_hpz_partition_size", setup.hpz_partition_size > 1),
                    ("zero_quantized_weights", setup.quantized_weights),
                    ("zero_quantized_gradients", setup.quantized_gradients),
                    ("zero_quantized_nontrainable_weights", setup.quantized_nontrainable),
                    ("offload_param", option.offload_param != "none")):
        if on:
            return f"{key} with MoE layers at stage 3 is not built (zero.moe)"
    return None


def _device_only_refusal(setup: Setup, option: Option) -> str | None:
    """LAMB's and Muon's refusals, by the engine's rule (zero.optimizer.ON_DEVICE): a 16-bit
    master, or an offload they do not take."""
    from zero.optimizer import ON_DEVICE, offload_allowed

    if setup.optimizer not in ON_DEVICE:
        return None
    name, offload_rule, not_16_bit = ON_DEVICE[setup.optimizer]
    if setup.sixteen_bit_master:
        return (f"bf16_master_weights_and_grads / fp16_master_weights_and_grads with optimizer "
                f"{name}: {not_16_bit}; set them to false or use Adam")
    if not offload_allowed(setup.optimizer, option.offload_optimizer, setup.offload_ratio,
                           setup.delayed_update):
        return (f"zero_optimization.offload_optimizer with optimizer {name}: {offload_rule}; "
                "use Adam to offload")
    return None


def estimate_all(shapes: ModelShapes, setup: Setup) -> list[Estimate]:
    """Every option of OPTIONS: stages 0-3 and their offload variants as the engine builds
    them. A row the engine would refuse (parameters on NVMe with a unit above buffer_size)
    is listed with its `error`, as one whose live bound is too small: the table says so."""
    return [estimate(shapes, setup, option, strict=False) for option in OPTIONS]
