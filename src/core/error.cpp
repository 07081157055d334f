#include "core/error.h"
#include <algorithm>
#include <vector>

namespace xx {

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = int(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = int(i);
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_d = 1 << 30;
  for (const auto& c : candidates) {
    int d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  const int limit = std::max<int>(2, int(word.size()) / 3);
  return (!best.empty() && best_d <= limit) ? " (did you mean '" + best + "'?)" : "";
}

}  // namespace xx
