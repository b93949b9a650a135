// Tests for core::quantize_int8 / dequantize_int8 (csrc/core/block_quantizer.cpp): the
// block-wise int8 code that ZeRO++'s quantized weights and gradients travel in.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/block_quantizer.h"

using zero::core::dequantize_add_int8;
using zero::core::dequantize_int8;
using zero::core::quantize_int8;
using zero::core::quantized_bytes;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float spread) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> values(n);
  for (auto& v : values) v = dist(gen);
  return values;
}

std::vector<float> round_trip(const std::vector<float>& values, std::int64_t block) {
  const auto n = static_cast<std::int64_t>(values.size());
  std::vector<std::uint8_t> packed(static_cast<std::size_t>(quantized_bytes(n, block)));
  quantize_int8(values.data(), n, packed.data(), block);
  std::vector<float> out(values.size());
  dequantize_int8(packed.data(), n, out.data(), block);
  return out;
}

}  // namespace

TEST_CASE("a packed piece is the block scales then the values, padded to 4 bytes") {
  CHECK(quantized_bytes(0) == 0);
  CHECK(quantized_bytes(1, 256) == 4 + 4);
  CHECK(quantized_bytes(256, 256) == 4 + 256);
  CHECK(quantized_bytes(257, 256) == 8 + 260);
  CHECK(quantized_bytes(10, 4) == 12 + 12);
}

TEST_CASE("every value comes back within half its block's step") {
  const std::int64_t block = GENERATE(1, 7, 256);
  const std::size_t n = GENERATE(1u, 255u, 1000u);
  const auto values = random_floats(n, 11, 0.02f);
  const auto out = round_trip(values, block);
  for (std::size_t begin = 0; begin < n; begin += static_cast<std::size_t>(block)) {
    const std::size_t end = std::min(n, begin + static_cast<std::size_t>(block));
    float largest = 0.0f;
    for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(values[i]));
    for (std::size_t i = begin; i < end; ++i) {
      REQUIRE(std::fabs(out[i] - values[i]) <= largest / 127.0f * 0.5f * (1 + 1e-5f));
    }
  }
}

TEST_CASE("a block's largest magnitude, zeros and small integers are exact") {
  std::vector<float> values{127.0f, -3.0f, 0.0f, 5.0f, -127.0f, 0.0f, 0.0f, 0.0f};
  CHECK(round_trip(values, 4) == values);
  std::vector<float> zeros(300, 0.0f);
  CHECK(round_trip(zeros, 256) == zeros);
}

TEST_CASE("a block holding inf or NaN decodes to NaN; the other blocks are untouched") {
  const float bad = GENERATE(std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN());
  std::vector<float> values{1.0f, 2.0f, bad, 4.0f, 1.0f, 2.0f, 3.0f, 4.0f};
  const auto out = round_trip(values, 4);
  for (int i = 0; i < 4; ++i) CHECK(std::isnan(out[i]));
  for (int i = 4; i < 8; ++i) CHECK(std::isfinite(out[i]));
}

TEST_CASE("dequantize_add sums contributions in fp32") {
  const auto a = random_floats(600, 1, 1.0f);
  const auto b = random_floats(600, 2, 1e-3f);  // a much smaller contribution keeps its detail
  std::vector<std::uint8_t> pa(static_cast<std::size_t>(quantized_bytes(600)));
  std::vector<std::uint8_t> pb(pa.size());
  quantize_int8(a.data(), 600, pa.data());
  quantize_int8(b.data(), 600, pb.data());
  std::vector<float> sum(600, 0.0f);
  dequantize_add_int8(pa.data(), 600, sum.data());
  dequantize_add_int8(pb.data(), 600, sum.data());
  const auto qa = round_trip(a, 256);
  const auto qb = round_trip(b, 256);
  for (std::size_t i = 0; i < 600; ++i) REQUIRE(sum[i] == qa[i] + qb[i]);
}

TEST_CASE("bad arguments are refused") {
  std::vector<float> values(4);
  std::vector<std::uint8_t> packed(8);
  CHECK_THROWS_AS(quantize_int8(values.data(), -1, packed.data()), std::invalid_argument);
  CHECK_THROWS_AS(quantize_int8(values.data(), 4, packed.data(), 0), std::invalid_argument);
  CHECK_THROWS_AS(quantize_int8(nullptr, 4, packed.data()), std::invalid_argument);
  CHECK_THROWS_AS(dequantize_int8(packed.data(), 4, nullptr), std::invalid_argument);
}
