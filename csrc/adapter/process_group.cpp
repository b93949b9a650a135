#include "adapter/process_group.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include "adapter/errors.h"

namespace zero::adapter {

c10::intrusive_ptr<c10d::ProcessGroup> resolve_group(const std::string& group_name) {
  try {
    return c10d::resolve_process_group(group_name);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "zero: no process group named '", group_name,
                "' is registered; call torch.distributed.init_process_group() first and pass "
                "the group's group_name (", message_of(error), ")");
  }
}

}  // namespace zero::adapter
