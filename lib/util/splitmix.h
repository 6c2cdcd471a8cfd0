// SplitMix64 (Steele, Lea and Flood): a 64-bit state stepped by a fixed odd constant and mixed into
// each output. Portable and cheap, so other tools can reproduce what it drives.
#pragma once

#include <cstdint>

namespace fsdp {

inline constexpr uint64_t kSplitMixStep = 0x9E3779B97F4A7C15ULL;

// One output of SplitMix64 from its state after a step: the state, mixed.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace fsdp
