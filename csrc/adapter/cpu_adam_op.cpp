#include "adapter/cpu_adam_op.h"

#include <cmath>
#include <stdexcept>

#include "core/cpu_adam.h"
#include "core/cpu_features.h"

namespace zero::adapter {
namespace {

using core::ElemType;

// Every check raises ValueError in Python (TORCH_CHECK_VALUE), like the rest of zero._C.

void check_dense_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), "cpu_adam_step: ", name, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "cpu_adam_step: ", name, " must be on the CPU, got ",
                    t.device(), " (the CPU optimizer steps the offloaded fp32 master copy)");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "cpu_adam_step: ", name,
                    " must be a dense (strided) tensor");
  TORCH_CHECK_VALUE(t.is_contiguous(), "cpu_adam_step: ", name,
                    " must be contiguous; pass t.contiguous() (and copy the result back if it "
                    "is optimizer state)");
}

void check_same_numel(const at::Tensor& t, const char* name, const at::Tensor& params) {
  TORCH_CHECK_VALUE(t.numel() == params.numel(), "cpu_adam_step: ", name, " has ", t.numel(),
                    " elements but params has ", params.numel(),
                    "; all buffers must describe the same shard");
}

void check_fp32_state(const at::Tensor& t, const char* name, const at::Tensor& params) {
  check_dense_cpu(t, name);
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat, "cpu_adam_step: ", name,
                    " must be float32 (the fp32 master copy / optimizer state), got ",
                    t.scalar_type());
  check_same_numel(t, name, params);
}

ElemType elem_type_of(const at::Tensor& t, const char* name, bool allow_f32) {
  switch (t.scalar_type()) {
    case at::kFloat:
      if (allow_f32) return ElemType::kF32;
      break;
    case at::kBFloat16: return ElemType::kBF16;
    case at::kHalf: return ElemType::kF16;
    default: break;
  }
  TORCH_CHECK_VALUE(false, "cpu_adam_step: ", name, " must be ",
                    allow_f32 ? "float32, bfloat16 or float16" : "bfloat16 or float16", ", got ",
                    t.scalar_type());
}

// Written buffers must not overlap each other or the grads: the kernel streams through all of
// them at once, and an alias would silently read already-updated values.
void check_no_overlap(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                      const char* b_name) {
  if (a.numel() == 0 || b.numel() == 0) return;
  const auto* a0 = static_cast<const char*>(a.const_data_ptr());
  const auto* b0 = static_cast<const char*>(b.const_data_ptr());
  const auto* a1 = a0 + a.numel() * a.element_size();
  const auto* b1 = b0 + b.numel() * b.element_size();
  TORCH_CHECK_VALUE(a1 <= b0 || b1 <= a0, "cpu_adam_step: ", a_name, " and ", b_name,
                    " share memory; pass separate buffers");
}

// Raw-pointer writes bypass autograd's in-place tracking; bump the version counter like an
// in-place op would. Inference tensors have no version counter.
void bump_version(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

void cpu_adam_step(const at::Tensor& params, const at::Tensor& grads, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                   double weight_decay, bool adamw_mode, bool bias_correction, std::int64_t step,
                   double grad_scale, const std::optional<at::Tensor>& out16,
                   const std::string& isa, std::int64_t num_threads) {
  check_fp32_state(params, "params", params);
  check_fp32_state(exp_avg, "exp_avg", params);
  check_fp32_state(exp_avg_sq, "exp_avg_sq", params);
  check_dense_cpu(grads, "grads");
  check_same_numel(grads, "grads", params);
  const ElemType grad_type = elem_type_of(grads, "grads", /*allow_f32=*/true);

  const bool has_out = out16.has_value() && out16->defined();
  ElemType out_type = ElemType::kBF16;
  if (has_out) {
    check_dense_cpu(*out16, "out16");
    check_same_numel(*out16, "out16", params);
    out_type = elem_type_of(*out16, "out16", /*allow_f32=*/false);
  }

  const at::Tensor* written[] = {&params, &exp_avg, &exp_avg_sq, has_out ? &*out16 : nullptr};
  const char* written_names[] = {"params", "exp_avg", "exp_avg_sq", "out16"};
  for (int i = 0; i < 4; ++i) {
    if (written[i] == nullptr) continue;
    check_no_overlap(*written[i], written_names[i], grads, "grads");
    for (int j = i + 1; j < 4; ++j) {
      if (written[j] == nullptr) continue;
      check_no_overlap(*written[i], written_names[i], *written[j], written_names[j]);
    }
  }

  TORCH_CHECK_VALUE(!bias_correction || step >= 1,
                    "cpu_adam_step: step is 1-based and must be incremented before the call, "
                    "got ", step);
  TORCH_CHECK_VALUE(std::isfinite(grad_scale), "cpu_adam_step: grad_scale must be finite, got ",
                    grad_scale, " (skip the step on overflow instead)");
  TORCH_CHECK_VALUE(std::isfinite(lr) && std::isfinite(beta1) && std::isfinite(beta2) &&
                        std::isfinite(eps) && std::isfinite(weight_decay),
                    "cpu_adam_step: lr, beta1, beta2, eps and weight_decay must be finite");
  TORCH_CHECK_VALUE(num_threads >= 1 && num_threads <= 1024,
                    "cpu_adam_step: num_threads must be in [1, 1024], got ", num_threads,
                    " (torch.get_num_threads() is a good choice)");

  core::Isa chosen = core::Isa::kScalar;
  try {
    chosen = core::parse_isa(isa);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "cpu_adam_step: ", e.what());
  }
  TORCH_CHECK_VALUE(core::isa_supported(chosen), "cpu_adam_step: isa '", isa,
                    "' is not supported by this CPU, which supports up to '",
                    core::isa_name(core::detected_isa()), "'; pass \"auto\" to pick the best");

  core::AdamParams hp;
  hp.lr = lr;
  hp.beta1 = beta1;
  hp.beta2 = beta2;
  hp.eps = eps;
  hp.weight_decay = weight_decay;
  hp.adamw_mode = adamw_mode;
  hp.bias_correction = bias_correction;
  hp.step = step;
  hp.grad_scale = static_cast<float>(grad_scale);

  core::adam_step(hp, params.mutable_data_ptr<float>(), grads.const_data_ptr(), grad_type,
                  exp_avg.mutable_data_ptr<float>(), exp_avg_sq.mutable_data_ptr<float>(),
                  params.numel(), has_out ? out16->mutable_data_ptr() : nullptr, out_type,
                  chosen, static_cast<int>(num_threads));

  bump_version(params);
  bump_version(exp_avg);
  bump_version(exp_avg_sq);
  if (has_out) bump_version(*out16);
}

}  // namespace zero::adapter
