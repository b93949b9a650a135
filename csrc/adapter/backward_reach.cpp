#include "adapter/backward_reach.h"

#include <cstdint>
#include <unordered_set>

#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>

#include "adapter/group.h"

namespace zero::adapter {
namespace {

// The leaves (parameters) the running backward will accumulate gradients into.
std::unordered_set<const c10::TensorImpl*> reached_leaves() {
  std::unordered_set<const c10::TensorImpl*> leaves;
  const auto* nodes = torch::autograd::get_current_graph_task_nodes_in_graph();
  if (nodes == nullptr) return leaves;
  // (empty for a plain backward; torch.autograd.grad and backward(inputs=...) run only part)
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  for (torch::autograd::Node* node : *nodes) {
    const auto* leaf = dynamic_cast<const torch::autograd::AccumulateGrad*>(node);
    if (leaf == nullptr) continue;
    if (exec_info != nullptr && !exec_info->empty()) {
      const auto found = exec_info->find(node);
      if (found == exec_info->end() || !found->second.should_execute()) continue;
    }
    leaves.insert(leaf->variable.unsafeGetTensorImpl());
  }
  return leaves;
}

}  // namespace

std::vector<std::vector<UnitReach>> compare_reach(const std::vector<std::unique_ptr<Group>>& groups,
                                                  Communicator& communicator, c10::Device device) {
  std::vector<std::vector<UnitReach>> reach;
  // How many of each unit's parameters are reached, and how many take a gradient, groups in
  // order.
  const auto leaves = reached_leaves();
  std::vector<std::int64_t> reached;
  std::vector<std::int64_t> trainable;
  for (const auto& group : groups) {
    const std::size_t first = reached.size();
    reach.emplace_back(group->layout().unit_count());
    reached.resize(first + reach.back().size(), 0);
    trainable.resize(first + reach.back().size(), 0);
    const auto& params = group->params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::size_t unit = first + group->layout().location(i).buffer;
      if (params[i].requires_grad()) ++trainable[unit];
      if (leaves.count(params[i].unsafeGetTensorImpl()) != 0) ++reached[unit];
    }
  }
  if (reached.empty()) return reach;
  // One all-reduce gives every rank the largest and (negated) the smallest of each count.
  const at::Tensor mine = at::tensor(reached, at::kLong);
  at::Tensor extremes = at::cat({mine, -mine}).to(device);
  communicator.all_reduce(extremes, Reduction::kMax, /*control=*/true)->wait();
  extremes = extremes.cpu();
  const std::int64_t* values = extremes.data_ptr<std::int64_t>();
  const std::size_t n = reached.size();
  std::size_t entry = 0;
  for (auto& units : reach) {
    for (UnitReach& unit : units) {
      const std::int64_t most = values[entry];
      const std::int64_t least = -values[n + entry];
      unit.split = most != least;
      unit.whole = least == trainable[entry];
      ++entry;
    }
  }
  return reach;
}

}  // namespace zero::adapter
