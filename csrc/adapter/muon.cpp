#include "adapter/muon.h"

#include <cmath>
#include <memory>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "adapter/dtype_map.h"
#include "adapter/shard_state.h"
#include "adapter/tracked_tensor.h"

namespace zero::adapter {
namespace {

// The quintic's coefficients (Jordan et al.): steep at zero, so few steps push every singular
// value towards 1 (into about [0.7, 1.2] rather than exactly 1).
constexpr double kA = 3.4445;
constexpr double kB = -4.7750;
constexpr double kC = 2.0315;
constexpr std::int64_t kGramRestart = 2;  // the Gram iteration re-forms X Q here (stability)

at::Tensor transposed(const at::Tensor& x) { return x.transpose(-2, -1); }

at::Tensor normalized(const at::Tensor& x) {
  return x / (at::linalg_vector_norm(x, 2, {-2, -1}, /*keepdim=*/true) + 1e-7);
}

// X <- a X + (b A + c A A) X with A = X X^T, `steps` times (X has no more rows than columns).
at::Tensor quintic_steps(at::Tensor x, std::int64_t steps) {
  for (std::int64_t i = 0; i < steps; ++i) {
    const at::Tensor a = at::matmul(x, transposed(x));
    const at::Tensor b = a * kB + at::matmul(a * kC, a);
    x = x * kA + at::matmul(b, x);
  }
  return x;
}

// The same polynomial applied through the n x n Gram matrix R = X X^T: X_k = Q_k X, with Q
// accumulated from R's powers, so a wide matrix costs n x n products (Dao's Gram
// Newton-Schulz, DeepSpeed's "gram"). Returns Q X, or for a `tall` input (x is its transpose)
// (Q X)^T as X^T Q^T.
at::Tensor gram_iteration(at::Tensor x, std::int64_t steps, bool tall) {
  at::Tensor r = at::matmul(x, transposed(x));
  at::Tensor q;
  for (std::int64_t i = 0; i < steps; ++i) {
    if (i == kGramRestart) {
      x = at::matmul(q, x);
      r = at::matmul(x, transposed(x));
      q = at::Tensor();
    }
    const at::Tensor z = r * kB + at::matmul(r * kC, r);
    if (!q.defined()) {
      q = z.clone();
      q.diagonal(0, -2, -1).add_(kA);
    } else {
      q = q * kA + at::matmul(z, q);
    }
    if (i + 1 < steps && i + 1 != kGramRestart) {
      const at::Tensor rz = r * kA + at::matmul(z, r);
      r = rz * kA + at::matmul(z, rz);
    }
  }
  return tall ? at::matmul(transposed(x), transposed(q)) : at::matmul(q, x);
}

// Newton-Schulz on matrix (or batch) `g`, in `dtype`; the result in `dtype`.
at::Tensor newton_schulz(const at::Tensor& g, NsMethod method, c10::ScalarType dtype,
                         std::int64_t steps) {
  const bool tall = g.size(-2) > g.size(-1);
  if (method == NsMethod::kStandard) {  // cast, then normalize in the iteration's dtype
    at::Tensor x = g.to(dtype);
    if (tall) x = transposed(x);
    x = quintic_steps(normalized(x), steps);
    return tall ? transposed(x) : x;
  }
  at::Tensor x = tall ? transposed(g) : g;  // normalized in fp32 (fp16 would overflow first)
  x = normalized(x).to(dtype);
  if (x.size(-1) <= x.size(-2)) {  // square: no smaller Gram matrix to iterate on
    x = quintic_steps(x, steps);
    return tall ? transposed(x) : x;
  }
  return gram_iteration(x, steps, tall);
}

double aspect_ratio_scale(std::int64_t rows, std::int64_t cols) {
  return rows > cols ? std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)) : 1.0;
}

}  // namespace

