// What the model-level unit tests share: the tiny architectures of the
// finite-difference checks (defined in tests/test_model.cpp) and token
// batches of a fixed arithmetic pattern.
#pragma once
#include <string>
#include "core/device_memory.h"
#include "deck/config.h"
#include "core/views.h"

// "dense", "mla", "mla-qlora", "mla-yarn", "moe-softmax-aux", "moe-sigmoid-bias", "deepseek-mtp"
xx::ModelConfig architecture(const std::string& name);

namespace xx::test {

// n tokens, token i = (mul * i + add) mod vocab.
inline Kokkos::View<int32_t*, MemSpace> pattern_tokens(int64_t n, int vocab, int mul, int add) {
  Kokkos::View<int32_t*, MemSpace> t("test::tokens", n);
  auto h = xx::host_staging(t);
  for (int64_t i = 0; i < n; ++i) h(i) = int32_t((i * mul + add) % vocab);
  Kokkos::deep_copy(t, h);
  return t;
}

// n tokens of a fixed quadratic pattern, another for each seed.
inline Kokkos::View<int32_t*, MemSpace> seeded_tokens(int64_t n, int vocab, uint64_t seed) {
  Kokkos::View<int32_t*, MemSpace> t("tokens", n);
  auto h = xx::host_staging(t);
  for (int64_t i = 0; i < n; ++i) h(i) = int32_t((i * 7 + seed * 3 + (i * i) % 5) % vocab);
  Kokkos::deep_copy(t, h);
  return t;
}

}  // namespace xx::test
