"""Check a raw config dict against the schema and resolve it to plain values.

The validator walks the schema (``schema.py``), never stops at the first
problem, and reports every error together in one ``ConfigError``, one line per
error, each line starting with the full key path::

    zero_optimization.reduce_bucket_sise = 200000: unknown key; did you mean 'reduce_bucket_size'?

Two passes:

1. ``_Validator.block`` checks each key on its own (known? right type? in
   range? supported?) and fills in defaults. A key that fails resolves to
   ``INVALID`` so later checks can skip it instead of piling up follow-on errors.
2. The ``_resolve_*`` / ``_check_*`` functions handle rules that span keys: the
   batch-size trio, fp16 vs bf16, stage-dependent ZeRO rules and the values
   DeepSpeed computes from other keys (overlap_comm, Adam's weight_decay, ...).

The result is a nested dict of resolved values (supported keys only), turned
into frozen dataclasses by ``model.build``.
"""

import difflib
import json
import logging
import math
import os
from collections.abc import Mapping

from . import schema
from .schema import BETAS, BLOCK, BOOL, CHOICE, FLOAT, INT, PARAMS, SECTION, STR, STRINGS, RENAMED

logger = logging.getLogger("zero")
# Integer keys whose null means "never", where +Infinity means the same (Accelerate's
# DeepSpeedPlugin always writes "steps_per_print": inf).
INFINITY_MEANS_NEVER = ("steps_per_print",)


class ConfigError(ValueError):
    """The config is invalid. ``errors`` holds one message per problem."""

    def __init__(self, errors, source=None):
        self.errors = (errors,) if isinstance(errors, str) else tuple(errors)
        self.source = source
        where = f" {source}" if source else ""
        count = len(self.errors)
        header = f"invalid zero config{where}: {count} error{'' if count == 1 else 's'}"
        super().__init__("\n".join([header] + [f"  {line}" for line in self.errors]))


class _Sentinel:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


INVALID = _Sentinel("INVALID")  # value of a key that failed validation
MISSING = _Sentinel("MISSING")  # "no value to show" in an error message


# --------------------------------------------------------------------------- small helpers


def _join(path, name):
    return f"{path}.{name}" if path else str(name)


def format_number(value):
    """Numbers the way configs write them: 500000000.0 -> 5e8, 1e-08 -> 1e-8, ints unchanged."""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e4:
        mantissa, exponent = f"{value:e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        if len(mantissa) <= 4:
            return f"{mantissa}e{int(exponent)}"
    text = repr(value)
    if isinstance(value, float) and "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def _show(value, limit=60):
    """A value as the user wrote it in JSON, shortened for messages."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format_number(value)
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _same(a, b):
    """Equality that does not confuse true with 1."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _type_name(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def _looks_numeric(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def _describe_range(key):
    parts = []
    if key.minimum is not None:
        parts.append(f"{'>' if key.minimum_exclusive else '>='} {_show(key.minimum)}")
    if key.maximum is not None:
        parts.append(f"{'<' if key.maximum_exclusive else '<='} {_show(key.maximum)}")
    return " and ".join(parts)


def _in_range(key, number):
    if key.minimum is not None:
        if number < key.minimum or (key.minimum_exclusive and number == key.minimum):
            return False
    if key.maximum is not None:
        if number > key.maximum or (key.maximum_exclusive and number == key.maximum):
            return False
    return True


def _falsy(value):
    return value is None or value is False or (not isinstance(value, bool) and value in (0, "", [], {}))


def _section_is_inert(value):
    """An unsupported section is harmless when it is empty, disabled, or all-off."""
    if value is None:
        return True
    if not isinstance(value, Mapping):
        return False
    return value.get("enabled") is False or all(_falsy(v) for v in value.values())


def _key_homes():
    """key name -> the block paths that declare it (for "belongs under ..." hints)."""
    homes = {}
    for block in schema.iter_blocks():
        for name in block.names:
            paths = homes.setdefault(name, [])
            if block.path not in paths:
                paths.append(block.path)
    return homes


_HOMES = _key_homes()


def _where(path):
    return path if path else "the top level"


# --------------------------------------------------------------------------- pass 1: key by key


