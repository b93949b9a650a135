#include "adapter/param_group.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "adapter/dtype_map.h"
#include "adapter/grad_norm.h"

namespace zero::adapter {

bool grads_offloaded(const GroupOptions& options) {
  return options.stage >= 2 && options.offload.enabled && options.offload.ratio >= 1.0 &&
         !options.offload.grads_on_device;
}

c10::TensorOptions bucket_options(const c10::TensorOptions& model, const GroupOptions& options) {
  if (!options.communication_dtype) return model;
  return model.dtype(to_scalar_type(*options.communication_dtype));
}

c10::TensorOptions grad_options(const c10::TensorOptions& model, const GroupOptions& options) {
  return options.grads_in_fp32 ? model.dtype(at::kFloat) : model;
}

std::vector<std::string> optimizer_arrays(const GroupOptions& options) {
  return optimizer_state_names(options.optimizer, options.sgd_momentum, options.external_states);
}

ShardPrecision shard_precision(const GroupOptions& options, at::ScalarType model,
                               bool separate_master) {
  ShardPrecision precision;
  precision.master = options.master_in_model_dtype ? model : at::kFloat;
  precision.states = options.states_in_model_dtype ? model : at::kFloat;
  precision.grads = options.grads_in_fp32 ? at::kFloat : model;
  precision.keep_master = separate_master || precision.master != model;
  return precision;
}

void start_grad_window(PlacedBuffer& shard, GradReducer& reducer) {
  reducer.finish_copies();  // a backward cut short may have left some writing the shard
  if (shard.on_host()) {
    reducer.grads_discarded();
  } else {
    shard.clear();
    reducer.grads_zeroed();
  }
}

namespace {

core::ShardedLayout layout_for(const std::vector<at::Tensor>& params, const GroupOptions& options,
                               int world_size) {
  TORCH_CHECK(options.stage >= 0 && options.stage <= 2, "zero: stage ", options.stage,
              " is not handled by ParamGroup (stages 0, 1, 2)");
  const std::vector<core::TensorSpec> specs = param_specs(params);
  // Stage 0 shards nothing: lay out for one rank, so "this rank's piece" is everything.
  return core::ShardedLayout(specs, options.stage == 0 ? 1 : world_size, options.alignment,
                             options.unit_numel);
}

}  // namespace

ParamGroup::ParamGroup(std::vector<at::Tensor> params, const GroupOptions& options,
                       core::MemoryRegistry& registry, core::RangePool& host_threads,
                       Communicator& communicator)
    : params_(std::move(params)),
      options_(options),
      communicator_(communicator),
      rank_(options.stage == 0 ? 0 : communicator.rank()),
      layout_(layout_for(params_, options, communicator.world_size())),
      state_(registry, host_threads, layout_.shard_numel(), params_.front().options(),
             options.optimizer,
             optimizer_arrays(options),
             shard_precision(options, params_.front().scalar_type(), /*separate_master=*/false),
             options.offload) {
  TORCH_CHECK(!options.offload.enabled || options.stage >= 1, "zero: offload_optimizer needs "
              "ZeRO stage 1, 2 or 3 (at stage 0 nothing is sharded to offload)");
  const c10::TensorOptions model_options = params_.front().options();
  param_buffer_ =
      device_buffer(registry, core::MemoryCategory::kParam, layout_.full_numel(), model_options);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor view = param_view(i);
    view.copy_(params_[i]);
    params_[i].set_data(view);
  }
  const std::int64_t shard = layout_.shard_numel();
  gathering_.assign(layout_.unit_count(), false);
  refresh_master();
  if (sharded_grads()) {
    grad_shard_ = PlacedBuffer(registry, core::MemoryCategory::kGradient, shard,
                               grad_options(model_options, options_), grads_offloaded(options_),
                               options_.offload.pin_memory);
    reducer_ = std::make_unique<GradReducer>(ReduceMode::kReduceScatter, layout_,
                                             options_.overlap_comm, grad_shard_.tensor(), registry,
                                             communicator_, std::vector<std::size_t>{},
                                             bucket_options(model_options, options_),
                                             options_.shared_params);
    ParamGroup::zero_grads();  // on the device: no memory until the first gradient
  } else {
    grad_full_ = device_buffer(registry, core::MemoryCategory::kGradient, layout_.full_numel(),
                               grad_options(model_options, options_));
    // Stage 0 steps every element and needs the whole average; stage 1 only its pieces.
    const ReduceMode mode = options_.stage == 0 ? ReduceMode::kAllReduce
                                                : ReduceMode::kReduceScatterInPlace;
    reducer_ = std::make_unique<GradReducer>(mode, layout_, options_.overlap_comm,
                                             grad_full_.tensor(), registry, communicator_,
                                             std::vector<std::size_t>{},
                                             bucket_options(model_options, options_),
                                             options_.shared_params);
    prepare_backward();
  }
}

