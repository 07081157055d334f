// The host GEMM: oneDNN matmul. One primitive per shape (sizes, transposes,
// operand type, alpha, beta), created on first use and kept; the same shape
// always runs the same primitive, so a row's bits never depend on what ran
// before (a resumed run computes what the uninterrupted one did). Products
// whose token count varies (routed experts: a new count most steps) get one
// primitive for every count, with M and K given at run time: JIT code and
// memory stay bounded. oneDNN runs on one thread, as every rank's BLAS does
// (tools/env.sh).
#include "kernels/gemm.h"

#ifdef XX_HAVE_DNNL
#include <dlfcn.h>
#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <bit>
#include <optional>
#include <tuple>
#include <unordered_map>

namespace xx::kernels {
namespace {

using dnnl::memory;
using Dims = memory::dims;

memory::data_type dnnl_type(Precision p) {
  return p == Precision::bf16 ? memory::data_type::bf16
         : p == Precision::fp16 ? memory::data_type::f16
                                : memory::data_type::f32;
}

struct ShapeKey {
  int64_t m, n, k;
  bool ta, tb;
  Precision type;
  uint32_t alpha, beta;  // bit patterns
  bool operator==(const ShapeKey&) const = default;
};

struct ShapeHash {
  size_t operator()(const ShapeKey& s) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint64_t v : {uint64_t(s.m), uint64_t(s.n), uint64_t(s.k), uint64_t(s.ta) | uint64_t(s.tb) << 1 |
                                                                          uint64_t(s.type) << 2,
                       uint64_t(s.alpha) << 32 | s.beta})
      h = (h ^ v) * 0x100000001b3ull;
    return size_t(h);
  }
};

// A batched product: its shape and the batch's count and strides.
struct BatchKey {
  ShapeKey shape;
  int64_t count, sa, sb, sc;
  bool operator==(const BatchKey&) const = default;
};

struct BatchHash {
  size_t operator()(const BatchKey& k) const {
    uint64_t h = ShapeHash()(k.shape);
    for (uint64_t v : {uint64_t(k.count), uint64_t(k.sa), uint64_t(k.sb), uint64_t(k.sc)}) h = (h ^ v) * 0x100000001b3ull;
    return size_t(h);
  }
};

struct Primitive {
  dnnl::matmul matmul;
  memory::desc a, b, c;
};

// oneDNN's OpenMP runtime takes omp_get_max_threads() threads unless told
// otherwise; libgomp is loaded with libdnnl, so look the setter up there.
void pin_one_thread() {
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(1);
}

