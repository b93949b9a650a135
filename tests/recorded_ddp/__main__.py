"""python -m recorded_ddp NAME... (in tests/): runs the named tests' plain-DDP jobs again and
writes their recordings (recorded_ddp/NAME.json, and recorded_ddp/NAME/ when files are kept)."""
import argparse
import importlib
import os
import shutil
import sys
import tempfile

import recorded_ddp


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m recorded_ddp")
    parser.add_argument("names", nargs="+", choices=sorted(recorded_ddp.MODULES))
    names = parser.parse_args().names
    sys.path.insert(0, os.path.dirname(recorded_ddp.HERE))  # the test modules
    for name in names:
        module = importlib.import_module(recorded_ddp.MODULES[name])
        folder = recorded_ddp.files(name)
        shutil.rmtree(folder, ignore_errors=True)
        with tempfile.TemporaryDirectory() as scratch:
            runs = module.record_ddp(folder, scratch)
        recorded_ddp.save(name, module.ddp_digest(), runs)
        print(f"recorded_ddp/{name}.json written", flush=True)


if __name__ == "__main__":
    main()
