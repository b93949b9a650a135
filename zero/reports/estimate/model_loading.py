"""Where the model comes from: an import path (`--model module.path:factory` or
`path/to/file.py:factory`) or a Hugging Face config.json, built on the meta device."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys

import torch

from .errors import EstimateError
from .shapes import ModelShapes, shapes_from_module


def import_factory(spec: str):
    """'package.module:callable' or 'path/to/file.py:callable' -> the callable."""
    if ":" not in spec:
        raise EstimateError(f"--model {spec!r}: expected module.path:factory (a callable that "
                            "returns an nn.Module), e.g. zero.models.tiny_gpt:TinyGPT")
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            if not os.path.exists(path):
                raise EstimateError(f"--model {spec!r}: no file {path}")
            directory = os.path.dirname(path)
            if directory not in sys.path:
                sys.path.insert(0, directory)  # the file's own imports of its neighbours
            name = os.path.splitext(os.path.basename(path))[0]
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the current folder imports
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise EstimateError(f"--model {spec!r}: cannot import {module_name!r}: {error}") from None
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise EstimateError(f"--model {spec!r}: {module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise EstimateError(f"--model {spec!r}: {attr} is not callable")
    return target


def build_on_meta(factory, *args, **kwargs) -> torch.nn.Module:
    """Calls the factory with the meta device as the default: shapes without storage."""
    with torch.device("meta"):
        model = factory(*args, **kwargs)
    if not isinstance(model, torch.nn.Module):
        raise EstimateError(f"the model factory returned {type(model).__name__}, not an "
                            "nn.Module")
    return model


def shapes_from_factory(spec: str, unit_rules=None, expert_parallel=None) -> ModelShapes:
    """`module.path:factory`: the model built on the meta device (nothing allocated)."""
    model = build_on_meta(import_factory(spec))
    return shapes_from_module(model, description=f"{type(model).__name__} ({spec})",
                              unit_rules=unit_rules, expert_parallel=expert_parallel)


def model_from_hf_config(path: str, on_meta: bool = True) -> torch.nn.Module:
    """A Hugging Face config.json (or its folder), built on meta. Needs `transformers`, which
    zero does not require: without it this raises an EstimateError that says so."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise EstimateError(
            "--hf-config needs the `transformers` package, which is not installed (zero does not "
            "require it). Install it (pip install transformers) or describe the model another "
            "way: --model module.path:factory (exact) or --params N (approximate)") from None
    config_file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(config_file, encoding="utf-8") as handle:
            values = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise EstimateError(f"--hf-config {path!r}: cannot read {config_file}: {error}") from None
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise EstimateError(f"--hf-config {config_file}: no \"model_type\" key")
    config = transformers.AutoConfig.for_model(model_type, **values)
    build = build_on_meta if on_meta else (lambda factory, *args: factory(*args))
    try:
        model = build(transformers.AutoModelForCausalLM.from_config, config)
    except ValueError:
        model = build(transformers.AutoModel.from_config, config)
    model.zero_config_file = config_file
    return model


def shapes_from_hf_config(path: str, unit_rules=None, expert_parallel=None) -> ModelShapes:
    model = model_from_hf_config(path)
    return shapes_from_module(model, description=f"{type(model).__name__} ({model.zero_config_file})",
                              unit_rules=unit_rules, expert_parallel=expert_parallel)