class _Validator:
    def __init__(self, features):
        self.features = frozenset(features)
        self.errors = []
        self.listed_auto_keys = False  # the list of "auto" keys is printed once per report
        self.dotted = []  # top-level keys naming a nested one ("zero_optimization.stage")

    def error(self, path, value, problem, fix=None):
        shown = "" if value is MISSING else f" = {_show(value)}"
        self.errors.append(f"{path}{shown}: {problem}" + (f"; {fix}" if fix else ""))

    # ---- objects

    def block(self, block, raw, path):
        """Validate the object `raw` against `block`; return {name: resolved value} of supported keys."""
        for name, value in raw.items():
            if not isinstance(name, str) or block.get(name) is None:
                self.unknown(block, path, name, value)
        values = {}
        for key in block.keys:
            if key.kind != PARAMS:
                values[key.name] = self.key(key, raw, path)
        for key in block.keys:  # params last: their schema depends on the resolved "type"
            if key.kind == PARAMS:
                values[key.name] = self.params(key, raw.get(key.name), values.get("type"), _join(path, key.name))
        return {key.name: values[key.name] for key in block.keys if key.supported}

    def key(self, key, raw, path):
        key_path = _join(path, key.name)
        if key.name in raw:
            return self.value(key, raw[key.name], key_path)
        if key.required:
            self.error(key_path, MISSING, "required key is missing")
            return INVALID
        return self.default(key, key_path)

    def default(self, key, path):
        if key.kind == BLOCK and key.supported and key.default is not None:
            return self.block(key.block, key.default, path)
        return key.default

    def params(self, key, raw, type_value, path):
        if type_value is INVALID:
            return INVALID  # the type error is already reported; the params schema is unknown
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            self.error(path, raw, f"expected an object, got {_type_name(raw)}")
            return INVALID
        return self.block(key.variants[type_value], raw, path)

    def unknown(self, block, path, name, value):
        full = _join(path, name)
        if not isinstance(name, str):
            self.error(full, value, "keys must be strings")
        elif not path and "." in name and block.get(name.split(".")[0]) is not None:
            self.dotted.append(name)  # TRL's prepare_deepspeed writes these
        elif full in RENAMED:
            self.error(full, value, "not accepted under this name", RENAMED[full])
        else:
            self.error(full, value, "unknown key", self.unknown_key_fix(block, name))

    def unknown_key_fix(self, block, name):
        valid_here = "valid keys here: " + ", ".join(block.names) if len(block.keys) <= 15 else \
            f"see docs/CONFIG.md for the keys of {_where(block.path)}"
        homes = _HOMES.get(name, [])
        elsewhere = [home for home in homes if home != block.path]
        if elsewhere:
            return "this key belongs under " + " or ".join(_where(home) for home in elsewhere)
        if homes:  # declared at this path, but for another "type" (e.g. Adam's betas under SGD)
            return f"not a parameter of this type; {valid_here}"
        close = difflib.get_close_matches(name, block.names, n=1, cutoff=0.7)
        if close:
            return f"did you mean '{close[0]}'?"
        other_blocks = {n: [h for h in hs if h != block.path] for n, hs in _HOMES.items()}
        close = difflib.get_close_matches(name, [n for n, hs in other_blocks.items() if hs], n=1, cutoff=0.8)
        if close:
            return f"did you mean '{_join(other_blocks[close[0]][0], close[0])}'?"
        return valid_here

    # ---- single values

    def value(self, key, value, path):
        if not key.supported:
            return self.unsupported(key, value, path)
        if isinstance(value, str) and value == "auto":
            return self.auto(key, path)
        if value is None:
            if key.nullable:
                return self.default(key, path) if key.kind == BLOCK else None
            self.error(path, value, f"null is not allowed; expected {self.expected(key)}")
            return INVALID
        checker = {BOOL: self.check_bool, INT: self.check_int, FLOAT: self.check_float, STR: self.check_str,
                   CHOICE: self.check_choice, BETAS: self.check_betas, BLOCK: self.check_block,
                   STRINGS: self.check_strings}[key.kind]
        resolved = checker(key, value, path)
        if resolved is INVALID or not self.feature_enabled(key, resolved, path):
            return INVALID
        return resolved

    def expected(self, key):
        return {BOOL: "true or false", INT: "an integer", FLOAT: "a number", STR: "a string",
                CHOICE: "one of " + ", ".join(_show(c) for c in key.choices),
                BETAS: "[beta1, beta2]", BLOCK: "an object",
                STRINGS: "a list of strings" + (" from " + ", ".join(_show(c) for c in key.choices)
                                                if key.choices else "")}[key.kind]

    def wrong_type(self, key, value, path):
        fix = None
        if isinstance(value, str) and key.kind in (INT, FLOAT) and _looks_numeric(value):
            fix = f"write the number without quotes: {value}"
        elif isinstance(value, str) and key.kind == BOOL and value.lower() in ("true", "false"):
            fix = f"write {value.lower()} without quotes"
        self.error(path, value, f"expected {self.expected(key)}, got {_type_name(value)}", fix)
        return INVALID

    def out_of_range(self, key, value, path):
        self.error(path, value, f"out of range: must be {_describe_range(key)}")
        return INVALID

    def check_bool(self, key, value, path):
        return value if isinstance(value, bool) else self.wrong_type(key, value, path)

    def check_int(self, key, value, path):
        if key.name in INFINITY_MEANS_NEVER and isinstance(value, float) and value == math.inf:
            return None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)  # DeepSpeed configs write sizes as 5e8
        elif isinstance(value, float):
            problem = "with a fractional part" if math.isfinite(value) else "that is not finite"
            self.error(path, value, f"expected an integer, got a number {problem}")
            return INVALID
        if isinstance(value, bool) or not isinstance(value, int):
            return self.wrong_type(key, value, path)
        return value if _in_range(key, value) else self.out_of_range(key, value, path)

    def check_float(self, key, value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.wrong_type(key, value, path)
        value = float(value)
        if not math.isfinite(value):
            self.error(path, value, "expected a finite number")
            return INVALID
        return value if _in_range(key, value) else self.out_of_range(key, value, path)

    def check_str(self, key, value, path):
        return value if isinstance(value, str) else self.wrong_type(key, value, path)

    def check_strings(self, key, value, path):
        if isinstance(value, str) and not key.choices:
            value = [value]  # one free-form name (DeepSpeed's leaf_module lists take one too)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            return self.wrong_type(key, value, path)
        unknown = [v for v in value if key.choices and v not in key.choices]
        if unknown:
            self.error(path, unknown[0], "unknown name in the list",
                       "use names from " + ", ".join(_show(c) for c in key.choices))
            return INVALID
        return tuple(value)

    def check_choice(self, key, value, path):
        if not isinstance(value, str):
            return self.wrong_type(key, value, path)
        if value in key.choices:
            return value
        by_lower = {choice.lower(): choice for choice in key.choices}
        if key.ignore_case and value.lower() in by_lower:
            return by_lower[value.lower()]
        supported = ", ".join(_show(c) for c in key.choices)
        unsupported_lower = {choice.lower() for choice in key.unsupported_choices}
        if value.lower() in unsupported_lower:
            self.error(path, value, "not supported yet by zero", f"supported: {supported}")
            return INVALID
        if value.lower() in by_lower:
            fix = f"did you mean '{by_lower[value.lower()]}'? (case-sensitive, as in DeepSpeed)"
        else:
            close = difflib.get_close_matches(value, key.choices, n=1, cutoff=0.6)
            fix = f"did you mean '{close[0]}'?" if close else None
        self.error(path, value, f"must be one of {supported}", fix)
        return INVALID

    def check_betas(self, key, value, path):
        numeric = isinstance(value, (list, tuple)) and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in value)
        if not numeric or len(value) != 2:
            self.error(path, value, "expected [beta1, beta2]: two numbers")
            return INVALID
        if not all(_in_range(key, b) for b in value):
            self.error(path, value, f"out of range: each beta must be {_describe_range(key)}")
            return INVALID
        return (float(value[0]), float(value[1]))

    def check_block(self, key, value, path):
        if not isinstance(value, Mapping):
            return self.wrong_type(key, value, path)
        return self.block(key.block, value, path)

    # ---- "auto", unsupported keys, features

    def auto(self, key, path):
        if key.auto is None:
            if self.listed_auto_keys:
                fix = "(\"auto\" is accepted only by the keys listed above)"
            else:
                fix = "keys that accept \"auto\": " + ", ".join(schema.auto_keys())
                self.listed_auto_keys = True
            self.error(path, "auto", "\"auto\" is not accepted here: it is a placeholder that the Hugging "
                       "Face Trainer and Accelerate replace with values from their own arguments "
                       "before the engine sees the config; given to zero directly, give an explicit "
                       "value", fix)
            return INVALID
        return self.default(key, path)

    def unsupported(self, key, value, path):
        if key.kind == SECTION:
            if not _section_is_inert(value):
                self.error(path, value, f"not supported yet: zero does not implement DeepSpeed's {key.name}",
                           "remove the block (a disabled one such as {\"enabled\": false} is accepted)")
        elif not _same(value, key.default):
            self.error(path, value, f"not supported yet: zero does not implement DeepSpeed's {key.name}",
                       f"remove it or set it to DeepSpeed's default {_show(key.default)}")
        return key.default

    def feature_enabled(self, key, value, path):
        """False (and an error) if `value` needs an engine feature the caller did not enable."""
        needed = [feature for gated, feature in key.value_features if _same(value, gated)]
        if key.feature is not None and not _same(value, key.default):
            needed.append(key.feature)
        missing = [feature for feature in needed if feature not in self.features]
        if not missing:
            return True
        problem = f"not supported yet (needs engine feature '{missing[0]}', not enabled in this build)"
        alternatives = self.enabled_alternatives(key)
        if len(alternatives) == 1 and key.value_features:
            fix = f"use {_show(alternatives[0])}"
        elif alternatives and key.value_features:
            fix = "use one of " + ", ".join(_show(v) for v in alternatives)
        else:
            fix = f"remove it or set it to the default {_show(key.default)}"
        self.error(path, value, problem, fix)
        return False

    def enabled_alternatives(self, key):
        if key.choices:
            values = list(key.choices)
        elif key.kind == INT and key.minimum is not None and key.maximum is not None \
                and key.maximum - key.minimum <= 64:
            values = list(range(int(key.minimum), int(key.maximum) + 1))
        else:
            return []
        gated = {gated: feature for gated, feature in key.value_features}
        return [v for v in values if gated.get(v) is None or gated[v] in self.features]


