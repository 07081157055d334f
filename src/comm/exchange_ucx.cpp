// The UCX payload exchange (see exchange.h). One UCP context (UCP_FEATURE_TAG)
// and one worker per rank; worker addresses are gathered over MPI once, and
// the endpoint to a peer is created the first time that peer is in a group,
// with peer-failure error handling: the error callback marks the peer failed,
// and a later round with it fails at once, naming it.
//
// A message's 64-bit UCP tag is (round tag << 24) | source rank. A receiver
// probes for any message of its round (the mask keeps the round bits), takes
// the source from the sender tag and the size from the message, and receives
// it with ucp_tag_msg_recv_nbx: variable sizes without a header, and no
// message of another round or peer can match.
//
// Payloads are host memory (Debian's UCX is built without CUDA).
#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <thread>

#include "comm/exchange.h"

namespace xx {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSourceBits = 64 - kExchangeTagBits;  // 24: up to 16 M ranks
constexpr ucp_tag_t kSourceMask = (ucp_tag_t(1) << kSourceBits) - 1;
constexpr ucp_tag_t kRoundMask = ~kSourceMask;
constexpr double kCloseTimeout = 5.0;  // seconds the destructor waits for endpoints to flush

ucp_tag_t make_tag(uint64_t round, int source) { return (ucp_tag_t(round) << kSourceBits) | ucp_tag_t(source); }

using detail::rank_list;

void on_send(void*, ucs_status_t, void*) {}
void on_recv(void*, ucs_status_t, const ucp_tag_recv_info_t*, void*) {}

// A request from a *_nbx call: nullptr when it completed at once.
struct Op {
  void* request = nullptr;
  bool pending = false;
  ucs_status_t status = UCS_OK;
  // Records the return value of a *_nbx call.
  void start(ucs_status_ptr_t r) {
    if (r == nullptr) {
      status = UCS_OK;
    } else if (UCS_PTR_IS_ERR(r)) {
      status = UCS_PTR_STATUS(r);
    } else {
      request = r;
      pending = true;
    }
  }
  // True once complete (status says how).
  bool test() {
    if (!pending) return true;
    const ucs_status_t s = ucp_request_check_status(request);
    if (s == UCS_INPROGRESS) return false;
    status = s;
    ucp_request_free(request);
    request = nullptr;
    pending = false;
    return true;
  }
};

// What one round keeps alive while its requests may still be in flight.
struct RoundBuffers {
  std::vector<std::byte> send_data;  // the staged copy of the send buffer
  std::vector<std::vector<std::byte>> inbox;
};

class UcxExchange final : public PayloadExchange {
 public:
  explicit UcxExchange(MPI_Comm comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    std::string mine;  // this rank's worker address, or why UCX failed here
    const bool ok = start(mine);
    // Collective even when UCX failed locally, so that every rank agrees on enabled().
    const int header[2] = {ok ? 1 : 0, int(mine.size())};
    std::vector<int> headers(2 * size_);
    MPI_Allgather(header, 2, MPI_INT, headers.data(), 2, MPI_INT, comm);
    std::vector<int> counts(size_), displs(size_);
    int total = 0;
    for (int r = 0; r < size_; ++r) counts[r] = headers[2 * r + 1], displs[r] = total, total += counts[r];
    std::vector<char> all(std::max(total, 1));
    MPI_Allgatherv(mine.data(), int(mine.size()), MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, comm);
    int failed = 0;
    for (int r = 0; r < size_; ++r) {
      if (headers[2 * r]) continue;
      if (failed++ == 0)
        reason_ = fmt::format("UCX did not start on rank {}: {}", r, std::string(&all[displs[r]], counts[r]));
    }
    if (failed > 1) reason_ += fmt::format(" (and on {} other ranks)", failed - 1);
    if (failed) {
      stop();
      return;
    }
    addresses_.resize(size_);
    for (int r = 0; r < size_; ++r) addresses_[r].assign(&all[displs[r]], &all[displs[r]] + counts[r]);
    peers_.resize(size_);
    for (int r = 0; r < size_; ++r) peers_[r].rank = r;
    // Connect to the next rank now: a UCX_TLS without a transport that handles peer failure then disables the
    // exchange on every rank, with the reason, instead of failing its first round.
    const int next = (rank_ + 1) % size_;
    const std::string local = size_ > 1 && !endpoint(next) ? connect_error(next) : std::string();
    int first = local.empty() ? size_ : rank_;
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first < size_) {
      int length = int(local.size());
      MPI_Bcast(&length, 1, MPI_INT, first, comm);
      reason_.resize(length);
      if (rank_ == first) reason_ = local;
      MPI_Bcast(reason_.data(), length, MPI_CHAR, first, comm);
      reason_ = fmt::format("rank {}: {}", first, reason_);
      for (auto& p : peers_) p.ep = nullptr;  // destroyed with the worker
      stop();
    }
  }

