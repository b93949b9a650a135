"""`deepspeed.utils.logging`: DeepSpeed's logger and its rank-filtered log_dist / print_dist."""
from __future__ import annotations

import functools
import logging
import sys


def _deepspeeds_logger() -> logging.Logger:
    """The "DeepSpeed" logger as DeepSpeed makes it: WARNING and above, to stdout, with
    time, level and place, not passed up to the root logger (HF and scripts set its level)."""
    made = logging.getLogger("DeepSpeed")
    if not made.handlers:
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setFormatter(logging.Formatter(
            "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"))
        made.addHandler(handler)
        made.setLevel(logging.WARNING)
        made.propagate = False
    return made


logger = _deepspeeds_logger()


def _rank_message(message, ranks) -> str | None:
    """`message` prefixed with "[Rank r] " when this rank is to say it: always before the
    process group is up, else when `ranks` holds this rank or -1 (no ranks: none)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return f"[Rank -1] {message}"
    rank = dist.get_rank()
    if ranks and (ranks[0] == -1 or rank in set(ranks)):
        return f"[Rank {rank}] {message}"
    return None


def log_dist(message, ranks=None, level=logging.INFO) -> None:
    """Logs `message` on the ranks `ranks` ([-1]: every rank) through DeepSpeed's logger."""
    text = _rank_message(message, ranks)
    if text is not None:
        logger.log(level, text)


def print_dist(message, ranks=None) -> None:
    """As log_dist, printed whatever the log level."""
    text = _rank_message(message, ranks)
    if text is not None:
        print(text)


@functools.lru_cache(None)
def _logged_once(message, ranks: tuple, level) -> None:
    log_dist(message, list(ranks), level)


def log_dist_once(message, ranks=None, level=logging.INFO) -> None:
    """log_dist, once per message, ranks and level in a process."""
    _logged_once(message, tuple(ranks or ()), level)