# --------------------------------------------------------------------------- pass 2: rules across keys


def _valid(*values):
    return all(value is not INVALID for value in values)


def _multiples(total, unit):
    """Two multiples of `unit` around `total`, for "use e.g. ..." hints."""
    below = (total // unit) * unit
    return [m for m in (below, below + unit) if m > 0]


def _resolve_batch(v, values, world_size, all_ranks=None):
    """DeepSpeed's rules: any two of the trio derive the third; one alone derives with gas=1.
    `all_ranks` (tensor parallelism from the config alone): DeepSpeed's rules count every rank
    then; a train_batch_size beside both other keys may count them (the HF Trainer's "auto"
    does) as well as the data ranks. A missing key is derived over the data ranks, zero's
    rule (docs/CONFIG.md says where this differs from DeepSpeed)."""
    tb = values["train_batch_size"]
    mb = values["train_micro_batch_size_per_gpu"]
    gas = values["gradient_accumulation_steps"]
    if not _valid(tb, mb, gas):
        return
    ws = world_size

    def not_divisible(total_key, total, parts, unit):
        hint = " or ".join(str(m) for m in _multiples(total, unit))
        v.error(total_key, total, f"{total_key} ({total}) is not divisible by {parts} = {unit}",
                f"use a multiple of {unit} (e.g. {hint}) or change the other batch keys")

    if tb is not None and mb is not None and gas is not None:
        if all_ranks is not None and tb == mb * gas * all_ranks != mb * gas * ws:
            _note_once(f"train_batch_size {tb} counts all {all_ranks} ranks, as DeepSpeed's "
                       f"check does under AutoTP; the step takes {mb * gas * ws} samples over "
                       f"the {ws} data-parallel rank(s)")
        elif tb != mb * gas * ws:
            v.error("train_batch_size", tb, f"train_batch_size must equal train_micro_batch_size_per_gpu ({mb}) * "
                    f"gradient_accumulation_steps ({gas}) * world_size ({ws}) = {mb * gas * ws}",
                    f"set it to {mb * gas * ws}, or leave one of the three keys out to derive it")
            return
    elif tb is not None and mb is not None:
        if tb % (mb * ws):
            return not_divisible("train_batch_size", tb,
                                 f"train_micro_batch_size_per_gpu ({mb}) * world_size ({ws})", mb * ws)
        gas = tb // (mb * ws)
    elif tb is not None and gas is not None:
        if tb % (gas * ws):
            return not_divisible("train_batch_size", tb,
                                 f"gradient_accumulation_steps ({gas}) * world_size ({ws})", gas * ws)
        mb = tb // (gas * ws)
    elif mb is not None and gas is not None:
        tb = mb * gas * ws
    elif tb is not None:
        if tb % ws:
            return not_divisible("train_batch_size", tb, f"world_size ({ws})", ws)
        gas, mb = 1, tb // ws
    elif mb is not None:
        gas, tb = 1, mb * ws
    else:
        v.error("train_batch_size", MISSING, "no batch size given",
                "set train_batch_size or train_micro_batch_size_per_gpu (gradient_accumulation_steps alone "
                "is not enough)")
        return
    values["train_batch_size"], values["train_micro_batch_size_per_gpu"] = tb, mb
    values["gradient_accumulation_steps"] = gas


def _check_precision(v, values):
    fp16, bf16 = values["fp16"], values["bf16"]
    if not _valid(fp16, bf16):
        return
    if fp16["enabled"] is True and bf16["enabled"] is True:
        v.error("bf16.enabled", True, "fp16 and bf16 cannot both be enabled", "disable one of them")
    power, minimum = fp16["initial_scale_power"], fp16["min_loss_scale"]
    autocast = values["torch_autocast"]  # an fp16 autocast scales the loss with these keys
    scaled = fp16["enabled"] is True or (_valid(autocast) and autocast["enabled"] is True and
                                         autocast["dtype"] in schema.FP16_AUTOCAST_DTYPES)
    if scaled and fp16["loss_scale"] == 0 and _valid(power, minimum) and minimum > 2 ** power:
        v.error("fp16.min_loss_scale", minimum, f"larger than the initial dynamic loss scale 2**{power}",
                "lower min_loss_scale or raise initial_scale_power")
    _check_sixteen_bit_master(v, values)
    _check_grad_accum_dtype(v, values)


def _check_grad_accum_dtype(v, values):
    """data_types.grad_accum_dtype: the training dtype, or fp32 under bf16/fp16 (DeepSpeed's
    fp32 gradient accumulation of a 16-bit model)."""
    block, fp16, bf16 = values.get("data_types"), values["fp16"], values["bf16"]
    if not _valid(block, fp16, bf16) or block["grad_accum_dtype"] is None or \
            not _valid(block["grad_accum_dtype"], fp16["enabled"], bf16["enabled"]):
        return
    training = "fp16" if fp16["enabled"] is True else "bf16" if bf16["enabled"] is True else "fp32"
    asked = block["grad_accum_dtype"]
    if asked in schema.DTYPE_SPELLINGS[training] or asked in schema.FP32_DTYPES:
        return
    if training == "fp32":
        v.error("data_types.grad_accum_dtype", asked, "fp32 training accumulates its gradients in "
                "fp32, not in a 16-bit dtype", "remove the key or set it to \"fp32\"")
        return
    v.error("data_types.grad_accum_dtype", asked,
            f"{training} training accumulates its gradients in {training} or fp32 (a 16-bit "
            f"model's in fp32 when asked), not in another 16-bit dtype",
            f"remove the key or set it to \"{training}\" or \"fp32\"")


def _check_sixteen_bit_master(v, values):
    """DeepSpeed's 16-bit master weights and bf16 optimizer states: over a 16-bit model, at
    stages 1-3 (DeepSpeed's assertions), the states only with the master."""
    fp16, bf16 = values["fp16"], values["bf16"]
    zero = values["zero_optimization"]
    stage = zero["stage"] if _valid(zero) else INVALID
    asked = [(block, name, precision) for block, name, precision in (
        (fp16, "fp16_master_weights_and_grads", "fp16"),
        (bf16, "bf16_master_weights_and_grads", "bf16"),
        (bf16, "bf16_optimizer_states", "bf16")) if block[name] is True]
    for block, name, precision in asked:
        if block["enabled"] is not True:
            v.error(f"{precision}.{name}", True, f"keeps state in the {precision} parameters' dtype but "
                    f"{precision}.enabled is false", f"set {precision}.enabled to true, or {name} to false")
        if _valid(stage) and stage == 0:
            v.error(f"{precision}.{name}", True, "is only supported with ZeRO stage 1, 2 or 3 (as in "
                    "DeepSpeed)", f"set zero_optimization.stage to 1, 2 or 3, or {name} to false")
    if bf16["bf16_optimizer_states"] is True and bf16["bf16_master_weights_and_grads"] is not True:
        v.error("bf16.bf16_optimizer_states", True, "requires bf16_master_weights_and_grads (as in DeepSpeed)",
                "set bf16.bf16_master_weights_and_grads to true too")


def _check_activation_checkpointing(v, values):
    block = values.get("activation_checkpointing")
    if not _valid(block) or not block.get("contiguous_memory_optimization"):
        return
    if block.get("partition_activations") is False:
        v.error("activation_checkpointing.contiguous_memory_optimization", True,
                "needs partition_activations (as in DeepSpeed)",
                "set partition_activations to true, or contiguous_memory_optimization to false")
    elif block.get("number_checkpoints") is None:
        v.error("activation_checkpointing.number_checkpoints", None,
                "contiguous_memory_optimization needs the number of checkpointed regions",
                "set number_checkpoints (e.g. the number of layers)")


def _check_aio(v, values):
    aio = values.get("aio")
    if _valid(aio) and _valid(aio.get("block_size", INVALID)) and aio["block_size"] % 4096:
        v.error("aio.block_size", aio["block_size"], "must be a multiple of 4096 (the O_DIRECT "
                "alignment of every I/O piece)", f"use {max(4096, aio['block_size'] // 4096 * 4096)}")


def _check_zero(v, values):
    zero = values["zero_optimization"]
    if not _valid(zero):
        return
    stage = zero["stage"]
    if zero["overlap_comm"] is None:
        zero["overlap_comm"] = stage == 3 if _valid(stage) else INVALID  # DeepSpeed's dynamic default
    if not _valid(stage):
        return
    param, optim = zero["offload_param"], zero["offload_optimizer"]
    path = "zero_optimization"
    if _valid(param) and param["device"] not in ("none", INVALID) and stage != 3:
        v.error(f"{path}.offload_param.device", param["device"], f"parameter offload needs stage 3 (stage is "
                f"{stage})", "set zero_optimization.stage to 3 or the device to \"none\"")
    if _valid(optim) and optim["device"] not in ("none", INVALID) and stage == 0:
        v.error(f"{path}.offload_optimizer.device", optim["device"], "optimizer offload needs ZeRO stage 1, 2 or 3 "
                "(stage is 0)", "set zero_optimization.stage or the device to \"none\"")
    if _valid(optim) and optim.get("delayed_update") is True and optim["device"] != "cpu":
        v.error(f"{path}.offload_optimizer.delayed_update", True, "the delayed parameter update needs "
                f"device \"cpu\" (device is {_show(optim['device'])})", "set device to \"cpu\" or "
                "delayed_update to false")
    if _valid(optim) and optim.get("delayed_update") is True and _valid(optim["ratio"]) and optim["ratio"] < 1:
        v.error(f"{path}.offload_optimizer.delayed_update", True, "the delayed parameter update needs the whole "
                f"step on the host (ratio is {optim['ratio']})", "set ratio to 1.0 or delayed_update to false")
    if _valid(optim) and optim.get("grads_on_device") is True and optim["device"] == "none":
        v.error(f"{path}.offload_optimizer.grads_on_device", True, "keeps an offloaded step's gradients on the "
                "device, and offload_optimizer.device is \"none\" (gradients are on the device already)",
                "set device to \"cpu\" or \"nvme\", or remove grads_on_device")
    if _valid(param) and param["device"] == "nvme" and _valid(param["buffer_count"]) and param["buffer_count"] < 2:
        v.error(f"{path}.offload_param.buffer_count", param["buffer_count"], "parameters on NVMe need at least 2 "
                "host buffers (one unit is read while another is written back)", "set buffer_count to 2 or more")
    for name, block in (("offload_param", param), ("offload_optimizer", optim)):
        if _valid(block) and block["device"] == "nvme" and block["nvme_path"] is None:
            v.error(f"{path}.{name}.nvme_path", MISSING, "required when device is \"nvme\"",
                    "set it to a directory on the NVMe drive")
    for key in schema.ZERO_OPTIMIZATION.keys:
        value = zero.get(key.name, INVALID)
        if key.feature == schema.FEATURE_STAGE3 and _valid(value) and not _same(value, key.default) and stage != 3:
            # DeepSpeed ignores them, and Accelerate fills two of them in at every stage.
            _note_once(f"{path}.{key.name} = {_show(value)} only applies to stage 3 (stage is {stage}): ignored")


def _check_stage3_layouts(v, values, world_size):
    """hpZ's secondary groups and MiCS's shard groups cut the world into equal groups of
    consecutive ranks; the two are not combined (yet)."""
    zero = values["zero_optimization"]
    if not _valid(zero) or not _valid(zero["stage"]) or zero["stage"] != 3:
        return
    _resolve_hsdp_names(v, zero, world_size)
    active = {}
    for key, off in (("zero_hpz_partition_size", 1), ("mics_shard_size", 0)):
        size = zero.get(key, INVALID)
        if not _valid(size) or size <= off or size >= world_size:
            continue
        active[key] = size
        if world_size % size:
            v.error(f"zero_optimization.{key}", size, f"does not divide the world size "
                    f"{world_size}", "use a divisor of it, such as the ranks per node")
    if len(active) == 2:
        v.error("zero_optimization.zero_hpz_partition_size", active["zero_hpz_partition_size"],
                f"hpZ together with MiCS (mics_shard_size = {active['mics_shard_size']}) is not "
                "built yet (#21)", "use one of them")


def _resolve_hsdp_names(v, zero, world_size):
    """dp_shard_size / dp_replicate_size (FSDP2's HSDP as Accelerate names it) into
    mics_shard_size: the shard size, or the world size over the replicate size."""
    shard, replicate = zero.get("dp_shard_size", INVALID), zero.get("dp_replicate_size", INVALID)
    if not _valid(shard, replicate) or (shard <= 0 and replicate <= 0):
        return
    path = "zero_optimization"
    if replicate > 0 and world_size % replicate:
        v.error(f"{path}.dp_replicate_size", replicate, f"does not divide the world size "
                f"{world_size}", "use a divisor of it")
        return
    size = shard if shard > 0 else world_size // replicate
    if shard > 0 and replicate > 0 and shard * replicate != world_size:
        v.error(f"{path}.dp_shard_size", shard, f"times dp_replicate_size ({replicate}) must be "
                f"the world size {world_size}", "give one of them, or a pair whose product is it")
    elif _valid(zero["mics_shard_size"]) and zero["mics_shard_size"] > 0 \
            and zero["mics_shard_size"] != size:
        v.error(f"{path}.mics_shard_size", zero["mics_shard_size"], f"disagrees with "
                f"dp_shard_size / dp_replicate_size (shard size {size})", "give one of them")
    else:
        zero["mics_shard_size"] = size


def _note_once(message):
    """A warning on rank 0 (or a process outside a launcher), once per message."""
    if message not in _NOTED and os.environ.get("RANK", "0") == "0":
        _NOTED.add(message)
        logger.warning("zero: config: %s", message)


_NOTED: set = set()


def _resolve_optimizer(v, values):
    optimizer = values["optimizer"]
    if optimizer is None or not _valid(optimizer) or not _valid(optimizer["type"], optimizer["params"]):
        return  # an invalid block (e.g. "optimizer": []) is already reported
    kind, params = optimizer["type"], optimizer["params"]
    path = "optimizer.params"
    if kind in ("Adagrad", "Lion"):
        optimizer["decoupled_weight_decay"] = kind == "Lion"
        return
    if kind == "Muon":  # Muon's decay is decoupled; this is the Adam half's
        optimizer["decoupled_weight_decay"] = params["adam_w_mode"] is True
        return
    if kind == "Lamb":  # its weight decay joins the update, scaled by the trust ratio
        optimizer["decoupled_weight_decay"] = True
        low, high = params["min_coeff"], params["max_coeff"]
        if _valid(low, high) and low > high:
            v.error(f"{path}.min_coeff", low, f"above max_coeff {high}: the trust ratio is clamped to "
                    "[min_coeff, max_coeff]", "lower min_coeff or raise max_coeff")
        return
    if kind not in ("Adam", "AdamW", "SGD"):  # a torch.optim type: its own switch, if any
        optimizer["decoupled_weight_decay"] = params.get("decoupled_weight_decay") is True
        return
    if kind == "SGD":
        optimizer["decoupled_weight_decay"] = False
        if params["nesterov"] is True and _valid(params["momentum"], params["dampening"]) \
                and (params["momentum"] <= 0 or params["dampening"] != 0):
            v.error(f"{path}.nesterov", True, "Nesterov momentum needs momentum > 0 and dampening = 0",
                    "set momentum > 0 and dampening to 0, or nesterov to false")
        return
    if kind == "AdamW" and params["adam_w_mode"] is False:
        v.error(f"{path}.adam_w_mode", False, "contradicts type \"AdamW\" (DeepSpeed silently ignores it and "
                "applies decoupled weight decay)", "remove it, or use type \"Adam\" with adam_w_mode false for "
                "L2-coupled Adam")
        return
    decoupled = kind == "AdamW" or params["adam_w_mode"] is True
    optimizer["decoupled_weight_decay"] = decoupled
    if params["weight_decay"] is None:
        params["weight_decay"] = 0.01 if (params["torch_adam"] is True and decoupled) else 0.0


def _resolve_memory_report(values):
    report = values["memory_report"]
    if _valid(report) and report["every_n_steps"] is None:
        report["every_n_steps"] = values["steps_per_print"]


def _read_aliases(v, raw):
    """The config with each block given under its old name (schema.ALIASES) renamed, and the
    zero_optimization keys given under DeepSpeed's field names (schema.ZERO_OPTIMIZATION_ALIASES)
    given their documented names, as DeepSpeed reads them."""
    renamed = dict(raw)
    for old, new in schema.ALIASES.items():
        if old not in raw:
            continue
        block = renamed.pop(old)
        if new in raw:
            v.error(old, block, f"given beside \"{new}\", its new name",
                    f"keep one block (DeepSpeed reads \"{new}\" and ignores this one)")
        else:
            renamed[new] = block
    zero = renamed.get("zero_optimization")
    if isinstance(zero, Mapping):
        zero = renamed["zero_optimization"] = dict(zero)
        for short, documented in schema.ZERO_OPTIMIZATION_ALIASES.items():
            if short not in zero:
                continue
            value = zero.pop(short)
            if documented in zero:
                v.error(f"zero_optimization.{short}", value, f"given beside \"{documented}\", "
                        "the same key's documented name", "keep one of the two")
            else:
                zero[documented] = value
    return renamed


# --------------------------------------------------------------------------- entry point


def _check_data_parallel_size(v, values, world_size):
    """`data_parallel_size` says what the launch makes; a different number is a mistake."""
    size = values["data_parallel_size"]
    if _valid(size) and size is not None and size != world_size:
        v.error("data_parallel_size", size, f"this run has {world_size} data-parallel rank(s) "
                "(world size / tensor size, or the mpu's data group)",
                f"set it to {world_size} or leave it out")


def validate(raw, world_size, features, source=None, all_ranks=None):
    """Validate `raw` (a dict) and return the resolved nested dict; raise ConfigError listing every problem."""
    if not isinstance(raw, Mapping):
        raise ConfigError([f"<root> = {_show(raw)}: expected a JSON object"], source)
    v = _Validator(features)
    values = v.block(schema.TOP, _read_aliases(v, raw), "")
    if v.dotted:  # DeepSpeed ignores every unknown top-level key
        _note_once(f"top-level keys {', '.join(v.dotted)} ignored, as DeepSpeed ignores them "
                   "(it reads no dotted paths); to set one, write it inside its block")
    _resolve_batch(v, values, world_size, all_ranks)
    _check_data_parallel_size(v, values, world_size)
    _check_precision(v, values)
    _check_zero(v, values)
    _check_stage3_layouts(v, values, world_size)
    _check_aio(v, values)
    _check_activation_checkpointing(v, values)
    _resolve_optimizer(v, values)
    _resolve_memory_report(values)
    if v.errors:
        raise ConfigError(v.errors, source)
    return values
