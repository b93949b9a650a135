"""`deepspeed.launcher.runner`: zero's launcher (`zero` = `deepspeed`) and the env file name
Accelerate writes for multi-node launches, which zero's launcher reads (docs/LAUNCHER.md)."""
import sys

from zero.launcher.env import ENV_FILE_NAMES
from zero.launcher.runner import main

DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"
assert DEEPSPEED_ENVIRONMENT_NAME in ENV_FILE_NAMES

__all__ = ["DEEPSPEED_ENVIRONMENT_NAME", "main"]

if __name__ == "__main__":
    sys.exit(main())
