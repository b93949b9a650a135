#pragma once
// Gradient reduction unit by unit, overlapped with backward. The reducer collects gradients
// and says when a unit is complete; *when* a unit is launched is decided by EngineCore, which
// keeps one launch sequence across all groups (the same on every rank), so ranks always issue
// the same collectives in the same order.
//
//   kAllReduce     (stage 0): grads live in a full buffer (param.grad are views of it);
//                  a ready unit is all-reduced (averaged) in place.
//   kReduceScatterInPlace (stage 1, and stage 3's persistent group): grads live in a full
//                  buffer too, but only this rank's piece of each unit is stepped, so a ready
//                  unit is reduce-scattered: the piece receives the average (through a
//                  piece-sized bucket) and the rest of the unit stays this rank's own. The
//                  step moves 2Ψ (this and the parameters' all-gather), not all-reduce's 3Ψ.
//   kReduceScatter (stage 2): each ready grad is copied into a unit-sized bucket and may be
//                  freed; the bucket is reduce-scattered and each rank adds its 1/N into its
//                  gradient shard: straight into it at an accumulation window's first
//                  reduction, through a piece-sized buffer otherwise (reduces_into_shard).
//                  Buckets come from a small pool (two with overlap_comm, one without) that
//                  grows only if more units fill at once than it holds. A shard in host
//                  memory (optimizer offload on a GPU, or any CPU run) is fed off the engine
//                  thread (copy_engine.h): each unit's 1/N is copied in (the window's first)
//                  or added (on the buckets' device: the range comes in, takes the sum, goes
//                  back) while backward goes on. The copy is queued when the reduce-scatter
//                  is launched and waits for that collective alone (on a GPU the copy stream
//                  waits, not the compute stream nor the host); its bucket is held until it is
//                  done, and wait_all() waits for those copies too.
// With a bucket dtype other than the gradients' (DeepSpeed's communication_data_type, e.g.
// fp32 sums of bf16 gradients; or bf16 buckets for gradients accumulated in fp32,
// GroupOptions::grads_in_fp32), every mode reduces a copy of the unit in a bucket of that
// dtype and casts the result back into the gradients (on the device, before a host
// shard's copy). With qgZ the copy is quantized as DeepSpeed quantizes its cast: the wire
// carries the same int8, the buckets are the larger dtype's.
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/collectives.h"
#include "adapter/copy_engine.h"
#include "adapter/tracked_tensor.h"
#include "core/sharded_layout.h"

namespace zero::adapter {

enum class ReduceMode { kAllReduce, kReduceScatterInPlace, kReduceScatter };

// A host gradient shard's copies so far (kReduceScatter into host memory): how many batches
// went to the copy engine, the copy engine's time for them (copy_engine.h busy_seconds), and
// how long the engine thread waited for them: for a bucket to come free, at the end of
// backward, or before the shard was read. The wait is what backward did not hide.
struct HostCopyTimings {
  std::int64_t batches = 0;
  double copy_s = 0;
  double wait_s = 0;
};

// The reduce-scatter buckets (stages 1-3): each is made for its unit when the unit's first
// gradient arrives (its reduce-scatter, at stage 1), sized to it, and freed as soon as its
// reduce-scatter is waited for: nothing is kept between steps, and a backward holds at most
// `slots` units' buckets at once (two with overlap_comm), more only while that many units
// are all still filling (a tied weight's unit fills over the whole backward).

class GradReducer {
 public:
  // `grads`: the full gradient buffer (kAllReduce, kReduceScatterInPlace) or this rank's
  // gradient shard (kReduceScatter), laid out by `layout`; written, never owned.
  // expected[u]: how many gradients unit u receives per backward (default: all its
  // parameters; stage 3 units may hold frozen ones). Buckets are allocated with
  // `bucket_options` (default: the gradients'; another dtype is the communication dtype:
  // each unit is then reduced as a copy in it, at every stage). `shared`: parameters whose
  // gradient may arrive several times per backward (GroupOptions::shared_params): their
  // arrivals add up and their units complete only at the end of backward (launched by the
  // owner then).
  // `quantized`: kReduceScatter sends block-wise int8 (quantized_comm.h, ZeRO++ qgZ).
  // `replicate` (kReduceScatter, MiCS): the ranks holding the same shard; each reduced piece
  // is averaged over them before it is added to the shard.
  GradReducer(ReduceMode mode, const core::ShardedLayout& layout, bool overlap_comm,
              at::Tensor grads, core::MemoryRegistry& registry, Communicator& communicator,
              std::vector<std::size_t> expected = {},
              std::optional<at::TensorOptions> bucket_options = std::nullopt,
              const std::vector<std::size_t>& shared = {}, bool quantized = false,
              Communicator* replicate = nullptr);

