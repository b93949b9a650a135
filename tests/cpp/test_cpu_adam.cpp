// Tests for the fused CPU Adam/AdamW kernels (csrc/core/cpu_adam*.cpp).
//
// Every ISA the CPU supports is forced in turn and checked against a plain double-precision
// reference written here; the 16-bit conversions are checked against independent
// nearest-candidate searches rather than against the kernels' own bit tricks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "half_reference.h"
#include "core/cpu_adam.h"
#include "core/cpu_adam_kernel.h"
#include "core/cpu_features.h"

using zero::core::AdamParams;
using zero::core::adam_step;
using zero::core::ElemType;
using zero::core::Isa;

namespace {

const Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
const std::int64_t kOddLengths[] = {0, 1, 7, 15, 17, 33, 1000003};

// ---- independent 16-bit references ----

using zero_test::bf16_value;
using zero_test::fp16_value;

// Nearest of the two representable neighbours of |f|, ties to the even encoding. `value` decodes a
// magnitude encoding; encodings are monotonic in value, which is what makes the search valid.
template <class Decode>
std::uint16_t nearest_even(float f, std::uint16_t max_finite, std::uint16_t inf, Decode value) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  std::uint32_t lo = 0, hi = max_finite;  // largest encoding with value <= a, by bisection
  if (a >= value(max_finite)) {
    lo = max_finite;
  } else {
    while (lo < hi) {
      const std::uint32_t mid = (lo + hi + 1) / 2;
      if (value(static_cast<std::uint16_t>(mid)) <= a) lo = mid; else hi = mid - 1;
    }
  }
  const double below = value(static_cast<std::uint16_t>(lo));
  // Above the largest finite value the next candidate is "one more ulp", which encodes infinity.
  const double ulp = lo < max_finite ? value(static_cast<std::uint16_t>(lo + 1)) - below
                                     : below - value(static_cast<std::uint16_t>(lo - 1));
  const double above = below + ulp;
  std::uint32_t pick;
  if (a - below < above - a) pick = lo;
  else if (a - below > above - a) pick = lo + 1;
  else pick = (lo & 1) ? lo + 1 : lo;
  if (pick > max_finite) pick = inf;
  return static_cast<std::uint16_t>(sign | pick);
}

std::uint16_t ref_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  if (std::isinf(f)) return std::signbit(f) ? 0xFF80 : 0x7F80;
  return nearest_even(f, 0x7F7F, 0x7F80, bf16_value);
}

std::uint16_t ref_fp16(float f) {
  if (std::isinf(f)) return std::signbit(f) ? 0xFC00 : 0x7C00;
  return nearest_even(f, 0x7BFF, 0x7C00, fp16_value);
}

// ---- a problem instance and the double-precision reference ----

struct Problem {
  std::vector<float> params, exp_avg, exp_avg_sq;
  std::vector<float> grads32;         // the gradient values, as fp32
  std::vector<std::uint16_t> grads16; // the same values encoded (when grad_type is 16-bit)
  ElemType grad_type = ElemType::kF32;

  const void* grads() const {
    return grad_type == ElemType::kF32 ? static_cast<const void*>(grads32.data())
                                       : static_cast<const void*>(grads16.data());
  }
};

// Random state and gradients. 16-bit gradients are generated as 16-bit values, and grads32 holds
// their exact fp32 values, so the reference sees precisely what the kernel decodes.
Problem make_problem(std::int64_t n, ElemType grad_type, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem pr;
  pr.grad_type = grad_type;
  const auto size = static_cast<std::size_t>(n);
  pr.params.resize(size);
  pr.exp_avg.resize(size);
  pr.exp_avg_sq.resize(size);
  pr.grads32.resize(size);
  for (std::size_t i = 0; i < size; ++i) {
    pr.params[i] = uni(rng);
    pr.exp_avg[i] = 0.1f * normal(rng);
    pr.exp_avg_sq[i] = 0.01f * std::fabs(normal(rng));
    pr.grads32[i] = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(i % 7) - 3));
  }
  if (grad_type != ElemType::kF32) {
    pr.grads16.resize(size);
    for (std::size_t i = 0; i < size; ++i) {
      const bool bf = grad_type == ElemType::kBF16;
      pr.grads16[i] = bf ? ref_bf16(pr.grads32[i]) : ref_fp16(pr.grads32[i]);
      const double exact = bf ? bf16_value(pr.grads16[i]) : fp16_value(pr.grads16[i]);
      pr.grads32[i] = static_cast<float>(exact);
    }
  }
  return pr;
}

