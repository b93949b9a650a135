#include "adapter/grad_reducer.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "adapter/quantized_comm.h"

namespace zero::adapter {

GradReducer::GradReducer(ReduceMode mode, const core::ShardedLayout& layout, bool overlap_comm,
                         at::Tensor grads, core::MemoryRegistry& registry,
                         Communicator& communicator, std::vector<std::size_t> expected,
                         std::optional<at::TensorOptions> bucket_options,
                         const std::vector<std::size_t>& shared, bool quantized,
                         Communicator* replicate)
    : mode_(mode),
      quantized_(quantized),
      layout_(layout),
      grads_(std::move(grads)),
      bucket_options_(bucket_options.value_or(grads_.options())),
      registry_(registry),
      communicator_(communicator),
      replicate_(replicate),
      expected_(std::move(expected)),
      slot_of_unit_(layout.unit_count(), nullptr) {
  if (expected_.empty()) {
    for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
      expected_.push_back(layout_.unit(u).params().size());
    }
  }
  TORCH_CHECK(expected_.size() == layout_.unit_count(), "zero: expected gradient counts for ",
              expected_.size(), " units but the layout has ", layout_.unit_count());
  missing_ = expected_;
  shared_.assign(layout_.param_count(), false);
  holds_shared_.assign(layout_.unit_count(), false);
  arrivals_.assign(layout_.param_count(), 0);
  for (const std::size_t param : shared) {
    TORCH_CHECK(param < layout_.param_count(), "zero: shared parameter ", param,
                " outside the group's ", layout_.param_count());
    const std::size_t unit = layout_.location(param).buffer;
    shared_[param] = true;
    holds_shared_[unit] = true;
    TORCH_CHECK(missing_[unit] > 0, "zero: shared parameter ", param, " is not trainable");
    --missing_[unit];  // counted by arrival instead: the unit completes at the end of backward
  }
  expected_ = missing_;
  launched_.assign(layout_.unit_count(), false);
  overwrite_.assign(layout_.unit_count(), false);
  converts_ = grads_.scalar_type() != c10::typeMetaToScalarType(bucket_options_.dtype());
  if (mode_ != ReduceMode::kAllReduce || converts_) {
    slot_limit_ = std::min<std::size_t>(overlap_comm ? 2 : 1, layout_.unit_count());
  }
  into_shard_ = mode_ == ReduceMode::kReduceScatter && !quantized_ && replicate_ == nullptr &&
                grads_.device() == bucket_options_.device() && !converts_;
  host_shard_ = mode_ == ReduceMode::kReduceScatter && grads_.is_cpu();
}

std::int64_t GradReducer::bucket_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& slot : slots_) bytes += slot->full.bytes() + slot->piece.bytes();
  return bytes;
}

GradReducer::Slot& GradReducer::add_slot(std::int64_t numel, bool with_piece) {
  // zero-filled (TrackedTensor): alignment gaps and padding add nothing
  auto slot = std::make_unique<Slot>();
  if (mode_ == ReduceMode::kReduceScatter || converts_) {
    slot->full = device_buffer(registry_, core::MemoryCategory::kBucket, numel, bucket_options_);
  }
  if (with_piece) {
    slot->piece = device_buffer(registry_, core::MemoryCategory::kBucket,
                                numel / layout_.world_size(), bucket_options_);
  }
  slots_.push_back(std::move(slot));
  return *slots_.back();
}

GradReducer::Slot& GradReducer::acquire_slot(std::int64_t numel, bool with_piece) {
  // The oldest bucket on the wire is waited for (and freed) before a bucket beyond the limit
  // is made; only when every bucket is still filling does the backward hold more (the
  // report's peak shows it).
  while (slots_.size() >= slot_limit_ && wait_for_a_bucket()) {
  }
  return add_slot(numel, with_piece);
}

bool GradReducer::wait_for_a_bucket() {
  if (!copying_.empty()) {  // the oldest bucket being copied into the host shard
    wait_oldest_copy();
    return true;
  }
  const bool any = std::any_of(in_flight_.begin(), in_flight_.end(),
                               [](const InFlight& entry) { return entry.slot != nullptr; });
  while (any) {
    const bool holds_bucket = in_flight_.front().slot != nullptr;
    wait_oldest();
    if (holds_bucket) break;
  }
  return any;
}

void GradReducer::release(Slot* slot) {
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if (it->get() == slot) {
      slots_.erase(it);  // its buffers go back to the allocator, and out of the registry
      return;
    }
  }
}

GradReducer::Slot& GradReducer::slot_for(std::size_t unit) {
  if (slot_of_unit_[unit] == nullptr) {
    // new and zero-filled: alignment gaps and padding add nothing
    slot_of_unit_[unit] =
        &acquire_slot(layout_.unit(unit).numel(), !reduces_into_shard(unit));
  }
  return *slot_of_unit_[unit];
}

