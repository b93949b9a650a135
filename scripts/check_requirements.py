"""Exits 0 when every package a requirements file names is installed, else 1 (and names them).

Used by scripts/setup.sh (on requirements/constraints.txt for torch, on requirements/dev.txt
for the rest) so that a second run does not call pip. Lines are package names with an
optional ``==version``; comments and blank lines are skipped.
"""
import importlib.metadata
import re
import sys


def missing(path):
    absent = []
    with open(path) as file:
        for line in file:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, wanted = (part.strip() for part in line.partition("=="))
            name = re.split(r"[<>!~\[;]", name, maxsplit=1)[0].strip()
            try:
                found = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                absent.append(line)
                continue
            if wanted and found.split("+")[0] != wanted:
                absent.append(f"{line} (found {found})")
    return absent


if __name__ == "__main__":
    absent = missing(sys.argv[1])
    if absent:
        print("missing: " + ", ".join(absent), file=sys.stderr)
    sys.exit(1 if absent else 0)
