// Counter-based random numbers: value i of stream s is a pure function of
// (seed, s, i), so results never depend on thread count, call order or rank.
#pragma once
#include <cmath>
#include <cstdint>

namespace xx {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Mixes several words into one seed (e.g. run seed, rank, purpose).
inline uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0) {
  return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}

// Uniform in (0, 1), never 0 (safe for log).
inline double uniform01(uint64_t seed, uint64_t i) {
  return (double(splitmix64(seed ^ splitmix64(i)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller on the pair (2i, 2i+1).
inline double normal(uint64_t seed, uint64_t i) {
  const double u1 = uniform01(seed, 2 * i), u2 = uniform01(seed, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace xx
