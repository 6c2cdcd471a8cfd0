// SplitMix64 (Steele, Lea and Flood): a 64-bit state stepped by a fixed odd constant and mixed into
// each output. Portable and cheap, so other tools can reproduce what it drives.
// Also the seed of a named random stream (a parameter's initial values, a LoRA adapter's).
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

inline constexpr uint64_t kSplitMixStep = 0x9E3779B97F4A7C15ULL;

// 64-bit FNV-1a of `name`, started from the seed mixed with `salt`: the same stream for a name at
// any world size, and another for each salt.
inline uint64_t named_stream(uint64_t seed, const std::string& name, uint64_t salt = 0) {
  uint64_t h = 1469598103934665603ULL ^ (seed * kSplitMixStep) ^ salt;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

// One output of SplitMix64 from its state after a step: the state, mixed.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace fsdp
