"""Plain-DDP runs (gloo on the CPU, zero not standing in for deepspeed) that the Hugging Face
tests compare zero's runs with, recorded once rather than run again in every CI run (each is a
2-rank job of 20-40 s on a 2-core machine).

A recording is `<name>.json` here (the values the test compares, and a digest of what they
depend on: the script, its arguments, the library versions), and `<name>/` when the test also
reads files a run wrote (a saved model). A test module that compares with one defines
`ddp_digest()` and `record_ddp(folder, scratch) -> dict`; a stale recording fails the test
with the command that makes it again:

    python -m recorded_ddp trainer|accelerate|trl      (from tests/, after scripts/setup.sh)
"""
import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULES = {"trainer": "test_hf_trainer", "accelerate": "test_hf_accelerate", "trl": "test_trl"}


def digest(script: Path, *arguments, packages=("torch", "transformers")) -> str:
    """What a recording depends on: the script's text, its arguments, the packages' versions."""
    from importlib.metadata import version

    text = json.dumps([script.read_text(), arguments, [version(p) for p in packages]])
    return hashlib.sha256(text.encode()).hexdigest()


def files(name: str) -> Path:
    """The folder of the files the recorded runs wrote."""
    return HERE / name


def load(name: str, current_digest: str) -> dict:
    """The recorded runs, if they were made of what the test runs now."""
    recorded = json.loads((HERE / f"{name}.json").read_text())
    assert recorded["digest"] == current_digest, (
        f"tests/recorded_ddp/{name}.json is stale (the script, its arguments or a library "
        f"changed): run `python -m recorded_ddp {name}` in tests/")
    return recorded["runs"]


def save(name: str, current_digest: str, runs: dict) -> None:
    with open(HERE / f"{name}.json", "w") as file:
        json.dump({"digest": current_digest, "runs": runs}, file, indent=1, sort_keys=True)
        file.write("\n")
