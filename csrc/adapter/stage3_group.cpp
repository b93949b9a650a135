#include "adapter/stage3_group.h"

#include "adapter/process_group.h"
#include "adapter/quantized_comm.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "adapter/dtype_map.h"
#include "adapter/grad_norm.h"
#include "adapter/storage_in_place.h"
#include "core/block_quantizer.h"

namespace zero::adapter {
namespace {

core::ShardedLayout stage3_layout(const std::vector<at::Tensor>& params,
                                  const std::vector<std::size_t>& unit_of_param,
                                  const std::vector<std::vector<std::int64_t>>& full_shapes,
                                  const GroupOptions& options, int world_size) {
  TORCH_CHECK(unit_of_param.size() == params.size(), "zero: got ", unit_of_param.size(),
              " unit ids for ", params.size(), " parameters");
  TORCH_CHECK(full_shapes.empty() || full_shapes.size() == params.size(), "zero: got ",
              full_shapes.size(), " full shapes for ", params.size(), " parameters");
  std::vector<core::TensorSpec> specs = param_specs(params);
  for (std::size_t i = 0; i < full_shapes.size(); ++i) {
    if (!full_shapes[i].empty()) specs[i].shape = full_shapes[i];
  }
  return core::ShardedLayout(specs, world_size, options.alignment, unit_of_param);
}

// A frozen group's options: no optimizer state to offload, none kept per element, no
// gradients to wait for (a tied frozen parameter is shared, but reduces nothing).
GroupOptions frozen_or_trained(GroupOptions options) {
  if (options.frozen) {
    options.offload = OffloadOptions{};
    options.external_states.clear();
    options.shared_params.clear();
  }
  return options;
}

}  // namespace

Stage3Group::Stage3Group(std::vector<at::Tensor> params,
                         const std::vector<std::size_t>& unit_of_param,
                         const std::vector<std::vector<std::int64_t>>& full_shapes,
                         const GroupOptions& options, core::MemoryRegistry& registry,
                         core::RangePool& host_threads, Communicator& communicator)
    : params_(std::move(params)),
      options_(frozen_or_trained(options)),
      registry_(registry),
      shard_(options.mics_shard_group.empty() && options.data_group.empty()
                 ? nullptr
                 : std::make_unique<Communicator>(
                       resolve_group(options.data_group.empty() ? options.mics_shard_group
                                                                : options.data_group),
                       options.average_over)),
      replicate_(options.mics_replicate_group.empty()
                     ? nullptr
                     : std::make_unique<Communicator>(resolve_group(options.mics_replicate_group))),
      communicator_(shard_ ? *shard_ : communicator),
      layout_(stage3_layout(params_, unit_of_param, full_shapes, options,
                            communicator_.world_size())),
      model_options_(params_.front().options()),
      // A frozen group keeps its parameters' shard alone (a shard state of no elements).
      state_(registry, host_threads, options_.frozen ? 0 : layout_.shard_numel(),
             model_options_,
             options_.optimizer,
             options_.frozen ? std::vector<std::string>{} : optimizer_arrays(options_),
             // With the parameters on the host, a device-side step needs its own master.
             shard_precision(options_, model_options_.dtype().toScalarType(),
                             /*separate_master=*/options_.offload_param.enabled),
             options_.offload),
      units_(layout_.unit_count()) {
  if (!options.hpz_group.empty()) {
    secondary_ = std::make_unique<Communicator>(resolve_group(options.hpz_group));
    TORCH_CHECK_VALUE(communicator_.world_size() % secondary_->world_size() == 0,
                      "zero: zero_optimization.zero_hpz_partition_size = ",
                      secondary_->world_size(), " does not divide the world size ",
                      communicator_.world_size());
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Unit& unit = units_[layout_.location(i).buffer];
    unit.params.push_back(i);
    if (params_[i].requires_grad()) ++unit.trainable;
    TORCH_CHECK(!options_.frozen || !params_[i].requires_grad(), "zero: parameter ", i,
                " of a frozen stage-3 group requires a gradient");
  }
  place_param_shard();
  fill_shard(full_shapes);  // frees each whole parameter as it goes
  refresh_master();
  // After the whole parameters are gone: a model that fills the device as it was built
  // never holds them and this shard-sized buffer at once.
  grad_shard_ = PlacedBuffer(registry, core::MemoryCategory::kGradient,
                             options_.frozen ? 0 : layout_.shard_numel(),
                             grad_options(model_options_, options_), grads_offloaded(options_),
                             options_.offload.pin_memory);
  std::vector<std::size_t> expected;
  for (Unit& unit : units_) {
    unit.pending_grads = unit.trainable;
    expected.push_back(unit.trainable);
  }
  reducer_ = std::make_unique<GradReducer>(ReduceMode::kReduceScatter, layout_,
                                           options_.overlap_comm, grad_shard_.tensor(), registry,
                                           communicator_, std::move(expected),
                                           bucket_options(model_options_, options_),
                                           options_.shared_params, options_.quantized_gradients,
                                           replicate_.get());
  Stage3Group::zero_grads();  // on the device: no memory until the first gradient
}

void Stage3Group::place_param_shard() {
  const ParamOffloadOptions& offload = options_.offload_param;
  const c10::TensorOptions model_options = params_.front().options();
  host_numel_ = layout_.shard_numel();
  if (packed()) {
    TORCH_CHECK(options_.frozen, "zero: quantized_storage is for a frozen group's shard");
    TORCH_CHECK_VALUE(offload.nvme_path.empty(), "zero: zero_optimization."
                      "zero_quantized_nontrainable_weights with offload_param.device \"nvme\" is "
                      "not supported: keep the frozen shard in host memory (device \"cpu\") or "
                      "set zero_quantized_nontrainable_weights to false");
    packed_offsets_.assign(1, 0);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      packed_offsets_.push_back(packed_offsets_.back() +
                                core::quantized_bytes(layout_.unit(u).shard_numel()));
    }
    param_shard_ = PlacedBuffer(registry_, core::MemoryCategory::kParam, packed_offsets_.back(),
                                model_options.dtype(at::kByte), offload.enabled,
                                offload.pin_memory);
    return;
  }
  if (!offload.nvme_path.empty()) {
    // The first units, up to max_in_cpu elements, stay in host memory; the rest go to NVMe.
    std::vector<std::int64_t> nvme_numel(units_.size(), 0);
    std::int64_t kept = 0;
    std::size_t largest = 0;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const std::int64_t numel = layout_.unit(u).shard_numel();
      if (host_numel_ == layout_.shard_numel() && kept + numel <= offload.max_in_cpu) {
        kept += numel;
        continue;
      }
      if (host_numel_ == layout_.shard_numel()) host_numel_ = layout_.shard_offset(u);
      nvme_numel[u] = numel;
      if (numel > nvme_numel[largest]) largest = u;
    }
    TORCH_CHECK_VALUE(nvme_numel[largest] <= offload.buffer_numel, "zero: gather unit ", largest,
                      " has ", nvme_numel[largest], " parameter elements per rank on NVMe, more "
                      "than zero_optimization.offload_param.buffer_size = ", offload.buffer_numel,
                      "; raise buffer_size to at least ", nvme_numel[largest], " (the largest "
                      "unit) or split the unit (every ModuleList child is one unit)");
    if (host_numel_ < layout_.shard_numel()) {
      ParamSwapOptions swap;
      swap.nvme_path = offload.nvme_path;
      swap.aio = offload.aio;
      swap.buffer_count = offload.buffer_count;
      swap.pin = offload.pin_memory;
      param_swap_ = std::make_unique<ParamSwap>(registry_, nvme_numel,
                                                model_options.dtype().toScalarType(), swap);
    }
  }
  // Offloaded: the host holds the shard but for its NVMe units.
  param_shard_ = PlacedBuffer(registry_, core::MemoryCategory::kParam, host_numel_, model_options,
                              offload.enabled, offload.pin_memory);
}

