"""`deepspeed.runtime.zero.stage3`: DeepSpeed's ZeRO-3 memory estimate functions, under their
names and arguments, answered by zero's estimator (zero/reports/estimate/deepspeed_table.py:
DeepSpeed's table, zero's bytes)."""
from zero.reports.estimate import deepspeed_table as _table


def model_to_params(model):
    """(all parameters, a shared one once; the most parameters one module holds directly)."""
    return _table.model_to_params(model)


def estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, num_gpus_per_node=1,
                                          num_nodes=1, cpu_offload=True, cpu_offload_params=True,
                                          zero_init=True, additional_buffer_factor=1.5):
    """(host bytes per node, device bytes per GPU, 4 x largest_layer_params) of one option."""
    host, device = _table.needs(
        _table.cold_shapes(total_params, largest_layer_params), total_params,
        largest_layer_params, 3, num_gpus_per_node, num_nodes, cpu_offload,
        cpu_offload and cpu_offload_params, zero_init, additional_buffer_factor)
    return host, device, 4 * largest_layer_params


def estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Prints the ZeRO-3 table for `model` (its own shapes and gather units)."""
    shapes, total, largest = _table.live_shapes(model)
    print(_table.stage3_table(shapes, total, largest, num_gpus_per_node, num_nodes,
                              additional_buffer_factor))


def estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params,
                                                   num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Prints the ZeRO-3 table for a model of `total_params`, its largest layer
    `largest_layer_params`."""
    print(_table.stage3_table(_table.cold_shapes(total_params, largest_layer_params),
                              total_params, largest_layer_params, num_gpus_per_node, num_nodes,
                              additional_buffer_factor))
