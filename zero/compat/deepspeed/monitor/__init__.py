"""`deepspeed.monitor`: the monitor blocks' writers (zero/monitor). `monitor.monitor.MonitorMaster`
takes a DeepSpeedConfig's monitor_config, as DeepSpeed's does."""
from . import monitor

__all__ = ["monitor"]
