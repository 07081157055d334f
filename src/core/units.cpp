#include "core/units.h"
#include <cmath>
#include <fmt/format.h>

namespace xx {

// The largest unit in which the value is at least 1, judged after rounding to
// two decimals (1023.999 KiB prints as 1.00 MiB, not 1024.00 KiB).
static std::string scaled(double v, double base, const char* const* units, int n, const char* plain) {
  if (std::fabs(v) < base - 0.005) return fmt::format("{:.0f}{}", v, plain);
  int i = 0;
  double x = v / base;
  while (i + 1 < n && std::fabs(x) >= base - 0.005) x /= base, ++i;
  return fmt::format("{:.2f} {}", x, units[i]);
}

std::string format_count(double n) {
  static const char* const units[] = {"K", "M", "B", "T"};
  return scaled(n, 1000.0, units, 4, "");
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  return scaled(bytes, 1024.0, units, 4, " B");
}

}  // namespace xx