// Copies this rank's slices of every full parameter into its shard (unit by unit, so an NVMe
// unit needs one unit of host memory), then drops the full parameters. Parameters that arrive
// partitioned (zero.Init) start at zero and are filled by gather + copy + commit later.
void Stage3Group::fill_shard(const std::vector<std::vector<std::int64_t>>& full_shapes) {
  const c10::TensorOptions model_options = params_.front().options();
  const int rank = communicator_.rank();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const at::Tensor target =
        on_nvme(u) ? at::zeros({layout_.unit(u).shard_numel()}, model_options.device(at::kCPU))
        : packed() ? at::zeros({layout_.unit(u).shard_numel()}, model_options)
                   : shard_piece(param_shard_.tensor(), u);
    bool filled = false;
    for (const std::size_t i : units_[u].params) {
      if (i < full_shapes.size() && !full_shapes[i].empty()) continue;
      for (const core::OwnedSlice& slice : layout_.unit(u).owned_slices(layout_.location(i).index)) {
        if (slice.rank != rank) continue;
        const std::int64_t length = slice.param_end - slice.param_begin;
        target.narrow(0, slice.shard_offset, length)
            .copy_(params_[i].detach().reshape({-1}).narrow(0, slice.param_begin, length));
      }
      params_[i].set_data(at::empty({0}, model_options));
      filled = true;
    }
    if (filled && on_nvme(u)) {
      param_swap_->write(u, target);
      const auto& report = options_.offload_param.on_swap_write;
      if (report) report(static_cast<std::int64_t>(target.nbytes()));
    }
    if (packed()) store_piece(u, target);  // (zero.Init's pieces: zeros until committed)
  }
}

