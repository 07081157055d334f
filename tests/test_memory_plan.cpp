// Sizes print in the unit that fits (core/units.h).
#include <catch2/catch.hpp>
#include "core/units.h"

using namespace xx;

TEST_CASE("sizes print in the unit that fits each value", "[units]") {
  CHECK(format_count(0) == "0");
  CHECK(format_count(950) == "950");
  CHECK(format_count(3295488) == "3.30 M");
  CHECK(format_count(15.706e9) == "15.71 B");
  CHECK(format_count(2.5e12) == "2.50 T");
  CHECK(format_count(999999) == "1.00 M");  // rounds up into the next unit, not "1000.00 K"
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(3.5 * 1024 * 1024) == "3.50 MiB");
  CHECK(format_bytes(8.0 * 1024 * 1024 * 1024) == "8.00 GiB");
  CHECK(format_bytes(16.0 * 1024 * 1024 * 1024 * 1024) == "16.00 TiB");
  CHECK(format_bytes(20000.0 * 1024 * 1024 * 1024 * 1024) == "20000.00 TiB");  // TiB is the largest unit
  CHECK(format_bytes(1024.0 * 1024 - 1) == "1.00 MiB");
}
