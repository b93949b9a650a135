"""`deepspeed.runtime.zero.stage_1_and_2`: DeepSpeed's ZeRO-2 memory estimate functions, under
their names and arguments, answered by zero's estimator (zero/reports/estimate/
deepspeed_table.py: DeepSpeed's table, zero's bytes)."""
from zero.reports.estimate import deepspeed_table as _table


def model_to_params(model):
    """All parameters, a shared one once."""
    return _table.model_to_params(model)[0]


def estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=1, num_nodes=1,
                                          cpu_offload=True, additional_buffer_factor=1.5):
    """(host bytes per node, device bytes per GPU) of one option."""
    return _table.needs(_table.cold_shapes(total_params), total_params, total_params, 2,
                        num_gpus_per_node, num_nodes, cpu_offload,
                        additional_buffer_factor=additional_buffer_factor)


def estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Prints the ZeRO-2 table for `model` (its own shapes)."""
    shapes, total, _ = _table.live_shapes(model)
    print(_table.stage2_table(shapes, total, num_gpus_per_node, num_nodes,
                              additional_buffer_factor))


def estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node=1,
                                                   num_nodes=1, additional_buffer_factor=1.5):
    """Prints the ZeRO-2 table for a model of `total_params`."""
    print(_table.stage2_table(_table.cold_shapes(total_params), total_params,
                              num_gpus_per_node, num_nodes, additional_buffer_factor))