  // Parameter `param`'s gradient (or, for a shared one, one more contribution to it) is
  // final for this backward (kReduceScatter copies it). Returns its unit if that unit is now
  // complete.
  std::optional<std::size_t> grad_ready(std::size_t param, const at::Tensor& grad);
  bool complete(std::size_t unit) const {
    return missing_.at(unit) == 0 && !holds_shared_.at(unit);
  }
  bool shared(std::size_t param) const { return shared_.at(param); }
  bool launched(std::size_t unit) const { return launched_.at(unit); }
  std::size_t unit_count() const { return layout_.unit_count(); }
  // Starts the unit's collective. Units with missing gradients (unused parameters) may be
  // launched at the end of backward: their gradients count as zero.
  void launch(std::size_t unit);
  void wait_all();
  // Ready for the next backward (every bucket was freed when its unit was done).
  void reset();
  // The owner has just zeroed `grads` (a new accumulation window): each unit's next reduced
  // gradient is copied in instead of added, which for a host shard (optimizer offload) is one
  // copy into its pinned memory instead of a temporary, a copy and an add on the CPU. Until
  // the first call every unit adds, which is right whatever `grads` holds.
  void grads_zeroed();
  // As grads_zeroed, but `grads` still holds the last window's gradients: a host shard is not
  // zeroed (a pass over all of its memory every step), since every unit's next reduction
  // overwrites its range. Before anyone reads `grads`, zero_unreduced() zeroes the ranges of
  // the units no reduction has reached since (kReduceScatter only: `grads` is the shard).
  void grads_discarded();
  void zero_unreduced();
  // Waits for every copy into a host shard whose collective was waited for (all of them at
  // the end of backward: wait_all), rethrowing the first that failed; after a backward cut
  // short, zero_unreduced(), reset() and the owner before it zeroes or frees the shard
  // (start_grad_window) call it too.
  void finish_copies();
  std::size_t bucket_count() const { return slots_.size(); }
  std::int64_t bucket_bytes() const;
  HostCopyTimings host_copy_timings() const;

 private:
  struct Slot {
    TrackedTensor full;   // one unit's gradients, the collective's input (kReduceScatter, or
                          // any mode converting to the communication dtype)
    TrackedTensor piece;  // this rank's 1/N, reduce-scatter output; none when it goes straight
                          // into the gradient shard
  };
  struct InFlight {
    Slot* slot = nullptr;  // the reduce-scatter modes only
    std::unique_ptr<PendingCollective> work;  // none: the copy `then` returns waits for it
    // runs after the wait; a valid future: the slot's bucket is read until it is ready
    std::function<std::shared_future<void>()> then;
  };
  struct Copying {  // a bucket whose reduced piece is on its way into a host shard
    Slot* slot = nullptr;
    std::shared_future<void> done;
  };

  Slot& slot_for(std::size_t unit);
  void launch_in_place(std::size_t unit);
  // Copies (the window's first) or adds `reduced` into the unit's range of the gradients;
  // for a host shard off the engine thread (the future: done when it is), after `reducing`
  // (the collective that makes `reduced`) when given.
  std::shared_future<void> accumulate(std::size_t unit, const at::Tensor& target,
                                      const at::Tensor& reduced,
                                      std::shared_ptr<PendingCollective> reducing = nullptr);
  Slot& acquire_slot(std::int64_t numel, bool with_piece);
  Slot& add_slot(std::int64_t numel, bool with_piece);
  // kReduceScatter: the unit's reduced 1/N can be the collective's output in the gradient shard
  // itself (the window's first reduction, plain, on the bucket's device and dtype).
  bool reduces_into_shard(std::size_t unit) const { return into_shard_ && overwrite_[unit]; }
  bool wait_for_a_bucket();  // false: no bucket is on the wire or being copied
  void release(Slot* slot);  // a bucket whose reduce-scatter (and copy) is done
  void wait_oldest();
  void wait_oldest_copy();

  ReduceMode mode_;
  bool quantized_;
  const core::ShardedLayout& layout_;
  at::Tensor grads_;
  at::TensorOptions bucket_options_;
  core::MemoryRegistry& registry_;
  Communicator& communicator_;
  Communicator* replicate_;
  bool into_shard_ = false;  // kReduceScatter, not quantized, not MiCS, shard beside the buckets
  // The buckets' dtype is not the gradients' (GroupOptions::communication_dtype): every mode
  // reduces a copy of the unit in a bucket and casts the result back.
  bool converts_ = false;
  std::vector<std::size_t> expected_;  // per unit: gradients of unshared params per backward
  std::vector<std::size_t> missing_;   // gradients still to arrive, per unit
  std::vector<bool> shared_;           // per parameter: GroupOptions::shared_params
  std::vector<bool> holds_shared_;     // per unit: it has a shared parameter
  std::vector<std::uint32_t> arrivals_;  // per parameter: contributions this backward
  std::vector<Slot*> slot_of_unit_;
  std::vector<bool> launched_;
  // per unit: its next reduction overwrites its range of `grads`, which holds zeros
  // (grads_zeroed) or, while `discarded_`, the last window's gradients (grads_discarded)
  std::vector<bool> overwrite_;
  bool discarded_ = false;
  std::size_t slot_limit_ = 0;  // the most buckets live at once while one is on the wire
  std::deque<std::unique_ptr<Slot>> slots_;
  std::deque<InFlight> in_flight_;    // oldest first
  bool host_shard_ = false;           // kReduceScatter into a shard in host memory
  std::deque<Copying> copying_;       // oldest first
  HostCopyTimings copy_timings_;      // copy_s is the copier's, read when asked
  std::unique_ptr<CopyEngine> copier_;  // made at a host shard's first copy; last: joins first
};

}  // namespace zero::adapter