std::optional<std::size_t> GradReducer::grad_ready(std::size_t param, const at::Tensor& grad) {
  TORCH_CHECK(param < layout_.param_count(), "zero: gradient for parameter ", param,
              " but the group has ", layout_.param_count());
  const core::ParamLocation where = layout_.location(param);
  const bool again = arrivals_[param]++ > 0;
  TORCH_CHECK(!launched_[where.buffer] && (shared_[param] || !again), "zero: the gradient of "
              "parameter ", param, " arrived twice in one backward. A weight the model uses in "
              "two reentrant activation-checkpointed regions (torch.utils.checkpoint with "
              "use_reentrant=True) gets one gradient per region; the engine adds them up only "
              "for weights registered under two names (tied). Use use_reentrant=False, or "
              "deepspeed.checkpointing.checkpoint");
  // An undefined gradient (a custom autograd function returning None for this parameter on
  // this rank, as DDP allows) is a zero one: the unit's bucket is new and zero-filled.
  if (mode_ == ReduceMode::kReduceScatter && grad.defined()) {
    const core::ParamSlot& slot = layout_.unit(where.buffer).params()[where.index];
    at::Tensor target = slot_for(where.buffer).full.tensor().narrow(0, slot.offset, slot.numel);
    if (again) {
      target.add_(grad.reshape({-1}));
    } else {
      target.copy_(grad.reshape({-1}));
    }
  }
  if (shared_[param]) return std::nullopt;  // complete at the end of backward
  // A unit holding a shared parameter completes at the end of backward too: reported
  // complete now, it would be learned as the first to launch and hold every later unit's
  // bucket back until then.
  if (--missing_[where.buffer] == 0 && !holds_shared_[where.buffer]) return where.buffer;
  return std::nullopt;
}

void GradReducer::launch(std::size_t unit) {
  TORCH_CHECK(!launched_.at(unit), "zero: unit ", unit, " launched twice in one backward");
  launched_[unit] = true;
  const core::FlatBufferPlan& plan = layout_.unit(unit);
  if (mode_ == ReduceMode::kAllReduce) {
    at::Tensor range = grads_.narrow(0, layout_.full_offset(unit), plan.numel());
    if (!converts_) {
      in_flight_.push_back({nullptr, communicator_.all_reduce(range, Reduction::kAvg), {}});
      return;
    }
    Slot& slot = acquire_slot(plan.numel(), /*with_piece=*/false);
    at::Tensor copy = slot.full.tensor().narrow(0, 0, plan.numel());
    copy.copy_(range);
    in_flight_.push_back({&slot, communicator_.all_reduce(copy, Reduction::kAvg),
                          [range, copy]() mutable {
                            range.copy_(copy);
                            return std::shared_future<void>();
                          }});
    return;
  }
  if (mode_ == ReduceMode::kReduceScatterInPlace) {
    launch_in_place(unit);
    return;
  }
  Slot& slot = slot_for(unit);
  slot_of_unit_[unit] = nullptr;  // launched: no more gradients (freed once reduced)
  at::Tensor input = slot.full.tensor().narrow(0, 0, plan.numel());
  at::Tensor target = grads_.narrow(0, layout_.shard_offset(unit), plan.shard_numel());
  if (!slot.piece.defined()) {  // the window's first reduction: straight into the shard
    overwrite_[unit] = false;
    in_flight_.push_back({&slot, communicator_.reduce_scatter(target, input, Reduction::kAvg),
                          {}});
    return;
  }
  at::Tensor output = slot.piece.tensor().narrow(0, 0, plan.shard_numel());
  auto work = quantized_ ? quantized_reduce_scatter(communicator_, output, input, Reduction::kAvg)
                        : communicator_.reduce_scatter(output, input, Reduction::kAvg);
  if (host_shard_ && !quantized_ && replicate_ == nullptr && !converts_) {
    // The piece goes to the host shard as soon as it is reduced: its copy is queued now and
    // waits for the collective alone (on a GPU, on the copy stream: not behind the backward
    // queued meanwhile, nor blocking the engine thread).
    std::shared_ptr<PendingCollective> reducing(std::move(work));
    std::shared_future<void> copying = accumulate(unit, target, output, reducing);
    in_flight_.push_back({&slot, nullptr, [copying] { return copying; }});
    return;
  }
  in_flight_.push_back({&slot, std::move(work),
                        [this, unit, target, output]() mutable {
                          if (replicate_ != nullptr) {
                            replicate_->all_reduce(output, Reduction::kAvg)->wait();
                          }
                          // back in the gradients' dtype on the device: a host shard then
                          // takes the narrow copy
                          return accumulate(unit, target,
                                            converts_ ? output.to(grads_.scalar_type())
                                                      : output);
                        }});
}

void GradReducer::launch_in_place(std::size_t unit) {
  const core::FlatBufferPlan& plan = layout_.unit(unit);
  Slot& slot = acquire_slot(plan.numel(), /*with_piece=*/true);
  at::Tensor range = grads_.narrow(0, layout_.full_offset(unit), plan.numel());
  at::Tensor output = slot.piece.tensor().narrow(0, 0, plan.shard_numel());
  at::Tensor mine = range.narrow(0, communicator_.rank() * plan.shard_numel(), plan.shard_numel());
  at::Tensor input = range;
  if (converts_) {  // the unit in the communication dtype
    input = slot.full.tensor().narrow(0, 0, plan.numel());
    input.copy_(range);
  }
  in_flight_.push_back({&slot, communicator_.reduce_scatter(output, input, Reduction::kAvg),
                        [mine, output]() mutable {
                          mine.copy_(output);
                          return std::shared_future<void>();
                        }});
}

