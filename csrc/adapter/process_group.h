#pragma once
// Resolving the c10d ProcessGroup that Python created, by its registered name
// (`pg.group_name` on the Python side), so C++ issues collectives on the same group.
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace zero::adapter {

c10::intrusive_ptr<c10d::ProcessGroup> resolve_group(const std::string& group_name);

}  // namespace zero::adapter
