// Every mode a deck can name, as an enum with its words. The deck (src/deck/)
// turns each word into one of these once, at start-up; everything after it
// compares enums, never strings. A mode's words are one table, in the enum's
// order: mode_name(e) is the word of e, mode_from_name<E>(word) the enum (or
// nothing), and fmt prints a mode as its word.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>
#include <fmt/format.h>

namespace xx {

using namespace std::string_view_literals;

// ---------------------------------------------------------------------------
// model, attention, moe

enum class ModelKind { dense, deepseek };
constexpr auto mode_words(ModelKind) { return std::array{"dense"sv, "deepseek"sv}; }

enum class AttentionKind { mha, mla };
constexpr auto mode_words(AttentionKind) { return std::array{"mha"sv, "mla"sv}; }

// rope_scaling: off, the plain rotary embedding; yarn, DeepSeek-V2's YaRN (model/attention.h rope_frequencies)
enum class RopeScalingKind { off, yarn };
constexpr auto mode_words(RopeScalingKind) { return std::array{"off"sv, "yarn"sv}; }

// attention_kernel: automatic picks packed on the host, flash on a device (model/attention.h)
enum class AttentionKernel { automatic, packed, flash };
constexpr auto mode_words(AttentionKernel) { return std::array{"auto"sv, "packed"sv, "flash"sv}; }

// recompute: what the backward recomputes instead of keeping (model/transformer.h): off keeps every
// activation; selective recomputes the RMSNorm outputs, the MLA up-projections and the SwiGLU (or
// expert) activation, as DeepSeek-V3 did; full keeps only each block's input and reruns its forward.
enum class Recompute { off, selective, full };
constexpr auto mode_words(Recompute) { return std::array{"off"sv, "selective"sv, "full"sv}; }

enum class MoeMode { off, on };
constexpr auto mode_words(MoeMode) { return std::array{"off"sv, "on"sv}; }

enum class Gate { softmax, sigmoid };  // V2: softmax; V3: sigmoid, normalised over the chosen
constexpr auto mode_words(Gate) { return std::array{"softmax"sv, "sigmoid"sv}; }

enum class Balance { aux, bias };  // V2: auxiliary loss; V3: auxiliary-loss-free bias
constexpr auto mode_words(Balance) { return std::array{"aux"sv, "bias"sv}; }

// balance aux: the expert-level loss over the rank's whole batch (V2's
// seq_aux false) or per sequence, averaged over the sequences (seq_aux true)
enum class AuxScope { batch, sequence };
constexpr auto mode_words(AuxScope) { return std::array{"batch"sv, "sequence"sv}; }

// init: where the weights of a fresh run come from (random: the seed; hf: a
// Hugging Face directory, src/hf/import.h)
enum class InitKind { random, hf };
constexpr auto mode_words(InitKind) { return std::array{"random"sv, "hf"sv}; }

// ---------------------------------------------------------------------------
// data

enum class DataFormat { bytes, shard };
constexpr auto mode_words(DataFormat) { return std::array{"bytes"sv, "shard"sv}; }

enum class Shuffle { fixed, chaos, independent };  // data/sampler.h
constexpr auto mode_words(Shuffle) { return std::array{"fixed"sv, "chaos"sv, "independent"sv}; }

enum class Partition { shuffled, contiguous };
constexpr auto mode_words(Partition) { return std::array{"shuffled"sv, "contiguous"sv}; }

// ---------------------------------------------------------------------------
// schedule, precision, loss aggregation

enum class ScheduleKind { cosine, sgdr, step };
constexpr auto mode_words(ScheduleKind) { return std::array{"cosine"sv, "sgdr"sv, "step"sv}; }

enum class RestartFrom { last, best };
constexpr auto mode_words(RestartFrom) { return std::array{"last"sv, "best"sv}; }

enum class Precision { fp32, bf16, fp16 };  // kernels/precision.h
constexpr auto mode_words(Precision) { return std::array{"fp32"sv, "bf16"sv, "fp16"sv}; }

enum class Products { native, widened, tf32 };
constexpr auto mode_words(Products) { return std::array{"native"sv, "widened"sv, "tf32"sv}; }

enum class ClipOrder { unscaled, scaled };
constexpr auto mode_words(ClipOrder) { return std::array{"unscaled"sv, "scaled"sv}; }

// precision ... loss_scale: auto (dynamic under fp16, none under bf16), dynamic, or a fixed number
enum class LossScaleKind { automatic, dynamic, fixed };
constexpr auto mode_words(LossScaleKind) { return std::array{"auto"sv, "dynamic"sv, "fixed"sv}; }

enum class LossAggKind { off, mean, robust, softmax, uncertainty };
constexpr auto mode_words(LossAggKind) {
  return std::array{"off"sv, "mean"sv, "robust"sv, "softmax"sv, "uncertainty"sv};
}

// gemm: the GEMM backend (kernels/gemm.h), its registry's name; automatic: the first that runs here
enum class GemmChoice { automatic, onednn, cublas, blas };
constexpr auto mode_words(GemmChoice) { return std::array{"auto"sv, "onednn"sv, "cublas"sv, "blas"sv}; }

// ---------------------------------------------------------------------------
// gradient exchange

enum class SyncKind { dense, accumulate, local };
constexpr auto mode_words(SyncKind) { return std::array{"dense"sv, "accumulate"sv, "local"sv}; }

enum class Outer { average, sgd, nesterov };  // sync local: what a sync does with the averaged change
constexpr auto mode_words(Outer) { return std::array{"average"sv, "sgd"sv, "nesterov"sv}; }

enum class DenseTransport { automatic, nccl, mpi };
constexpr auto mode_words(DenseTransport) { return std::array{"auto"sv, "nccl"sv, "mpi"sv}; }

enum class TopologyKind { full, clusters, ring };
constexpr auto mode_words(TopologyKind) { return std::array{"full"sv, "clusters"sv, "ring"sv}; }

enum class CompressKind { off, topk };
constexpr auto mode_words(CompressKind) { return std::array{"off"sv, "topk"sv}; }

// How compressed values travel (kernels/compress.h); the value is the payload's header field.
enum class Quant : uint32_t { none = 0, int8 = 1, int4 = 2, bf16 = 3 };
constexpr auto mode_words(Quant) { return std::array{"none"sv, "int8"sv, "int4"sv, "bf16"sv}; }

enum class CompressTarget { gradient, update };
constexpr auto mode_words(CompressTarget) { return std::array{"gradient"sv, "update"sv}; }

enum class SparseTransport { automatic, ucx, mpi };
constexpr auto mode_words(SparseTransport) { return std::array{"auto"sv, "ucx"sv, "mpi"sv}; }

enum class Exchange { allgather, partitioned };  // comm/compressed_sync.h
constexpr auto mode_words(Exchange) { return std::array{"allgather"sv, "partitioned"sv}; }

// shard off | optimizer | gradients | params: ZeRO 0, 1, 2, 3 (core/placement.h)
enum class ShardLevel { off, optimizer, gradients, params };
constexpr auto mode_words(ShardLevel) { return std::array{"off"sv, "optimizer"sv, "gradients"sv, "params"sv}; }

// ---------------------------------------------------------------------------
// pipeline

// pipeline ... schedule: the order of the micro-batches' forward and backward
// passes on each stage (core/pipeline_schedule.h). gpipe: every forward, then
// every backward; 1f1b: P - s warm-up forwards on stage s, then one forward
// and one backward alternately; interleaved: V chunks a stage, Megatron's
// order; dualpipev: chunks s and 2P - 1 - s, DeepSeek's DualPipeV phases.
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, dualpipev };
constexpr auto mode_words(PipelineSchedule) { return std::array{"gpipe"sv, "1f1b"sv, "interleaved"sv, "dualpipev"sv}; }

