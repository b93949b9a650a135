#include "adapter/gather_schedule.h"

#include <sstream>

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

namespace zero::adapter {

GatherSchedule::GatherSchedule(Communicator& communicator, std::vector<std::string> unit_names,
                               ScheduleOptions options)
    : communicator_(communicator),
      names_(std::move(unit_names)),
      options_(options),
      placement_(names_.size()) {}

void GatherSchedule::place(std::size_t unit, Stage3Group* group, std::size_t local) {
  TORCH_CHECK(unit < placement_.size(), "zero: unit ", unit, " outside the schedule's ",
              placement_.size());
  placement_[unit].emplace_back(group, local);
}

std::string GatherSchedule::describe(std::int64_t phase, std::int64_t unit) const {
  if (phase == kEnd) return "the end of backward";
  const std::string name =
      unit >= 0 && unit < static_cast<std::int64_t>(names_.size()) && !names_[unit].empty()
          ? names_[unit]
          : "<root module>";
  return std::string(phase == kForward ? "forward" : "backward") + " of '" + name + "'";
}

void GatherSchedule::verify(Phase phase, std::size_t unit, std::int64_t step) {
  const int world = communicator_.world_size();
  if (world == 1) return;
  const auto options = at::TensorOptions().dtype(at::kLong);
  at::Tensor mine = at::tensor({static_cast<std::int64_t>(phase),
                                static_cast<std::int64_t>(unit), step}, options)
                        .to(options_.device);
  at::Tensor everyone = at::zeros({3 * world}, options.device(options_.device));
  communicator_.all_gather(everyone, mine, /*control=*/true)->wait();
  everyone = everyone.cpu();
  const auto* values = everyone.data_ptr<std::int64_t>();
  bool agree = true;
  for (int r = 0; r < world && agree; ++r) {
    agree = values[3 * r] == phase && values[3 * r + 1] == static_cast<std::int64_t>(unit) &&
            values[3 * r + 2] == step;
  }
  if (agree) return;
  std::ostringstream message;
  message << "zero: ranks diverged at stage 3 (step " << step << "): ";
  for (int r = 0; r < world; ++r) {
    message << (r ? "; " : "") << "rank " << r << " is at " << describe(values[3 * r], values[3 * r + 1])
            << " of step " << values[3 * r + 2];
  }
  message << ". Every rank must run the same modules in the same order (data-dependent "
             "branches must agree across ranks)";
  TORCH_CHECK(false, message.str());
}

void GatherSchedule::advance(Order& order, std::size_t unit, std::int64_t step,
                             const char* phase_name) {
  const std::size_t position = order.current.size();
  order.current.push_back(unit);
  if (!order.following) return;
  if (position < order.recorded.size() && order.recorded[position] == unit) return;
  order.following = false;
  if (notice_.empty() && !order.recorded.empty()) {
    std::ostringstream message;
    message << "zero: the stage-3 " << phase_name << " order changed at step " << step
            << " (position " << position << ": expected '"
            << (position < order.recorded.size() ? names_[order.recorded[position]] : "<end>")
            << "', got '" << names_[unit]
            << "'); prefetching stops for this step and the new order is recorded";
    notice_ = message.str();
  }
}

bool GatherSchedule::is_live(std::size_t unit) const {
  for (const auto& [group, local] : placement_[unit]) {
    if (!group->is_gathered(local)) return false;
  }
  return !placement_[unit].empty();
}

std::int64_t GatherSchedule::unit_numel(std::size_t unit) const {
  std::int64_t numel = 0;
  for (const auto& [group, local] : placement_[unit]) numel += group->layout().unit(local).numel();
  return numel;
}

std::int64_t GatherSchedule::gathered_numel() const {
  std::int64_t numel = 0;
  for (std::size_t u = 0; u < placement_.size(); ++u) {
    if (is_live(u)) numel += unit_numel(u);
  }
  return numel;
}

void GatherSchedule::check_live_bound(std::size_t unit) const {
  const std::int64_t live = gathered_numel();
  TORCH_CHECK(live <= options_.max_live_numel, "zero: gathering unit '",
              names_[unit].empty() ? "<root module>" : names_[unit],
              "' brings the gathered parameters to ", live,
              " elements, above zero_optimization.stage3_max_live_parameters = ",
              options_.max_live_numel,
              "; raise the bound or split the model into smaller units (every ModuleList child "
              "is one unit)");
}

void GatherSchedule::fetch(std::size_t unit) {
  for (const auto& [group, local] : placement_[unit]) group->fetch(local);
}

void GatherSchedule::gather(std::size_t unit) {
  for (const auto& [group, local] : placement_[unit]) group->gather(local);
  check_live_bound(unit);
}

void GatherSchedule::release(std::size_t unit) {
  for (const auto& [group, local] : placement_[unit]) group->release(local);
}

void GatherSchedule::prefetch(const Order& order) {
  if (options_.prefetch_numel <= 0 || !order.following) return;
  std::int64_t ahead = 0;
  for (std::size_t position = order.current.size(); position < order.recorded.size();
       ++position) {
    const std::size_t next = order.recorded[position];
    if (is_live(next)) continue;
    const std::int64_t numel = unit_numel(next);
    if (ahead + numel > options_.prefetch_numel ||
        gathered_numel() + numel > options_.max_live_numel) {
      return;
    }
    fetch(next);
    ahead += numel;
    ++prefetches_;
  }
}

void GatherSchedule::restart(Order& order) {
  if (!order.following || order.recorded.empty()) order.recorded = order.current;
  order.current.clear();
  order.following = true;
}

void GatherSchedule::before_forward(std::size_t unit, std::int64_t step) {
  verify(kForward, unit, step);
  if (unit == 0 && !forward_.current.empty()) restart(forward_);  // the root opens a forward
  advance(forward_, unit, step, "forward");
  gather(unit);
  prefetch(forward_);
}

void GatherSchedule::after_forward(std::size_t unit) { release(unit); }


void GatherSchedule::before_backward(std::size_t unit, std::int64_t step) {
  verify(kBackward, unit, step);
  advance(backward_, unit, step, "backward");
  gather(unit);
  prefetch(backward_);
}

void GatherSchedule::end_backward(std::int64_t step) {
  verify(kEnd, 0, step);
  restart(forward_);
  restart(backward_);
}

}  // namespace zero::adapter
