"""`python -m zero.launcher ...`: the `zero` command (zero/launcher/runner.py), as
`python -m zero.launcher.runner` is."""
import sys

from zero.launcher.runner import main

if __name__ == "__main__":
    sys.exit(main())
