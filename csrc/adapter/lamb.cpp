#include "adapter/lamb.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "adapter/shard_state.h"

namespace zero::adapter {
namespace {

// u = m / (sqrt(v) + eps) + weight_decay * w, in fp32.
at::Tensor direction(const at::Tensor& w, const at::Tensor& m, const at::Tensor& v,
                     const OptimizerHyper& hyper) {
  const at::Tensor denom = hyper.eps_inside_sqrt ? v.add(hyper.eps).sqrt_()
                                                 : v.sqrt().add_(hyper.eps);
  at::Tensor u = m.div(denom);
  if (hyper.weight_decay != 0.0) u.add_(w, hyper.weight_decay);
  return u;
}

// A piece's master (what the update writes) and its update direction from the moments. The
// step computes it twice, for the norms and for the update, rather than keep the whole
// shard's directions alive in between (as FusedLamb's two kernels do).
std::pair<at::Tensor, at::Tensor> master_and_direction(ShardState& state, const ShardPiece& piece,
                                                       const OptimizerHyper& hyper) {
  at::Tensor w = state.master_of(piece);
  const std::vector<at::Tensor> moments = state.states_of(piece);
  at::Tensor u = direction(w, moments[0], moments[1], hyper);
  return {std::move(w), std::move(u)};
}

double trust_ratio(double w_squares, double u_squares, const OptimizerHyper& hyper) {
  const double w = std::sqrt(w_squares);
  const double u = std::sqrt(u_squares);
  if (w == 0.0 || u == 0.0) return 1.0;
  return std::clamp(w / u, hyper.min_coeff, hyper.max_coeff);
}

// Per parameter, this rank's sum of w^2 and of u^2 (before the update), [param_count, 2] in
// double on the pieces' device.
at::Tensor squares_per_param(ShardState& state, const std::vector<ShardPiece>& pieces,
                             const ParamSlices& params, const OptimizerHyper& hyper) {
  const at::Device device = pieces.empty() ? at::Device(at::kCPU) : pieces.front().grad.device();
  std::vector<at::Tensor> w_squares, u_squares;
  std::vector<std::int64_t> owner;
  for (const ShardPiece& piece : pieces) {
    const auto [w, u] = master_and_direction(state, piece, hyper);
    const auto [first, last] = slices_of(piece, params.slices);
    for (std::size_t i = first; i < last; ++i) {
      const core::ShardSlice& slice = params.slices[i];
      const std::int64_t at = slice.shard_offset - piece.offset;
      w_squares.push_back(w.narrow(0, at, slice.numel).square().sum(at::kDouble));
      u_squares.push_back(u.narrow(0, at, slice.numel).square().sum(at::kDouble));
      owner.push_back(static_cast<std::int64_t>(slice.param));
    }
  }
  const auto doubles = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor sums = at::zeros({static_cast<std::int64_t>(params.param_count), 2}, doubles);
  if (!owner.empty()) {
    const at::Tensor index = at::tensor(owner, at::TensorOptions().dtype(at::kLong)).to(device);
    sums.index_add_(0, index, at::stack({at::stack(w_squares), at::stack(u_squares)}, 1));
  }
  return sums;
}

}  // namespace

std::vector<double> lamb_step(ShardState& state, const std::vector<ShardPiece>& pieces,
                              const ParamSlices& params, const OptimizerHyper& hyper,
                              double grad_scale, std::int64_t step,
                              const std::function<void(std::size_t)>& stepped) {
  TORCH_CHECK(hyper.kind == OptimizerKind::kLamb, "zero: lamb_step stepped with ",
              optimizer_name(hyper.kind));
  TORCH_CHECK_VALUE(hyper.min_coeff <= hyper.max_coeff, "zero: LAMB's min_coeff ",
                    hyper.min_coeff, " is above its max_coeff ", hyper.max_coeff);
  for (const ShardPiece& piece : pieces) {  // the moments
    const std::vector<at::Tensor> moments = state.states_of(piece);
    at::Tensor grad = piece.grad.to(at::kFloat);
    if (grad_scale != 1.0) grad = grad.mul(grad_scale);  // (never in place: an fp32 grad's own)
    moments[0].mul_(hyper.beta1).add_(grad, 1.0 - hyper.beta1);
    moments[1].mul_(hyper.beta2).addcmul_(grad, grad, 1.0 - hyper.beta2);
  }
  at::Tensor sums = squares_per_param(state, pieces, params, hyper);
  if (params.sharers != nullptr) params.sharers->all_reduce(sums, Reduction::kSum)->wait();
  const at::Tensor host = sums.cpu();
  const auto* squares = host.data_ptr<double>();
  double step_size = hyper.lr;
  if (hyper.bias_correction) {
    const double steps = static_cast<double>(step);
    step_size *= std::sqrt(1.0 - std::pow(hyper.beta2, steps)) /
                 (1.0 - std::pow(hyper.beta1, steps));
  }
  std::vector<double> ratios(params.param_count);
  for (std::size_t p = 0; p < params.param_count; ++p) {
    ratios[p] = trust_ratio(squares[2 * p], squares[2 * p + 1], hyper);
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {  // the update, parameter by parameter
    const ShardPiece& piece = pieces[i];
    const auto [w, u] = master_and_direction(state, piece, hyper);
    const auto [first, last] = slices_of(piece, params.slices);
    for (std::size_t s = first; s < last; ++s) {
      const core::ShardSlice& slice = params.slices[s];
      const std::int64_t at = slice.shard_offset - piece.offset;
      w.narrow(0, at, slice.numel).add_(u.narrow(0, at, slice.numel),
                                        -step_size * ratios[slice.param]);
    }
    if (state.keeps_master()) store_params(piece, 0, w);
    if (stepped) stepped(i);
  }
  return ratios;
}

}  // namespace zero::adapter
