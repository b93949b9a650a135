"""The answers the real DeepSpeed 0.19.8 gave, which tests hold zero to. Each
tests/deepspeed_<name>/ folder has cases.py (what to run, shared by its maker and its test),
make.py (run under build/ds-venv, where DeepSpeed is installed: see each maker's docstring)
and expected.json, the answers it wrote."""
from __future__ import annotations

import importlib.util
import json
import os

TESTS = os.path.dirname(os.path.abspath(__file__))


def cases_of(name: str):
    """tests/deepspeed_<name>/cases.py, loaded under a name of its own (several test files
    each use one in the same process)."""
    spec = importlib.util.spec_from_file_location(
        f"deepspeed_{name}_cases", os.path.join(TESTS, f"deepspeed_{name}", "cases.py"))
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    return cases


def fixture(name: str):
    """(cases module, expected answers) of tests/deepspeed_<name>/."""
    with open(os.path.join(TESTS, f"deepspeed_{name}", "expected.json")) as file:
        return cases_of(name), json.load(file)


def write(name: str, found: dict, indent: int | None = 1) -> None:
    """expected.json of tests/deepspeed_<name>/."""
    with open(os.path.join(TESTS, f"deepspeed_{name}", "expected.json"), "w") as out:
        json.dump(found, out, indent=indent, sort_keys=True, default=str)
        out.write("\n")


def _under_deepspeed(rank, world, answer, *args):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed.__version__, answer(rank, world, *args)


def ask_deepspeed(answer, world: int = 1, args=(), timeout: int = 600):
    """(DeepSpeed's version, rank 0's `answer(rank, world, *args)`), run on `world` ranks
    after deepspeed.init_distributed (gloo): for the makers, under build/ds-venv."""
    from distributed_harness import run_distributed

    return run_distributed(_under_deepspeed, world, args=(answer, *args), timeout=timeout)[0]
