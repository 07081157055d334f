// Sizes printed in the unit that fits, chosen per value, so a 3.3M-parameter
// model and a 16 TB plan read alike: counts in powers of 1000 (K, M, B, T),
// bytes in powers of 1024 (KiB, MiB, GiB, TiB).
#pragma once
#include <string>

namespace xx {

std::string format_count(double n);      // 950 -> "950", 3295488 -> "3.30 M", 15.7e9 -> "15.71 B"
std::string format_bytes(double bytes);  // 512 -> "512 B", 1536 -> "1.50 KiB", 2^33 -> "8.00 GiB"

}  // namespace xx
