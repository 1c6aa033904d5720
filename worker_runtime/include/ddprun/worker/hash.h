// Checksums and a counter-based RNG, written here so the formats never depend on a library.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddprun/worker/export.h"

namespace ddprun::worker {

// CRC-32C (Castagnoli, reflected, poly 0x82F63B78), the checksum of checkpoint files.
// crc32c(data, n, 0) of "123456789" is 0xE3069283.
DDPRUN_WORKER_API uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// 64-bit FNV-1a over bytes, used for printing parameter checksums.
DDPRUN_WORKER_API uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// SplitMix64 step: a stateless mix used for deterministic data and shuffles.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A tiny sequential RNG (state = one uint64, checkpointed as such).
struct Rng {
  uint64_t state = 0;
  uint64_t next_u64() { return splitmix64(state++); }
  // Uniform in [0, 1) with 24 random bits.
  float next_unit() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [0, n) (modulo bias negligible for n << 2^64).
  uint64_t below(uint64_t n) { return next_u64() % n; }
};

}  // namespace ddprun::worker
