#pragma once
// Block-wise symmetric int8 quantization of fp32 values, for communication (ZeRO++'s quantized
// weights and gradients): every block of `block` consecutive values shares one fp32 scale,
// max|x| / 127, and each value travels as round(x / scale), an int8 in [-127, 127]. The error of
// a value is at most scale / 2, so a block's relative error is bounded by 1/254 of its largest
// magnitude; a block holding an inf or a NaN decodes to NaN throughout, so non-finite gradients
// stay visible to the overflow check.
//
// Every loop is one the compiler vectorizes at -O3 (checked with -fopt-info-vec): the scale
// from an integer max over the values' bit patterns, the encode and the decode branch-free.
//
// A packed piece of n values is the blocks' scales (4 bytes each) followed by the n int8 values,
// padded to a multiple of 4 bytes, so pieces can be laid end to end in one message and each
// piece's scales stay 4-byte aligned.
#include <cstdint>

namespace zero::core {

constexpr std::int64_t kQuantBlock = 256;

// Bytes of one packed piece of n values.
std::int64_t quantized_bytes(std::int64_t n, std::int64_t block = kQuantBlock);

// packed (quantized_bytes(n, block) bytes) <- values[0, n). Throws std::invalid_argument on
// n < 0, block < 1 or a null pointer with n > 0.
void quantize_int8(const float* values, std::int64_t n, std::uint8_t* packed,
                   std::int64_t block = kQuantBlock);

// out[0, n) <- the values packed holds.
void dequantize_int8(const std::uint8_t* packed, std::int64_t n, float* out,
                     std::int64_t block = kQuantBlock);

// sum[0, n) += the values packed holds (a reduction in fp32 over quantized contributions).
void dequantize_add_int8(const std::uint8_t* packed, std::int64_t n, float* sum,
                         std::int64_t block = kQuantBlock);

}  // namespace zero::core
