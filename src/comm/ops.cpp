#include "comm/ops.h"
#include "comm/kernel_memory_mpi.h"
#include <algorithm>
#include <climits>
#include <type_traits>
#include <map>
#include <fmt/format.h>
#include "core/device_memory.h"
#include "core/error.h"
#include "core/views.h"
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_CUDA_AWARE_SUPPORT
#endif
#ifdef XX_HAVE_NCCL
#include "comm/nccl.h"
#endif

namespace xx {
namespace {

// Gradients live where Kokkos allocates them; NCCL wants device memory.
constexpr bool kDeviceBuffers = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;

// The CUDA stream the kernels run on, which queued sums wait for and which
// waits for them; null where the kernels are not CUDA's (then sums block).
void* kernel_stream() {
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) return static_cast<void*>(ExecSpace().cuda_stream());
#endif
  return nullptr;
}

int group_size(MPI_Comm group) {
  int size = 1;
  MPI_Comm_size(group, &size);
  return size;
}

// A float buffer summed over group by sum(part, count), in pieces of at most
// INT_MAX (MPI counts are int), with the traffic counted; nothing for a group of one.
template <class Sum>
void sum_in_int_counts(float* buffer, int64_t n, MPI_Comm group, CommStats& stats, Sum sum) {
  const int size = group_size(group);
  if (size == 1 || n == 0) return;
  const double t0 = MPI_Wtime();
  for (int64_t at = 0; at < n; at += INT_MAX) {
    sum(buffer + at, int(std::min<int64_t>(INT_MAX, n - at)));
    stats.rounds += 1;
  }
  stats.seconds += MPI_Wtime() - t0;
  stats.bytes_sent += n * int64_t(sizeof(float));
  stats.wire_bytes += allreduce_wire_bytes(n * int64_t(sizeof(float)), size);
}

class MpiAllreduce final : public DenseAllreduce {
 public:
  const char* name() const override { return "mpi"; }
  DenseTransport transport() const override { return DenseTransport::mpi; }
  bool enabled() const override { return true; }
  std::string disabled_reason() const override { return ""; }
  void execute(float* buffer, int64_t n, MPI_Comm group, CommStats& stats) override {
    // through the host where MPI cannot read kernel memory
    sum_in_int_counts(buffer, n, group, stats, [&](float* part, int count) { mpi_.allreduce_sum(part, count, group); });
  }

 private:
  KernelMemoryMpi mpi_;
};

// NCCL's sum on the GPU; under the device emulation, the same path with the
// sum run by MPI on the host buffers, as a device library reads kernel memory.
class NcclAllreduce final : public DenseAllreduce {
 public:
  NcclAllreduce(MPI_Comm world, const NcclFacts& facts)
      : world_(world), emulated_(facts.emulated), obstacles_(nccl_obstacles(facts)) {}
  const char* name() const override { return "nccl"; }
  DenseTransport transport() const override { return DenseTransport::nccl; }
  bool enabled() const override { return obstacles_.empty(); }
  std::string disabled_reason() const override { return obstacles_; }
  void execute(float* buffer, int64_t n, MPI_Comm group, CommStats& stats) override {
    if (emulated_) return emulated_sum(buffer, n, group, stats);
#ifdef XX_HAVE_NCCL
    NcclContext* ctx = context(group);
    if (!ctx || n == 0) return;
    const double t0 = MPI_Wtime();
    ctx->allreduce_sum(buffer, size_t(n));
    stats.seconds += MPI_Wtime() - t0;
    stats.rounds += 1;
    stats.bytes_sent += n * int64_t(sizeof(float));
    stats.wire_bytes += allreduce_wire_bytes(n * int64_t(sizeof(float)), group_size(group));
#else
    throw std::logic_error("nccl all-reduce called in a build without NCCL");
#endif
  }
  bool queues() const override { return enabled() && !emulated_ && kernel_stream() != nullptr; }
  void start(float* buffer, int64_t n, MPI_Comm group, CommStats& stats) override {
#ifdef XX_HAVE_NCCL
    if (emulated_) return execute(buffer, n, group, stats);
    NcclContext* ctx = context(group);
    if (!ctx || n == 0) return;
    const double t0 = MPI_Wtime();
    ctx->allreduce_sum_after(buffer, size_t(n), kernel_stream());
    if (std::find(queued_.begin(), queued_.end(), ctx) == queued_.end()) queued_.push_back(ctx);
    stats.seconds += MPI_Wtime() - t0;
    stats.rounds += 1;
    stats.bytes_sent += n * int64_t(sizeof(float));
    stats.wire_bytes += allreduce_wire_bytes(n * int64_t(sizeof(float)), group_size(group));
#else
    execute(buffer, n, group, stats);
#endif
  }
  void finish(CommStats& stats) override {
#ifdef XX_HAVE_NCCL
    const double t0 = MPI_Wtime();
    for (NcclContext* ctx : queued_) ctx->join(kernel_stream());
    queued_.clear();
    stats.seconds += MPI_Wtime() - t0;
#endif
  }