at::Tensor orthogonalized(const at::Tensor& blend, const std::vector<std::int64_t>& shape,
                          const OptimizerHyper& hyper) {
  TORCH_CHECK_VALUE(shape.size() >= 2, "zero: Muon orthogonalizes matrices; a parameter of ",
                    shape.size(), " dimensions was tagged use_muon");
  TORCH_CHECK_VALUE(hyper.ns_steps >= 1, "zero: Muon needs at least one Newton-Schulz step");
  const at::Tensor matrix = shape.size() == 4 ? blend.view({shape[0], -1}) : blend.view(shape);
  at::Tensor update = newton_schulz(matrix, hyper.ns_method, to_scalar_type(hyper.ns_dtype),
                                    hyper.ns_steps);
  const double scale = aspect_ratio_scale(shape[shape.size() - 2], shape.back());
  if (scale != 1.0) update = update * scale;  // (in the iteration's dtype, as DeepSpeed)
  return update.to(at::kFloat).reshape({-1});
}

namespace {

// A piece's blends on their way to the whole unit (in rank order: each rank holds the same
// 1/N of every unit); `unit` is the blends themselves where the parameters are whole here.
// The gathered unit is counted in the memory report ("other") while it lives.
struct UnitBlends {
  at::Tensor unit;
  TrackedTensor gathered;
  std::unique_ptr<PendingCollective> gather;
};

// Advances the piece's momentum and starts gathering its Nesterov blends, on `device`.
UnitBlends start_blends(ShardState& state, const ShardPiece& piece, const ParamSlices& params,
                        const OptimizerHyper& hyper, double grad_scale, at::Device device) {
  const double beta = hyper.momentum;
  at::Tensor grad = piece.grad.to(device, at::kFloat, false, /*copy=*/true);
  if (grad_scale != 1.0) grad.mul_(grad_scale);
  const std::int64_t numel = piece.grad.numel();
  // offloaded: a copy of the host momentum, stored back once advanced
  at::Tensor momentum = state.offloaded()
      ? state.read_array("momentum_buffer", piece.offset, numel).to(device)
      : state.states_of(piece).at(0);
  momentum.lerp_(grad, 1.0 - beta);
  if (state.offloaded()) state.write_array("momentum_buffer", piece.offset, momentum);
  at::Tensor blend = hyper.nesterov ? grad.lerp_(momentum, beta) : momentum.clone();
  if (params.sharers == nullptr) return {blend, {}, nullptr};
  TrackedTensor gathered = device_buffer(state.registry(), core::MemoryCategory::kOther,
                                         blend.numel() * params.sharers->world_size(),
                                         blend.options());
  auto gather = params.sharers->all_gather(gathered.tensor(), blend);
  return {gathered.tensor(), std::move(gathered), std::move(gather)};
}

// Each parameter of the gathered unit that the piece holds a slice of, orthogonalized whole;
// the piece's slices of the updates replace its gradients.
void write_updates(const ShardPiece& piece, const at::Tensor& unit, const ParamSlices& params,
                   const OptimizerHyper& hyper) {
  const auto [first, last] = slices_of(piece, params.slices);
  for (std::size_t s = first; s < last; ++s) {
    const core::ShardSlice& slice = params.slices[s];
    const core::ParamLocation& where = params.layout->location(slice.param);
    const core::ParamSlot& slot = params.layout->unit(where.buffer).params().at(where.index);
    const at::Tensor update = orthogonalized(unit.narrow(0, slot.offset, slot.numel), slot.shape,
                                             hyper);
    piece.grad.narrow(0, slice.shard_offset - piece.offset, slice.numel)
        .copy_(update.narrow(0, slice.param_begin, slice.numel));
  }
}

}  // namespace

void muon_updates(ShardState& state, const std::vector<ShardPiece>& pieces,
                  const ParamSlices& params, const OptimizerHyper& hyper, double grad_scale,
                  at::Device device) {
  TORCH_CHECK(hyper.kind == OptimizerKind::kMuon, "zero: muon_updates stepped with ",
              optimizer_name(hyper.kind));
  TORCH_CHECK(params.layout != nullptr, "zero: Muon needs the parameters' layout");
  // One unit's gather in flight while the one before is orthogonalized (two units' blends
  // alive at a time).
  UnitBlends next;
  if (!pieces.empty()) {
    next = start_blends(state, pieces.front(), params, hyper, grad_scale, device);
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    UnitBlends current = std::move(next);
    if (i + 1 < pieces.size()) {
      next = start_blends(state, pieces[i + 1], params, hyper, grad_scale, device);
    }
    if (current.gather) current.gather->wait();
    write_updates(pieces[i], current.unit, params, hyper);
  }
}

}  // namespace zero::adapter
