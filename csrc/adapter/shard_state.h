#pragma once
// The optimizer side of a rank's shard: fp32 master (mixed precision, or offload), Adam's m
// and v or SGD's momentum, all laid out like the shard, and the step over its pieces.
//
// On the device (the default) the update runs with ATen ops. With offload (ZeRO-Offload) the
// state lives in one host pool (pinned when possible) and the step streams the shard in
// chunks: a worker thread copies chunk i+1's gradients to host staging and chunk i-1's new
// parameters back to the device while the fused CPU Adam updates chunk i. With an NVMe path
// (ZeRO-Infinity) the state lives in a swap file instead, and the host holds two chunks of
// it: chunk i+1 is read and chunk i-1 written back while chunk i is updated.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/optimizer_math.h"
#include "adapter/tracked_tensor.h"
#include "core/host_pool.h"
#include "core/io_backend.h"
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
  // Delayed parameter update (ZeRO-Offload's DPU): the host update of step i runs on a
  // worker while step i+1's forward and backward run; its parameters are applied at the
  // start of step i+1's optimizer step, so the model trains on parameters one update old.
  bool delayed_update = false;
};

// One contiguous piece of this rank's shard: its gradients and the parameters the step
// writes (both on the device, model dtype, `grad.numel()` elements) at `offset` in the shard.
struct ShardPiece {
  at::Tensor grad;
  at::Tensor param;
  std::int64_t offset = 0;
};

class ShardState {
 public:
  // keep_master: a separate fp32 master (mixed precision); offload always keeps one.
  ShardState(core::MemoryRegistry& registry, std::int64_t shard_numel,
             const c10::TensorOptions& device_options, OptimizerKind kind, bool sgd_momentum,
             bool keep_master, const OffloadOptions& offload);
  ~ShardState();

  bool has_master() const { return master_.defined() || nvme(); }
  bool offloaded() const { return offload_.enabled; }
  bool nvme() const { return swap_ != nullptr; }
  bool pinned() const { return host_pool_ && host_pool_->pinned(); }
  // Why offloaded state is pageable ("" when pinned or not offloaded).
  std::string why_not_pinned() const {
    return host_pool_ && !host_pool_->pinned() ? host_pool_->why_not_pinned() : "";
  }
  // The fp32 master of shard [offset, offset + numel): read returns a copy, write stores.
  at::Tensor read_master(std::int64_t offset, std::int64_t numel) const;
  void write_master(std::int64_t offset, const at::Tensor& values);
  // Updates the pieces (grads multiplied by grad_scale) and leaves the new parameters in each
  // piece's `param`. step is 1-based and counts this update.
  void step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper, double grad_scale,
            std::int64_t step);
  // Delayed update: writes the finished update's parameters into the pieces (waiting for it);
  // a no-op when nothing is pending.
  void apply_delayed(const std::vector<ShardPiece>& pieces);
  bool delayed_pending() const { return delayed_pending_; }
  // Copies of the optimizer state tensors (exp_avg / exp_avg_sq, or momentum_buffer; with a
  // delayed update also its pending parameters, so a checkpoint resumes exactly).
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;
  void load_optimizer_state(const std::string& name, const at::Tensor& values);
  // NVMe: where the state lives and which I/O backend moves it ("" otherwise).
  std::string swap_description() const;

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
  void check_kind(const OptimizerHyper& hyper) const;
  void update(at::Tensor master, const at::Tensor& grads, std::int64_t offset,
              const OptimizerHyper& hyper, std::int64_t step);
  void device_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                   double grad_scale, std::int64_t step);
  void offloaded_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step);
  void update_chunk(std::int64_t chunk, int slot, const OptimizerHyper& hyper,
                    double grad_scale, std::int64_t step);
  void delayed_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                    double grad_scale, std::int64_t step);
  void update_chunk_from(const at::Tensor& grads, const at::Tensor& out, std::int64_t chunk,
                         const OptimizerHyper& hyper, double grad_scale, std::int64_t step);
  void wait_delayed() const;
  at::Tensor chunk_view(const std::string& name, std::int64_t chunk, int slot) const;
  std::vector<core::IoHandle> read_chunk(std::int64_t chunk, int slot);
  std::vector<core::IoHandle> write_chunk(std::int64_t chunk, int slot);
  void allocate_on_host(core::MemoryRegistry& registry, std::int64_t shard_numel,
                        const c10::TensorOptions& device_options, bool sgd_momentum);

  OptimizerKind kind_;
  OffloadOptions offload_;
  std::int64_t shard_numel_ = 0;
  std::int64_t chunk_ = 0;  // elements per chunk (offload)
  bool sgd_momentum_ = false;
  std::vector<TrackedTensor> device_owned_;
  std::unique_ptr<core::HostPool> host_pool_;  // offload: owns the memory the tensors view
  std::unique_ptr<core::SwapStore> swap_;       // NVMe: the state's home
  std::unique_ptr<core::TaskWorker> copier_;
  std::vector<core::TrackedBytes> nvme_bytes_;
  // NVMe: two host slots per state array, each one chunk (page-aligned for O_DIRECT).
  std::vector<std::pair<std::string, at::Tensor>> slots_[2];
  at::Tensor master_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  at::Tensor momentum_;
  at::Tensor staged_grads_[2];   // offload: host copies of two tiles' gradients (model dtype)
  at::Tensor staged_params_[2];  // offload, 16-bit models: two tiles' new parameters
  // Delayed update: the step's gradients, the parameters it produces, and the worker.
  at::Tensor delayed_grads_;
  at::Tensor delayed_params_;
  std::unique_ptr<core::TaskWorker> updater_;
  mutable std::shared_future<void> delayed_job_;
  bool delayed_pending_ = false;
};

}  // namespace zero::adapter