at::Tensor Stage3Group::param_piece(std::size_t unit) const {
  if (!packed()) return shard_piece(param_shard_.tensor(), unit);
  return param_shard_.tensor().narrow(0, packed_offsets_[unit],
                                      packed_offsets_[unit + 1] - packed_offsets_[unit]);
}

void Stage3Group::store_piece(std::size_t unit, const at::Tensor& values) {
  if (packed()) {
    // encoded where the values are (the device's kernel on CUDA), then moved to the shard
    param_piece(unit).copy_(quantize(values.contiguous()));
  } else {
    param_piece(unit).copy_(values);
  }
}

at::Tensor Stage3Group::shard_piece(const at::Tensor& shard, std::size_t unit) const {
  return shard.narrow(0, layout_.shard_offset(unit), layout_.unit(unit).shard_numel());
}

void Stage3Group::allocate_gathered(std::size_t index) {
  Unit& unit = units_[index];
  const core::FlatBufferPlan& plan = layout_.unit(index);
  const std::int64_t bytes = plan.numel() * static_cast<std::int64_t>(c10::elementSize(
                                                 model_options_.dtype().toScalarType()));
  if (!unit.gathered.defined()) {
    unit.gathered = at::empty({plan.numel()}, model_options_);
  } else {
    allocate_storage(unit.gathered, static_cast<std::size_t>(bytes));
  }
  unit.tracking = core::TrackedBytes(&registry_, core::MemoryCategory::kGatheredParam,
                                     core::MemoryLocation::kDevice, bytes);
  unit.resident = true;
}

void Stage3Group::fetch(std::size_t index) {
  Unit& unit = units_.at(index);
  if (unit.resident) return;
  if (unit.secondary_valid) {  // hpZ: within the secondary group, from its copies
    allocate_gathered(index);
    launch_or_release(index, [&] {
      unit.in_flight = secondary_->all_gather(unit.gathered, unit.secondary.tensor());
    });
    return;
  }
  // The shard piece to send first: if bringing it to the device fails, the unit stays
  // released and nothing is lent out.
  at::Tensor source = on_nvme(index) ? at::Tensor() : param_piece(index);
  if (params_offloaded()) {  // collectives send from the device
    unit.staging = packed()
        ? device_buffer(registry_, core::MemoryCategory::kStaging, source.numel(),
                        model_options_.dtype(at::kByte))
        : device_buffer(registry_, core::MemoryCategory::kStaging,
                        layout_.unit(index).shard_numel(), model_options_);
    if (on_nvme(index)) {
      const at::Tensor host = param_swap_->read(index);
      try {
        unit.staging.tensor().copy_(host);
      } catch (...) {
        param_swap_->finish_read(index);
        unit.staging.reset();
        throw;
      }
      param_swap_->finish_read(index);
    } else {
      // Queued on the current stream, without waiting for it: the collective's stream waits
      // for this copy (c10d orders it after the current stream's work), so a prefetch no longer
      // stops the host until the compute queued so far is done. The host shard is written
      // again only by the step, after backward's reductions and their copies were waited for;
      // the NVMe buffer above goes back to the swap at once, so it is copied before that.
      unit.staging.tensor().copy_(source, /*non_blocking=*/true);
    }
    source = unit.staging.tensor();
  }
  allocate_gathered(index);
  launch_or_release(index, [&] {
    unit.in_flight = packed()
                         ? packed_all_gather(communicator_, unit.gathered, source,
                                             layout_.unit(index).shard_numel())
                     : options_.quantized_weights
                         ? quantized_all_gather(communicator_, unit.gathered, source)
                     : options_.all_reduce_fetch
                         ? communicator_.all_gather_by_all_reduce(unit.gathered, source)
                         : communicator_.all_gather(unit.gathered, source);
  });
}

