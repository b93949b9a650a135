"""comms_logger: the collectives an engine issues, with size, latency and bandwidth, and
DeepSpeed's summary table (deepspeed.comm.log_summary).

The C++ communicator keeps a record per collective while logging is on (csrc/adapter/
comm_log.h); the engine drains them after every backward and step into a CommsLogger. A
record's message size is the buffer the collective is about: the full buffer of an
all-gather or reduce-scatter (the ZeRO paper's volume), the tensor of an all-reduce or
broadcast. Its latency runs from launch to completion, so it includes queueing behind the
collectives launched before it: zero overlaps them with backward instead of synchronizing
each one as DeepSpeed's logger does. Bandwidths are DeepSpeed's (utils/comms_logging.py).
"""
from __future__ import annotations

import math
from datetime import datetime

import torch
import torch.distributed as dist

# C++ CollectiveOp name -> DeepSpeed's name of the collective (what prof_ops lists)
OP_NAMES = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
            "all_reduce": "all_reduce", "broadcast": "broadcast"}
HEADER = ("Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)",
          "tput_avg (Gbps)", "busbw_avg (Gbps)")


def convert_size(size_bytes: int) -> str:
    """DeepSpeed's human size: 1024-based, two decimals ("4.0 MB")."""
    if size_bytes == 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    power = int(math.floor(math.log(size_bytes, 1024)))
    return f"{round(size_bytes / math.pow(1024, power), 2)} {names[power]}"


def bandwidths(op: str, size: int, latency_ms: float, world_size: int) -> tuple[float, float]:
    """(algorithmic, bus) bandwidth in Gbps, DeepSpeed's formulas with `size` the full buffer."""
    duration = max(latency_ms, 1e-6)
    n = world_size
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        algbw, busbw = size / duration, size / duration * (n - 1) / n
    elif op == "all_reduce":
        algbw, busbw = 2 * size / duration, size / duration * 2 * (n - 1) / n
    else:  # broadcast
        algbw = busbw = size / duration
    return algbw * 8 / 1e6, busbw * 8 / 1e6  # bytes per ms -> Gbit per s


def trim_mean(values: list[float], trim: float = 0.1) -> float:
    """DeepSpeed's trimmed mean (utils/timer.py): drop round(n * trim) from each end."""
    ordered = sorted(values)
    k = int(round(len(ordered) * trim))
    kept = ordered[k:len(ordered) - k] or ordered
    return sum(kept) / len(kept)


