"""`import zero.compat.deepspeed as deepspeed`: DeepSpeed's API, backed by zero.

A package laid out like DeepSpeed's, so `from deepspeed.X import Y` works once zero stands in
for `deepspeed` (zero/compat/deepspeed_alias.py; the HF Trainer and Accelerate import it by
name). Each submodule holds only names that DeepSpeed scripts and the Hugging Face libraries
use (docs/HUGGINGFACE.md), each backed by zero's own implementation.
"""
from __future__ import annotations

from zero.api import add_config_arguments, init_distributed, initialize
from zero.engine import ZeroEngine as DeepSpeedEngine
from zero.inference import InferenceEngine, init_inference
from zero.tp import tp_model_init

from . import (accelerator, checkpoint, checkpointing, comm, env_report, inference, launcher, moe,
               monitor, ops, pipe, profiling, runtime, sequence, utils)
from .accelerator import get_accelerator
from .pipe import PipelineModule
from .runtime import zero  # deepspeed.zero is deepspeed.runtime.zero, as in DeepSpeed
from .runtime.config import DeepSpeedConfig, DeepSpeedConfigError
from .utils import OnDevice, log_dist, logger

__version__ = "0.19.8"  # the DeepSpeed API version zero mirrors (as_deepspeed's dist-info)
__version_major__, __version_minor__, __version_patch__ = 0, 19, 8

__all__ = ["initialize", "init_distributed", "add_config_arguments", "zero", "comm", "utils",
           "checkpointing", "tp_model_init", "accelerator", "checkpoint", "env_report",
           "launcher", "moe", "monitor", "ops", "pipe", "profiling", "runtime", "sequence", "DeepSpeedEngine",
           "get_accelerator", "PipelineModule", "OnDevice", "log_dist", "logger", "__version__",
           "DeepSpeedConfig", "DeepSpeedConfigError", "init_inference", "InferenceEngine",
           "inference"]
