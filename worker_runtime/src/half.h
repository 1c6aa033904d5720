// IEEE binary16 and bfloat16 <-> float, for the CPU backends' f16/bf16 reductions (which
// accumulate in float). Narrowing rounds to nearest, ties to even, as CUDA's __float2half_rn
// and __float2bfloat16_rn do; NaN stays NaN, overflow becomes infinity.
#pragma once

#include <cstdint>
#include <cstring>

namespace ddprun::worker {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);  // signed zero
  // Subnormal: mant * 2^-24, exact in float.
  const float v = static_cast<float>(mant) * bits_float(0x33800000u);  // 2^-24
  return sign ? -v : v;
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Below the smallest normal (2^-14): a subnormal or zero, in units of 2^-24. Adding 0.5
    // (as 2^-1 in those units) and truncating with the float adder's own round-to-even gives
    // the correctly rounded count of units.
    const float scaled = bits_float(a) * bits_float(0x4b800000u);  // * 2^24
    const float r = scaled + bits_float(0x4b000000u);              // + 2^23: integer rounding, ties to even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(float_bits(r) - 0x4b000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  const uint32_t rebased = a - (112u << 23);
  const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

}  // namespace ddprun::worker
