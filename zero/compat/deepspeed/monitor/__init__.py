"""`deepspeed.monitor`: the monitor blocks' writers (zero/monitor). `monitor.monitor.MonitorMaster`
takes zero's validated config (zero.config.load_config) where DeepSpeed's takes its own."""
from . import monitor

__all__ = ["monitor"]
