#include "adapter/grad_reducer.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace zero::adapter {

GradReducer::GradReducer(ReduceMode mode, const core::FlatBufferPlan& plan,
                         std::int64_t bucket_numel, bool overlap_comm, at::Tensor grads,
                         core::MemoryRegistry& registry, Communicator& communicator)
    : mode_(mode),
      plan_(plan),
      buckets_(core::plan_buckets(plan, bucket_numel)),
      bucket_of_param_(plan.params().size(), 0),
      missing_(buckets_.size(), 0),
      slot_of_bucket_(buckets_.size(), nullptr),
      grads_(std::move(grads)),
      registry_(registry),
      communicator_(communicator) {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (const std::size_t p : buckets_[b].params) bucket_of_param_[p] = b;
    missing_[b] = buckets_[b].params.size();
    max_chunk_numel_ = std::max(max_chunk_numel_, buckets_[b].chunk_numel);
  }
  if (mode_ == ReduceMode::kReduceScatter) {
    const int initial_slots = overlap_comm ? 2 : 1;
    for (int i = 0; i < initial_slots && i < static_cast<int>(buckets_.size()); ++i) {
      add_slot();  // allocated up front: the memory report shows them from step 0
    }
  }
}

std::int64_t GradReducer::bucket_buffer_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& slot : slots_) bytes += slot->scatter.bytes() + slot->chunk.bytes();
  return bytes;
}

GradReducer::Slot& GradReducer::acquire_slot() {
  for (auto& slot : slots_) {
    if (!slot->filling && !slot->in_flight) {
      slot->filling = true;
      return *slot;
    }
  }
  // Recycle the oldest buffer on the wire, unless none is (then every buffer is filling).
  for (const InFlight& entry : in_flight_) {
    if (entry.slot != nullptr) {
      while (!in_flight_.empty() && in_flight_.front().slot != entry.slot) wait_oldest();
      wait_oldest();
      return acquire_slot();
    }
  }
  Slot& slot = add_slot();
  slot.filling = true;
  return slot;
}

GradReducer::Slot& GradReducer::add_slot() {
  auto slot = std::make_unique<Slot>();
  const auto options = grads_.options();
  slot->scatter = TrackedTensor(registry_, core::MemoryCategory::kBucket,
                                core::MemoryLocation::kDevice,
                                max_chunk_numel_ * plan_.world_size(), options);
  slot->chunk = TrackedTensor(registry_, core::MemoryCategory::kBucket,
                              core::MemoryLocation::kDevice, max_chunk_numel_, options);
  slots_.push_back(std::move(slot));
  return *slots_.back();
}

GradReducer::Slot& GradReducer::slot_for(std::size_t bucket) {
  if (slot_of_bucket_[bucket] == nullptr) {
    Slot& slot = acquire_slot();
    slot.scatter.tensor().zero_();  // chunk padding and alignment gaps must add nothing
    slot_of_bucket_[bucket] = &slot;
  }
  return *slot_of_bucket_[bucket];
}

void GradReducer::grad_ready(std::size_t index, const at::Tensor& grad) {
  TORCH_CHECK(index < bucket_of_param_.size(), "zero: gradient for parameter ", index,
              " but the group has ", bucket_of_param_.size());
  const std::size_t bucket = bucket_of_param_[index];
  TORCH_CHECK(missing_[bucket] > 0, "zero: gradient of parameter ", index,
              " arrived twice in one backward; each parameter's post-accumulate hook must fire "
              "once per backward");
  if (mode_ == ReduceMode::kReduceScatter) {
    TORCH_CHECK(grad.defined(), "zero: parameter ", index, " reported ready without a gradient");
    const at::Tensor flat = grad.reshape({-1});
    const at::Tensor& scatter = slot_for(bucket).scatter.tensor();
    for (const core::BucketPiece& piece : buckets_[bucket].pieces) {
      if (piece.param != index) continue;
      const std::int64_t length = piece.param_end - piece.param_begin;
      scatter.narrow(0, piece.bucket_offset, length)
          .copy_(flat.narrow(0, piece.param_begin, length));
    }
  }
  --missing_[bucket];
  launch_ready_buckets();
}

void GradReducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) launch(next_launch_++);
}

void GradReducer::launch(std::size_t bucket_index) {
  const core::Bucket& bucket = buckets_[bucket_index];
  if (mode_ == ReduceMode::kAllReduce) {
    at::Tensor range = grads_.narrow(0, bucket.flat_begin, bucket.flat_end - bucket.flat_begin);
    in_flight_.push_back({nullptr, communicator_.all_reduce(range, Reduction::kAvg), {}});
    return;
  }
  Slot& slot = slot_for(bucket_index);
  slot.filling = false;
  slot.in_flight = true;
  const std::int64_t chunk = bucket.chunk_numel;
  at::Tensor input = slot.scatter.tensor().narrow(0, 0, chunk * plan_.world_size());
  at::Tensor output = slot.chunk.tensor().narrow(0, 0, chunk);
  const core::BucketShard mine = bucket.shards[communicator_.rank()];
  at::Tensor shard = grads_;
  auto accumulate = [shard, output, mine]() mutable {
    if (mine.length > 0) {
      shard.narrow(0, mine.shard_offset, mine.length).add_(output.narrow(0, 0, mine.length));
    }
  };
  in_flight_.push_back(
      {&slot, communicator_.reduce_scatter(output, input, Reduction::kAvg), std::move(accumulate)});
}

void GradReducer::wait_oldest() {
  InFlight entry = std::move(in_flight_.front());
  in_flight_.pop_front();
  entry.work->wait();
  if (entry.then) entry.then();
  if (entry.slot != nullptr) entry.slot->in_flight = false;
}

void GradReducer::finish() {
  for (std::size_t b = next_launch_; b < buckets_.size(); ++b) missing_[b] = 0;
  launch_ready_buckets();
  while (!in_flight_.empty()) wait_oldest();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    missing_[b] = buckets_[b].params.size();
    slot_of_bucket_[b] = nullptr;
  }
  next_launch_ = 0;
}

}  // namespace zero::adapter
