// config.json onto the model lines (interface in config.h). What each key
// means follows the Hugging Face model codes of Llama, DeepSeek-V2 and
// DeepSeek-V3 (defaults included: a key left out means its class default);
// tools/xxpy/hf_export.py writes the same keys from the other side.
#include "hf/config.h"
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "core/error.h"

namespace xx {
namespace {

using json = nlohmann::json;

// Keys that describe the files, the tokenizer's ids or serving, and change
// nothing this run computes.
const std::set<std::string> kInert = {
    "_name_or_path", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "pretraining_tp", "ep_size",
    "tokenizer_class", "return_dict", "output_hidden_states", "output_attentions", "id2label", "label2id",
    "model_type"};

// config.json, read once, with the keys taken so far: what is left at the
// end was not understood.
class Keys {
 public:
  Keys(std::string path, const std::string& where) : path_(std::move(path)), where_(where) {
    std::ifstream in(path_, std::ios::binary);
    if (!in)
      input_error("{}: cannot read {} (expected a Hugging Face model directory with config.json)", where_, path_);
    std::stringstream s;
    s << in.rdbuf();
    text_ = s.str();
    try {
      j_ = json::parse(text_);
    } catch (const json::parse_error& e) {
      input_error("{}: byte {}: not JSON ({}) (expected a Hugging Face config.json)", path_, e.byte, e.what());
    }
    if (!j_.is_object())
      input_error("{}:1: the top level is not an object (expected a Hugging Face config.json)", path_);
  }

  // "FILE:LINE" of a key (its first mention), for the errors.
  std::string at(const std::string& key) const { return fmt::format("{}:{}", path_, line(key)); }
  int line(const std::string& key) const {
    const size_t pos = text_.find("\"" + key + "\"");
    return pos == std::string::npos ? 1 : int(std::count(text_.begin(), text_.begin() + long(pos), '\n')) + 1;
  }

  [[noreturn]] void refuse(const std::string& key, const std::string& what) const {
    input_error("{}: {} (init hf at {})", at(key), what, where_);
  }

  // The key's value, or null when absent; marks it understood.
  const json& get(const std::string& key) {
    taken_.insert(key);
    static const json null;
    auto it = j_.find(key);
    return it == j_.end() ? null : *it;
  }
  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int integer(const std::string& key, std::optional<int> fallback, int least) {
    const json& v = get(key);
    if (v.is_null()) {
      if (!fallback) refuse(key, fmt::format("'{}' is missing (expected an integer >= {})", key, least));
      return *fallback;
    }
    if (!v.is_number_integer() || v.get<int64_t>() < least || v.get<int64_t>() > (1 << 30))
      refuse(key, fmt::format("'{}' is {} (expected an integer >= {})", key, v.dump(), least));
    return int(v.get<int64_t>());
  }
  double number(const std::string& key, double fallback, bool positive = true) {
    const json& v = get(key);
    if (v.is_null()) return fallback;
    if (!v.is_number() || !std::isfinite(v.get<double>()) || (positive && !(v.get<double>() > 0)) ||
        v.get<double>() < 0)
      refuse(key, fmt::format("'{}' is {} (expected a number{})", key, v.dump(), positive ? " > 0" : " >= 0"));
    return v.get<double>();
  }
  bool flag(const std::string& key, bool fallback) {
    const json& v = get(key);
    if (v.is_null()) return fallback;
    if (!v.is_boolean()) refuse(key, fmt::format("'{}' is {} (expected true or false)", key, v.dump()));
    return v.get<bool>();
  }
  std::string word(const std::string& key, const std::string& fallback) {
    const json& v = get(key);
    if (v.is_null()) return fallback;
    if (!v.is_string()) refuse(key, fmt::format("'{}' is {} (expected a string)", key, v.dump()));
    return v.get<std::string>();
  }

  // Every key neither taken nor inert: refused, the first by name.
  void check_all_understood(const std::string& model_type) const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!taken_.count(it.key()) && !kInert.count(it.key()))
        refuse(it.key(), fmt::format("key '{}' is not one xuanxue reads for model_type {} (expected only keys that "
                                     "it maps or that change nothing it computes: docs/HF.md; a key not "
                                     "understood may change the model)", it.key(), model_type));
  }