 private:
  static void emulated_sum(float* buffer, int64_t n, MPI_Comm group, CommStats& stats) {
    DeviceWork device;  // the "library" reads and writes kernel memory in place
    sum_in_int_counts(buffer, n, group, stats, [&](float* part, int count) {
      MPI_Allreduce(MPI_IN_PLACE, part, count, MPI_FLOAT, MPI_SUM, group);
    });
  }
  MPI_Comm world_;
  bool emulated_;
  std::string obstacles_;
#ifdef XX_HAVE_NCCL
  // One NCCL communicator per distinct group of world ranks, made on first
  // use (collective over the group, like the all-reduce itself); null for a
  // group of one.
  NcclContext* context(MPI_Comm group) {
    MPI_Group world_group, g;
    MPI_Comm_group(world_, &world_group);
    MPI_Comm_group(group, &g);
    int size = 0;
    MPI_Group_size(g, &size);
    std::vector<int> local(size), members(size);
    for (int i = 0; i < size; ++i) local[i] = i;
    MPI_Group_translate_ranks(g, size, local.data(), world_group, members.data());
    MPI_Group_free(&g);
    MPI_Group_free(&world_group);
    if (size == 1) return nullptr;
    auto& ctx = contexts_[members];
    if (!ctx) ctx = std::make_unique<NcclContext>(group);
    return ctx.get();
  }
  std::map<std::vector<int>, std::unique_ptr<NcclContext>> contexts_;
  std::vector<NcclContext*> queued_;  // the contexts with sums queued since the last finish
#endif
};

template <class Op>
Op* first_enabled(const std::vector<std::unique_ptr<Op>>& ops) {
  for (const auto& op : ops)
    if (op->enabled()) return op.get();
  return nullptr;
}

template <class Op>
std::string describe(const char* traffic, const std::vector<std::unique_ptr<Op>>& ops, const Op* chosen) {
  std::string line = fmt::format("  {:<18} {}", traffic, chosen ? chosen->name() : "none");
  for (const auto& op : ops) {
    if (op.get() == chosen) break;
    line += fmt::format(" ({}: {})", op->name(), op->disabled_reason());
  }
  return line;
}

}  // namespace

bool mpi_reaches_kernel_memory() {
  if (kernel_memory_on_host()) return true;
  if (device_emulated()) return false;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

NcclFacts gather_nccl_facts(MPI_Comm world) {
  NcclFacts f;
#ifdef XX_HAVE_NCCL
  f.built = true;
#endif
  f.buffers_on_device = kDeviceBuffers;
  f.emulated = device_emulated();
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int ranks = 1;
  MPI_Comm_size(node, &ranks);
  MPI_Comm_free(&node);
  const int gpus = visible_gpus();
  // The node with the most ranks per GPU speaks for all: (ranks - gpus, its world rank), the largest.
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  struct { int excess, rank; } mine{ranks - gpus, rank}, worst{};
  MPI_Allreduce(&mine, &worst, 1, MPI_2INT, MPI_MAXLOC, world);
  int counts[2] = {ranks, gpus};
  MPI_Bcast(counts, 2, MPI_INT, worst.rank, world);
  f.ranks_on_node = counts[0], f.gpus_on_node = counts[1];
  return f;
}

std::string nccl_obstacles(const NcclFacts& f) {
  std::vector<std::string> why;
  if (!f.emulated && !f.built) why.push_back("not built (no CUDA toolkit with NCCL at configure time)");
  if (!f.emulated && !f.buffers_on_device)
    why.push_back(fmt::format("gradients live in host memory (Kokkos {})", ExecSpace::name()));
  if ((f.emulated || f.buffers_on_device) && f.ranks_on_node > f.gpus_on_node)
    why.push_back(fmt::format("{} ranks on a node share {} visible GPU{} (NCCL takes one GPU per rank)",
                              f.ranks_on_node, f.gpus_on_node, f.gpus_on_node == 1 ? "" : "s"));
  std::string joined;
  for (const auto& w : why) joined += (joined.empty() ? "" : "; ") + w;
  return joined;
}

Communicator::Communicator(MPI_Comm world, DenseTransport dense_transport, std::optional<SparseTransport> sparse) {
  if (dense_transport != DenseTransport::mpi) dense_ops_.push_back(std::make_unique<NcclAllreduce>(world, gather_nccl_facts(world)));
  if (dense_transport != DenseTransport::nccl) dense_ops_.push_back(std::make_unique<MpiAllreduce>());
  dense_ = first_enabled(dense_ops_);
  if (!dense_)
    input_error("deck: sync transport nccl: NCCL cannot carry the dense sums here: {} (expected transport auto or "
                "mpi)", dense_ops_.front()->disabled_reason());
  if (!sparse) return;
  const SparseTransport sparse_transport = *sparse;
  // Both exchanges are collective to create; every rank builds the same list.
  if (sparse_transport != SparseTransport::mpi) sparse_ops_.push_back(make_ucx_exchange(world));
  if (sparse_transport != SparseTransport::ucx) sparse_ops_.push_back(make_mpi_exchange(world));
  sparse_ = first_enabled(sparse_ops_);
  if (!sparse_)
    input_error("deck: compress transport ucx: UCX cannot serve the sparse exchange here: {} (expected "
                "transport auto or mpi, or UCX_TLS naming tcp, rc, dc or ud)",
                sparse_ops_.front()->disabled_reason());
}

Communicator::~Communicator() = default;

PayloadExchange& Communicator::sparse() {
  if (!sparse_) throw std::logic_error("Communicator::sparse(): no sparse transport (no compress in the deck)");
  return *sparse_;
}

std::string Communicator::report() const {
  std::string out = describe("dense all-reduce", dense_ops_, static_cast<const DenseAllreduce*>(dense_));
  if (dense_ops_.size() == 1) out += " (the deck's sync ... transport)";
  if (dense_->transport() == DenseTransport::nccl && device_emulated())
    out += "; emulated: MPI sums the kernel buffers in place, as NCCL would on the GPU";
  if (dense_ && dense_->transport() == DenseTransport::mpi && !mpi_reaches_kernel_memory())
    out += "; each bucket staged through host memory (this MPI cannot read kernel memory)";
  // appended in two steps: "\n" + a temporary trips GCC 12's false -Wrestrict (its bug 105329)
  if (sparse_)
    out.append("\n").append(describe("sparse exchange", sparse_ops_, static_cast<const PayloadExchange*>(sparse_)));
  return out;
}

}  // namespace xx
