#include "train/pass_pair.h"
#include <exception>
#include <thread>

namespace xx {

void PassPair::run(const std::function<void()>& first, const std::function<void()>& second) {
  {
    std::lock_guard lock(mutex_);
    turn_ = 0, running_ = true, done_[0] = done_[1] = false;
  }
  std::exception_ptr failed[2];
  std::thread other([&] {
    {
      std::unique_lock lock(mutex_);
      turn_changed_.wait(lock, [this] { return turn_ == 1; });
    }
    try {
      second();
    } catch (...) {
      failed[1] = std::current_exception();
    }
    finish(1);
  });
  try {
    first();
  } catch (...) {
    failed[0] = std::current_exception();
  }
  finish(0);
  other.join();
  {
    std::lock_guard lock(mutex_);
    running_ = false;
  }
  for (const auto& f : failed)
    if (f) std::rethrow_exception(f);
}

void PassPair::hand_over() {
  std::unique_lock lock(mutex_);
  const int me = turn_, other = 1 - me;
  if (!running_ || done_[other]) return;
  turn_ = other, ++hand_overs_;
  turn_changed_.notify_all();
  turn_changed_.wait(lock, [this, me] { return turn_ == me; });
}

// A pass that ends hands over for good (the second starts here if it never has).
void PassPair::finish(int pass) {
  std::lock_guard lock(mutex_);
  done_[pass] = true;
  if (!done_[1 - pass]) turn_ = 1 - pass;
  turn_changed_.notify_all();
}

}  // namespace xx
