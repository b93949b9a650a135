#pragma once
// Where a group's offloaded state is and how it is doing: what EngineCore.group_offload_info
// reads back (pinning, the swap files, the delayed update, the parameter swap of stage 3).
#include <cstdint>
#include <string>

namespace zero::adapter {

struct OffloadInfo {
  // optimizer state (offload_optimizer)
  bool offloaded = false;
  bool pinned = false;
  std::string why_not_pinned;  // "" when pinned or not offloaded
  std::string swap;            // the optimizer swap file, "" when not on NVMe
  bool delayed_pending = false;
  std::int64_t offloaded_numel = 0;  // shard elements whose state and step are offloaded
  bool grads_on_host = false;        // the gradient shard lives in host memory
  // parameters (offload_param, stage 3's partitioned groups only)
  bool params_offloaded = false;
  std::string why_params_not_pinned;
  std::int64_t nvme_param_numel = 0;
  std::string param_swap;  // the parameter swap file, "" when not on NVMe
  std::int64_t param_swap_reads = 0;
  std::int64_t param_swap_read_aheads = 0;
};

}  // namespace zero::adapter
