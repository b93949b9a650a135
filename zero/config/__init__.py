"""zero's strict, DeepSpeed-compatible JSON config.

    from zero.config import load_config, ConfigError, ZeroConfig
    cfg = load_config("ds_config.json", world_size=2)   # or a dict
    cfg.train_micro_batch_size_per_gpu, cfg.zero_optimization.stage, cfg.optimizer.params["lr"]

DeepSpeed's keys, meanings and code defaults; but every unknown, misplaced,
mistyped, out-of-range or not-yet-supported key is an error, and all errors
are reported together. See docs/CONFIG.md (generated from ``schema.py``).
"""

import copy
import json
import os
from collections.abc import Mapping

from .model import (AioConfig, BF16Config, FP16Config, MemoryReportConfig, OffloadOptimizerConfig,
                    OffloadParamConfig, OptimizerConfig, SchedulerConfig, ZeroConfig, ZeroOptimizationConfig,
                    build)
from .schema import ALL_FEATURES, BUILT_FEATURES, FEATURE_NVME, FEATURE_OFFLOAD, FEATURE_STAGE3
from .validate import ConfigError, validate

__all__ = [
    "load_config", "read_config", "ConfigError", "ZeroConfig", "OptimizerConfig", "SchedulerConfig", "FP16Config", "BF16Config",
    "ZeroOptimizationConfig", "OffloadOptimizerConfig", "OffloadParamConfig", "AioConfig", "MemoryReportConfig",
    "ALL_FEATURES", "BUILT_FEATURES", "FEATURE_STAGE3", "FEATURE_OFFLOAD", "FEATURE_NVME",
]


def load_config(config, world_size, enabled_features=None, unused_blocks=(), all_ranks=None):
    """Validate a DeepSpeed-style config and return the resolved ``ZeroConfig``.

    Args:
        config: a dict, or a path (str / os.PathLike) to a JSON file.
        world_size: number of data-parallel ranks (used for the batch-size trio).
        enabled_features: engine features the caller supports (names from
            ``ALL_FEATURES``); values that need any other feature are rejected as
            "not supported yet". Default: ``BUILT_FEATURES``.
        unused_blocks: top-level blocks nothing will read (a "scheduler" without an
            optimizer): kept in ``raw`` as given, not validated, as DeepSpeed never reads them.
        all_ranks: with tensor parallelism set by the config alone, the world's rank count:
            DeepSpeed checks the batch trio against every rank then (no mpu tells it the data
            ranks), and the HF Trainer fills "auto" the same way, so a train_batch_size given
            beside both other keys may count them instead of the data ranks.

    Raises:
        ConfigError: the config is invalid; ``.errors`` lists every problem.
        ValueError / TypeError: bad arguments (world_size, feature names, config type).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    features = BUILT_FEATURES if enabled_features is None else frozenset(enabled_features)
    unknown = sorted(features - ALL_FEATURES)
    if unknown:
        raise ValueError(f"unknown engine feature(s) {unknown}; known: {sorted(ALL_FEATURES)}")
    raw, source = _read(config)
    values = validate({k: v for k, v in raw.items() if k not in unused_blocks}, world_size,
                      features, source, all_ranks=all_ranks)
    return build(values, raw, world_size, features)


def read_config(config) -> dict:
    """The config as given (a private deep copy), not validated: for the few values needed
    before validation can run (the tensor-parallel size that the batch trio depends on)."""
    return _read(config)[0]


def _read(config):
    """(a private deep copy of the config dict, a source name for messages)."""
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config)), None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f, object_pairs_hook=_reject_duplicate_keys), path
        except OSError as e:
            raise ConfigError([f"<file>: cannot read {path!r}: {e.strerror or e}"], path) from None
        except json.JSONDecodeError as e:
            raise ConfigError([f"<file>: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}"],
                              path) from None
        except _DuplicateKeyError as e:
            raise ConfigError([f"<file>: duplicate key(s) {e.keys} in one object; JSON keeps only the last, "
                               "so remove the duplicates"], path) from None
    raise TypeError(f"config must be a dict or a path to a JSON file, got {type(config).__name__}")


class _DuplicateKeyError(ValueError):
    def __init__(self, keys):
        super().__init__(keys)
        self.keys = keys


def _reject_duplicate_keys(pairs):
    names = [name for name, _ in pairs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise _DuplicateKeyError(duplicates)
    return dict(pairs)
