"""`deepspeed.monitor.monitor`: MonitorMaster (zero.monitor.MonitorMaster)."""
from zero.monitor import MonitorMaster

__all__ = ["MonitorMaster"]