void Stage3Group::launch_or_release(std::size_t index, const std::function<void()>& launch) {
  try {
    launch();
  } catch (...) {
    // Nothing was launched (a collective that was is waited for as its handle unwinds): the
    // unit must not pass for gathered with its buffer never written.
    units_[index].staging.reset();
    release(index);  // (no collective in flight: it frees the buffer at once)
    throw;
  }
}

void Stage3Group::read_ahead(std::size_t unit) {
  if (on_nvme(unit) && !units_.at(unit).resident) param_swap_->prefetch(unit);
}

OffloadInfo Stage3Group::offload_info() const {
  OffloadInfo info = Group::offload_info();
  if (!options_.offload_param.enabled) return info;
  info.params_offloaded = true;
  info.why_params_not_pinned = param_shard_.why_not_pinned();
  if (info.why_params_not_pinned.empty() && param_swap_) {
    info.why_params_not_pinned = param_swap_->why_not_pinned();
  }
  info.nvme_param_numel = layout_.shard_numel() - host_numel_;
  if (param_swap_) {
    info.param_swap = param_swap_->description();
    info.param_swap_reads = param_swap_->reads();
    info.param_swap_read_aheads = param_swap_->read_aheads();
  }
  return info;
}

void Stage3Group::gather(std::size_t index) {
  fetch(index);
  Unit& unit = units_.at(index);
  if (unit.in_flight) {
    unit.in_flight->wait();
    unit.in_flight.reset();
    unit.staging.reset();
    attach(index);
    if (secondary_ && !unit.secondary_valid) keep_secondary(index);
  }
}

void Stage3Group::keep_secondary(std::size_t index) {
  Unit& unit = units_[index];
  const std::int64_t piece = layout_.unit(index).numel() / secondary_->world_size();
  if (!unit.secondary.defined()) {
    unit.secondary =
        device_buffer(registry_, core::MemoryCategory::kGatheredParam, piece, model_options_);
  }
  unit.secondary.tensor().copy_(unit.gathered.narrow(0, secondary_->rank() * piece, piece));
  unit.secondary_valid = true;
}

std::vector<TrackedTensor*> Stage3Group::device_buffers(StateKind kind) {
  PlacedBuffer* shard = nullptr;
  if (kind == StateKind::kParams) {
    for (const Unit& unit : units_) {
      TORCH_CHECK(!unit.resident, "zero: offload_states needs every gathered unit released "
                  "first (GatheredParameters still open?)");
    }
    shard = &param_shard_;
  }
  if (kind == StateKind::kGrads) shard = &grad_shard_;
  if (shard == nullptr) return Group::device_buffers(kind);
  TrackedTensor* on_device = shard->on_device();
  return on_device ? std::vector<TrackedTensor*>{on_device} : std::vector<TrackedTensor*>{};
}

void Stage3Group::states_parked(StateKind kind, const std::vector<at::Tensor>& /*hosts*/) {
  if (kind == StateKind::kParams) drop_secondaries();  // hpZ: gathered again when needed
}