// ---------------------------------------------------------------------------
// checkpoints, output, resilience

enum class CheckpointMode { full, diff };
constexpr auto mode_words(CheckpointMode) { return std::array{"full"sv, "diff"sv}; }

// A rank's difference from the base (kernels/ckpt_codec.h); the value is stored in files.
enum class Codec : uint32_t { lossless = 0, int8 = 1, topk = 2 };
constexpr auto mode_words(Codec) { return std::array{"lossless"sv, "int8"sv, "topk"sv}; }

// Who writes a checkpoint file (ckpt/checkpoint.h); the file is the same either way.
enum class CheckpointWriter { collective, rank0 };
constexpr auto mode_words(CheckpointWriter) { return std::array{"collective"sv, "rank0"sv}; }

enum class Progress { automatic, on, off };
constexpr auto mode_words(Progress) { return std::array{"auto"sv, "on"sv, "off"sv}; }

enum class NanPolicy { stop, skip };
constexpr auto mode_words(NanPolicy) { return std::array{"stop"sv, "skip"sv}; }

enum class FaultKind { off, kill, hang, nan, signal, throw_error, detach };
constexpr auto mode_words(FaultKind) {
  return std::array{"off"sv, "kill"sv, "hang"sv, "nan"sv, "signal"sv, "throw"sv, "detach"sv};
}

enum class MissingGradient { warn, error, off };  // grad_check missing
constexpr auto mode_words(MissingGradient) { return std::array{"warn"sv, "error"sv, "off"sv}; }

// ---------------------------------------------------------------------------
// words <-> modes

template <class E>
concept Mode = std::is_enum_v<E> && requires(E e) { mode_words(e); };

// "?" for a value outside the enum (one read from a damaged file).
template <Mode E>
constexpr std::string_view mode_name(E e) {
  const auto words = mode_words(E{});
  return size_t(e) < words.size() ? words[size_t(e)] : "?"sv;
}

template <Mode E>
constexpr std::optional<E> mode_from_name(std::string_view word) {
  const auto words = mode_words(E{});
  for (size_t i = 0; i < words.size(); ++i)
    if (words[i] == word) return E(i);
  return std::nullopt;
}

template <Mode E>
std::vector<std::string> mode_word_list() {
  std::vector<std::string> out;
  for (auto w : mode_words(E{})) out.emplace_back(w);
  return out;
}

}  // namespace xx

// fmt prints a mode as its word: fmt::format("sync {}", kind).
template <xx::Mode E>
struct fmt::formatter<E> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(E e, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(xx::mode_name(e), ctx);
  }
};