 private:
  std::string path_, where_, text_;
  json j_;
  std::set<std::string> taken_;
};

std::string num(double v) { return fmt::format("{}", v); }
std::string num(int v) { return fmt::format("{}", v); }

// rope_scaling (transformers 4) or rope_parameters (5): the plain rotary
// embedding (type default; rope_parameters may carry rope_theta), or YaRN as
// a `rope_scaling yarn` line (DeepSeek-V2's YaRN, model/attention.h); every
// other rope type, and every YaRN key that would change the computation in a
// way the line cannot say, refused. `llama`: Llama's attention, which does
// not scale its scores by YaRN's mscale_all_dim as DeepSeek's does.
struct RopeKeys {
  double theta = 10000.0;
  std::optional<HfLine> scaling;  // rope_scaling yarn ...
};
RopeKeys read_rope(Keys& k, bool llama) {
  RopeKeys rope;
  rope.theta = k.number("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json& r = k.get(key);
    if (r.is_null()) continue;
    if (!r.is_object()) k.refuse(key, fmt::format("'{}' is {} (expected null or an object)", key, r.dump()));
    std::string type = "default";
    for (const char* t : {"type", "rope_type"})
      if (r.contains(t) && r[t].is_string()) type = r[t].get<std::string>();
    if (type != "default" && type != "yarn")
      k.refuse(key, fmt::format("'{}' has rope type '{}': not built (expected null, rope_type default, or yarn as "
                                "DeepSeek-V2 and V3 carry it)", key, type));
    // one value of the object: a number > 0 (>= 0 with `zero`), or `fallback` where absent
    auto value = [&](const char* name, std::optional<double> fallback, bool zero = false) {
      if (!r.contains(name) || r[name].is_null()) {
        if (!fallback)
          k.refuse(key, fmt::format("'{}' has no '{}' (expected it with rope type yarn{})", key, name,
                                    std::string(name) == "original_max_position_embeddings"
                                        ? ": DeepSeek's code defaults it to 4096, transformers' to "
                                          "max_position_embeddings"
                                        : ""));
        return *fallback;
      }
      const json& v = r[name];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 || (!zero && v.get<double>() == 0))
        k.refuse(key, fmt::format("'{}' has '{}': {} (expected a number {})", key, name, v.dump(),
                                  zero ? ">= 0" : "> 0"));
      return v.get<double>();
    };
    const std::set<std::string> yarn_keys = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                                             "mscale", "mscale_all_dim", "attention_factor", "truncate"};
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (it.key() == "type" || it.key() == "rope_type") continue;
      if (it.key() == "rope_theta" && it->is_number() && it->get<double>() > 0) {
        rope.theta = it->get<double>();
        continue;
      }
      if (type == "yarn" && yarn_keys.count(it.key())) continue;
      k.refuse(key, fmt::format("'{}' has '{}': {} (expected only rope_type and rope_theta{})", key, it.key(),
                                it->dump(), type == "yarn" ? ", and YaRN's factor, original_max_position_embeddings, "
                                                             "beta_fast, beta_slow, mscale, mscale_all_dim" : ""));
    }
    if (type != "yarn") continue;
    if (rope.scaling)
      k.refuse(key, "both rope_scaling and rope_parameters give YaRN (expected one of them)");
    const double factor = value("factor", {});
    const double original = value("original_max_position_embeddings", {});
    if (original != std::floor(original) || original < 2 || original > (1 << 30))
      k.refuse(key, fmt::format("'{}' has 'original_max_position_embeddings': {} (expected an integer >= 2)", key,
                                num(original)));
    const double beta_fast = value("beta_fast", 32.0), beta_slow = value("beta_slow", 1.0);
    if (!(beta_fast > beta_slow))
      k.refuse(key, fmt::format("'{}' has beta_fast {} and beta_slow {} (expected beta_fast > beta_slow > 0)", key,
                                num(beta_fast), num(beta_slow)));
    // DeepSeek's defaults: mscale 1, mscale_all_dim 0
    const double mscale = value("mscale", 1.0, true), all_dim = value("mscale_all_dim", 0.0, true);
    if (r.contains("truncate") && r["truncate"] != json(true))
      k.refuse(key, fmt::format("'{}' has 'truncate': {}: the ramp's bounds unrounded are not built (expected "
                                "true, DeepSeek's floor and ceil)", key, r["truncate"].dump()));
    if (llama && yarn_mscale(factor, all_dim) != 1)
      k.refuse(key, fmt::format("'{}' has mscale_all_dim {} with model_type llama: Llama's attention does not "
                                "scale its scores by mscale(factor, mscale_all_dim)^2, xuanxue's YaRN does "
                                "(expected mscale_all_dim 0)", key, num(all_dim)));
    // The cos/sin factor: DeepSeek's code always takes the ratio below; transformers takes attention_factor
    // when given, else the ratio only when mscale and mscale_all_dim are both non-zero, else mscale(factor, 1).
    const double ours = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim);
    const bool given = r.contains("attention_factor") && !r["attention_factor"].is_null();
    const double transformers = mscale != 0 && all_dim != 0 ? ours : yarn_mscale(factor, 1);
    const double theirs = given ? value("attention_factor", {}) : transformers;
    if (std::abs(theirs - ours) > 1e-12 * ours)
      k.refuse(key, fmt::format("'{}' gives the cos/sin tables the factor {} ({}), but mscale(factor, mscale) / "
                                "mscale(factor, mscale_all_dim) = {} is what DeepSeek's code and xuanxue use "
                                "(expected {})", key, num(theirs),
                                given ? "its attention_factor" : "transformers' reading, with mscale or "
                                                                 "mscale_all_dim 0",
                                num(ours), given ? "attention_factor equal to it, or none"
                                                 : "mscale and mscale_all_dim both given, as DeepSeek's configs, or "
                                                   "attention_factor"));
    const std::string at = std::string(key) + ".";
    rope.scaling = HfLine{"rope_scaling", "yarn",
                          {{"factor", num(factor), at + "factor"},
                           {"original_seq", num(int(original)), at + "original_max_position_embeddings"},
                           {"beta_fast", num(beta_fast), at + "beta_fast"},
                           {"beta_slow", num(beta_slow), at + "beta_slow"},
                           {"mscale", num(mscale), at + "mscale"},
                           {"mscale_all_dim", num(all_dim), at + "mscale_all_dim"}},
                          k.line(key)};
  }
  return rope;
}

