// The command registry. Each deck command is a table entry: an optional kind
// word (model dense, schedule cosine), positional values, and `key value`
// keywords, each bound to a field of a running Config. Adding a command, a
// kind or a keyword is one table row; build_program applies the lines in
// order and snapshots the Config at every `run N`.
#include <glob.h>
#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <variant>
#include <unistd.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "deck/deck.h"
#include <glob.h>

namespace xx {
namespace {

// did_you_mean, plus the two slips edit distance misses in keywords:
// reordered parts ('lr_min' for 'min_lr') and a longer or shorter word
// ('warning' for 'warn').
std::string suggest(const std::string& word, const std::vector<std::string>& candidates) {
  if (std::string hint = did_you_mean(word, candidates); !hint.empty()) return hint;
  auto parts = [](const std::string& s) {
    std::vector<std::string> out;
    for (size_t start = 0, end; start <= s.size(); start = end + 1) {
      end = std::min(s.find('_', start), s.size());
      out.push_back(s.substr(start, end - start));
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  for (const auto& c : candidates) {
    const bool reordered = c.find('_') != std::string::npos && parts(c) == parts(word);
    const auto& shorter = c.size() < word.size() ? c : word;
    const auto& longer = c.size() < word.size() ? word : c;
    const bool prefix = shorter.size() >= 3 && longer.compare(0, shorter.size(), shorter) == 0;
    if (reordered || prefix) return " (did you mean '" + c + "'?)";
  }
  return "";
}

// ----------------------------------------------------------------------------
// options: one value a command sets

// A mode field of the Config (core/modes.h), set from its word and read back as one.
struct ModeRef {
  std::function<void(const std::string&)> set;  // the word is one of the mode's words
  std::function<std::string()> get;
  ModeRef() = default;
  ModeRef(std::nullptr_t) {}
  ModeRef(std::function<void(const std::string&)> s, std::function<std::string()> g) : set(std::move(s)), get(std::move(g)) {}
  explicit operator bool() const { return bool(set); }
};

template <Mode E>
ModeRef mode_ref(E* p) {
  return {[p](const std::string& word) {
            const auto m = mode_from_name<E>(word);
            if (!m) throw std::logic_error("deck registry: '" + word + "' is not a word of its mode");
            *p = *m;
          },
          [p]() { return std::string(mode_name(*p)); }};
}

using Target = std::variant<int*, int64_t*, uint64_t*, double*, std::string*, bool*, ModeRef>;

struct Range {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
};
Range at_least(double lo) { return {lo, {}, false, false}; }
Range above(double lo) { return {lo, {}, true, false}; }
Range within(double lo, double hi, bool lo_open = false, bool hi_open = false) { return {lo, hi, lo_open, hi_open}; }

struct Option {
  std::string name;
  Target target;
  Range range;                       // numbers only
  std::vector<std::string> choices;  // words only; empty: any word
  std::string expected;              // "an integer", "a number", "one of: a, b", ...
};

Option integer(std::string name, std::variant<int*, int64_t*, uint64_t*> target, Range range = {}) {
  Option o{std::move(name), {}, range, {}, "an integer"};
  std::visit([&](auto* p) { o.target = p; }, target);
  return o;
}
Option real(std::string name, double* target, Range range = {}) { return {std::move(name), target, range, {}, "a number"}; }
Option path(std::string name, std::string* target) { return {std::move(name), target, {}, {}, "a path"}; }
Option yes_no(std::string name, bool* target) { return {std::move(name), target, {}, {"yes", "no"}, "yes or no"}; }
Option on_off(std::string name, bool* target) { return {std::move(name), target, {}, {"on", "off"}, "on or off"}; }
// A mode keyword: every word of E, or only `only` where a variant allows fewer.
template <Mode E>
Option choice(std::string name, E* target, std::vector<std::string> only = {}) {
  Option o{std::move(name), mode_ref(target), {}, only.empty() ? mode_word_list<E>() : std::move(only), ""};
  o.expected = "one of: " + fmt::format("{}", fmt::join(o.choices, ", "));
  return o;
}

std::string range_text(const Range& r) {
  if (r.lo && r.hi) return fmt::format("in {}{}, {}{}", r.lo_open ? '(' : '[', *r.lo, *r.hi, r.hi_open ? ')' : ']');
  if (r.lo) return fmt::format("{} {}", r.lo_open ? ">" : ">=", *r.lo);
  if (r.hi) return fmt::format("{} {}", r.hi_open ? "<" : "<=", *r.hi);
  return "";
}

bool in_range(const Range& r, double v) {
  if (r.lo && (r.lo_open ? v <= *r.lo : v < *r.lo)) return false;
  if (r.hi && (r.hi_open ? v >= *r.hi : v > *r.hi)) return false;
  return true;
}

// The whole word must parse: "12x" and, for integers, "1.5" are bad.
template <class T>
std::optional<T> parse_number(const std::string& word) {
  T value{};
  const char* end = word.data() + word.size();
  auto [ptr, ec] = std::from_chars(word.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(value)) return std::nullopt;
  return value;
}

void set_value(const Option& o, const std::string& word, const std::string& where) {
  auto bad = [&]() { input_error("{}: bad value '{}' for '{}' (expected {})", where, word, o.name, o.expected); };
  auto check_range = [&](double v, Range r) {
    if (!in_range(r, v)) input_error("{}: value {} for '{}' is out of range (expected {})", where, word, o.name, range_text(r));
  };
  std::visit(
      [&](auto p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, ModeRef> || std::is_same_v<T, std::string> || std::is_same_v<T, bool>) {
          if (!o.choices.empty() && std::find(o.choices.begin(), o.choices.end(), word) == o.choices.end())
            input_error("{}: bad value '{}' for '{}' (expected {}){}", where, word, o.name, o.expected,
                        suggest(word, o.choices));
          if constexpr (std::is_same_v<T, ModeRef>) p.set(word);
          else if constexpr (std::is_same_v<T, bool>) *p = word == o.choices.front();  // yes, on
          else *p = word;
        } else {
          auto v = parse_number<T>(word);
          if (!v) bad();
          check_range(double(*v), o.range);
          // An int field also has the int's own limits.
          if constexpr (std::is_same_v<T, int>) check_range(double(*v), within(INT_MIN, INT_MAX));
          *p = *v;
        }
      },
      o.target);
}

std::string value_text(const Option& o) {
  return std::visit(
      [&o](auto p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, ModeRef>) return p.get();
        else if constexpr (std::is_same_v<T, bool>) return *p ? o.choices.front() : o.choices.back();
        else if constexpr (std::is_same_v<T, std::string>) return p->empty() ? "(none)" : *p;
        else return fmt::format("{}", *p);
      },
      o.target);
}

// ----------------------------------------------------------------------------
// commands

// One kind of a command, e.g. 'model dense'. Commands without a kind word
// have one variant with an empty kind.
struct Variant {
  std::string kind;
  std::vector<Option> positional;  // values right after the kind word
  std::vector<Option> keywords;    // `key value` pairs, any order
  std::vector<std::string> required;
  std::function<void(const std::string& where)> check;  // cross-field checks
};

// When a command takes effect. A per-job command is one value for the whole
// deck (the model, the data, the precision, the seed, the watchdog, the
// fault, the output directory): changing it after the first `run` is an
// error. A per-phase command takes effect at the next `run`.
enum class Scope { job, phase };

struct Command {
  std::string name;
  ModeRef kind_target;                 // where the kind word goes, if anywhere
  std::string kind_label = "kind";     // its row name in describe
  std::vector<Variant> variants;
  std::string usage;
  Scope scope = Scope::phase;
  bool has_kind() const { return !variants.front().kind.empty(); }
};

// Checks across the model, attention, moe, mtp and rope_scaling lines, once all are known.
void check_model(const ModelConfig& m, const std::string& where) {
  if (m.rope_scaling.yarn() && !(m.rope_theta > 1))
    input_error("{}: rope_scaling yarn with 'rope_theta' {} (expected rope_theta > 1: YaRN places its ramp by "
                "log(rope_theta))", where, m.rope_theta);
  if (!m.attention.mla()) {
    if (m.dim % m.heads != 0)
      input_error("{}: 'dim' {} is not divisible by 'heads' {} (expected dim % heads == 0)", where, m.dim, m.heads);
    if (m.head_dim() % 2 != 0)
      input_error("{}: head_dim = dim / heads = {} is odd (expected an even head_dim, for rotary embeddings)", where,
                  m.head_dim());
  }
  if (m.moe.enabled() && m.moe.dense_layers > m.layers)
    input_error("{}: moe 'dense_layers' {} exceeds 'layers' {} (expected dense_layers <= layers)", where,
                m.moe.dense_layers, m.layers);
}

// moe ... groups G topk_groups g: the groups split the routed experts evenly,
// a token keeps 1 to G of them, and the kept groups hold its k experts.
// pipeline ...: what the line alone can say (the layers, the other commands
// and the world size are checked at the run line and at start-up).
void check_pipeline_line(PipelineConfig& p, const std::string& where) {
  // cut N0,N1,...: one positive block count per chunk (per stage without virtual stages), read here once
  p.cut.clear();
  if (!p.cut_text.empty()) {
    for (size_t at = 0; at <= p.cut_text.size();) {
      const size_t comma = std::min(p.cut_text.find(',', at), p.cut_text.size());
      const auto n = parse_number<int>(p.cut_text.substr(at, comma - at));
      if (!n || *n < 1)
        input_error("{}: bad value '{}' for 'cut' (expected each chunk's number of blocks (each stage's without "
                    "virtual stages), integers >= 1 separated by commas, e.g. cut 3,1)", where, p.cut_text);
      p.cut.push_back(*n);
      at = comma + 1;
    }
    if (int(p.cut.size()) != p.stages * p.virtual_stages)
      input_error("{}: pipeline cut {} names {} chunks, not 'stages' {} x 'virtual' {} (expected one block count per "
                  "chunk)", where, p.cut_text, p.cut.size(), p.stages, p.virtual_stages);
  }
  const PipelineSchedule s = p.schedule;
  const bool chunked = s == PipelineSchedule::interleaved || s == PipelineSchedule::dualpipev;
  if (!chunked && p.virtual_stages != 1)
    input_error("{}: pipeline 'virtual' {} with schedule {} (expected virtual 1: virtual stages belong to schedule "
                "interleaved or dualpipev)", where, p.virtual_stages, s);
  if (s == PipelineSchedule::dualpipev && (p.stages * p.virtual_stages) % 2 != 0)
    input_error("{}: pipeline schedule dualpipev with {} chunks (stages {} x virtual {}) (expected an even number "
                "of chunks: dualpipev runs each stage's chunks in two directions)", where,
                p.stages * p.virtual_stages, p.stages, p.virtual_stages);
  if (chunked && p.stages < 2)
    input_error("{}: pipeline schedule {} with stages {} (expected stages >= 2: its chunks go between stages; one "
                "stage takes schedule gpipe or 1f1b)", where, s, p.stages);
  if (s == PipelineSchedule::dualpipev && p.virtual_stages != 2)
    input_error("{}: pipeline schedule dualpipev with virtual {} (expected virtual 2: each stage runs one chunk down "
                "the V and one back up)", where, p.virtual_stages);
  if (s == PipelineSchedule::dualpipev && p.micro < 2 * p.stages)
    input_error("{}: pipeline 'micro' {} is fewer than 2 x 'stages' {} with schedule dualpipev (expected micro >= {}: "
                "DualPipeV fills both arms of the V)", where, p.micro, p.stages, 2 * p.stages);
  if (s == PipelineSchedule::interleaved && p.micro % p.stages != 0)
    input_error("{}: pipeline 'micro' {} is not a multiple of 'stages' {} with schedule interleaved (expected micro "
                "a multiple of stages: micro-batches go through the chunks in groups of stages)", where, p.micro,
                p.stages);
  if (s == PipelineSchedule::one_f_one_b && p.micro < p.stages)
    input_error("{}: pipeline 'micro' {} is fewer than 'stages' {} with schedule 1f1b (expected micro >= stages: "
                "1f1b keeps every stage busy only with at least one micro-batch per stage in flight; schedule "
                "gpipe takes fewer)", where, p.micro, p.stages);
}

void check_expert_groups(const MoeConfig& moe, const std::string& where) {
  const int G = moe.groups, g = moe.kept_groups(), per_group = moe.routed / moe.groups;
  if (G > kMaxExpertGroups)
    input_error("{}: 'groups' {} exceeds {} (expected groups <= {}: the router keeps a token's chosen groups as "
                "one 64-bit mask)", where, G, kMaxExpertGroups, kMaxExpertGroups);
  if (moe.routed % G != 0)
    input_error("{}: 'routed' {} is not divisible by 'groups' {} (expected routed % groups == 0: each group holds "
                "routed / groups experts)", where, moe.routed, G);
  if (g > G)
    input_error("{}: 'topk_groups' {} exceeds 'groups' {} (expected 1 <= topk_groups <= groups)", where, g, G);
  if (G > 1 && moe.gate == Gate::sigmoid && per_group < 2)
    input_error("{}: 'groups' {} leaves {} expert per group under gate sigmoid (expected at least 2 per group: the "
                "sigmoid gate scores a group by the sum of its two largest scores, as DeepSeek-V3)", where, G,
                per_group);
  if (moe.topk > g * per_group)
    input_error("{}: 'topk' {} exceeds the {} experts of topk_groups {} groups of {} (expected topk <= topk_groups x "
                "routed / groups)", where, moe.topk, g * per_group, g, per_group);
}

// precision ... loss_scale auto|dynamic|S, as written, into its kind and value.
void resolve_loss_scale(PrecisionConfig& p, const std::string& where) {
  if (const auto kind = mode_from_name<LossScaleKind>(p.loss_scale); kind && *kind != LossScaleKind::fixed) {
    p.loss_scale_kind = *kind, p.loss_scale_value = 1;
    return;
  }
  const auto v = parse_number<double>(p.loss_scale);
  if (!v || !(*v > 0))
    input_error("{}: bad value '{}' for 'loss_scale' (expected dynamic or a number > 0){}", where, p.loss_scale,
                suggest(p.loss_scale, {"dynamic"}));
  p.loss_scale_kind = LossScaleKind::fixed, p.loss_scale_value = *v;
}

// The registry, bound to `c`; `steps` receives `run N`.
std::vector<Command> registry(Config& c, int64_t& steps) {
  const Option dense_transport = choice("transport", &c.sync.transport);  // every sync kind
  auto data_variant = [&](std::string kind) {
    return Variant{std::move(kind),
                   {path("path", &c.data.path)},
                   {Option{"valid", &c.data.valid, {}, {}, "a fraction in (0, 0.5] or a validation shard"},
                    path("tokenizer", &c.data.tokenizer),
                    integer("batch", &c.data.batch, at_least(1)), integer("workers", &c.data.workers, within(0, 64)),
                    integer("queue", &c.data.queue, at_least(1)),
                    choice("shuffle", &c.data.shuffle),
                    integer("chaos_seed", &c.data.chaos_seed, at_least(0)),
                    real("common", &c.data.common, within(0, 1, false, true)),
                    real("common_rate", &c.data.common_rate, within(0, 1, true, true)),
                    choice("partition", &c.data.partition),
                    integer("noise_rank", &c.data.noise_rank, at_least(-1))},
                   {},
                   [&c](const std::string& where) {
                     // valid: a number is a fraction of the windows, anything else a file.
                     const std::string& v = c.data.valid;
                     if (const auto f = parse_number<double>(v)) {
                       if (!in_range(within(0, 0.5, true, false), *f))
                         input_error("{}: value {} for 'valid' is out of range (expected a fraction in (0, 0.5], or a "
                                     "validation shard)", where, v);
                       c.data.valid_fraction = *f, c.data.valid_path.clear();
                     } else {
                       c.data.valid_fraction = 0, c.data.valid_path = v;
                     }
                     if (c.data.shuffle == Shuffle::fixed && c.data.chaos_seed != 0)
                       input_error("{}: 'chaos_seed' {} with shuffle fixed (expected shuffle chaos or independent; "
                                   "fixed shuffles with the run seed)", where, c.data.chaos_seed);
                   }};
  };
  // `model dense` checks its head shape at its own line; deepseek waits for
  // the attention line, and every model is checked again at each run.
  auto model_variant = [&](std::string kind) {
    const bool dense = kind == "dense";
    return Variant{std::move(kind),
                   {},
                   {integer("vocab", &c.model.vocab, at_least(2)), integer("dim", &c.model.dim, at_least(1)),
                    integer("layers", &c.model.layers, at_least(1)), integer("heads", &c.model.heads, at_least(1)),
                    integer("ffn", &c.model.ffn, at_least(1)), integer("seq", &c.model.seq, at_least(2)),
                    real("rope_theta", &c.model.rope_theta, above(0)), real("norm_eps", &c.model.norm_eps, above(0)),
                    real("init_std", &c.model.init_std, above(0)), yes_no("tie_embeddings", &c.model.tie_embeddings)},
                   {"vocab", "dim", "layers", "heads", "ffn", "seq"},
                   [&c, dense](const std::string& where) {
                     if (dense) check_model(c.model, where);
                   }};
  };
  // bf16 and fp16 take the same keywords; loss_scale is a word or a number.
  auto precision_variant = [&](std::string kind) {
    Option scale{"loss_scale", &c.precision.loss_scale, {}, {}, "dynamic or a number > 0"};
    return Variant{std::move(kind),
                   {},
                   {scale, integer("scale_window", &c.precision.scale_window, at_least(1)),
                    choice("products", &c.precision.products, {"native", "widened"}),
                    choice("clip_order", &c.precision.clip_order)},
                   {},
                   [&c](const std::string& where) { resolve_loss_scale(c.precision, where); }};
  };
  // fault kill|hang|nan|signal|throw|detach rank R step S: the same keywords, all
  // required (`off` takes them too, so a deck can switch the kind with a variable).
  auto fault_variant = [&](std::string kind) {
    return Variant{std::move(kind),
                   {},
                   {integer("rank", &c.fault.rank, at_least(0)), integer("step", &c.fault.step, at_least(1))},
                   {"rank", "step"},
                   {}};
  };
  auto& a = c.model.attention;
  auto& moe = c.model.moe;
  auto& rs = c.model.rope_scaling;
  return {
      {"seed", nullptr, "", {{"", {integer("seed", &c.seed, at_least(0))}, {}, {}, {}}}, "seed S", Scope::job},
      {"peak_gflops", nullptr, "", {{"", {real("peak_gflops", &c.peak_gflops, above(0))}, {}, {}, {}}}, "peak_gflops X", Scope::job},
      {"init",
       mode_ref(&c.init.kind),
       "kind",
       {{"random", {}, {}, {}, {}},
        {"hf", {path("dir", &c.init.dir)},
         {integer("seq", &c.init.seq, at_least(2)), yes_no("expanded", &c.init.expanded)}, {}, {}}},
       "init random | hf DIR [seq T]", Scope::job},
      {"model",
       mode_ref(&c.model.kind),
       "kind",
       {model_variant("dense"), model_variant("deepseek")},
       "model dense|deepseek vocab V dim C layers L heads H ffn F seq T [rope_theta X] [norm_eps X] [init_std X] "
       "[tie_embeddings yes|no]", Scope::job},
      {"attention",
       mode_ref(&a.kind),
       "kind",
       {{"mha", {}, {}, {}, {}},
        {"mla",
         {},
         {integer("kv_lora_rank", &a.kv_lora_rank, at_least(1)), integer("q_lora_rank", &a.q_lora_rank, at_least(0)),
          integer("qk_nope_dim", &a.qk_nope_dim, at_least(0)), integer("rope_dim", &a.rope_dim, at_least(2)),
          integer("v_dim", &a.v_dim, at_least(1)), real("latent_eps", &a.latent_eps, above(0))},
         {"kv_lora_rank", "qk_nope_dim", "rope_dim", "v_dim"},
         [&a](const std::string& where) {
           if (a.rope_dim % 2 != 0)
             input_error("{}: 'rope_dim' {} is odd (expected an even rope_dim, for rotary embeddings)", where, a.rope_dim);
         }}},
       "attention mha | mla kv_lora_rank R [q_lora_rank Q] qk_nope_dim N rope_dim P v_dim V [latent_eps X]",
       Scope::job},
      {"attention_kernel",
       mode_ref(&a.kernel),
       "kernel",
       {{"auto", {}, {}, {}, {}}, {"packed", {}, {}, {}, {}}, {"flash", {}, {}, {}, {}}},
       "attention_kernel auto | packed | flash", Scope::job},
      {"recompute",
       mode_ref(&c.model.recompute),
       "mode",
       {{"off", {}, {}, {}, {}}, {"selective", {}, {}, {}, {}}, {"full", {}, {}, {}, {}}},
       "recompute off | selective | full", Scope::job},
      {"moe",
       mode_ref(&moe.mode),
       "mode",
       {{"off",
         {},
         {integer("ep", &moe.ep, at_least(1))},
         {},
         [&moe](const std::string& where) {
           if (moe.ep != 1)
             input_error("{}: 'ep' {} with moe off (expected moe on: expert parallelism spreads routed experts)",
                         where, moe.ep);
         }},
        {"on",
         {},
         {integer("dense_layers", &moe.dense_layers, at_least(0)), integer("shared", &moe.shared, at_least(0)),
          integer("routed", &moe.routed, at_least(1)), integer("topk", &moe.topk, at_least(1)),
          integer("ffn", &moe.ffn, at_least(1)), choice("gate", &moe.gate),
          choice("balance", &moe.balance), real("balance_coef", &moe.balance_coef, at_least(0)),
          choice("aux_scope", &moe.aux_scope), real("seq_aux", &moe.seq_aux, at_least(0)),
          real("route_scale", &moe.route_scale, above(0)), integer("ep", &moe.ep, at_least(1)),
          real("capacity_factor", &moe.capacity_factor, at_least(0)),
          integer("groups", &moe.groups, at_least(1)),
          integer("topk_groups", &moe.topk_groups, at_least(1)), integer("layer_freq", &moe.layer_freq, at_least(1))},
         {"routed", "topk", "ffn"},
         [&moe](const std::string& where) {
           if (moe.topk > moe.routed)
             input_error("{}: 'topk' {} exceeds 'routed' {} (expected topk <= routed)", where, moe.topk, moe.routed);
           if (moe.routed % moe.ep != 0)
             input_error("{}: 'routed' {} is not divisible by 'ep' {} (expected routed % ep == 0: each rank of an "
                         "expert-parallel group holds routed / ep experts)", where, moe.routed, moe.ep);
           check_expert_groups(moe, where);
           // each balance mode has its own sequence-wise loss keyword
           if (moe.balance == Balance::bias && moe.aux_scope != AuxScope::batch)
             input_error("{}: 'aux_scope' {} with balance bias (expected balance aux: aux_scope belongs to balance "
                         "aux; balance bias takes the sequence-wise loss as seq_aux X)", where, moe.aux_scope);
           if (moe.balance == Balance::aux && moe.seq_aux != 0)
             input_error("{}: 'seq_aux' {} with balance aux (expected balance bias: seq_aux belongs to balance "
                         "bias; balance aux takes the sequence-wise loss as aux_scope sequence)", where, moe.seq_aux);
         }}},
       "moe off | on [dense_layers K] [shared S] routed E topk k ffn F [gate softmax|sigmoid] [balance aux|bias] "
       "[balance_coef X] [aux_scope batch|sequence] [seq_aux X] [route_scale X] [ep N] [capacity_factor C] "
       "[groups G] [topk_groups g] [layer_freq N]",
       Scope::job},
      {"mtp",
       nullptr,
       "",
       {{"",
         {},
         {integer("depth", &c.model.mtp.depth, at_least(0)), real("weight", &c.model.mtp.weight, at_least(0))},
         {"depth"},
         {}}},
       "mtp depth D [weight W]", Scope::job},
      {"rope_scaling",
       mode_ref(&rs.kind),
       "kind",
       {{"off", {}, {}, {}, {}},
        {"yarn",
         {},
         {real("factor", &rs.factor, above(0)), integer("original_seq", &rs.original_seq, at_least(2)),
          real("beta_fast", &rs.beta_fast, above(0)), real("beta_slow", &rs.beta_slow, above(0)),
          real("mscale", &rs.mscale, at_least(0)), real("mscale_all_dim", &rs.mscale_all_dim, at_least(0))},
         {"factor", "original_seq"},
         [&rs](const std::string& where) {
           if (!(rs.beta_fast > rs.beta_slow))
             input_error("{}: 'beta_fast' {} is not above 'beta_slow' {} (expected beta_fast > beta_slow > 0: the "
                         "pairs turning more than beta_fast times keep their frequency, fewer than beta_slow are "
                         "interpolated)", where, rs.beta_fast, rs.beta_slow);
         }}},
       "rope_scaling off | yarn factor F original_seq T [beta_fast X] [beta_slow X] [mscale X] [mscale_all_dim X]",
       Scope::job},
      {"data",
       mode_ref(&c.data.format),
       "format",
       {data_variant("bytes"), data_variant("shard")},
       "data bytes|shard PATH|GLOB [valid F|FILE] [tokenizer MODEL] [batch B] [workers N] [queue Q] [shuffle fixed|chaos|independent] "
       "[chaos_seed S] [common F] [common_rate R] [partition shuffled|contiguous] [noise_rank R]", Scope::job},
      {"optimizer",
       nullptr,
       "kind",
       {{"adamw",
         {},
         {real("lr", &c.optimizer.lr, above(0)), real("beta1", &c.optimizer.beta1, within(0, 1, false, true)),
          real("beta2", &c.optimizer.beta2, within(0, 1, false, true)), real("eps", &c.optimizer.eps, above(0)),
          real("weight_decay", &c.optimizer.weight_decay, at_least(0)), real("clip", &c.optimizer.clip, at_least(0)),
          choice("moments", &c.optimizer.moments, {"fp32", "bf16"})},
         {},
         {}}},
       "optimizer adamw [lr X] [beta1 X] [beta2 X] [eps X] [weight_decay X] [clip X] [moments fp32|bf16]"},
      {"schedule",
       mode_ref(&c.schedule.kind),
       "kind",
       {{"cosine",
         {},
         {integer("warmup", &c.schedule.warmup, at_least(0)), real("min_lr", &c.schedule.min_lr, at_least(0)),
          integer("total", &c.schedule.total, at_least(0))},
         {},
         {}},
        {"sgdr",
         {},
         {integer("period", &c.schedule.period, at_least(1)), real("mult", &c.schedule.mult, at_least(1)),
          real("min_lr", &c.schedule.min_lr, at_least(0)), integer("warmup", &c.schedule.warmup, at_least(0)),
          real("jitter", &c.schedule.jitter, within(0, 1, false, true)),
          choice("restart_from", &c.schedule.restart_from)},
         {"period"},
         {}},
        {"step",
         {},
         {integer("every", &c.schedule.every, at_least(1)), real("factor", &c.schedule.factor, within(0, 1, true, false)),
          real("jitter", &c.schedule.jitter, within(0, 1, false, true)),
          integer("warmup", &c.schedule.warmup, at_least(0))},
         {"every", "factor"},
         {}}},
       "schedule cosine [warmup W] [min_lr X] [total S] | sgdr period P [mult M] [min_lr X] [warmup W] [jitter J] "
       "[restart_from last|best] | step every S factor F [jitter J] [warmup W]"},
      {"sync",
       mode_ref(&c.sync.kind),
       "kind",
       {{"dense",
         {},
         {real("bucket_mb", &c.sync.bucket_mb, above(0)), dense_transport},
         {},
         [&c](const std::string&) { c.sync.every = 1; }},
        {"accumulate",
         {integer("steps", &c.sync.every, at_least(1))},
         {real("bucket_mb", &c.sync.bucket_mb, above(0)), dense_transport},
         {},
         {}},
        {"local",
         {integer("steps", &c.sync.every, at_least(1))},
         {choice("outer", &c.sync.outer), real("lr", &c.sync.outer_lr, above(0)),
          real("momentum", &c.sync.momentum, within(0, 1, false, true)), dense_transport},
         {},
         {}}},
       "sync dense [bucket_mb X] [transport auto|nccl|mpi] | accumulate K [bucket_mb X] [transport auto|nccl|mpi] | "
       "local K [outer average|sgd|nesterov] [lr X] [momentum X] [transport auto|nccl|mpi]"},
      {"topology",
       mode_ref(&c.topology.kind),
       "kind",
       {{"full", {}, {}, {}, {}},
        {"clusters", {integer("size", &c.topology.size, at_least(1))}, {integer("redraw", &c.topology.redraw, at_least(0))}, {}, {}},
        {"ring", {}, {}, {}, {}}},
       "topology full | clusters N [redraw S] | ring"},
      {"compress",
       mode_ref(&c.compress.kind),
       "kind",
       {{"off", {}, {}, {}, {}},
        {"topk",
         {real("ratio", &c.compress.ratio, within(0, 1, true, false))},
         {choice("quant", &c.compress.quant),
          on_off("feedback", &c.compress.feedback),
          real("momentum", &c.compress.momentum, within(0, 1, false, true)),
          integer("min_size", &c.compress.min_size, at_least(0)), integer("warmup", &c.compress.warmup, at_least(0)),
          integer("block", &c.compress.block, at_least(1)),
          choice("target", &c.compress.target),
          choice("transport", &c.compress.transport),
          choice("exchange", &c.compress.exchange)},
         {},
         {}}},
       "compress off | topk RATIO [quant none|int8|int4|bf16] [feedback on|off] [momentum M] [min_size N] [warmup STEPS] "
       "[block B] [target gradient|update] [transport auto|ucx|mpi] [exchange allgather|partitioned]"},
      {"output",
       nullptr,
       "",
       {{"",
         {},
         {path("dir", &c.output.dir), integer("log_every", &c.output.log_every, at_least(1)),
          choice("progress", &c.output.progress), on_off("tensorboard", &c.output.tensorboard),
          on_off("barrier", &c.output.barrier)},
         {"dir"},
         {}}},
       "output dir PATH [log_every N] [progress auto|on|off] [tensorboard on|off] [barrier on|off]", Scope::job},
      {"eval",
       nullptr,
       "",
       {{"", {}, {integer("every", &c.eval.every, at_least(0)), integer("batches", &c.eval.batches, at_least(1))}, {}, {}}},
       "eval [every N] [batches K]"},
      {"sample",
       nullptr,
       "",
       {{"",
         {},
         {integer("every", &c.sample.every, at_least(0)), Option{"prompt", &c.sample.prompt, {}, {}, "a text"},
          integer("tokens", &c.sample.tokens, at_least(1)), real("temperature", &c.sample.temperature, at_least(0)),
          integer("top_k", &c.sample.top_k, at_least(0)), real("top_p", &c.sample.top_p, within(0, 1, true, false)),
          integer("seed", &c.sample.seed, at_least(0))},
         {"every"},
         {}}},
       "sample every N [prompt TEXT] [tokens K] [temperature T] [top_k K] [top_p P] [seed S]"},
      {"checkpoint",
       nullptr,
       "",
       {{"",
         {},
         {integer("every", &c.checkpoint.every, at_least(0)), yes_no("at_end", &c.checkpoint.at_end),
          choice("mode", &c.checkpoint.mode),
          choice("codec", &c.checkpoint.codec),
          real("ratio", &c.checkpoint.ratio, within(0, 1, true, false)),
          integer("block", &c.checkpoint.block, within(1, 1 << 20)), integer("keep", &c.checkpoint.keep, at_least(0)),
          integer("base_every", &c.checkpoint.base_every, at_least(1)), on_off("async", &c.checkpoint.async),
          choice("writer", &c.checkpoint.writer)},
         {},
         {}}},
       "checkpoint [every N] [at_end yes|no] [mode full|diff] [codec lossless|int8|topk] [ratio R] [block B] "
       "[keep K] [base_every M] [async on|off] [writer collective|rank0]"},
      {"health",
       nullptr,
       "",
       {{"",
         {},
         {integer("every", &c.health.every, at_least(0)), choice("nan", &c.health.nan, {"skip", "stop"}),
          integer("max_skips", &c.health.max_skips, at_least(1))},
         {},
         {}}},
       "health [every N] [nan skip|stop] [max_skips K]"},
      {"timeout", nullptr, "", {{"", {real("seconds", &c.resilience.timeout, at_least(0))}, {}, {}, {}}}, "timeout S", Scope::job},
      {"preempt", nullptr, "", {{"", {}, {on_off("requeue", &c.resilience.requeue)}, {"requeue"}, {}}},
       "preempt requeue on|off", Scope::job},
      {"fault",
       mode_ref(&c.fault.kind),
       "kind",
       {{"off", {}, {integer("rank", &c.fault.rank, at_least(0)), integer("step", &c.fault.step, at_least(1))}, {}, {}},
        fault_variant("kill"), fault_variant("hang"), fault_variant("nan"), fault_variant("signal"),
        fault_variant("throw"), fault_variant("detach")},
       "fault off | kill|hang|nan|signal|throw|detach rank R step S", Scope::job},
      {"shard",
       mode_ref(&c.shard.level),
       "level",
       {{"off", {}, {}, {}, {}}, {"optimizer", {}, {}, {}, {}}, {"gradients", {}, {}, {}, {}}, {"params", {}, {}, {}, {}}},
       "shard off | optimizer | gradients | params", Scope::job},
      {"pipeline",
       nullptr,
       "",
       {{"",
         {},
         {integer("stages", &c.pipeline.stages, at_least(1)), choice("schedule", &c.pipeline.schedule),
          integer("virtual", &c.pipeline.virtual_stages, at_least(1)), integer("micro", &c.pipeline.micro, at_least(1)),
          Option{"cut", &c.pipeline.cut_text, {}, {}, "each stage's blocks, comma-separated"}},
         {"stages"},
         [&p = c.pipeline](const std::string& where) { check_pipeline_line(p, where); }}},
       "pipeline stages P [schedule gpipe|1f1b|interleaved|dualpipev] [virtual V] [micro M] [cut N0,N1,...]",
       Scope::job},
      {"grad_check",
       nullptr,
       "",
       {{"", {}, {choice("missing", &c.grad_check.missing)}, {"missing"}, {}}},
       "grad_check missing warn|error|off"},
      {"gemm",
       mode_ref(&c.gemm),
       "backend",
       {{"auto", {}, {}, {}, {}}, {"onednn", {}, {}, {}, {}}, {"cublas", {}, {}, {}, {}}, {"blas", {}, {}, {}, {}}},
       "gemm auto | onednn | cublas | blas", Scope::job},
      {"precision",
       mode_ref(&c.precision.kind),
       "kind",
       {{"fp32", {}, {choice("products", &c.precision.products, {"native", "tf32"})}, {}, {}},
        precision_variant("bf16"), precision_variant("fp16")},
       "precision fp32 [products native|tf32] | bf16|fp16 [loss_scale S|dynamic] [scale_window N] "
       "[products native|widened] [clip_order unscaled|scaled]", Scope::job},
      {"lossagg",
       mode_ref(&c.lossagg.kind),
       "kind",
       {{"off", {}, {}, {}, {}},
        {"mean", {}, {}, {}, {}},
        {"robust", {}, {real("trim", &c.lossagg.trim, within(0, 0.5, false, true))}, {}, {}},
        {"softmax", {real("temperature", &c.lossagg.temperature, above(0))}, {}, {}, {}},
        {"uncertainty", {}, {}, {}, {}}},
       "lossagg off | mean | robust [trim F] | softmax T | uncertainty"},
      {"run", nullptr, "", {{"", {integer("steps", &steps, at_least(1))}, {}, {}, {}}}, "run N"},
  };
}

// Commands read_deck consumes; listed for help and did-you-mean.
const std::vector<std::string> kReaderCommands = {"variable", "include"};

template <class T>
const T* find_named(const std::vector<T>& items, const std::string& name, std::string T::*field) {
  for (const auto& item : items)
    if (item.*field == name) return &item;
  return nullptr;
}

std::string names_of(const std::vector<Option>& options) {
  std::vector<std::string> names;
  for (const auto& o : options) names.push_back(o.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// Parses one line into the Config the registry is bound to. A `repeat` (the
// command given before, of the same kind) changes what it names and keeps
// the rest: its required keywords were given already.
void apply(const Command& cmd, const DeckLine& line, const std::string& where, bool repeat) {
  const auto& w = line.words;
  size_t i = 1;
  const Variant* variant = &cmd.variants.front();
  std::string label = cmd.name;
  if (cmd.has_kind()) {
    std::vector<std::string> kinds;
    for (const auto& v : cmd.variants) kinds.push_back(v.kind);
    const std::string kinds_text = fmt::format("{}", fmt::join(kinds, ", "));
    if (w.size() < 2) input_error("{}: '{}' needs a kind (expected one of: {})", where, cmd.name, kinds_text);
    variant = find_named(cmd.variants, w[1], &Variant::kind);
    if (!variant)
      input_error("{}: unknown kind '{}' for '{}' (expected one of: {}){}", where, w[1], cmd.name, kinds_text,
                  suggest(w[1], kinds));
    if (cmd.kind_target) cmd.kind_target.set(w[1]);
    label += " " + w[1];
    i = 2;
  }
  for (const auto& o : variant->positional) {
    if (i >= w.size()) {
      if (o.name == cmd.name) input_error("{}: '{}' needs a value (expected {})", where, label, o.expected);
      input_error("{}: '{}' needs a value for '{}' (expected {})", where, label, o.name, o.expected);
    }
    set_value(o, w[i++], where);
  }
  std::vector<std::string> seen;
  for (; i < w.size(); i += 2) {
    if (variant->keywords.empty())
      input_error("{}: unexpected word '{}' after '{}' (expected end of line: {})", where, w[i], label, cmd.usage);
    const Option* o = find_named(variant->keywords, w[i], &Option::name);
    if (!o) {
      std::vector<std::string> names;
      for (const auto& k : variant->keywords) names.push_back(k.name);
      input_error("{}: unknown keyword '{}' for '{}' (expected one of: {}){}", where, w[i], label,
                  names_of(variant->keywords), suggest(w[i], names));
    }
    if (std::find(seen.begin(), seen.end(), o->name) != seen.end())
      input_error("{}: keyword '{}' given twice for '{}' (expected each keyword at most once)", where, o->name, label);
    seen.push_back(o->name);
    if (i + 1 >= w.size()) input_error("{}: keyword '{}' needs a value (expected {})", where, o->name, o->expected);
    set_value(*o, w[i + 1], where);
  }
  for (const auto& r : variant->required)
    if (!repeat && std::find(seen.begin(), seen.end(), r) == seen.end())
      input_error("{}: '{}' is missing keyword '{}' (expected {})", where, label, r, cmd.usage);
  if (variant->check) variant->check(where);
}

// Every value a command holds, "name value" pairs; used by describe and to
// tell whether a repeated model line changes the model.
std::vector<std::pair<std::string, std::string>> rows(const Command& cmd) {
  std::vector<std::pair<std::string, std::string>> out;
  const Variant* variant = &cmd.variants.front();
  if (cmd.has_kind()) {
    const std::string kind = cmd.kind_target ? cmd.kind_target.get() : variant->kind;
    if (const Variant* v = find_named(cmd.variants, kind, &Variant::kind)) variant = v;
    out.emplace_back(cmd.name + "." + cmd.kind_label, kind);
  }
  for (const auto* list : {&variant->positional, &variant->keywords})
    for (const auto& o : *list) out.emplace_back(o.name == cmd.name ? o.name : cmd.name + "." + o.name, value_text(o));
  return out;
}

// The same values typed, for program_json: a command that is one value
// (seed S, timeout S) is that value, any other an object.
nlohmann::ordered_json values_json(const Command& cmd) {
  const Variant* variant = &cmd.variants.front();
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (cmd.has_kind()) {
    const std::string kind = cmd.kind_target ? cmd.kind_target.get() : variant->kind;
    if (const Variant* v = find_named(cmd.variants, kind, &Variant::kind)) variant = v;
    out[cmd.kind_label] = kind;
  }
  for (const auto* list : {&variant->positional, &variant->keywords})
    for (const auto& o : *list)
      out[o.name] = std::visit(
          [](auto p) {
            if constexpr (std::is_same_v<decltype(p), ModeRef>) return nlohmann::ordered_json(p.get());
            else return nlohmann::ordered_json(*p);
          },
          o.target);
  if (!cmd.has_kind() && variant->positional.size() == 1 && variant->keywords.empty()) return out.begin().value();
  return out;
}

// The run directory must be a directory we can create or write into.
void check_output_dir(const std::string& dir, const std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  if (!fs::is_directory(p, ec))
    input_error("{}: output dir '{}' cannot be created: '{}' is not a directory (expected a directory path)", where,
                dir, p.string());
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    input_error("{}: output dir '{}' is not writable: no write permission in '{}' (expected a writable directory)",
                where, dir, p.string());
}

bool readable_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && std::ifstream(path).good();
}

// A shard glob must match a file; every other path the data line names must be readable.
void check_data_files(const DataConfig& d, const std::string& where) {
  auto check = [&](const std::string& path, const char* what) {
    if (d.format == DataFormat::shard && path.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const bool any = ::glob(path.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
      ::globfree(&g);
      if (!any)
        input_error("{}: the shard pattern '{}' matches no file (expected shards such as tools/prepare-data writes, "
                    "e.g. 'DIR/train_*.bin'; relative paths start at the working directory)", where, path);
      return;
    }
    if (!readable_file(path))
      input_error("{}: cannot read {} '{}' (expected a readable file; relative paths start at the working directory)",
                  where, what, path);
  };
  check(d.path, "data file");
  if (!d.valid_path.empty()) check(d.valid_path, "validation file");
  if (!d.tokenizer.empty()) check(d.tokenizer, "tokenizer model");
}


// The values of a per-job command that must not change between phases
// (none for a per-phase command).
std::vector<std::pair<std::string, std::string>> job_rows(const Command& cmd) {
  std::vector<std::pair<std::string, std::string>> out;
  if (cmd.scope != Scope::job) return out;
  for (auto& row : rows(cmd)) {
    if (row.first != "output.log_every") out.push_back(std::move(row));  // the one per-phase keyword of a per-job command
  }
  return out;
}

// Settings of one phase that cannot work together, found at its `run` line.
void check_phase(const Config& c, const std::string& where, std::optional<CompressConfig>& topk) {
  if (c.compress.kind == CompressKind::topk) {
    if (c.sync.kind == SyncKind::local)
      input_error("{}: compress topk with sync local (expected sync dense or accumulate: compression applies to "
                  "gradients)", where);
    if (c.topology.kind == TopologyKind::ring)
      input_error("{}: compress topk with topology ring (expected topology full or clusters)", where);
    if (c.compress.exchange == Exchange::partitioned && c.topology.kind != TopologyKind::full)
      input_error("{}: compress exchange partitioned with topology {} (expected topology full, or exchange "
                  "allgather: each rank keeps the owner residual of its pieces of a fixed group)",
                  where, c.topology.kind);
    if (topk && c.compress != *topk)
      input_error("{}: a second, different compress topk setting (expected one per deck; phases may switch it off)",
                  where);
    topk = c.compress;
    if (c.precision.kind != Precision::fp32)
      input_error("{}: precision {} with compress topk (expected precision fp32: a skipped inf/NaN step would "
                  "poison the error-feedback residual)", where, c.precision.kind);
  }
  // Weighing ranks needs their gradients averaged over all of them, once, by
  // an all-reduce; per-loss weights (uncertainty) work anywhere.
  const auto& agg = c.lossagg.kind;
  if (agg != LossAggKind::robust && agg != LossAggKind::softmax) return;
  if (c.sync.kind == SyncKind::local)
    input_error("{}: lossagg {} with sync local (expected sync dense or accumulate: each rank's own AdamW would "
                "undo its weight)", where, agg);
  if (c.topology.kind != TopologyKind::full)
    input_error("{}: lossagg {} with topology {} (expected topology full: the weights are over all ranks)", where,
                agg, c.topology.kind);
  if (c.compress.kind == CompressKind::topk && c.compress.target == CompressTarget::update)
    input_error("{}: lossagg {} with compress target update (expected target gradient: each rank's own AdamW "
                "would undo its weight)", where, agg);
}
// Sharding (ZeRO 1/2/3) needs every rank to hold the same weights after each
// step and a plain all-reduce of the gradients over all ranks: `set_at`
// holds where each command was last given, so the error names both lines.
void check_shard(const Config& c, const std::string& where, const std::map<std::string, std::string>& set_at,
                 double first_bucket_mb) {
  if (c.shard.level == ShardLevel::off) return;
  auto at = [&](const std::string& name) {
    auto it = set_at.find(name);
    return it == set_at.end() ? std::string("the default") : it->second;
  };
  const std::string shard = fmt::format("shard {} ({})", c.shard.level, at("shard"));
  if (c.shard.level == ShardLevel::params && c.sample.every > 0)
    input_error("{}: {} with sample every {} ({}) (expected no sample line: rank 0 decodes alone, and under shard "
                "params it holds only its pieces of the weights; sample from a checkpoint with xuanxue generate)",
                where, shard, c.sample.every, at("sample"));
  const char* why = "(expected sync dense or accumulate over topology full, without compress: a sharded optimizer "
                    "needs the same averaged gradients and weights on every rank)";
  if (c.sync.kind == SyncKind::local)
    input_error("{}: {} with sync local ({}) {}", where, shard, at("sync"), why);
  if (c.topology.kind != TopologyKind::full)
    input_error("{}: {} with topology {} ({}) {}", where, shard, c.topology.kind, at("topology"), why);
  if (c.compress.kind != CompressKind::off)
    input_error("{}: {} with compress {} ({}) {}", where, shard, c.compress.kind, at("compress"), why);
  if (c.sync.bucket_mb != first_bucket_mb)
    input_error("{}: {} with sync bucket_mb {} ({}), unlike the first phase's {} (expected one bucket size per "
                "job: the pieces each rank owns are cut from the buckets)",
                where, shard, c.sync.bucket_mb, at("sync"), first_bucket_mb);
}

// pipeline stages P > 1, or micro M > 1 (at P = 1: M micro-batches of the
// batch, one after another): the cut of the model and what this slice
// composes with (docs/SCALING.md, "Pipeline parallelism"). The world size is
// checked at start-up (train/trainer_setup.cpp).
void check_pipeline(const Config& c, const std::string& where, const std::map<std::string, std::string>& set_at) {
  const PipelineConfig& p = c.pipeline;
  if (p.stages == 1 && p.micro == 1) return;
  auto at = [&](const std::string& name) {
    auto it = set_at.find(name);
    return it == set_at.end() ? std::string("the default") : it->second;
  };
  const std::string pipe = at("pipeline");
  const std::string stages = p.stages > 1 ? fmt::format("pipeline stages {}", p.stages)
                                          : fmt::format("pipeline stages 1 micro {}", p.micro);
  if (p.cut.empty() && c.model.layers % (p.stages * p.virtual_stages) != 0)
    input_error("{}: {}{} does not divide the model's {} layers ({}) (expected stages x virtual dividing layers: "
                "each chunk holds layers / (stages x virtual) consecutive blocks; or cut N0,N1,... naming each "
                "chunk's)", pipe, stages, p.virtual_stages > 1 ? fmt::format(" x virtual {}", p.virtual_stages) : "",
                c.model.layers, at("model"));
  if (!p.cut.empty() && std::accumulate(p.cut.begin(), p.cut.end(), 0) != c.model.layers)
    input_error("{}: pipeline cut {} gives {} blocks, the model has {} layers ({}) (expected a cut summing to the "
                "layers)", pipe, p.cut_text, std::accumulate(p.cut.begin(), p.cut.end(), 0), c.model.layers,
                at("model"));
  if (c.data.batch % p.micro != 0)
    input_error("{}: pipeline micro {} does not divide the data batch {} ({}) (expected micro dividing batch: a "
                "pipeline trains batch sequences per step as micro micro-batches of batch / micro)", pipe, p.micro,
                c.data.batch, at("data"));
  const char* not_yet = "is not built with pipeline stages yet (expected";
  // ZeRO-1 and 2 cut the moments and gradients over each stage's replicas; ZeRO-3's weight gathers would
  // meet the stages' messages in the middle of a pass.
  if (c.shard.level == ShardLevel::params)
    input_error("{}: {} with shard params ({}): sharding the weights {} shard optimizer, gradients or off)", pipe,
                stages, at("shard"), not_yet);
  if (c.sync.kind != SyncKind::dense || c.topology.kind != TopologyKind::full || c.compress.kind != CompressKind::off)
    input_error("{}: {} with sync {} topology {} compress {} (phase at {}): the pipeline averages only dense "
                "gradients (expected sync dense over topology full, without compress: the data-parallel ranks of a "
                "stage average its gradients; pipeline micro M takes the place of sync accumulate)",
                pipe, stages, c.sync.kind, c.topology.kind, c.compress.kind, where);
  if (c.lossagg.kind != LossAggKind::off)
    input_error("{}: {} with lossagg {} (phase at {}): loss aggregation {} lossagg off: the last stage alone "
                "sees the losses)", pipe, stages, c.lossagg.kind, where, not_yet);
  if (p.stages == 1) return;
  // What reads the whole model on one rank: not across stages yet.
  if (c.sample.every > 0)
    input_error("{}: {} with sample every {} ({}): sampling {} no sample line: no rank holds the whole model; "
                "sample from a checkpoint with xuanxue generate)", pipe, stages, c.sample.every, at("sample"), not_yet);
  if (c.schedule.restart_from == RestartFrom::best)
    input_error("{}: {} with schedule restart_from best ({}): {} restart_from last)", pipe, stages, at("schedule"),
                not_yet);
}

// moe ... ep N: what expert parallelism serves. The experts a rank holds
// are its own, so everything that averages, shards, compresses or decodes
// the whole weight buffer as if every rank held the same tensors is refused.
void check_expert_parallel(const Config& c, const std::string& where, const std::map<std::string, std::string>& set_at) {
  if (c.model.moe.ep == 1) return;
  auto at = [&](const std::string& name) {
    auto it = set_at.find(name);
    return it == set_at.end() ? std::string("the default") : it->second;
  };
  const std::string ep = fmt::format("moe ep {} ({})", c.model.moe.ep, at("moe"));
  const char* why = "(expected sync dense or accumulate over topology full, without compress: each expert's "
                    "gradient is averaged over the ranks that hold it)";
  if (c.sync.kind == SyncKind::local) input_error("{}: {} with sync local ({}) {}", where, ep, at("sync"), why);
  if (c.topology.kind != TopologyKind::full)
    input_error("{}: {} with topology {} ({}) {}", where, ep, c.topology.kind, at("topology"), why);
  if (c.compress.kind != CompressKind::off) input_error("{}: {} with compress {} ({}) {}", where, ep, c.compress.kind, at("compress"), why);
  if (c.sample.every > 0)
    input_error("{}: {} with sample every {} ({}) (expected no sample line: rank 0 decodes alone and holds only its "
                "own experts; sample from a checkpoint with xuanxue generate)", where, ep, c.sample.every, at("sample"));
  if (c.schedule.restart_from == RestartFrom::best)
    input_error("{}: {} with schedule restart_from best ({}) (expected restart_from last: the best weights are kept "
                "per rank)", where, ep, at("schedule"));
}

}  // namespace

std::vector<std::string> command_names() {
  Config c;
  int64_t steps = 0;
  std::vector<std::string> names;
  for (const auto& cmd : registry(c, steps)) names.push_back(cmd.name);
  names.insert(names.end(), kReaderCommands.begin(), kReaderCommands.end());
  return names;
}

Program build_program(const std::vector<DeckLine>& lines, bool check_files) {
  Program program;
  program.lines = lines;
  Config config;
  int64_t steps = 0, total_steps = 0;
  const std::vector<Command> commands = registry(config, steps);
  const std::vector<std::string> names = command_names();
  bool have_model = false, have_data = false;
  std::map<std::string, std::string> set_at;  // where each command was last given before the first run
  std::optional<CompressConfig> topk;         // the deck's compress topk setting
  std::map<std::string, std::string> last_set;  // where each command was last given
  std::map<std::string, std::string> last_kind;  // the kind word each command was last given with

  for (const auto& line : lines) {
    if (line.words.empty()) continue;
    const std::string where = fmt::format("{}:{}", line.file, line.line);
    const std::string& name = line.words[0];
    const Command* cmd = find_named(commands, name, &Command::name);
    if (!cmd)
      input_error("{}: unknown command '{}' (expected one of: {}){}", where, name, fmt::join(names, ", "),
                  suggest(name, names));
    program.deck_text += line.text + "\n";

    const auto before = job_rows(*cmd);
    const std::string kind = cmd->has_kind() && line.words.size() > 1 ? line.words[1] : "";
    const bool repeat = last_kind.count(name) && last_kind[name] == kind;
    apply(*cmd, line, where, repeat);
    last_kind[name] = kind;
    if (name == "init" && config.init.kind == InitKind::hf && program.phases.empty())
      for (const char* model_command : {"model", "attention", "moe", "mtp", "rope_scaling"})
        if (last_set.count(model_command))
          input_error("{}: init hf after '{}' ({}) (expected init hf above every model, attention, moe, mtp and "
                      "rope_scaling line: its config.json describes the model, and later lines may add only what "
                      "it does not say)", where, model_command, last_set[model_command]);
    if (program.phases.empty()) set_at[name] = where;
    last_set[name] = where;
    const bool model =
        name == "model" || name == "attention" || name == "moe" || name == "mtp" || name == "rope_scaling";
    if (!program.phases.empty() && job_rows(*cmd) != before) {
      if (model)
        input_error("{}: model cannot change after the first run (expected the same '{}' line, or none)", where,
                    name);
      input_error("{}: '{}' cannot change after the first run: it is one setting for the whole job{} (expected "
                  "the same '{}' line, or none, after the first run)",
                  where, name, set_at.count(name) ? " (set at " + set_at[name] + ")" : "", name);
    }
    if (model) {
      have_model |= name == "model";
    } else if (name == "output") {
      if (check_files) check_output_dir(config.output.dir, where);
    } else if (name == "data") {
      if (check_files) check_data_files(config.data, where);
      have_data = true;
    } else if (name == "run") {
      if (!have_model) input_error("{}: 'run' before any 'model' command (expected a model line above the run)", where);
      if (!have_data) input_error("{}: 'run' before any 'data' command (expected a data line above the run)", where);
      check_model(config.model, where);
      check_phase(config, where, topk);
      if (!program.phases.empty() && config.sync.transport != program.phases.front().config.sync.transport)
        input_error("{}: sync transport {} ({}), unlike the first phase's {} (expected one dense transport per job: "
                    "it is chosen once, at start-up)",
                    where, config.sync.transport, last_set.count("sync") ? last_set["sync"] : "the default",
                    program.phases.front().config.sync.transport);
      if (!program.phases.empty() && config.optimizer.moments != program.phases.front().config.optimizer.moments)
        input_error("{}: optimizer moments {} ({}), unlike the first phase's {} (expected one moments type per job: "
                    "AdamW's storage is chosen once, at start-up)",
                    where, config.optimizer.moments, last_set.count("optimizer") ? last_set["optimizer"] : "the default",
                    program.phases.front().config.optimizer.moments);
      check_shard(config, where, last_set,
                  program.phases.empty() ? config.sync.bucket_mb : program.phases.front().config.sync.bucket_mb);
      check_expert_parallel(config, where, last_set);
      check_pipeline(config, where, last_set);
      program.phases.push_back(Phase{config, steps, where});
      total_steps += steps;
    }
  }
  if (program.phases.empty()) {
    const std::string where = lines.empty() ? "deck:0" : fmt::format("{}:{}", lines.back().file, lines.back().line);
    input_error("{}: no run command: nothing to do (expected at least one 'run N' line)", where);
  }
  // total 0 means "the whole deck": the cosine reaches min_lr at the last step.
  for (auto& phase : program.phases)
    if (phase.config.schedule.total == 0) phase.config.schedule.total = total_steps;
  return program;
}

std::string where_given(const Program& program, const std::string& command) {
  for (const auto& l : program.lines)
    if (!l.words.empty() && l.words[0] == command) return fmt::format("{}:{}", l.file, l.line);
  return "deck";
}

std::string describe(const Config& config) {
  Config c = config;  // the registry binds to a mutable Config; it is only read here
  int64_t steps = 0;
  std::vector<std::pair<std::string, std::string>> table;
  for (const auto& cmd : registry(c, steps)) {
    if (cmd.name == "run") continue;
    auto r = rows(cmd);
    table.insert(table.end(), r.begin(), r.end());
  }
  size_t width = 0;
  for (const auto& [name, value] : table) width = std::max(width, name.size());
  std::string out;
  for (const auto& [name, value] : table) out += fmt::format("{:<{}}  {}\n", name, width, value);
  return out;
}

std::string program_json(const Program& program) {
  nlohmann::ordered_json phases = nlohmann::ordered_json::array();
  for (const auto& phase : program.phases) {
    Config c = phase.config;  // the registry binds to a mutable Config; it is only read here
    int64_t steps = 0;
    nlohmann::ordered_json config = nlohmann::ordered_json::object();
    for (const auto& cmd : registry(c, steps))
      if (cmd.name != "run") config[cmd.name] = values_json(cmd);
    phases.push_back({{"where", phase.where}, {"steps", phase.steps}, {"config", std::move(config)}});
  }
  // deck order, as written; a path that is not UTF-8 is printed with U+FFFD, not refused
  return nlohmann::ordered_json{{"phases", std::move(phases)}}.dump(2, ' ', false,
                                                                     nlohmann::json::error_handler_t::replace);
}

}  // namespace xx