at::Tensor ParamGroup::place_in(const at::Tensor& flat, std::size_t index) const {
  return flat.narrow(0, layout_.param_offset(index), params_[index].numel())
      .view(params_[index].sizes());
}

at::Tensor ParamGroup::param_view(std::size_t index) const {
  return place_in(param_buffer_.tensor(), index);
}

void ParamGroup::point_params_at(const at::Tensor& flat) {
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].set_data(place_in(flat, i));
}

void ParamGroup::point_grads_at(const at::Tensor& flat) {
  if (grads_apart()) return;  // no param.grad views the buffer
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    if (!grad.defined()) continue;  // set to None (zero_grad): prepare_backward starts it anew
    grad = place_in(flat, i);
  }
}

std::vector<TrackedTensor*> ParamGroup::device_buffers(StateKind kind) {
  if (kind == StateKind::kParams) return {&param_buffer_};
  if (kind == StateKind::kGrads) {
    if (grad_full_.defined()) return {&grad_full_};
    if (TrackedTensor* shard = grad_shard_.on_device()) return {shard};
    return {};
  }
  return Group::device_buffers(kind);
}

void ParamGroup::states_parked(StateKind kind, const std::vector<at::Tensor>& hosts) {
  if (hosts.empty() || !hosts.front().defined()) return;
  if (kind == StateKind::kParams) point_params_at(hosts.front());
  if (kind == StateKind::kGrads && grad_full_.defined()) point_grads_at(hosts.front());
}

void ParamGroup::states_restored(StateKind kind) {
  if (kind == StateKind::kParams) point_params_at(param_buffer_.tensor());
  if (kind == StateKind::kGrads && grad_full_.defined()) point_grads_at(grad_full_.tensor());
}

at::Tensor ParamGroup::full_piece(const at::Tensor& full, std::size_t unit) const {
  return full.narrow(0, layout_.full_offset(unit) + rank_ * piece_numel(unit), piece_numel(unit));
}

at::Tensor ParamGroup::shard_piece(const at::Tensor& shard, std::size_t unit) const {
  return shard.narrow(0, layout_.shard_offset(unit), piece_numel(unit));
}

at::Tensor ParamGroup::grad_piece(std::size_t unit) const {
  return sharded_grads() ? shard_piece(grad_shard_.tensor(), unit)
                         : full_piece(grad_full_.tensor(), unit);
}

void ParamGroup::refresh_master() {
  if (!state_.has_master()) return;  // the master is the parameters themselves
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
    state_.write_master(layout_.shard_offset(u), full_piece(param_buffer_.tensor(), u));
  }
}

void ParamGroup::fold_grad(std::size_t index) {
  at::Tensor& grad = params_[index].mutable_grad();
  if (grad.defined()) place_in(grad_full_.tensor(), index).add_(grad);
  grad = at::Tensor();
}

