"""`deepspeed.monitor.monitor`: MonitorMaster(monitor_config), DeepSpeed's signature (a
DeepSpeedConfig's monitor_config: its tensorboard, wandb, csv_monitor and comet blocks) over
zero.monitor.MonitorMaster. As in DeepSpeed only global rank 0 writes (rank 0 too before
torch.distributed is initialized); write_events takes (name, value, step) tuples."""
import zero.monitor


class MonitorMaster(zero.monitor.MonitorMaster):
    def __init__(self, monitor_config):
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        super().__init__(monitor_config, rank=dist.get_rank() if initialized else 0)
        self.monitor_config = monitor_config


__all__ = ["MonitorMaster"]
