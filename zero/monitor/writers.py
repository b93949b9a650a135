"""DeepSpeed's four monitor back ends (monitor/*.py there), writing (name, value, step) events.

Each writer is built on rank 0 only (MonitorMaster) and takes the events DeepSpeed's engine
writes: `Train/Samples/lr`, `Train/Samples/loss_scale`, ... with the global sample count as
the step. A missing package is an ImportError naming the package, the block and the fix.
"""
from __future__ import annotations

import atexit
import csv
import importlib
import os
from typing import Iterable, Tuple

Event = Tuple[str, float, int]  # (name, value, step)


def _require(module: str, block: str, pip_name: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"zero: \"{block}\": {{\"enabled\": true}} needs the {pip_name} package, which is not "
            f"installed: pip install {pip_name} (or set \"{block}\": {{\"enabled\": false}})") from error


def job_dir(output_path: str, job_name: str) -> str:
    """DeepSpeed's folder for a monitor's files: output_path/job_name ("" = working directory)."""
    return os.path.join(output_path, job_name)


class TensorBoardWriter:
    """Event files through torch.utils.tensorboard in output_path/job_name."""

    def __init__(self, config):
        _require("tensorboard", "tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter
        self.log_dir = job_dir(config.output_path, config.job_name)
        os.makedirs(self.log_dir, exist_ok=True)
        self._writer = SummaryWriter(log_dir=self.log_dir)

    def write_events(self, events: Iterable[Event]) -> None:
        for name, value, step in events:
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class CsvWriter:
    """DeepSpeed's layout: one file per scalar in output_path/job_name, named after the
    scalar with "/" and " " as "_" (Train_Samples_lr.csv), a `step,<last part of the name>`
    header, then one `step,value` row per event."""

    def __init__(self, config):
        self.log_dir = job_dir(config.output_path, config.job_name)
        os.makedirs(self.log_dir, exist_ok=True)
        self._started: set[str] = set()

    def write_events(self, events: Iterable[Event]) -> None:
        for name, value, step in events:
            filename = name.replace("/", "_").replace(" ", "_")
            with open(os.path.join(self.log_dir, filename + ".csv"), "a+", newline="") as out:
                writer = csv.writer(out)
                if filename not in self._started:
                    self._started.add(filename)
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([step, value])

    def close(self) -> None:
        pass


class WandbWriter:
    """wandb.init(project, group, entity=team); the events of one step in one
    wandb.log({name: value, ...}, step=step). WANDB_MODE=offline (as in zero's tests) keeps the
    run on disk."""

    def __init__(self, config):
        self._wandb = _require("wandb", "wandb", "wandb")
        self.run = self._wandb.init(project=config.project, group=config.group, entity=config.team)
        # An engine alive at exit is destroyed by a handler zero registered on import, before
        # wandb.init registered its teardown; handlers run last first, so wandb's service would
        # be gone by then (ConnectionResetError). The run is finished before it instead
        # (finish() again at destroy does nothing).
        atexit.register(self.close)

    def write_events(self, events: Iterable[Event]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for name, value, step in events:
            by_step.setdefault(step, {})[name] = value
        for step, values in sorted(by_step.items()):
            self._wandb.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class CometWriter:
    """comet_ml.start(...) with the block's keys; a scalar is logged again only after
    samples_log_interval more samples (DeepSpeed's EventsLogScheduler)."""

    def __init__(self, config):
        comet_ml = _require("comet_ml", "comet", "comet_ml")
        self.experiment = comet_ml.start(api_key=config.api_key, project=config.project,
                                         workspace=config.workspace,
                                         experiment_key=config.experiment_key, mode=config.mode,
                                         online=config.online)
        if config.experiment_name is not None:
            self.experiment.set_name(config.experiment_name)
        self._interval = config.samples_log_interval
        self._last: dict[str, int] = {}

    def write_events(self, events: Iterable[Event]) -> None:
        for name, value, step in events:
            last = self._last.get(name)
            if last is None or step - last >= self._interval:
                self._last[name] = step
                self.experiment.log_metric(name, value, step=step)

    def close(self) -> None:
        self.experiment.end()