void ParamGroup::prepare_backward() {
  if (!grad_full_.defined()) return;
  if (reduced_in_place_) carry_reduced_pieces();
  const bool apart = grads_apart();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (apart) {  // what was accumulated outside the engine joins the buffer
      fold_grad(i);
      continue;
    }
    at::Tensor& grad = params_[i].mutable_grad();
    const at::Tensor view = place_in(grad_full_.tensor(), i);
    if (!grad.defined()) {
      view.zero_();  // zero_grad(set_to_none=True) between micro-steps: start from zero
      grad = view;
    } else if (!grad.is_same(view)) {
      view.copy_(grad);  // keep what was accumulated outside the engine
      grad = view;
    }
  }
}

bool ParamGroup::reduces(bool boundary) const { return sharded_grads() || boundary; }

std::optional<std::size_t> ParamGroup::grad_ready(std::size_t index, bool boundary) {
  TORCH_CHECK(index < params_.size(), "zero: parameter index ", index, " outside the group's ",
              params_.size());
  if (sharded_grads()) {
    // The gradient shard holds memory from the first gradient of an accumulation window to
    // the step, as at stage 3 (DeepSpeed's stage 2 drops its partitions after the step too).
    grad_shard_.restore_memory();
    at::Tensor& grad = params_[index].mutable_grad();
    const auto completed = reducer_->grad_ready(index, grad);
    grad = at::Tensor();  // the bucket has it; release autograd's full-size gradient
    return completed;
  }
  if (grads_apart()) fold_grad(index);  // this micro-step's 16-bit gradient, added in fp32
  if (boundary) return reducer_->grad_ready(index, params_[index].grad());
  return std::nullopt;
}

at::Tensor ParamGroup::accumulated_grad(std::size_t index) const {
  TORCH_CHECK(index < params_.size(), "zero: parameter index ", index, " outside the group's ",
              params_.size());
  return grad_full_.defined() ? place_in(grad_full_.tensor(), index) : at::Tensor();
}

void ParamGroup::finish_backward(bool boundary) {
  reducer_->reset();
  if (!grad_full_.defined() || options_.stage == 0) return;
  if (carried_.defined()) {  // this backward's reduction is done: the earlier average joins it
    for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
      grad_piece(u).add_(carried_.narrow(0, layout_.shard_offset(u), piece_numel(u)));
    }
    carried_ = at::Tensor();
  }
  if (!boundary) return;
  // Reduced in place (stage 1 accumulating, stage 3's persistent group): the buffer now holds
  // the average in this rank's pieces and its own sums elsewhere, no gradient a user could
  // read, so param.grad goes, as DeepSpeed's stages 1 and 3 leave it None at a boundary; the
  // step reads the buffer, and the next backward starts the views from zero.
  reduced_in_place_ = true;
  if (grads_apart()) return;  // no param.grad views the buffer
  for (at::Tensor& param : params_) param.mutable_grad() = at::Tensor();
}

void ParamGroup::carry_reduced_pieces() {
  // A backward after a boundary's reduction and before the step (two losses' backwards at
  // one boundary): the buffer holds this rank's averaged pieces beside its own sums
  // elsewhere, which a second reduce-scatter would mix. The pieces wait aside (a copy, 1/N
  // of the group), the buffer starts from zero, and finish_backward adds them back once this
  // backward's average is in: the step applies the sum of both, as at stages 0 and 2. The
  // copy is not in the memory registry (it lives for that one backward).
  std::vector<at::Tensor> pieces;
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) pieces.push_back(grad_piece(u));
  carried_ = at::cat(pieces);
  grad_full_.tensor().zero_();
  reduced_in_place_ = false;
}

double ParamGroup::grad_square_sum() const {
  if (sharded_grads()) return square_sum(grad_shard_.tensor());
  double total = 0.0;
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) total += square_sum(grad_piece(u));
  return total;
}

