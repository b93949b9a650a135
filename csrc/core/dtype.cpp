#include "core/dtype.h"

#include <stdexcept>

namespace zero::core {

std::int64_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kFloat64: return 8;
  }
  throw std::logic_error("element_size: unknown DType");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
  }
  throw std::logic_error("dtype_name: unknown DType");
}

DType parse_dtype(const std::string& raw) {
  const std::string prefix = "torch.";
  const std::string name = raw.rfind(prefix, 0) == 0 ? raw.substr(prefix.size()) : raw;
  if (name == "float32" || name == "float") return DType::kFloat32;
  if (name == "bfloat16") return DType::kBFloat16;
  if (name == "float16" || name == "half") return DType::kFloat16;
  if (name == "float64" || name == "double") return DType::kFloat64;
  throw std::invalid_argument("unsupported dtype '" + raw +
                              "': expected one of float32, bfloat16, float16, float64");
}

}  // namespace zero::core
