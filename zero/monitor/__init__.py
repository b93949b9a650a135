"""What a training run shows while it runs: DeepSpeed's monitor blocks (tensorboard,
csv_monitor, wandb, comet), wall_clock_breakdown, comms_logger and the FLOPs profiler
(zero/profiling), with zero's memory report among the monitored scalars. docs/MONITORING.md."""
from .comms_logger import CommsLogger
from .master import MonitorMaster
from .watch import Watch

__all__ = ["CommsLogger", "MonitorMaster", "Watch"]