std::vector<ShardPiece> ParamGroup::shard_pieces() const {
  std::vector<ShardPiece> pieces;
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
    pieces.push_back({grad_piece(u), full_piece(param_buffer_.tensor(), u), layout_.shard_offset(u)});
  }
  return pieces;
}

ParamSlices ParamGroup::param_slices() {
  // stage 0 lays out for one rank: every parameter is whole here, as on every rank
  return {layout_.param_count(), owned_slices(rank_),
          options_.stage == 0 ? nullptr : &communicator_, &layout_};
}

void ParamGroup::piece_stepped(std::size_t unit) {
  if (options_.stage == 0) return;
  const at::Tensor& full = param_buffer_.tensor();
  at::Tensor whole = full.narrow(0, layout_.full_offset(unit), layout_.unit(unit).numel());
  gathers_.push_back(communicator_.all_gather(whole, full_piece(full, unit)));
  gathering_[unit] = true;
}

void ParamGroup::gather_params() {
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
    if (!gathering_[u]) piece_stepped(u);  // e.g. after a delayed update
  }
  for (auto& work : gathers_) work->wait();
  gathers_.clear();
  gathering_.assign(layout_.unit_count(), false);
}

void ParamGroup::hold_grads() {
  if (sharded_grads()) grad_shard_.restore_memory();
}

void ParamGroup::zero_grads() {
  reduced_in_place_ = false;
  carried_ = at::Tensor();
  if (grad_full_.holds_memory()) grad_full_.tensor().zero_();  // else offloaded: zeroed there
  if (grad_shard_.tensor().defined()) start_grad_window(grad_shard_, *reducer_);
}

at::Tensor ParamGroup::master_shard() const {
  if (state_.has_master()) return state_.read_master(0, layout_.shard_numel());
  std::vector<at::Tensor> pieces;
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
    pieces.push_back(full_piece(param_buffer_.tensor(), u));
  }
  return at::cat(pieces);
}

std::vector<std::pair<at::Tensor, std::int64_t>> ParamGroup::param_range(
    std::int64_t offset, std::int64_t numel) const {
  std::vector<std::pair<at::Tensor, std::int64_t>> views;
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
    const std::int64_t begin = layout_.shard_offset(u);
    const std::int64_t low = std::max(begin, offset);
    const std::int64_t high = std::min(begin + piece_numel(u), offset + numel);
    if (low < high) {
      views.emplace_back(full_piece(param_buffer_.tensor(), u).narrow(0, low - begin, high - low),
                         low - offset);
    }
  }
  return views;
}

at::Tensor ParamGroup::read_params(std::int64_t offset, std::int64_t numel) const {
  at::Tensor values = at::zeros({numel}, param_buffer_.tensor().options().dtype(at::kFloat));
  for (const auto& [view, start] : param_range(offset, numel)) {
    values.narrow(0, start, view.numel()).copy_(view);
  }
  return values;
}

void ParamGroup::write_master_range(std::int64_t offset, const at::Tensor& values) {
  if (state_.has_master()) {
    state_.write_master(offset, values);
    return;
  }
  for (const auto& [view, start] : param_range(offset, values.numel())) {
    view.copy_(values.narrow(0, start, view.numel()));
  }
}

void ParamGroup::load_master_shard(const at::Tensor& saved) {
  TORCH_CHECK(saved.numel() == layout_.shard_numel(), "zero: saved master shard has ",
              saved.numel(), " elements but this rank's shard has ", layout_.shard_numel(),
              "; the checkpoint was written for another model or world size");
  if (state_.has_master()) {
    state_.write_master(0, saved);
    return;
  }
  for (std::size_t u = 0; u < layout_.unit_count(); ++u) {
    full_piece(param_buffer_.tensor(), u)
        .copy_(saved.narrow(0, layout_.shard_offset(u), piece_numel(u)));
  }
}

}  // namespace zero::adapter