struct RefState {
  std::vector<double> p, m, v;
  explicit RefState(const Problem& pr)
      : p(pr.params.begin(), pr.params.end()),
        m(pr.exp_avg.begin(), pr.exp_avg.end()),
        v(pr.exp_avg_sq.begin(), pr.exp_avg_sq.end()) {}
};

// Textbook Adam / AdamW in double.
void reference_step(const AdamParams& hp, const std::vector<float>& grads, RefState& s) {
  const double t = static_cast<double>(hp.step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(hp.beta1, t) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 - std::pow(hp.beta2, t) : 1.0;
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    double g = static_cast<double>(grads[i]) * hp.grad_scale;
    if (hp.adamw_mode) s.p[i] *= 1.0 - hp.lr * hp.weight_decay;
    else g += hp.weight_decay * s.p[i];
    s.m[i] = hp.beta1 * s.m[i] + (1.0 - hp.beta1) * g;
    s.v[i] = hp.beta2 * s.v[i] + (1.0 - hp.beta2) * g * g;
    s.p[i] -= hp.lr / bc1 * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + hp.eps);
  }
}

// |actual - ref| <= rtol * |ref| + atol for every element; reports the worst element on failure.
void check_close(const char* what, const std::vector<float>& actual, const std::vector<double>& ref,
                 double rtol, double atol) {
  REQUIRE(actual.size() == ref.size());
  std::size_t worst = 0;
  double worst_excess = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(actual[i]) - ref[i]);
    const double excess = err - (rtol * std::fabs(ref[i]) + atol);
    if (!(excess <= worst_excess) || std::isnan(excess)) {
      worst_excess = std::isnan(excess) ? std::numeric_limits<double>::infinity() : excess;
      worst = i;
    }
  }
  if (ref.empty()) return;
  INFO(what << "[" << worst << "]: actual " << actual[worst] << " reference " << ref[worst]);
  CHECK(worst_excess <= 0.0);
}

// Tolerances for one fp32 step against the double reference: a handful of float roundings.
// Parameter errors are relative to |p| plus the size of an update (~lr).
void check_against_reference(const Problem& pr, const RefState& ref, double lr) {
  check_close("params", pr.params, ref.p, 1e-6, 1e-6 * lr);
  check_close("exp_avg", pr.exp_avg, ref.m, 1e-5, 1e-7);
  check_close("exp_avg_sq", pr.exp_avg_sq, ref.v, 1e-5, 1e-9);
}

AdamParams default_params() {
  AdamParams hp;
  hp.lr = 1e-3;
  hp.beta1 = 0.9;
  hp.beta2 = 0.999;
  hp.eps = 1e-8;
  hp.weight_decay = 0.01;
  hp.adamw_mode = true;
  hp.bias_correction = true;
  hp.step = 3;
  hp.grad_scale = 1.0f;
  return hp;
}

void run_kernel(const AdamParams& hp, Problem& pr, Isa isa, std::uint16_t* out16 = nullptr,
                ElemType out_type = ElemType::kBF16, int threads = 1) {
  adam_step(hp, pr.params.data(), pr.grads(), pr.grad_type, pr.exp_avg.data(),
            pr.exp_avg_sq.data(), static_cast<std::int64_t>(pr.params.size()), out16, out_type,
            isa, threads);
}

// One step of `isa` on a fresh problem against the reference.
void check_one_step(const AdamParams& hp, Isa isa, std::int64_t n, ElemType grad_type) {
  Problem pr = make_problem(n, grad_type, 1234u + static_cast<std::uint32_t>(n));
  RefState ref(pr);
  reference_step(hp, pr.grads32, ref);
  run_kernel(hp, pr, isa);
  check_against_reference(pr, ref, hp.lr);
}