void Stage3Group::drop_secondaries() {
  for (Unit& unit : units_) {
    unit.secondary_valid = false;
    unit.secondary.reset();
  }
}

void Stage3Group::attach(std::size_t index) {
  const Unit& unit = units_[index];
  const core::FlatBufferPlan& plan = layout_.unit(index);
  for (const std::size_t p : unit.params) {
    const core::ParamSlot& slot = plan.params()[layout_.location(p).index];
    params_[p].set_data(unit.gathered.narrow(0, slot.offset, slot.numel).view(slot.shape));
  }
}

void Stage3Group::release(std::size_t index, bool leave_shared) {
  Unit& unit = units_.at(index);
  if (!unit.resident) return;
  if (unit.in_flight) {  // never free a buffer a collective is still writing
    unit.in_flight->wait();
    unit.in_flight.reset();
    unit.staging.reset();
  }
  const at::TensorOptions options = model_options_;
  for (const std::size_t p : unit.params) params_[p].set_data(at::empty({0}, options));
  if (leave_shared && unit.gathered.storage().use_count() > 1) {
    unit.gathered = at::Tensor();  // theirs now
  } else {
    free_storage(unit.gathered);
  }
  unit.tracking.release();
  unit.resident = false;
}

std::int64_t Stage3Group::gathered_numel() const {
  std::int64_t numel = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].resident) numel += layout_.unit(u).numel();
  }
  return numel;
}

void Stage3Group::commit(std::size_t index) {
  Unit& unit = units_.at(index);
  TORCH_CHECK(unit.resident && !unit.in_flight, "zero: commit(", index,
              ") needs the unit gathered");
  const core::FlatBufferPlan& plan = layout_.unit(index);
  const int rank = communicator_.rank();
  const at::Tensor mine = unit.gathered.narrow(0, rank * plan.shard_numel(), plan.shard_numel());
  if (on_nvme(index)) {
    param_swap_->write(index, mine);
  } else {
    store_piece(index, mine);
  }
  if (state_.has_master()) state_.write_master(layout_.shard_offset(index), mine);
  if (!unit.secondary_valid) return;
  if (packed()) {  // the shards hold the values' int8 code: copies are made again from them
    unit.secondary_valid = false;
  } else {
    keep_secondary(index);  // the gathered values are the new ones
  }
}

void Stage3Group::refresh_master() {
  if (!state_.has_master()) return;
  state_.write_master(0, param_shard_.tensor().narrow(0, 0, host_numel_));
  // NVMe units in batches of about one offload chunk: the master may be on NVMe too, where
  // each write is a read-modify-write of whole chunks.
  constexpr std::int64_t kBatch = std::int64_t{1} << 22;
  std::vector<at::Tensor> batch;
  std::int64_t batch_offset = host_numel_;
  std::int64_t batch_numel = 0;
  auto write_batch = [&] {
    if (batch.empty()) return;
    state_.write_master(batch_offset, at::cat(batch));
    batch.clear();
    batch_offset += batch_numel;
    batch_numel = 0;
  };
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (!on_nvme(u)) continue;
    batch.push_back(param_swap_->read(u).clone());
    param_swap_->finish_read(u);
    batch_numel += batch.back().numel();
    if (batch_numel >= kBatch) write_batch();
  }
  write_batch();
}

void Stage3Group::prepare_backward() {}

bool Stage3Group::reduces(bool /*boundary*/) const { return !options_.frozen; }

std::optional<std::size_t> Stage3Group::grad_ready(std::size_t index, bool /*boundary*/) {
  TORCH_CHECK(index < params_.size(), "zero: parameter index ", index, " outside the group's ",
              params_.size());
  // The gradient shard holds memory from the first gradient of an accumulation window to
  // the step (FSDP2 frees its sharded gradients at zero_grad, DeepSpeed its partitions after
  // the step): between steps, in evaluation, while a checkpoint is written, and at the start
  // of backward (the loss's buffers, the peak) it takes none.
  grad_shard_.restore_memory();
  at::Tensor& grad = params_[index].mutable_grad();
  const auto completed = reducer_->grad_ready(index, grad);
  grad = at::Tensor();  // the bucket has it
  // A shared parameter's unit stays pending (gathered) until the end of backward: more of
  // its gradient may come, and autograd needs the whole parameter to accumulate it.
  if (reducer_->shared(index)) return completed;
  Unit& unit = units_[layout_.location(index).buffer];
  TORCH_CHECK(unit.pending_grads > 0, "zero: more gradients than trainable parameters in unit ",
              layout_.location(index).buffer);
  --unit.pending_grads;  // the schedule releases the unit (gather_schedule.h)
  return completed;
}