// What every model type shares; returns the model line.
HfLine model_line(Keys& k, const std::string& kind, int seq, double rope_theta) {
  HfLine m{"model", kind, {}, k.line("vocab_size")};
  const int vocab = k.integer("vocab_size", {}, 2), dim = k.integer("hidden_size", {}, 1);
  const int layers = k.integer("num_hidden_layers", {}, 1), heads = k.integer("num_attention_heads", {}, 1);
  const int ffn = k.integer("intermediate_size", {}, 1);
  if (k.has("num_key_value_heads") && k.integer("num_key_value_heads", {}, 1) != heads)
    k.refuse("num_key_value_heads", fmt::format("num_key_value_heads {} differs from num_attention_heads {}: grouped "
                                                "keys and values are not built (expected equal counts)",
                                                k.integer("num_key_value_heads", {}, 1), heads));
  k.get("num_key_value_heads");
  if (const std::string act = k.word("hidden_act", "silu"); act != "silu")
    k.refuse("hidden_act", fmt::format("hidden_act '{}' (expected silu: xuanxue's FFNs are SwiGLU)", act));
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (k.flag(key, false))
      k.refuse(key, fmt::format("'{}' is true: xuanxue's projections have no bias (expected false)", key));
  // Llama's and DeepSeek's configs default to untied (transformers' PretrainedConfig would say true).
  const bool tied = k.flag("tie_word_embeddings", false);
  if (k.number("attention_dropout", 0.0, false) != 0)
    k.refuse("attention_dropout", "attention_dropout is not 0: xuanxue has no dropout (expected 0)");
  const int context = seq > 0 ? seq : k.integer("max_position_embeddings", {}, 2);
  if (seq > 0) k.get("max_position_embeddings");
  m.keywords = {{"vocab", num(vocab), "vocab_size"},
                {"dim", num(dim), "hidden_size"},
                {"layers", num(layers), "num_hidden_layers"},
                {"heads", num(heads), "num_attention_heads"},
                {"ffn", num(ffn), "intermediate_size"},
                {"seq", num(context), ""},  // a training choice: the deck may set another
                {"rope_theta", num(rope_theta), "rope_theta"},
                {"norm_eps", num(k.number("rms_norm_eps", 1e-6)), "rms_norm_eps"},
                // the weights come from the files; kept so that an export says what the model's did
                {"init_std", num(k.number("initializer_range", 0.02)), "initializer_range"},
                // tied: the weights hold model.embed_tokens.weight alone (or lm_head.weight equal to it)
                {"tie_embeddings", tied ? "yes" : "no", "tie_word_embeddings"}};
  return m;
}