bool skip_unsupported(Isa isa) {
  if (zero::core::isa_supported(isa)) return false;
  WARN("CPU lacks " << zero::core::isa_name(isa) << "; skipping that path");
  return true;
}

// Bitwise equality, returned as a bool so that Catch does not print million-element vectors.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("ISA detection reports a consistent, parseable set", "[cpu_adam][isa]") {
  CHECK(zero::core::isa_supported(Isa::kScalar));
  CHECK(zero::core::isa_supported(zero::core::detected_isa()));
  CHECK(zero::core::isa_supported(zero::core::best_isa()));
  for (Isa isa : kAllIsas) CHECK(zero::core::parse_isa(zero::core::isa_name(isa)) == isa);
  CHECK(zero::core::parse_isa("auto") == zero::core::best_isa());
  CHECK_THROWS_AS(zero::core::parse_isa("sse9"), std::invalid_argument);
  // Wider ISAs imply the narrower ones.
  if (zero::core::isa_supported(Isa::kAvx512)) CHECK(zero::core::isa_supported(Isa::kAvx2));
  INFO("detected " << zero::core::isa_name(zero::core::detected_isa())
                   << ", best after ZERO_CPU_ISA " << zero::core::isa_name(zero::core::best_isa()));
  SUCCEED();
}

TEST_CASE("AdamW fp32 step matches the double reference on every ISA and odd length",
          "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  const std::int64_t n = GENERATE(from_range(std::begin(kOddLengths), std::end(kOddLengths)));
  if (skip_unsupported(isa)) return;
  INFO("isa " << zero::core::isa_name(isa) << " n " << n);
  check_one_step(default_params(), isa, n, ElemType::kF32);
}

TEST_CASE("Adam with L2 weight decay (adamw_mode off) matches the reference", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  if (skip_unsupported(isa)) return;
  AdamParams hp = default_params();
  hp.adamw_mode = false;
  hp.weight_decay = 0.1;
  check_one_step(hp, isa, 1003, ElemType::kF32);
}

TEST_CASE("Adam and AdamW give different results when weight decay is on", "[cpu_adam]") {
  AdamParams hp = default_params();
  hp.weight_decay = 0.1;
  Problem a = make_problem(257, ElemType::kF32, 7);
  Problem b = a;
  run_kernel(hp, a, zero::core::best_isa());
  hp.adamw_mode = false;
  run_kernel(hp, b, zero::core::best_isa());
  CHECK_FALSE(same_bits(a.params, b.params));
}

TEST_CASE("bias correction off matches the reference", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  if (skip_unsupported(isa)) return;
  AdamParams hp = default_params();
  hp.bias_correction = false;
  hp.step = 1;
  check_one_step(hp, isa, 1003, ElemType::kF32);
}

TEST_CASE("zero weight decay and a large beta1-complement (lerp from grad) match", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  if (skip_unsupported(isa)) return;
  AdamParams hp = default_params();
  hp.weight_decay = 0.0;
  hp.beta1 = 0.3;  // 1 - beta1 >= 0.5 takes at::lerp's other formula
  check_one_step(hp, isa, 1003, ElemType::kF32);
}

TEST_CASE("grad_scale multiplies the gradient before anything else", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  if (skip_unsupported(isa)) return;
  AdamParams hp = default_params();
  hp.adamw_mode = false;  // so the scaled grad also meets L2 decay
  hp.grad_scale = 0.37f / 1024.0f;
  check_one_step(hp, isa, 1003, ElemType::kF32);
}

TEST_CASE("bf16 and fp16 gradients match the reference on every ISA", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  const ElemType type = GENERATE(ElemType::kBF16, ElemType::kF16);
  const std::int64_t n = GENERATE(1, 17, 33, 1000003);
  if (skip_unsupported(isa)) return;
  INFO("isa " << zero::core::isa_name(isa) << " grads " << zero::core::elem_type_name(type)
              << " n " << n);
  AdamParams hp = default_params();
  hp.grad_scale = 0.5f;
  check_one_step(hp, isa, n, type);
}

