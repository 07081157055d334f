// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// checkpoint datasets and (issue 6/6) of TensorBoard records. Debian ships
// no C++ library for it; a byte-wise table is fast enough for what we hash.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace xx {

namespace detail {
constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
inline constexpr auto kCrc32cTable = crc32c_table();
}  // namespace detail

// CRC-32C of `size` bytes, continuing from `crc` (0 for a fresh checksum).
inline uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = detail::kCrc32cTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace xx