std::vector<HfLine> llama_lines(Keys& k, int seq) {
  const RopeKeys rotary = read_rope(k, true);
  HfLine m = model_line(k, "dense", seq, rotary.theta);
  const int dim = std::stoi(m.keywords[1].value), heads = std::stoi(m.keywords[3].value);
  if (k.has("head_dim") && k.integer("head_dim", {}, 1) * heads != dim)
    k.refuse("head_dim", fmt::format("head_dim {} is not hidden_size / num_attention_heads = {} / {} (expected "
                                     "heads that split the hidden state)", k.integer("head_dim", {}, 1), dim, heads));
  k.get("head_dim");
  std::vector<HfLine> lines = {m, {"attention", "mha", {}, k.line("num_attention_heads")}, {"moe", "off", {}, 1},
                               {"mtp", "", {{"depth", "0", ""}}, 1}};
  if (rotary.scaling) lines.push_back(*rotary.scaling);
  return lines;
}

// DeepSeek-V2 and V3: MLA, DeepSeekMoE, (V3) multi-token prediction.
std::vector<HfLine> deepseek_lines(Keys& k, bool v3, int seq) {
  const RopeKeys rotary = read_rope(k, false);
  HfLine m = model_line(k, "deepseek", seq, rotary.theta);
  HfLine a{"attention", "mla", {}, k.line("kv_lora_rank")};
  const int rope = k.integer("qk_rope_head_dim", {}, 2);
  if (rope % 2) k.refuse("qk_rope_head_dim", fmt::format("qk_rope_head_dim {} is odd (expected an even width)", rope));
  const int q_lora = k.has("q_lora_rank") ? k.integer("q_lora_rank", {}, 0) : 0;
  k.get("q_lora_rank");
  a.keywords = {{"kv_lora_rank", num(k.integer("kv_lora_rank", {}, 1)), "kv_lora_rank"},
                {"q_lora_rank", num(q_lora), "q_lora_rank"},
                {"qk_nope_dim", num(k.integer("qk_nope_head_dim", {}, 0)), "qk_nope_head_dim"},
                {"rope_dim", num(rope), "qk_rope_head_dim"},
                {"v_dim", num(k.integer("v_head_dim", {}, 1)), "v_head_dim"},
                // HF's latent norms (q_a_layernorm, kv_a_layernorm) are built with eps 1e-6 whatever
                // rms_norm_eps says (every other norm's)
                {"latent_eps", num(1e-6), "model_type (HF DeepSeek's latent norms: eps 1e-6)"}};
  for (const char* derived : {"head_dim", "qk_head_dim"}) k.get(derived);  // HF's own sums of the widths above
  if (v3 && !k.flag("rope_interleave", true))
    k.refuse("rope_interleave", "rope_interleave is false: the rope part's rows are in halves, xuanxue rotates "
                                "interleaved pairs as DeepSeek's released weights expect (expected true)");

  // DeepSeekMoE: n_routed_experts null or 0 is a dense model
  HfLine moe{"moe", "off", {}, k.line("n_routed_experts")};
  const bool routed = k.has("n_routed_experts") && k.integer("n_routed_experts", {}, 0) > 0;
  for (const char* key : {"n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                          "first_k_dense_replace", "moe_layer_freq", "routed_scaling_factor", "topk_method",
                          "scoring_func", "norm_topk_prob", "n_group", "topk_group", "seq_aux", "aux_loss_alpha"})
    if (!routed) k.get(key);  // without routed experts they change nothing
  if (routed) {
    const int experts = k.integer("n_routed_experts", {}, 1);
    const int topk = k.integer("num_experts_per_tok", {}, 1);
    if (topk > experts)
      k.refuse("num_experts_per_tok", fmt::format("num_experts_per_tok {} exceeds n_routed_experts {}", topk, experts));
    const int shared = k.has("n_shared_experts") ? k.integer("n_shared_experts", {}, 0) : 0;
    k.get("n_shared_experts");
    const int freq = k.integer("moe_layer_freq", 1, 1);
    const std::string scoring = k.word("scoring_func", v3 ? "sigmoid" : "softmax");
    std::string method = k.word("topk_method", v3 ? "noaux_tc" : "greedy");
    if (method == "gready") method = "greedy";  // DeepSeek-V2's remote code spells its default so
    const bool normalized = k.flag("norm_topk_prob", v3);
    const int groups = k.has("n_group") ? k.integer("n_group", {}, 1) : (v3 ? 8 : 1);
    const int chosen = k.has("topk_group") ? k.integer("topk_group", {}, 1) : (v3 ? 4 : 1);
    k.get("n_group"), k.get("topk_group");
    if (scoring != "softmax" && scoring != "sigmoid")
      k.refuse("scoring_func", fmt::format("scoring_func '{}' (expected softmax or sigmoid)", scoring));
    if (scoring == "softmax" && method != "greedy" && method != "group_limited_greedy")
      k.refuse("topk_method", fmt::format("topk_method '{}' with scoring_func softmax (expected greedy or "
                                          "group_limited_greedy)", method));
    if (scoring == "sigmoid" && method != "noaux_tc")
      k.refuse("topk_method", fmt::format("topk_method '{}' with scoring_func sigmoid (expected noaux_tc)", method));
    // Group-limited routing: V2's group_limited_greedy, V3's noaux_tc (the
    // deck's groups/topk_groups; greedy ignores n_group and topk_group).
    const bool grouped = method != "greedy";
    const std::string group_key = k.has("n_group") ? "n_group" : "topk_method";
    if (grouped && groups > kMaxExpertGroups)
      k.refuse(group_key, fmt::format("n_group {} exceeds {} (expected n_group <= {}: xuanxue's router keeps a "
                                      "token's chosen groups as one 64-bit mask)", groups, kMaxExpertGroups,
                                      kMaxExpertGroups));
    if (grouped && experts % groups)
      k.refuse(group_key, fmt::format("n_group {} does not divide n_routed_experts {} (expected a divisor: each group "
                                      "holds n_routed_experts / n_group experts)", groups, experts));
    if (grouped && chosen > groups)
      k.refuse(k.has("topk_group") ? "topk_group" : "topk_method",
               fmt::format("topk_group {} exceeds n_group {} (expected 1 <= topk_group <= n_group)", chosen, groups));
    if (grouped && scoring == "sigmoid" && groups > 1 && experts / groups < 2)
      k.refuse(group_key, fmt::format("n_group {} leaves {} expert per group (expected at least 2: noaux_tc scores a "
                                      "group by the sum of its two largest scores)", groups, experts / groups));
    if (grouped && topk > chosen * (experts / groups))
      k.refuse("num_experts_per_tok",
               fmt::format("num_experts_per_tok {} exceeds the {} experts of topk_group {} groups of {} (expected "
                           "num_experts_per_tok <= topk_group x n_routed_experts / n_group)", topk,
                           chosen * (experts / groups), chosen, experts / groups));
    if (scoring == "softmax" && normalized)
      k.refuse("norm_topk_prob", "norm_topk_prob true with scoring_func softmax: xuanxue's softmax gate weighs the "
                                 "chosen experts by their probabilities unnormalised, as DeepSeek-V2 (expected false)");
    if (scoring == "sigmoid" && !normalized)
      k.refuse("norm_topk_prob", "norm_topk_prob false with scoring_func sigmoid: xuanxue's sigmoid gate normalises "
                                 "the chosen scores, as DeepSeek-V3 (expected true)");
    const double alpha = k.number("aux_loss_alpha", 0.001, false);
    const bool seq_aux = k.flag("seq_aux", true);
    // The balance loss: V2's greedy gate trains with alpha x the expert-level
    // loss, per sequence under seq_aux (aux_scope sequence), else over the
    // batch; V3 with its bias, and under seq_aux the complementary
    // sequence-wise loss beside it, alpha aux_loss_alpha (seq_aux).
    const HfKeyword sequence_loss =
        scoring == "sigmoid" ? HfKeyword{"seq_aux", num(seq_aux ? alpha : 0.0), seq_aux ? "aux_loss_alpha" : "seq_aux"}
                             : HfKeyword{"aux_scope", seq_aux ? "sequence" : "batch", "seq_aux"};
    moe.kind = "on";
    moe.keywords = {{"dense_layers", num(k.integer("first_k_dense_replace", 0, 0)), "first_k_dense_replace"},
                    {"shared", num(shared), "n_shared_experts"},
                    {"routed", num(experts), "n_routed_experts"},
                    {"topk", num(topk), "num_experts_per_tok"},
                    {"ffn", num(k.integer("moe_intermediate_size", {}, 1)), "moe_intermediate_size"},
                    {"gate", scoring, "scoring_func"},
                    {"balance", scoring == "sigmoid" ? "bias" : "aux", "topk_method"},
                    // V3's bias step is a training setting, not in config.json (its paper: 0.001)
                    {"balance_coef", num(scoring == "sigmoid" ? 0.001 : alpha),
                     scoring == "sigmoid" ? "" : "aux_loss_alpha"},
                    sequence_loss,
                    {"route_scale", num(k.number("routed_scaling_factor", 1.0)), "routed_scaling_factor"},
                    {"groups", num(grouped ? groups : 1), grouped ? "n_group" : "topk_method"},
                    {"topk_groups", num(grouped ? chosen : 1), grouped ? "topk_group" : "topk_method"},
                    {"layer_freq", num(freq), "moe_layer_freq"}};
  }
  const int depth = v3 ? k.integer("num_nextn_predict_layers", 0, 0) : 0;
  HfLine mtp{"mtp", "", {{"depth", num(depth), v3 ? "num_nextn_predict_layers" : ""}},
             k.line("num_nextn_predict_layers")};
  std::vector<HfLine> lines = {m, a, moe, mtp};
  if (rotary.scaling) lines.push_back(*rotary.scaling);
  return lines;
}

}  // namespace