class CommsLogger:
    """DeepSpeed's CommsLogger over the engine's records: comms_dict is {record name:
    {message bytes: [count, [latency ms], [algbw], [busbw]]}}, as DeepSpeed keeps it."""

    def __init__(self, config, rank: int, world_size: int):
        self.enabled = config.enabled
        self.verbose, self.debug = config.verbose, config.debug
        self.prof_all, self.prof_ops = config.prof_all, list(config.prof_ops)
        self.rank, self.world_size = rank, world_size
        self.comms_dict: dict[str, dict[int, list]] = {}
        self.payload_bytes: dict[str, int] = {}  # per op, control collectives apart
        self.shown_count = 0  # operation_count() when a summary was last printed

    def ingest(self, records) -> None:
        for record in records:
            op = OP_NAMES[record.op.name]
            if not (self.prof_all or op in self.prof_ops):
                continue
            name = self._record_name(op, record)
            self._append(op, name, record.latency_ms, record.message_bytes)
            if not record.control:
                volume = 2 * record.message_bytes if op == "all_reduce" else record.message_bytes
                self.payload_bytes[op] = self.payload_bytes.get(op, 0) + volume

    def _record_name(self, op: str, record) -> str:
        name = op + (" (control)" if record.control else "")
        return f"{name} | [Caller Func: {record.label or 'engine'}]" if self.debug else name

    def _append(self, op: str, name: str, latency: float, size: int) -> None:
        algbw, busbw = bandwidths(op, size, latency, self.world_size)
        entry = self.comms_dict.setdefault(name, {}).setdefault(size, [0, [], [], []])
        entry[0] += 1
        entry[1].append(latency)
        entry[2].append(algbw)
        entry[3].append(busbw)
        if self.verbose and self.rank == 0:
            print(f"comm op: {name} | time (ms): {latency:.2f} | msg size: {convert_size(size)} | "
                  f"algbw (Gbps): {algbw:.2f} | busbw (Gbps): {busbw:.2f}", flush=True)

    def reset_data(self) -> None:
        self.comms_dict.clear()
        self.payload_bytes.clear()
        self.shown_count = 0

    def has_data(self) -> bool:
        return bool(self.comms_dict)

    def operation_count(self) -> int:
        """How many collectives were logged."""
        return sum(entry[0] for sizes in self.comms_dict.values() for entry in sizes.values())

    def operation_names(self) -> list[str]:
        return list(self.comms_dict)

    def summary(self) -> dict:
        return {name: {size: {"count": vals[0], "total_latency_ms": sum(vals[1]),
                              "avg_latency_ms": trim_mean(vals[1]),
                              "tput_avg_gbps": trim_mean(vals[2]),
                              "busbw_avg_gbps": trim_mean(vals[3]),
                              "msg_size_bytes": size, "msg_size_str": convert_size(size)}
                       for size, vals in sorted(sizes.items())}
                for name, sizes in self.comms_dict.items()}

    def log_all(self, print_log: bool = True, show_straggler: bool = False,
                return_dict: bool = False):
        """The summary table (rank 0 prints); with show_straggler, every rank must call it."""
        summary = self.summary()
        stragglers = self._stragglers() if show_straggler else None
        if print_log:
            self.shown_count = self.operation_count()
        if print_log and self.rank == 0:
            print(_table(summary, stragglers), flush=True)
        if not return_dict:
            return None
        return {"summary": summary, "straggler_analysis": stragglers,
                "metadata": {"world_size": self.world_size, "rank": self.rank,
                             "timestamp": datetime.now().isoformat()}}

    def _stragglers(self) -> dict:
        """Per record: latency as the fastest rank saw it, and how much longer this one waited."""
        keys = [(name, size, len(vals[1])) for name, sizes in sorted(self.comms_dict.items())
                for size, vals in sorted(sizes.items())]
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, keys)
        if any(other != keys for other in everyone):
            raise RuntimeError("zero: comms log show_straggler needs every rank to have logged the "
                               "same collectives; call log_summary on every rank at the same point")
        out: dict = {}
        for name, size, _ in keys:
            latencies = torch.tensor(self.comms_dict[name][size][1], dtype=torch.float64)
            fastest = latencies.clone()
            dist.all_reduce(fastest, op=dist.ReduceOp.MIN)
            waited = (latencies - fastest).tolist()
            out.setdefault(name, {})[size] = {
                "count": len(waited), "total_comm_lat_ms": float(fastest.sum()),
                "total_straggler_ms": sum(waited), "avg_comm_lat_ms": trim_mean(fastest.tolist()),
                "avg_straggler_ms": trim_mean(waited), "msg_size_bytes": size,
                "msg_size_str": convert_size(size)}
        return out


def _table(summary: dict, stragglers: dict | None) -> str:
    lines = ["".join(f"{title: <20}" for title in HEADER)]
    for name, sizes in summary.items():
        lines.append(name)
        for size, row in sizes.items():
            lines.append(f"{' ': <20}{row['msg_size_str']: <20}{row['count']: <20}"
                         f"{row['total_latency_ms']: <20.2f}{row['avg_latency_ms']: <20.2f}"
                         f"{row['tput_avg_gbps']: <20.2f}{row['busbw_avg_gbps']: <20.2f}")
    if stragglers is not None:
        lines += ["_______________________________", "Breakdown with straggler effect",
                  "-------------------------------",
                  "".join(f"{t: <20}" for t in ("Comm. Op", "Message Size", "Count",
                                                "Total comm lat(ms)", "Total straggler(ms)",
                                                "Avg comm lat(ms)", "Avg straggler(ms)"))]
        for name, sizes in stragglers.items():
            lines.append(name)
            for row in sizes.values():
                lines.append(f"{' ': <20}{row['msg_size_str']: <20}{row['count']: <20}"
                             f"{row['total_comm_lat_ms']: <20.2f}{row['total_straggler_ms']: <20.2f}"
                             f"{row['avg_comm_lat_ms']: <20.2f}{row['avg_straggler_ms']: <20.2f}")
    return "\n".join(lines)
