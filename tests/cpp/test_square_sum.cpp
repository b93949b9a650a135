// Tests for core::square_sum (csrc/core/square_sum.cpp): the per-rank piece of the global
// gradient norm, read in one pass from fp32, bf16 or fp16 shards.
#include <catch2/catch.hpp>

#include "half_reference.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/square_sum.h"

using zero::core::ElemType;
using zero::core::square_sum;

namespace {

using zero_test::bf16_value;
using zero_test::fp16_value;

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> values(n);
  for (auto& v : values) v = dist(gen);
  return values;
}

double reference(const std::vector<double>& values) {
  long double total = 0.0L;
  for (const double v : values) total += static_cast<long double>(v) * v;
  return static_cast<double>(total);
}

}  // namespace

TEST_CASE("square_sum of fp32 matches a long-double reference at odd lengths") {
  for (const std::size_t n : {1u, 7u, 8u, 9u, 65535u, 65536u, 65537u, 1000003u}) {
    const auto values = random_floats(n, static_cast<std::uint32_t>(n));
    const double expected = reference(std::vector<double>(values.begin(), values.end()));
    CHECK(square_sum(values.data(), ElemType::kF32, static_cast<std::int64_t>(n), 3) ==
          Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("square_sum decodes bf16 and fp16 elements") {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> bits(0, 0xFFFF);
  std::vector<std::uint16_t> raw;
  std::vector<double> bf16, fp16;
  while (raw.size() < 200001) {
    const auto h = static_cast<std::uint16_t>(bits(gen));
    // Finite in both formats: bf16 exponent below 0xFF, fp16 exponent below 0x1F.
    if (((h >> 7) & 0xFF) == 0xFF || ((h >> 10) & 0x1F) == 0x1F) continue;
    raw.push_back(h);
    bf16.push_back(bf16_value(h));
    fp16.push_back(fp16_value(h));
  }
  const auto n = static_cast<std::int64_t>(raw.size());
  CHECK(square_sum(raw.data(), ElemType::kBF16, n, 2) == Approx(reference(bf16)).epsilon(1e-12));
  CHECK(square_sum(raw.data(), ElemType::kF16, n, 2) == Approx(reference(fp16)).epsilon(1e-12));
}

TEST_CASE("square_sum gives the same bits for every thread count") {
  const auto values = random_floats(1 << 20, 11);
  const double one = square_sum(values.data(), ElemType::kF32, 1 << 20, 1);
  for (const int threads : {2, 3, 7, 16, 64}) {
    CHECK(square_sum(values.data(), ElemType::kF32, 1 << 20, threads) == one);
  }
}

TEST_CASE("square_sum does not overflow on large finite fp32 gradients") {
  // 1e20 squared overflows fp32 (max about 3.4e38); in double the sum stays finite.
  const std::vector<float> values(1000, 1e20f);
  const double sum = square_sum(values.data(), ElemType::kF32, 1000, 2);
  CHECK(std::isfinite(sum));
  CHECK(sum == Approx(1000.0 * 1e20 * 1e20).epsilon(1e-6));
}

TEST_CASE("square_sum is not finite when an element is NaN or infinite") {
  auto values = random_floats(100000, 3);
  values[77777] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(square_sum(values.data(), ElemType::kF32, 100000, 2)));
  values[77777] = -std::numeric_limits<float>::infinity();
  CHECK(std::isinf(square_sum(values.data(), ElemType::kF32, 100000, 2)));
  const std::uint16_t bf16_inf = 0x7F80;
  CHECK(std::isinf(square_sum(&bf16_inf, ElemType::kBF16, 1)));
}

TEST_CASE("square_sum of nothing is zero, and a negative length or null data is an error") {
  CHECK(square_sum(nullptr, ElemType::kF32, 0) == 0.0);
  const float one = 1.0f;
  CHECK_THROWS_AS(square_sum(&one, ElemType::kF32, -1), std::invalid_argument);
  CHECK_THROWS_AS(square_sum(nullptr, ElemType::kF32, 4), std::invalid_argument);
}