TEST_CASE("16-bit output equals round-to-nearest-even of the fp32 result", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  const ElemType out_type = GENERATE(ElemType::kBF16, ElemType::kF16);
  const ElemType grad_type = GENERATE(ElemType::kF32, ElemType::kBF16, ElemType::kF16);
  if (skip_unsupported(isa)) return;
  INFO("isa " << zero::core::isa_name(isa) << " out " << zero::core::elem_type_name(out_type));
  Problem pr = make_problem(4099, grad_type, 99);
  // Spread magnitudes so fp16 sees subnormals, normals and overflow to inf.
  for (std::size_t i = 0; i < pr.params.size(); ++i) {
    pr.params[i] *= std::exp2(static_cast<float>(static_cast<int>(i % 48) - 28));
  }
  std::vector<std::uint16_t> out(pr.params.size(), 0xDEAD);
  run_kernel(default_params(), pr, isa, out.data(), out_type);
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float p = pr.params[i];
    const std::uint16_t want = out_type == ElemType::kBF16 ? ref_bf16(p) : ref_fp16(p);
    if (out[i] != want && mismatches++ == 0) first = i;
  }
  INFO("first mismatch at " << first << ": param " << pr.params[first] << " got 0x" << std::hex
                            << out[first]);
  CHECK(mismatches == 0);
}

TEST_CASE("scalar fp16/bf16 conversions round to nearest even everywhere", "[cpu_adam][convert]") {
  namespace d = zero::core::adam_detail;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {  // every 16-bit pattern decodes exactly
    const auto bits = static_cast<std::uint16_t>(h);
    const double want = fp16_value(bits);
    const float got = d::fp16_to_float(bits);
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(static_cast<double>(got) == want);
      REQUIRE(d::float_to_fp16(got) == bits);  // and re-encodes to itself
    }
    const float bf = d::bf16_to_float(bits);  // exact widening: compare bits (NaNs included)
    std::uint32_t bf_bits;
    std::memcpy(&bf_bits, &bf, 4);
    REQUIRE(bf_bits == std::uint32_t{bits} << 16);
  }
  // Random floats over the whole exponent range, plus exact ties (halfway between neighbours).
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::uint32_t> bits32;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = bits32(rng);
    if (i % 4 == 0) u = (u & 0xFFFFE000u) | 0x1000u;  // fp16 tie in the normal range
    if (i % 4 == 1) u = (u & 0xFFFF0000u) | 0x8000u;  // bf16 tie
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    REQUIRE(d::float_to_fp16(f) == ref_fp16(f));
    REQUIRE(d::float_to_bf16(f) == ref_bf16(f));
  }
  CHECK(d::float_to_bf16(std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK((d::float_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7E00) == 0x7E00);
}

TEST_CASE("every ISA produces bit-identical results", "[cpu_adam]") {
  const ElemType grad_type = GENERATE(ElemType::kF32, ElemType::kBF16, ElemType::kF16);
  const bool adamw = GENERATE(true, false);
  AdamParams hp = default_params();
  hp.adamw_mode = adamw;
  hp.grad_scale = 1.0f / 3.0f;
  const Problem start = make_problem(100003, grad_type, 42);
  Problem want = start;
  std::vector<std::uint16_t> want16(start.params.size());
  run_kernel(hp, want, Isa::kScalar, want16.data(), ElemType::kBF16);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (skip_unsupported(isa)) continue;
    INFO("isa " << zero::core::isa_name(isa));
    Problem got = start;
    std::vector<std::uint16_t> got16(start.params.size());
    run_kernel(hp, got, isa, got16.data(), ElemType::kBF16);
    CHECK(same_bits(got.params, want.params));
    CHECK(same_bits(got.exp_avg, want.exp_avg));
    CHECK(same_bits(got.exp_avg_sq, want.exp_avg_sq));
    CHECK(same_bits(got16, want16));
  }
}