std::vector<HfLine> hf_model_lines(const std::string& dir, int seq, const std::string& where) {
  Keys k((std::filesystem::path(dir) / "config.json").string(), where);
  const std::string type = k.word("model_type", "");
  std::vector<HfLine> lines;
  if (type == "llama") lines = llama_lines(k, seq);
  else if (type == "deepseek_v2" || type == "deepseek_v3") lines = deepseek_lines(k, type == "deepseek_v3", seq);
  else
    k.refuse("model_type", fmt::format("model_type '{}' (expected llama, deepseek_v2 or deepseek_v3)",
                                       type.empty() ? "(none)" : type));
  // FP8 weights: the block shape hf_fp8_block reads; anything else is refused
  const json& q = k.get("quantization_config");
  if (!q.is_null()) {
    const bool fp8 = q.is_object() && q.value("quant_method", "") == "fp8" && q.value("fmt", "e4m3") == "e4m3";
    if (!fp8)
      k.refuse("quantization_config", fmt::format("quantization_config {} (expected quant_method fp8, fmt e4m3: "
                                                  "DeepSeek-V3's block-scaled FP8)", q.dump()));
    hf_fp8_block(dir);  // its checks
  }
  k.check_all_understood(type);
  return lines;
}

std::pair<int, int> hf_fp8_block(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  json j = json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return {0, 0};
  const json& b = j["quantization_config"].value("weight_block_size", json::array({128, 128}));
  auto side = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= (1 << 20); };
  if (!b.is_array() || b.size() != 2 || !side(b[0]) || !side(b[1]))
    input_error("{}: quantization_config weight_block_size {} (expected two positive integers, e.g. [128, 128])",
                path, b.dump());
  return {int(b[0].get<int64_t>()), int(b[1].get<int64_t>())};
}