  ~UcxExchange() override {
    if (!worker_) {
      stop();
      return;
    }
    // Flush-close the healthy endpoints, so that what this rank sent is delivered; force-close those of failed
    // peers and of peers with sends still in flight (a silent peer would keep a flush waiting forever).
    reap_orphans();
    std::vector<Op> closing;
    for (auto& p : peers_) {
      if (!p.ep) continue;
      const bool stuck =
          std::any_of(orphans_.begin(), orphans_.end(), [&](const Orphan& o) { return o.peer == p.rank; });
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = p.failed || stuck ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      Op op;
      op.start(ucp_ep_close_nbx(p.ep, &param));
      p.ep = nullptr;
      closing.push_back(op);
    }
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kCloseTimeout));
    // Messages of abandoned rounds that nobody will receive are taken and dropped, so that UCX has nothing
    // unmatched to warn about; they are not waited for.
    std::vector<Op> drains;
    std::vector<std::vector<std::byte>> junk;
    for (;;) {
      ucp_worker_progress(worker_);
      ucp_tag_recv_info_t info;
      while (ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, 0, 0, 1, &info)) {
        junk.emplace_back(std::max<size_t>(info.length, 1));
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
        param.cb.recv = on_recv;
        drains.emplace_back().start(ucp_tag_msg_recv_nbx(worker_, junk.back().data(), info.length, msg, &param));
      }
      bool done = true;
      for (auto& op : closing) done = op.test() && done;
      for (auto& op : drains) op.test();
      reap_orphans();
      if ((done && orphans_.empty()) || Clock::now() > deadline) break;
      std::this_thread::yield();
    }
    // Past the deadline: hand what is left back to UCX; destroying the worker purges it.
    for (auto& op : closing)
      if (op.pending) ucp_request_free(op.request);
    for (auto& op : drains)
      if (op.pending) ucp_request_free(op.request);
    for (auto& o : orphans_) ucp_request_free(o.op.request);
    stop();
    orphans_.clear();  // the worker is gone, nothing reads these buffers any more
  }

  const char* name() const override { return "ucx"; }
  bool enabled() const override { return worker_ != nullptr; }
  std::string disabled_reason() const override { return reason_; }
  int64_t bytes_sent() const override { return bytes_sent_; }

  std::vector<std::vector<std::byte>> personalized(const std::vector<int>& group, const std::vector<std::byte>& send,
                                                   const std::vector<Slice>& to, uint64_t tag,
                                                   double timeout_s) override {
    if (!worker_) throw std::runtime_error("ucx exchange is disabled: " + reason_);
    const int me = detail::check_group("ucx", group, rank_, size_, tag);
    detail::check_slices("ucx", to, group.size(), send.size(), std::numeric_limits<int64_t>::max());
    bytes_sent_ = 0;
    reap_orphans();
    const int n = int(group.size());
    auto own = [&] {
      return std::vector<std::byte>(send.begin() + to[me].offset, send.begin() + to[me].offset + to[me].size);
    };
    if (n == 1) return {own()};
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));

    {
      std::vector<int> dead;
      for (int r : group)
        if (peers_[r].failed) dead.push_back(r);
      if (!dead.empty()) {
        std::string why;
        for (int r : dead)
          why += fmt::format("{}rank {} ({})", why.empty() ? "" : ", ", r, ucs_status_string(peers_[r].status));
        throw std::runtime_error(
            fmt::format("ucx exchange on rank {} (round {}, group {{{}}}): peer failed earlier: {}", rank_, tag,
                        members(group), why));
      }
    }

    // Reuse the last round's staging capacity unless a failed round still holds it.
    auto round = spare_ && spare_.use_count() == 1 ? std::move(spare_) : std::make_shared<RoundBuffers>();
    round->send_data.assign(send.begin(), send.end());
    round->inbox.assign(n, {});
    static std::byte empty[1];  // a valid address for zero-length messages

    std::vector<Op> sends(n), recvs(n);
    std::vector<char> received(n, 0);  // probed and receive started
    for (int k = 1; k < n; ++k) {
      const int i = (me + k) % n;
      ucp_ep_h ep = endpoint(group[i]);
      if (!ep) fail(group, sends, recvs, round, tag, connect_error(group[i]));
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
      param.cb.send = on_send;
      const void* data = to[i].size > 0 ? static_cast<const void*>(round->send_data.data() + to[i].offset) : empty;
      sends[i].start(ucp_tag_send_nbx(ep, data, size_t(to[i].size), make_tag(tag, rank_), &param));
      bytes_sent_ += to[i].size;
      if (!sends[i].pending && sends[i].status != UCS_OK)
        fail(group, sends, recvs, round, tag,
             fmt::format("sending to rank {} failed: {}", group[i], ucs_status_string(sends[i].status)));
    }

    for (;;) {
      unsigned work = 0;
      while (unsigned w = ucp_worker_progress(worker_)) work += w;
      // Start the receive of every message of this round that has arrived.
      ucp_tag_recv_info_t info;
      while (ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, make_tag(tag, 0), kRoundMask, 1, &info)) {
        ++work;
        const int source = int(info.sender_tag & kSourceMask);
        const auto it = std::lower_bound(group.begin(), group.end(), source);
        const int member = it != group.end() && *it == source ? int(it - group.begin()) : -1;
        const bool unexpected = member < 0 || member == me || received[member];
        int i = member;
        // A probed message must be received; one that does not belong here goes to a spare slot and fails the round.
        if (unexpected) {
          i = n;
          round->inbox.resize(n + 1);
          recvs.resize(n + 1);
        }
        round->inbox[i].resize(info.length);
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
        param.cb.recv = on_recv;
        recvs[i].start(ucp_tag_msg_recv_nbx(worker_, info.length ? static_cast<void*>(round->inbox[i].data()) : empty,
                                            info.length, msg, &param));
        if (unexpected)
          fail(group, sends, recvs, round, tag,
               fmt::format("rank {} sent a message of this round but {}", source,
                           member < 0 || member == me ? "is not a peer in this rank's group" : "already sent one"));
        received[i] = 1;
      }
      bool done = true;
      std::vector<int> errors;
      std::string why;
      for (int i = 0; i < n; ++i) {
        if (i == me) continue;
        for (Op* op : {&sends[i], &recvs[i]}) {
          if (!op->test()) {
            done = false;
          } else if (op->status != UCS_OK) {
            errors.push_back(group[i]);
            why = ucs_status_string(op->status);
          }
        }
        if (!received[i]) done = false;
        if (peers_[group[i]].failed && !(received[i] && !recvs[i].pending && !sends[i].pending)) {
          errors.push_back(group[i]);
          why = ucs_status_string(peers_[group[i]].status);
        }
      }
      if (!errors.empty()) {
        std::sort(errors.begin(), errors.end());
        errors.erase(std::unique(errors.begin(), errors.end()), errors.end());
        fail(group, sends, recvs, round, tag, fmt::format("{} failed: {}", rank_list(errors), why));
      }
      if (done) break;
      if (Clock::now() > deadline) {
        std::vector<int> silent, stuck;
        for (int i = 0; i < n; ++i) {
          if (i == me) continue;
          if (!received[i] || recvs[i].pending)
            silent.push_back(group[i]);
          else if (sends[i].pending)
            stuck.push_back(group[i]);
        }
        fail(group, sends, recvs, round, tag, detail::timeout_reason(silent, stuck, timeout_s));
      }
      if (!work) std::this_thread::yield();
    }
    round->inbox[me] = own();
    auto result = std::move(round->inbox);
    round->inbox.clear();
    spare_ = std::move(round);
    return result;
  }

 private:
  struct Peer {
    int rank = 0;
    ucp_ep_h ep = nullptr;
    bool failed = false;
    ucs_status_t status = UCS_OK;
  };
  struct Orphan {
    Op op;
    int peer;
    std::shared_ptr<RoundBuffers> keep;
  };

  static void on_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->failed = true;
    peer->status = status;
  }

  // Creates the UCP context and worker; on failure says why in `out`, else puts the worker address there.
  bool start(std::string& out) {
    if (size_ > (1 << kSourceBits)) {
      out = fmt::format("{} ranks do not fit the {} source bits of a tag", size_, kSourceBits);
      return false;
    }
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) {
      out = fmt::format("ucp_config_read: {}", ucs_status_string(s));
      return false;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_TAG_SENDER_MASK | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG;
    params.tag_sender_mask = kSourceMask;
    params.estimated_num_eps = size_t(size_);
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) {
      context_ = nullptr;
      out = fmt::format("ucp_init: {}", ucs_status_string(s));
      return false;
    }
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(context_, &wparams, &worker_);
    if (s != UCS_OK) {
      worker_ = nullptr;
      out = fmt::format("ucp_worker_create: {}", ucs_status_string(s));
      return false;
    }
    ucp_address_t* address = nullptr;
    size_t length = 0;
    s = ucp_worker_get_address(worker_, &address, &length);
    if (s != UCS_OK) {
      out = fmt::format("ucp_worker_get_address: {}", ucs_status_string(s));
      return false;
    }
    out.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
    return true;
  }

  void stop() {
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
  }

  // The endpoint to `rank`, created on first use; nullptr (with the status in the peer) if that fails.
  ucp_ep_h endpoint(int rank) {
    Peer& p = peers_[rank];
    if (p.ep || p.failed) return p.ep;
    ucp_ep_params_t params{};
    params.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(addresses_[rank].data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_error;
    params.err_handler.arg = &p;
    const ucs_status_t s = ucp_ep_create(worker_, &params, &p.ep);
    if (s != UCS_OK) {
      p.ep = nullptr;
      p.failed = true;
      p.status = s;
    }
    return p.ep;
  }

  std::string connect_error(int rank) const {
    const ucs_status_t s = peers_[rank].status;
    std::string text = fmt::format("cannot connect to rank {}: {}", rank, ucs_status_string(s));
    if (s == UCS_ERR_UNREACHABLE) {
      const char* tls = std::getenv("UCX_TLS");
      text += fmt::format(
          " (UCX_TLS={}: peer-failure handling needs tcp, rc, dc or ud; UCX 1.13's shared-memory "
          "transports do not support it)",
          tls ? tls : "unset");
    }
    return text;
  }

  static std::string members(const std::vector<int>& group) {
    std::string s;
    for (size_t i = 0; i < group.size(); ++i) s += fmt::format("{}{}", i ? "," : "", group[i]);
    return s;
  }

  // Abandons the round: pending receives are cancelled, and what is still in flight keeps its buffers.
  [[noreturn]] void fail(const std::vector<int>& group, std::vector<Op>& sends, std::vector<Op>& recvs,
                         const std::shared_ptr<RoundBuffers>& round, uint64_t tag, const std::string& what) {
    for (auto& op : recvs)
      if (op.pending) ucp_request_cancel(worker_, op.request);
    auto peer_of = [&](size_t i) { return i < group.size() ? group[i] : -1; };
    for (size_t i = 0; i < recvs.size(); ++i)
      if (!recvs[i].test()) orphans_.push_back({recvs[i], peer_of(i), round});
    for (size_t i = 0; i < sends.size(); ++i)
      if (!sends[i].test()) orphans_.push_back({sends[i], peer_of(i), round});
    // The endpoint of a failed peer is unusable: close it now.
    for (auto& p : peers_) {
      if (!p.failed || !p.ep) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      Op op;
      op.start(ucp_ep_close_nbx(p.ep, &param));
      p.ep = nullptr;
      if (op.pending) orphans_.push_back({op, p.rank, nullptr});
    }
    throw std::runtime_error(
        fmt::format("ucx exchange on rank {} (round {}, group {{{}}}): {}", rank_, tag, members(group), what));
  }

  void reap_orphans() {
    if (worker_) ucp_worker_progress(worker_);
    std::erase_if(orphans_, [](Orphan& o) { return o.op.test(); });
  }

  int rank_ = 0, size_ = 1;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string reason_;
  std::vector<std::string> addresses_;
  std::vector<Peer> peers_;  // by rank; never resized after construction (the error callback holds pointers)
  std::vector<Orphan> orphans_;
  std::shared_ptr<RoundBuffers> spare_;
  int64_t bytes_sent_ = 0;
};

}  // namespace

std::unique_ptr<PayloadExchange> make_ucx_exchange(MPI_Comm comm) { return std::make_unique<UcxExchange>(comm); }

}  // namespace xx
