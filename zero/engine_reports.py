"""The engine's memory report: per-category current and peak bytes from the C++ registry,
each model-state category beside the ZeRO formula's value (zero/memory.py); written every
memory_report.every_n_steps to memory_report.path (one JSON line per rank and report), one
line per rank every steps_per_print, and a final report when the engine ends."""
from __future__ import annotations

import json
import os

import torch.distributed as dist

from .boundary import as_dict
from .memory import build_report
from .reports.table import format_report, format_report_line


class EngineReports:
    """Mixed into ZeroEngine, which sets `config`, `grid`, `global_steps`, `_core`,
    `_layouts`, `_watch` and `_final_report_step`."""

    def memory_report(self) -> dict:
        """Per-category current/peak bytes from the accounting registry, with the ZeRO formula's
        expected value beside each model-state category."""
        self._alive("memory_report")
        return self._report(dist.get_rank())

    def _report(self, rank: int) -> dict:
        grid = self.grid  # pipeline stages / tensor slices: the rank's place
        return build_report(self._core.registry(), self._layouts, rank, self.global_steps,
                            as_dict(self._core.comm_stats()), self._watch.activation_bytes,
                            mesh=grid.describe() if grid is not None else None)

    def print_memory_report(self) -> None:
        print(format_report(self.memory_report()), flush=True)

    def _maybe_report(self) -> None:
        every = self.config.memory_report.every_n_steps
        steps_per_print = self.config.steps_per_print
        write = bool(every) and self.global_steps % every == 0
        show = bool(steps_per_print) and self.global_steps % steps_per_print == 0
        if not (write or show):
            return
        report = self.memory_report()
        if write:
            self._write_report(report, show=False)
        if show:
            print(format_report_line(report), flush=True)  # one line per rank

    def final_memory_report(self, show: bool = True) -> dict | None:
        """Writes the memory report now, whatever memory_report.every_n_steps says: one JSON
        line to memory_report.path (marked "final", so `zero-mem report` folds it into the run
        even after a periodic report of the same step) and the table on rank 0. Not collective
        (every rank writes its own line); destroy() calls it when a path is configured.
        Returns the report, None once destroyed."""
        if self._core is None:
            return None
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        report = self._report(rank)
        report["final"] = True
        self._write_report(report, show=show)
        self._final_report_step = self.global_steps
        return report

    def __del__(self):
        """An engine dropped without destroy() still ends with its final report."""
        if "_final_report_step" in self.__dict__:   # construction finished
            self._final_report_once()

    def _final_report_once(self, show_table: bool = True) -> None:
        """The final report (JSON line; the table on rank 0 with steps_per_print, unless
        `show_table` is False), unless the last step already has one."""
        if self._core is not None and self._final_report_step != self.global_steps \
                and (self.config.memory_report.path or self.config.steps_per_print):
            self.final_memory_report(show=bool(self.config.steps_per_print) and show_table)

    def _write_report(self, report: dict, show: bool) -> None:
        path = self.config.memory_report.path
        if path:
            target = _rank_path(path, report["rank"])
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            with open(target, "a") as out:
                out.write(json.dumps(report) + "\n")
        if show and report["rank"] == 0:
            print(format_report(report), flush=True)



def _rank_path(path: str, rank: int) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.jsonl'}"
