#include "adapter/dtype_map.h"

#include <c10/util/Exception.h>

namespace zero::adapter {

core::DType to_core_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float: return core::DType::kFloat32;
    case c10::ScalarType::BFloat16: return core::DType::kBFloat16;
    case c10::ScalarType::Half: return core::DType::kFloat16;
    case c10::ScalarType::Double: return core::DType::kFloat64;
    default:
      TORCH_CHECK(false, "zero: unsupported dtype ", type,
                  "; flat buffers hold float32, bfloat16, float16 or float64");
  }
}

c10::ScalarType to_scalar_type(core::DType dtype) {
  switch (dtype) {
    case core::DType::kFloat32: return c10::ScalarType::Float;
    case core::DType::kBFloat16: return c10::ScalarType::BFloat16;
    case core::DType::kFloat16: return c10::ScalarType::Half;
    case core::DType::kFloat64: return c10::ScalarType::Double;
  }
  TORCH_CHECK(false, "zero: unknown core dtype");
}

}  // namespace zero::adapter
