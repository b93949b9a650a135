#pragma once
// Element types the core understands. The core is torch-free, so it names dtypes itself; the
// adapter maps at::ScalarType onto these.
#include <cstdint>
#include <string>

namespace zero::core {

enum class DType : std::uint8_t { kFloat32, kBFloat16, kFloat16, kFloat64 };

std::int64_t element_size(DType dtype);
const char* dtype_name(DType dtype);
// Accepts "float32", "bfloat16", "float16", "float64" (and torch's "torch." prefix);
// throws std::invalid_argument naming the value and the accepted spellings.
DType parse_dtype(const std::string& name);

}  // namespace zero::core
