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

namespace detail {
// a * b modulo the CRC polynomial, both in the reflected form (bit 31 is x^0).
constexpr uint32_t crc32c_multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t term = 1u << 31; term != 0; term >>= 1) {  // a's terms x^0, x^1, ...
    if (a & term) product ^= b;
    b = (b & 1) ? (b >> 1) ^ 0x82F63B78u : b >> 1;  // b *= x
  }
  return product;
}
}  // namespace detail

// The CRC-32C of A followed by B from crc32c(A), crc32c(B) and B's length
// alone: crc(AB) = crc(A) * x^(8 |B|) + crc(B) (the pre- and post-inversions
// cancel), the power by repeated squaring. What lets ranks that each hold
// pieces of a tensor agree on the whole tensor's checksum without its bytes.
inline uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  uint32_t power = 1u << 31, square = 1u << 23;  // x^0, x^8
  for (; size_b != 0; size_b >>= 1, square = detail::crc32c_multiply(square, square))
    if (size_b & 1) power = detail::crc32c_multiply(power, square);
  return detail::crc32c_multiply(crc_a, power) ^ crc_b;
}

}  // namespace xx
