// Errors a user can act on. InputError is bad input (deck, data, checkpoint):
// one line naming the file and the key or offset, exit code 2. Anything else
// that escapes is a failure of this rank (exit code 1, job aborted).
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>
#include <vector>

namespace xx {

constexpr int kExitBadInput = 2;

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

// Levenshtein distance, for did-you-mean hints.
int edit_distance(const std::string& a, const std::string& b);
// " (did you mean 'x'?)" when one candidate is close to `word`, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace xx
