// DualPipe's overlap on one core (deck: pipeline ... schedule dualpipev with
// moe ... ep N): a forward and a backward of the stage's two runs of layers
// (core/pipeline_schedule.h, PipeOp::paired) run as one pair. Each pass has
// a thread of its own, but only one runs at a time: a pass about to wait for
// its expert all-to-all hands over to the other (PairedExchange), which runs
// until it waits for its own or ends, and hands back. The tokens travel while
// the other pass computes.
// The hand-overs follow nothing but each pass's own order of exchanges, so
// every rank of an expert group interleaves its pair alike (their
// collectives match), and each pass's kernels run in their own order, over
// their own layers and scratch: the same bits as one pass after the other.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include "core/expert_exchange.h"

namespace xx {

class PassPair {
 public:
  // Runs `first`, which starts, and `second` to their ends, interleaved at
  // their hand-overs; rethrows the first pass's exception, then the second's.
  void run(const std::function<void()>& first, const std::function<void()>& second);
  // From a pass of run(): the other pass goes on until it hands back or
  // ends. Outside a pair, or once the other has ended: nothing.
  void hand_over();
  int64_t hand_overs() const { return hand_overs_; }  // since construction

 private:
  void finish(int pass);
  std::mutex mutex_;
  std::condition_variable turn_changed_;
  int turn_ = 0;  // the pass that runs: 0 (first) or 1
  bool running_ = false, done_[2] = {false, false};
  int64_t hand_overs_ = 0;
};

// An expert exchange whose waits first hand over to the paired pass.
class PairedExchange final : public ExpertExchange {
 public:
  PairedExchange(std::unique_ptr<ExpertExchange> inner, PassPair& pair) : inner_(std::move(inner)), pair_(pair) {}
  int ranks() const override { return inner_->ranks(); }
  int rank() const override { return inner_->rank(); }
  void start_counts(const int32_t* send, int32_t* recv, int n) override { inner_->start_counts(send, recv, n); }
  void start(const void* send, const std::vector<int64_t>& send_rows, void* recv, const std::vector<int64_t>& recv_rows,
             int64_t row_bytes) override {
    inner_->start(send, send_rows, recv, recv_rows, row_bytes);
  }
  void wait() override { pair_.hand_over(), inner_->wait(); }
  ExchangeStats& stats() override { return inner_->stats(); }
  std::string describe() const override { return inner_->describe() + ", a paired pass computing meanwhile"; }

 private:
  std::unique_ptr<ExpertExchange> inner_;
  PassPair& pair_;
};

}  // namespace xx