std::shared_future<void> GradReducer::accumulate(std::size_t unit, const at::Tensor& target,
                                                 const at::Tensor& reduced,
                                                 std::shared_ptr<PendingCollective> reducing) {
  const bool first = overwrite_[unit];
  overwrite_[unit] = false;
  if (!host_shard_) {
    if (first) {
      target.copy_(reduced);
    } else {
      target.add_(reduced);
    }
    return {};
  }
  // A host shard: the copy (and a later micro-step's add) runs on the copy engine, after
  // the work queued so far and `reducing`, while the engine thread goes on. `reducing` is
  // waited for on the copy engine's thread, its stream current: on a GPU the copy stream
  // waits for the collective, the host does not.
  if (!copier_) copier_ = std::make_unique<CopyEngine>(bucket_options_.device());
  ++copy_timings_.batches;
  std::function<void()> after_reduction;
  if (reducing) after_reduction = [reducing] { reducing->wait(); };
  return copier_->submit([target, reduced, first] {
    if (first) {
      CopyEngine::copy(target, reduced);  // the window's first gradient: one D2H copy
    } else if (reduced.device() == target.device()) {
      target.add_(reduced);
    } else {  // added on the device, where the sum is cheap: the range comes in and goes back
      at::Tensor sum = at::empty_like(reduced);
      CopyEngine::copy(sum, target);
      sum.add_(reduced);
      CopyEngine::copy(target, sum);
    }
  }, std::move(after_reduction));
}

void GradReducer::grads_zeroed() {
  overwrite_.assign(layout_.unit_count(), true);
  discarded_ = false;
}

void GradReducer::grads_discarded() {
  TORCH_CHECK(mode_ == ReduceMode::kReduceScatter,
              "zero: only a gradient shard can be discarded instead of zeroed");
  overwrite_.assign(layout_.unit_count(), true);
  discarded_ = true;
}

void GradReducer::zero_unreduced() {
  finish_copies();  // nothing writes the shard once it is read
  if (!discarded_) return;
  discarded_ = false;
  for (std::size_t u = 0; u < overwrite_.size(); ++u) {
    if (!overwrite_[u]) continue;
    grads_.narrow(0, layout_.shard_offset(u), layout_.unit(u).shard_numel()).zero_();
  }
}

void GradReducer::wait_oldest() {
  InFlight entry = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (entry.work) entry.work->wait();  // (none: its copy waits for it)
  std::shared_future<void> copying = entry.then ? entry.then() : std::shared_future<void>();
  if (copying.valid()) {
    TORCH_CHECK(entry.slot != nullptr, "zero: a host copy without its bucket");
    copying_.push_back({entry.slot, std::move(copying)});
  } else if (entry.slot != nullptr) {
    release(entry.slot);
  }
}

void GradReducer::wait_oldest_copy() {
  Copying entry = std::move(copying_.front());
  copying_.pop_front();
  const auto start = std::chrono::steady_clock::now();
  // A failed batch keeps its bucket: its collective may have failed too, and may still write
  // it (the copy stream never waited for it).
  entry.done.get();  // rethrows a failed copy
  copy_timings_.wait_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release(entry.slot);
}

HostCopyTimings GradReducer::host_copy_timings() const {
  HostCopyTimings timings = copy_timings_;
  if (copier_) timings.copy_s = copier_->busy_seconds();
  return timings;
}

void GradReducer::finish_copies() {
  // (Not the copies still queued behind collectives in flight, after a backward cut short:
  // those collectives may never complete. Each such copy holds its tensors, and the engine
  // starts no other backward.)
  std::exception_ptr failed;
  while (!copying_.empty()) {
    try {
      wait_oldest_copy();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void GradReducer::wait_all() {
  try {
    while (!in_flight_.empty()) wait_oldest();
  } catch (...) {
    try {
      finish_copies();  // none may still write the shard once this returns
    } catch (...) {
    }
    throw;
  }
  finish_copies();
}

void GradReducer::reset() {
  TORCH_CHECK(in_flight_.empty(), "zero: reset() with collectives still in flight");
  std::exception_ptr failed;
  try {
    finish_copies();  // a backward cut short: its copies end first
  } catch (...) {
    failed = std::current_exception();
  }
  missing_ = expected_;
  arrivals_.assign(layout_.param_count(), 0);
  launched_.assign(layout_.unit_count(), false);
  for (auto& slot : slot_of_unit_) slot = nullptr;
  slots_.clear();  // normally empty already; a backward cut short may leave a filling bucket
  if (failed) std::rethrow_exception(failed);
}

}  // namespace zero::adapter