std::vector<DeckLine> expand_hf_init(const std::vector<DeckLine>& lines) {
  std::vector<DeckLine> out;
  // the keyword values config.json gave, per command, with their key and line
  struct Given {
    std::string kind;
    std::map<std::string, std::pair<std::string, std::string>> values;  // keyword -> (value, key)
  };
  std::map<std::string, Given> given;
  std::string config;  // the config.json of the init line, once one was read
  for (const DeckLine& line : lines) {
    const auto& w = line.words;
    const std::string where = fmt::format("{}:{}", line.file, line.line);
    // `expanded yes`: the lines below are config.json's already (a checkpoint's resolved deck)
    const auto said = std::find(w.begin(), w.end(), "expanded");
    const bool expanded = said != w.end() && said + 1 != w.end() && said[1] == "yes";
    if (w.size() >= 3 && w[0] == "init" && w[1] == "hf" && !expanded) {
      DeckLine init = line;
      init.text += " expanded yes";
      init.words.insert(init.words.end(), {"expanded", "yes"});
      out.push_back(std::move(init));
      int seq = 0;
      for (size_t i = 3; i + 1 < w.size(); i += 2)  // the registry checks the words; seq is needed here
        if (w[i] == "seq") try {
            seq = std::stoi(w[i + 1]);
          } catch (const std::exception&) {
            seq = 0;
          }
      config = (std::filesystem::path(w[2]) / "config.json").string();
      given.clear();
      for (const HfLine& g : hf_model_lines(w[2], seq, where)) {
        std::string text = g.command + (g.kind.empty() ? "" : " " + g.kind);
        Given& record = given[g.command];
        record.kind = g.kind;
        for (const auto& kw : g.keywords) {
          text += " " + kw.name + " " + kw.value;
          if (!kw.key.empty()) record.values[kw.name] = {kw.value, kw.key};
        }
        DeckLine made{config, g.line, text, {}};
        std::istringstream words(text);
        for (std::string word; words >> word;) made.words.push_back(word);
        out.push_back(std::move(made));
      }
      continue;
    }
    if (!w.empty() && given.count(w[0])) {
      const Given& g = given[w[0]];
      const bool kinded = !g.kind.empty();
      if (kinded && (w.size() < 2 || w[1] != g.kind))
        input_error("{}: '{}' changes the {} config.json describes ({} {}) (expected '{} {}' with only what "
                    "config.json does not say)", where, line.text, w[0], w[0], g.kind, w[0], g.kind);
      for (size_t i = kinded ? 2 : 1; i + 1 < w.size(); i += 2) {
        auto it = g.values.find(w[i]);
        if (it == g.values.end()) continue;
        const auto& [value, key] = it->second;
        bool same = value == w[i + 1];
        try {
          same = same || std::stod(value) == std::stod(w[i + 1]);
        } catch (const std::exception&) {
        }
        if (!same)
          input_error("{}: {} {} {} contradicts {}'s {} (it gives {} {}) (expected the model config.json "
                      "describes; set only what it does not say)", where, w[0], w[i], w[i + 1], config, key,
                      w[i], value);
      }
    }
    out.push_back(line);
  }
  return out;
}

}  // namespace xx