class OnednnGemm : public GemmBackend {
 public:
  OnednnGemm() {
    if (!std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
      reason_ = "the kernels run on a device (oneDNN here is the CPU library)";
      return;
    }
    try {
      pin_one_thread();
      engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
      stream_ = dnnl::stream(engine_);
      for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) impl_[int(p)] = probe(p);
      available_ = true;
    } catch (const dnnl::error& e) {
      reason_ = std::string("oneDNN could not start: ") + e.what();
    }
  }

  std::string name() const override { return "onednn"; }
  std::string describe() const override {
    return fmt::format("onednn: {} matmul, 1 thread, fp32 {}, bf16 {}, fp16 {}", library(), impl_[0], impl_[1],
                       impl_[2].empty() ? "none" : impl_[2]);
  }
  bool available() const override { return available_; }
  std::string unavailable_reason() const override { return reason_; }
  // Native: oneDNN dispatched a kernel built on the type's own instructions
  // (AVX512_BF16, AVX512_FP16, AMX); otherwise it would convert inside, or
  // run its reference loops, and our widening to fp32 is as good.
  bool native(Precision p) const override {
    if (p == Precision::fp32) return true;
    const std::string& impl = impl_[int(p)];
    if (impl.empty() || impl.rfind("ref", 0) == 0) return false;
    return impl.find(p == Precision::bf16 ? "bf16" : "fp16") != std::string::npos ||
           impl.find("amx") != std::string::npos;
  }

  std::string kernel(Precision p) const override { return library() + " " + impl_[int(p)]; }

  void run(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c) override {
    const bool varying = a.varying || b.varying;
    const int64_t m = a.op_rows(), n = b.op_cols(), k = a.op_cols();
    const ShapeKey key{varying ? -1 : m, n, varying ? -1 : k, a.transposed, b.transposed, a.type,
                       std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      // A bound on the cache (MoE experts see a new row count most steps);
      // a shape built again is the same primitive, so results do not change.
      if (cache_.size() >= kMaxShapes) cache_.clear();
      it = cache_.emplace(key, build(key)).first;
    }
    const Primitive& p = it->second;
    const ShapeKey actual{m, n, k, a.transposed, b.transposed, a.type, key.alpha, key.beta};
    const auto [da, db, dc] = varying ? descs(actual) : std::tuple{p.a, p.b, p.c};
    memory ma(da, engine_, const_cast<void*>(a.data)), mb(db, engine_, const_cast<void*>(b.data)), mc(dc, engine_, c);
    p.matmul.execute(stream_, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream_.wait();
  }

  // One 3-D matmul per batch shape, its batch dimension stepping by the
  // strides. Where oneDNN has only its reference loops for such strides, the
  // products run one by one on the 2-D primitives instead.
  void run_batched(const GemmOperand& a, const GemmOperand& b, float alpha, float beta, float* c,
                   const GemmBatch& batch) override {
    const BatchKey key{{a.op_rows(), b.op_cols(), a.op_cols(), a.transposed, b.transposed, a.type,
                        std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)},
                       batch.count, batch.a, batch.b, batch.c};
    auto it = batched_.find(key);
    if (it == batched_.end()) {
      if (batched_.size() >= kMaxShapes) batched_.clear();
      it = batched_.emplace(key, build_batched(key)).first;
    }
    if (!it->second) {
      GemmBackend::run_batched(a, b, alpha, beta, c, batch);
      return;
    }
    const Primitive& p = *it->second;
    memory ma(p.a, engine_, const_cast<void*>(a.data)), mb(p.b, engine_, const_cast<void*>(b.data)), mc(p.c, engine_, c);
    p.matmul.execute(stream_, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream_.wait();
  }

 private:
  static constexpr size_t kMaxShapes = 1024;

  static std::string library() {
    const auto v = dnnl::version();
    return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
  }

  // op(a) (M, K) and op(b) (K, N) read row-major storage: a transposed
  // operand is the same memory with its strides swapped. A size of -1 is
  // given at run time.
  static std::tuple<memory::desc, memory::desc, memory::desc> descs(const ShapeKey& s) {
    const auto t = dnnl_type(s.type);
    const memory::dim M = s.m < 0 ? DNNL_RUNTIME_DIM_VAL : s.m, K = s.k < 0 ? DNNL_RUNTIME_DIM_VAL : s.k, N = s.n;
    return {memory::desc({M, K}, t, s.ta ? Dims{1, M} : Dims{K, 1}),
            memory::desc({K, N}, t, s.tb ? Dims{1, K} : Dims{N, 1}),
            memory::desc({M, N}, memory::data_type::f32, Dims{N, 1})};
  }

  static dnnl::primitive_attr attributes(const ShapeKey& s) {
    dnnl::primitive_attr attr;
    const float alpha = std::bit_cast<float>(s.alpha), beta = std::bit_cast<float>(s.beta);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);  // c = alpha a b + beta c
      attr.set_post_ops(ops);
    }
    return attr;
  }

  Primitive build(const ShapeKey& s) const {
    const auto [a, b, c] = descs(s);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attributes(s), engine_);
    return {dnnl::matmul(pd), a, b, c};
  }

  // (count, M, K) . (count, K, N) -> (count, M, N), each product's matrices
  // laid out as descs() says, product n at n strides; none if only "ref" runs it.
  std::optional<Primitive> build_batched(const BatchKey& k) const {
    const ShapeKey& s = k.shape;
    const auto t = dnnl_type(s.type);
    const memory::dim B = k.count, M = s.m, K = s.k, N = s.n;
    memory::desc a({B, M, K}, t, s.ta ? Dims{k.sa, 1, M} : Dims{k.sa, K, 1});
    memory::desc b({B, K, N}, t, s.tb ? Dims{k.sb, 1, K} : Dims{k.sb, N, 1});
    memory::desc c({B, M, N}, memory::data_type::f32, Dims{k.sc, N, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attributes(s), engine_);
    if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return std::nullopt;
    return Primitive{dnnl::matmul(pd), a, b, c};
  }

  // The kernel oneDNN picks for a model-sized product of `p`, "" if none.
  std::string probe(Precision p) const {
    try {
      const auto t = dnnl_type(p);
      memory::desc a({256, 256}, t, Dims{256, 1}), b({256, 256}, t, Dims{256, 1}),
          c({256, 256}, memory::data_type::f32, Dims{256, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine_);
      return pd.impl_info_str();
    } catch (const dnnl::error&) {
      return "";
    }
  }

  bool available_ = false;
  std::string reason_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::string impl_[3];  // by Precision
  std::unordered_map<ShapeKey, Primitive, ShapeHash> cache_;
  std::unordered_map<BatchKey, std::optional<Primitive>, BatchHash> batched_;
};

}  // namespace

std::unique_ptr<GemmBackend> make_onednn_gemm() { return std::make_unique<OnednnGemm>(); }

}  // namespace xx::kernels

#else

namespace xx::kernels {
std::unique_ptr<GemmBackend> make_onednn_gemm() { return nullptr; }
}  // namespace xx::kernels

#endif
