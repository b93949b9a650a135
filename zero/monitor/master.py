"""MonitorMaster: the enabled monitor blocks of a config, written to from rank 0 (DeepSpeed's
monitor/monitor.py). `enabled` is the same on every rank; only rank 0 builds writers."""
from __future__ import annotations

import logging
from typing import Iterable

from .writers import CometWriter, CsvWriter, Event, TensorBoardWriter, WandbWriter

logger = logging.getLogger("zero")


class MonitorMaster:
    def __init__(self, config, rank: int):
        blocks = ((config.tensorboard, TensorBoardWriter), (config.wandb, WandbWriter),
                  (config.csv_monitor, CsvWriter), (config.comet, CometWriter))
        self.enabled = any(block.enabled for block, _ in blocks)
        self.writers = [make(block) for block, make in blocks if block.enabled and rank == 0]

    def write_events(self, events: Iterable[Event]) -> None:
        events = list(events)
        for writer in self.writers:
            writer.write_events(events)

    def close(self) -> None:
        """Each writer closed; one that fails is named and the others still close."""
        for writer in self.writers:
            try:
                writer.close()
            except Exception as error:  # noqa: BLE001 - a monitor must not stop the clean-up
                logger.warning("zero: closing the %s monitor failed: %s: %s",
                               type(writer).__name__, type(error).__name__, error)
        self.writers = []