TEST_CASE("multiple threads give results bit-identical to one thread", "[cpu_adam][threads]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  const int threads = GENERATE(2, 3, 7);
  if (skip_unsupported(isa)) return;
  INFO("isa " << zero::core::isa_name(isa) << " threads " << threads);
  const Problem start = make_problem(1000003, ElemType::kBF16, 3);
  Problem one = start, many = start;
  std::vector<std::uint16_t> out_one(start.params.size()), out_many(start.params.size());
  run_kernel(default_params(), one, isa, out_one.data(), ElemType::kF16, 1);
  run_kernel(default_params(), many, isa, out_many.data(), ElemType::kF16, threads);
  CHECK(same_bits(one.params, many.params));
  CHECK(same_bits(one.exp_avg, many.exp_avg));
  CHECK(same_bits(one.exp_avg_sq, many.exp_avg_sq));
  CHECK(same_bits(out_one, out_many));
}

TEST_CASE("several consecutive steps track the reference", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  if (skip_unsupported(isa)) return;
  AdamParams hp = default_params();
  Problem pr = make_problem(4097, ElemType::kF32, 11);
  for (auto& x : pr.exp_avg) x = 0.0f;  // start from a fresh optimizer state, as training does
  for (auto& x : pr.exp_avg_sq) x = 0.0f;
  RefState ref(pr);
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t step = 1; step <= 10; ++step) {
    for (auto& g : pr.grads32) g = normal(rng);
    hp.step = step;
    reference_step(hp, pr.grads32, ref);
    run_kernel(hp, pr, isa);
  }
  // Errors accumulate over steps, so allow a few times the one-step tolerance.
  check_close("params", pr.params, ref.p, 4e-6, 1e-5 * hp.lr);
  check_close("exp_avg", pr.exp_avg, ref.m, 5e-5, 1e-6);
  check_close("exp_avg_sq", pr.exp_avg_sq, ref.v, 5e-5, 1e-9);
}

TEST_CASE("non-finite gradients propagate as NaN on every ISA", "[cpu_adam]") {
  const Isa isa = GENERATE(from_range(std::begin(kAllIsas), std::end(kAllIsas)));
  if (skip_unsupported(isa)) return;
  Problem pr = make_problem(40, ElemType::kF32, 8);
  pr.grads32[3] = std::numeric_limits<float>::quiet_NaN();
  pr.grads32[21] = std::numeric_limits<float>::infinity();
  std::vector<std::uint16_t> out(40);
  run_kernel(default_params(), pr, isa, out.data(), ElemType::kBF16);
  CHECK(std::isnan(pr.params[3]));
  CHECK(std::isnan(pr.params[21]));  // inf / inf in the update
  CHECK(out[3] == 0x7FC0);
  CHECK(std::isfinite(pr.params[4]));
}

TEST_CASE("invalid arguments are rejected with std::invalid_argument", "[cpu_adam]") {
  Problem pr = make_problem(8, ElemType::kF32, 1);
  AdamParams hp = default_params();
  std::uint16_t out[8];
  const Isa isa = Isa::kScalar;
  CHECK_THROWS_AS(adam_step(hp, pr.params.data(), pr.grads(), ElemType::kF32, pr.exp_avg.data(),
                            pr.exp_avg_sq.data(), 8, out, ElemType::kF32, isa),
                  std::invalid_argument);
  CHECK_THROWS_AS(adam_step(hp, pr.params.data(), pr.grads(), ElemType::kF32, pr.exp_avg.data(),
                            pr.exp_avg_sq.data(), -1, nullptr, ElemType::kBF16, isa),
                  std::invalid_argument);
  hp.step = 0;
  CHECK_THROWS_AS(adam_step(hp, pr.params.data(), pr.grads(), ElemType::kF32, pr.exp_avg.data(),
                            pr.exp_avg_sq.data(), 8, nullptr, ElemType::kBF16, isa),
                  std::invalid_argument);
  for (Isa wide : {Isa::kAvx2, Isa::kAvx512}) {
    if (zero::core::isa_supported(wide)) continue;
    hp.step = 1;
    CHECK_THROWS_AS(adam_step(hp, pr.params.data(), pr.grads(), ElemType::kF32, pr.exp_avg.data(),
                              pr.exp_avg_sq.data(), 8, nullptr, ElemType::kBF16, wide),
                    std::invalid_argument);
  }
}
