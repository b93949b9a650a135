#pragma once
// A shard's fp32 master and optimizer state offloaded from the device (ZeRO-Offload /
// ZeRO-Infinity), and the step that streams the shard through them in chunks:
//
//   host ("cpu"):  the state lives in one host pool (pinned when possible); the copy engine
//                  (copy_engine.h: its own CUDA stream, or a worker thread on CPU) copies
//                  chunk c+1's gradients to host staging and chunk c-1's new parameters back
//                  to the device while the fused CPU Adam updates chunk c.
//   NVMe ("nvme"): the state lives in a swap file; the host holds two chunks of it, read
//                  ahead and written back around each chunk's update.
//   delayed update (DPU, host only): the whole host update of step i runs on a second worker
//                  during step i+1's forward and backward; its parameters are applied at the
//                  start of step i+1's optimizer step.
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/copy_engine.h"
#include "adapter/optimizer_math.h"
#include "core/host_pool.h"
#include "core/io_backend.h"
#include "core/memory_registry.h"
#include "core/swap_store.h"
#include "core/task_worker.h"

namespace zero::adapter {

struct OffloadOptions {
  bool enabled = false;
  bool pin_memory = false;
  std::int64_t tile_numel = std::int64_t{1} << 22;  // elements per streamed chunk
  int num_threads = 1;                               // CPU Adam threads
  std::string nvme_path;  // non-empty: the state lives in a swap file in this directory
  core::AioConfig aio;
  bool delayed_update = false;  // ZeRO-Offload's DPU (host only)
  // Fraction of the shard whose state and step go to the host / NVMe (the shard's tail);
  // the rest stays on the device.
  double ratio = 1.0;
  // With NVMe: told the bytes of each chunk written outside the step (start-up, checkpoint
  // load, commit), for a progress display. Never called from the step.
  std::function<void(std::int64_t bytes)> on_swap_write;
};

// Where the offloaded steps' time went (host mode, summed over steps): waiting for gradient
// chunks to reach host staging, the CPU optimizer, waiting for new parameters to reach the
// model, and the whole step. Measured on the engine thread, so the waits are what the copies
// did not hide behind the CPU Adam.
struct OffloadTimings {
  std::int64_t steps = 0;
  double grads_in_wait_s = 0;
  double cpu_optimizer_s = 0;
  double params_out_wait_s = 0;
  double step_s = 0;
};

// One contiguous piece of this rank's shard: its gradients and the parameters the step
// writes (model dtype, `grad.numel()` elements) at `offset` in the shard. The new parameters
// go into `param`, or, when the parameters live on NVMe, to `store`, which receives them in
// order as (begin within the piece, values).
struct ShardPiece {
  using Store = std::function<void(std::int64_t begin, const at::Tensor& values)>;
  at::Tensor grad;
  at::Tensor param;  // undefined when `store` is set
  std::int64_t offset = 0;
  Store store;
  std::int64_t store_base = 0;  // this piece starts here in what `store` was made for
};

// Writes new parameters [begin, begin + values.numel()) of the piece; `copy` moves them into
// `param` (CopyEngine::copy inside a copy-engine batch).
void store_params(const ShardPiece& piece, std::int64_t begin, const at::Tensor& values,
                  void (*copy)(const at::Tensor& dst, const at::Tensor& src) = nullptr);
// Elements [begin, begin + numel) of the piece, at `offset` in the shard.
ShardPiece sub_piece(const ShardPiece& piece, std::int64_t begin, std::int64_t numel,
                     std::int64_t offset);

class OffloadedState {
 public:
  OffloadedState(core::MemoryRegistry& registry, std::int64_t shard_numel,
                 const c10::TensorOptions& device_options, OptimizerKind kind, bool sgd_momentum,
                 const OffloadOptions& offload);
  ~OffloadedState();
  OffloadedState(const OffloadedState&) = delete;
  OffloadedState& operator=(const OffloadedState&) = delete;

  bool nvme() const { return swap_ != nullptr; }
  bool pinned() const { return host_pool_->pinned(); }
  std::string why_not_pinned() const { return pinned() ? "" : host_pool_->why_not_pinned(); }
  std::string swap_description() const;  // the swap file and its I/O backend ("" on the host)
  bool delayed_pending() const { return delayed_pending_; }
  const OffloadTimings& timings() const { return timings_; }

  at::Tensor read_master(std::int64_t offset, std::int64_t numel) const;  // a copy
  void write_master(std::int64_t offset, const at::Tensor& values);
  void step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper, double grad_scale,
            std::int64_t step);
  void apply_delayed(const std::vector<ShardPiece>& pieces);
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;  // copies
  void load_optimizer_state(const std::string& name, const at::Tensor& values);

 private:
  struct Segment {  // the part of one piece that falls into one chunk
    const ShardPiece* piece;
    std::int64_t begin;  // within the piece
    std::int64_t numel;
    std::int64_t at;     // within the chunk
  };
  std::vector<std::string> state_names() const;
  at::Tensor host_state(const std::string& name) const;  // host mode: the whole array
  std::int64_t chunk_count() const;
  std::int64_t chunk_numel(std::int64_t chunk) const;
  std::string tile_name(const std::string& name, std::int64_t chunk) const;
  at::Tensor chunk_view(const std::string& name, std::int64_t chunk, int slot) const;
  std::vector<core::IoHandle> read_chunk(std::int64_t chunk, int slot);
  std::vector<core::IoHandle> write_chunk(std::int64_t chunk, int slot);
  void write_chunk_and_report(std::int64_t chunk);  // slot 0, waited for, told to on_swap_write
  void offloaded_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step);
  void delayed_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                    double grad_scale, std::int64_t step);
  void update_chunk(std::int64_t chunk, int slot, const OptimizerHyper& hyper,
                    double grad_scale, std::int64_t step);
  void update_chunk_from(const at::Tensor& grads, const at::Tensor& out, std::int64_t chunk,
                         const OptimizerHyper& hyper, double grad_scale, std::int64_t step);
  void wait_delayed() const;

  OptimizerKind kind_;
  OffloadOptions offload_;
  std::int64_t shard_numel_ = 0;
  std::int64_t chunk_ = 0;  // elements per chunk
  bool sgd_momentum_ = false;
  std::unique_ptr<core::HostPool> host_pool_;  // owns the memory every host tensor views
  std::unique_ptr<core::SwapStore> swap_;       // NVMe: the state's home
  std::vector<core::TrackedBytes> nvme_bytes_;
  std::unique_ptr<CopyEngine> copier_;
  at::Tensor master_;  // host mode: the whole arrays
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  at::Tensor momentum_;
  // NVMe: two host slots per state array, each one chunk (page-aligned for O_DIRECT).
  std::vector<std::pair<std::string, at::Tensor>> slots_[2];
  at::Tensor staged_grads_[2];   // two chunks' gradients (model dtype)
  at::Tensor staged_params_[2];  // 16-bit models: two chunks' new parameters
  // Delayed update: the step's gradients, the parameters it produces, and its worker.
  at::Tensor delayed_grads_;
  at::Tensor delayed_params_;
  std::unique_ptr<core::TaskWorker> updater_;
  mutable std::shared_future<void> delayed_job_;
  bool delayed_pending_ = false;
  OffloadTimings timings_;
};

}  // namespace zero::adapter
