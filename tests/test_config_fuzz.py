"""Config fuzzing: random mutations of the shipped configs (configs/*.json). Every case is
either accepted and trains a step, or rejected with a ConfigError that names the mutated key:
no other exception, no traceback from deep inside the engine, no hang."""
import copy
import json
import random
from pathlib import Path

import training
from distributed_harness import run_distributed

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.json"))
CASES = 300
SEED = 20261125
ODD_VALUES = [None, "auto", -1, 0, 1, 0.5, 10**15, 1e30, float("nan"), "", "garbage", [], {},
              True, False, [1, 2], {"x": 1}, 3, 2**40 + 1]


def _base(path: Path, tmp: str) -> dict:
    """A shipped config made runnable here: one rank, swap files and reports under tmp."""
    config = json.loads(path.read_text())
    config.pop("train_batch_size", None)  # written for another world size
    config["steps_per_print"] = None
    config.pop("memory_report", None)
    for block in ("offload_optimizer", "offload_param"):
        offload = config.get("zero_optimization", {}).get(block)
        if isinstance(offload, dict) and "nvme_path" in offload:
            offload["nvme_path"] = tmp
    for monitor in ("tensorboard", "csv_monitor"):
        if isinstance(config.get(monitor), dict) and "output_path" in config[monitor]:
            config[monitor]["output_path"] = tmp
    return config


def _paths(value, prefix=()):
    """Every key path in a config (blocks and leaves)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield prefix + (key,)
            yield from _paths(item, prefix + (key,))


def _mutate(config: dict, rng: random.Random):
    """One random mutation; returns (mutated config, the key it touched)."""
    config = copy.deepcopy(config)
    path = rng.choice(list(_paths(config)))
    parent = config
    for key in path[:-1]:
        parent = parent[key]
    kind = rng.random()
    if kind < 0.15:
        del parent[path[-1]]
    elif kind < 0.25:
        parent[path[-1] + "_typo"] = parent[path[-1]]
        del parent[path[-1]]
        path = path[:-1] + (path[-1] + "_typo",)
    else:
        parent[path[-1]] = rng.choice(ODD_VALUES)
    return config, path


def _fuzz(rank, world, tmp):
    import torch

    import zero
    from zero.config import ConfigError, load_config

    import os

    os.chdir(tmp)  # a mutated monitor path (say "") writes under the working directory
    rng = random.Random(SEED)
    bases = [_base(path, tmp) for path in CONFIGS]
    problems, accepted, rejected = [], 0, 0
    for case in range(CASES):
        config, path = _mutate(rng.choice(bases), rng)
        where = f"case {case}: {'.'.join(path)} -> {json.dumps(config, default=str)[:300]}"
        try:
            load_config(copy.deepcopy(config), world_size=world)
        except ConfigError as error:
            rejected += 1
            if path[-1] not in str(error) and path[0] not in str(error):
                problems.append(f"{where}: the error does not name the key: {error}")
            continue
        except Exception as error:  # noqa: BLE001 - anything else is the finding
            problems.append(f"{where}: {type(error).__name__}: {error}")
            continue
        accepted += 1
        try:
            torch.manual_seed(0)
            engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
            micro = engine.train_micro_batch_size_per_gpu()
            for tokens, targets in training.synthetic_batches(
                    training.MODEL, micro, engine.gradient_accumulation_steps(), seed=case):
                loss = engine(tokens, targets)
                if engine.inference_only:  # no optimizer block: a forward-only engine
                    break
                engine.backward(loss)
                engine.step()
            engine.destroy()
        except Exception as error:  # noqa: BLE001
            problems.append(f"{where}: accepted but training failed: "
                            f"{type(error).__name__}: {error}")
    return problems, accepted, rejected


def test_mutated_configs_are_accepted_and_train_or_rejected_naming_the_key(tmp_path):
    [(problems, accepted, rejected)] = run_distributed(_fuzz, 1, args=(str(tmp_path),),
                                                      timeout=600)
    assert not problems, f"{len(problems)} of {CASES} cases:\n" + "\n".join(problems[:20])
    assert accepted >= 30 and rejected >= 100, (accepted, rejected)  # both paths exercised