void Stage3Group::finish_backward(bool /*boundary*/) {
  reducer_->reset();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    release(u);
    units_[u].pending_grads = units_[u].trainable;
  }
}

double Stage3Group::grad_square_sum() const {
  // MiCS: every replicate holds this shard; the engine sums over all ranks.
  return square_sum(grad_shard_.tensor()) / (replicate_ ? replicate_->world_size() : 1);
}

void Stage3Group::hold_grads() { grad_shard_.restore_memory(); }

std::vector<ShardPiece> Stage3Group::shard_pieces() const {
  std::vector<ShardPiece> pieces;
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
    if (on_nvme(u)) {
      ParamSwap* swap = param_swap_.get();
      pieces.push_back({shard_piece(grad_shard_.tensor(), u), at::Tensor(),
                        layout_.shard_offset(u),
                        [swap, u](std::int64_t begin, const at::Tensor& values) {
                          swap->write_part(u, begin, values);
                        }});
      continue;
    }
    pieces.push_back({shard_piece(grad_shard_.tensor(), u), shard_piece(param_shard_.tensor(), u),
                      layout_.shard_offset(u)});
  }
  return pieces;
}

// After the step: the NVMe units' new parameters must all be on their way to the file, and a
// write that failed is reported here rather than at some later gather.
void Stage3Group::gather_params() {
  drop_secondaries();  // the step changed the parameters
  if (param_swap_) param_swap_->flush();
}

ParamSlices Stage3Group::param_slices() {
  // (with MiCS communicator_ is the shard group: the replicas hold the same slices)
  return {layout_.param_count(), owned_slices(communicator_.rank()), &communicator_, &layout_};
}

void Stage3Group::zero_grads() { start_grad_window(grad_shard_, *reducer_); }

at::Tensor Stage3Group::master_shard() const {
  return state_.has_master() ? state_.read_master(0, layout_.shard_numel())
                             : param_shard_.tensor().clone();
}

at::Tensor Stage3Group::read_params(std::int64_t offset, std::int64_t numel) const {
  // (no separate master: nothing is offloaded, the whole shard is in param_shard_)
  return param_shard_.tensor().narrow(0, offset, numel).to(at::kFloat, false, /*copy=*/true);
}

void Stage3Group::finish_fetch_copies() const {
  // fetch() queues host-to-device copies of param_shard_ without waiting for them
  const at::Device device = this->device();
  if (!params_offloaded() || device.is_cpu()) return;
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  impl->synchronizeStream(impl->getStream(device));
}

void Stage3Group::write_master_range(std::int64_t offset, const at::Tensor& values) {
  finish_fetch_copies();
  if (offset + values.numel() > host_numel_) {  // parameters on NVMe: through the whole shard
    at::Tensor whole = master_shard();
    whole.narrow(0, offset, values.numel()).copy_(values);
    load_master_shard(whole);
    return;
  }
  if (state_.has_master()) state_.write_master(offset, values);
  drop_secondaries();
  param_shard_.tensor().narrow(0, offset, values.numel()).copy_(values);
}

void Stage3Group::load_master_shard(const at::Tensor& saved) {
  TORCH_CHECK(saved.numel() == layout_.shard_numel(), "zero: saved master shard has ",
              saved.numel(), " elements but this rank's shard has ", layout_.shard_numel(),
              "; the checkpoint was written for another model or world size");
  finish_fetch_copies();
  if (state_.has_master()) state_.write_master(0, saved);
  drop_secondaries();
  param_shard_.tensor().copy_(saved.narrow(0, 0, host_numel_));
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (on_nvme(u)) param_swap_->write(u, shard_piece(saved, u));
  }
}

}  // namespace zero::adapter
