// init hf DIR (src/hf/config.h, src/hf/import.h): config.json onto the deck's
// model lines (mapped, refused by name and line, inert), the deck's later
// lines checked against it, and the tensors read through the layouts that
// differ (Llama's q/k rows, V3's eh_proj columns) and FP8 block scales,
// element range by element range. tests/cli/hf_import.sh runs it end to end.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "deck/deck.h"
#include "hf/config.h"
#include "hf/import.h"
#include "model/params.h"
#include "safetensors_file.h"
#include "temp_dir.h"

using namespace xx;
using xx::test::TempDir;
using json = nlohmann::json;

namespace {

// DeepSeek-V2-Lite's published config.json, key for key as its model card
// gives it (written here from those values; auto_map left out).
json v2_lite() {
  return json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})");
}

std::string write_config(const TempDir& t, const json& config) {
  t.write("model/config.json", config.dump(2));
  return t.file("model");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The generated lines as text, one per line.
std::string lines_text(const std::vector<HfLine>& lines) {
  std::string out;
  for (const auto& l : lines) {
    out += l.command + (l.kind.empty() ? "" : " " + l.kind);
    for (const auto& k : l.keywords) out += " " + k.name + " " + k.value;
    out += "\n";
  }
  return out;
}

// config.json's line of `key` in the file write_config wrote.
int line_of(const json& config, const std::string& key) {
  const std::string text = config.dump(2);
  const size_t at = text.find("\"" + key + "\"");
  return int(std::count(text.begin(), text.begin() + long(at), '\n')) + 1;
}

}  // namespace

TEST_CASE("hf config: DeepSeek-V2-Lite as published is our V2-Lite deck: its YaRN, eps and seq_aux read",
          "[hf][hf_config]") {
  TempDir t;
  json c = v2_lite();
  std::string dir = write_config(t, c);
  // input/deepseek-v2-lite.deck's model, with config.json's own context and init_std, its latent norms at
  // HF's 1e-6, its sequence-wise balance loss (seq_aux true) and its YaRN
  CHECK(lines_text(hf_model_lines(dir, 4096, "deck:1")) ==
        "model deepseek vocab 102400 dim 2048 layers 27 heads 16 ffn 10944 seq 4096 rope_theta 10000 norm_eps 1e-06 "
        "init_std 0.02 tie_embeddings no\n"
        "attention mla kv_lora_rank 512 q_lora_rank 0 qk_nope_dim 128 rope_dim 64 v_dim 128 latent_eps 1e-06\n"
        "moe on dense_layers 1 shared 2 routed 64 topk 6 ffn 1408 gate softmax balance aux balance_coef 0.001 "
        "aux_scope sequence route_scale 1 groups 1 topk_groups 1 layer_freq 1\n"
        "mtp depth 0\n"
        "rope_scaling yarn factor 40 original_seq 4096 beta_fast 32 beta_slow 1 mscale 0.707 mscale_all_dim 0.707\n");
  // rms_norm_eps is every other norm's: any value > 0
  c["rms_norm_eps"] = 1e-5;
  dir = write_config(t, c);
  CHECK_THAT(lines_text(hf_model_lines(dir, 0, "deck:1")),
             Catch::Contains("norm_eps 1e-05 ") && Catch::Contains("latent_eps 1e-06"));
}

TEST_CASE("hf config: rope_scaling yarn onto its line, DeepSeek's defaults; what YaRN cannot say, refused",
          "[hf][hf_config]") {
  TempDir t;
  json c = v2_lite();
  c["seq_aux"] = false;
  auto yarn_line = [&](const json& rope, const std::string& key = "rope_scaling") {
    json cfg = c;
    cfg.erase("rope_scaling");
    cfg[key] = rope;
    const auto lines = hf_model_lines(write_config(t, cfg), 0, "deck:1");
    for (const auto& l : lines)
      if (l.command == "rope_scaling") return lines_text({l});
    return std::string("(none)");
  };
  // V3's, and transformers 5's rope_parameters with its theta; left out: beta 32 and 1, mscale 1, mscale_all_dim 0
  CHECK(yarn_line({{"type", "yarn"}, {"factor", 40}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}, {"beta_fast", 32},
                   {"beta_slow", 1}, {"original_max_position_embeddings", 4096}}) ==
        "rope_scaling yarn factor 40 original_seq 4096 beta_fast 32 beta_slow 1 mscale 1 mscale_all_dim 1\n");
  CHECK(yarn_line({{"rope_type", "yarn"}, {"factor", 4.5}, {"original_max_position_embeddings", 256},
                   {"rope_theta", 500.0}, {"truncate", true}}, "rope_parameters") ==
        "rope_scaling yarn factor 4.5 original_seq 256 beta_fast 32 beta_slow 1 mscale 1 mscale_all_dim 0\n");
  CHECK(yarn_line({{"rope_type", "default"}}) == "(none)");
  CHECK(yarn_line(nullptr) == "(none)");
  {  // theta from rope_parameters; each value's key kept, for the deck's later lines
    json cfg = c;
    cfg.erase("rope_scaling");
    cfg["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64},
                              {"rope_theta", 500.0}};
    const auto lines = hf_model_lines(write_config(t, cfg), 0, "deck:1");
    CHECK_THAT(lines_text(lines), Catch::Contains("rope_theta 500 "));
    REQUIRE(lines.back().command == "rope_scaling");
    CHECK(lines.back().keywords[1].key == "rope_parameters.original_max_position_embeddings");
  }
  // attention_factor: accepted where it equals mscale(f, mscale) / mscale(f, mscale_all_dim)
  const double ratio = (0.1 * 1.0 * std::log(4.0) + 1) / (0.1 * 0.5 * std::log(4.0) + 1);
  CHECK_THAT(yarn_line({{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64},
                        {"mscale_all_dim", 0.5}, {"attention_factor", ratio}}),
             Catch::StartsWith("rope_scaling yarn factor 4 "));
  struct Bad {
    json rope;
    std::string says;
  };
  for (const Bad& b : std::vector<Bad>{
           {{{"type", "linear"}, {"factor", 2}}, "rope type 'linear': not built (expected null, rope_type default, "
                                                 "or yarn"},
           {{{"rope_type", "yarn"}, {"original_max_position_embeddings", 64}}, "'rope_scaling' has no 'factor'"},
           {{{"type", "yarn"}, {"factor", 4}}, "no 'original_max_position_embeddings' (expected it with rope type "
                                               "yarn: DeepSeek's code defaults it to 4096"},
           {{{"type", "yarn"}, {"factor", 0}, {"original_max_position_embeddings", 64}}, "'factor': 0 (expected a "
                                                                                         "number > 0)"},
           {{{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64.5}},
            "'original_max_position_embeddings': 64.5 (expected an integer >= 2)"},
           {{{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}, {"beta_fast", 1},
             {"beta_slow", 2}}, "beta_fast 1 and beta_slow 2 (expected beta_fast > beta_slow > 0)"},
           {{{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}, {"truncate", false}},
            "'truncate': false"},
           {{{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}, {"attention_factor", 1.5}},
            "the factor 1.5 (its attention_factor)"},
           {{{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}, {"mscale", 0.5}},
            "(transformers' reading, with mscale or mscale_all_dim 0)"},
           {{{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}, {"low_freq_factor", 1}},
            "'rope_scaling' has 'low_freq_factor': 1 (expected only rope_type and rope_theta, and YaRN's"},
           {{{"type", "default"}, {"factor", 4}}, "has 'factor': 4 (expected only rope_type and rope_theta)"},
       }) {
    CAPTURE(b.rope.dump());
    json bad = c;
    bad["rope_scaling"] = b.rope;
    const std::string dir = write_config(t, bad);
    CHECK_THAT(error_of([&] { hf_model_lines(dir, 0, "deck:1"); }),
               Catch::StartsWith(dir + "/config.json:" + std::to_string(line_of(bad, "rope_scaling")) + ": ") &&
                   Catch::Contains(b.says));
  }
  {
    json both = c;
    both["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}};
    const std::string dir = write_config(t, both);
    CHECK_THAT(error_of([&] { hf_model_lines(dir, 0, "deck:1"); }),
               Catch::Contains("both rope_scaling and rope_parameters give YaRN"));
  }
  // Llama's attention never scales its scores: mscale_all_dim refused there, and a YaRN Llama keeps working
  json llama = {{"model_type", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                {"num_attention_heads", 2}, {"intermediate_size", 64}, {"max_position_embeddings", 256},
                {"rms_norm_eps", 1e-5},
                {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64}}}};
  CHECK(lines_text(hf_model_lines(write_config(t, llama), 0, "deck:1")) ==
        "model dense vocab 64 dim 32 layers 2 heads 2 ffn 64 seq 256 rope_theta 10000 norm_eps 1e-05 init_std 0.02 "
        "tie_embeddings no\n"
        "attention mha\nmoe off\nmtp depth 0\n"
        "rope_scaling yarn factor 4 original_seq 64 beta_fast 32 beta_slow 1 mscale 1 mscale_all_dim 0\n");
  llama["rope_scaling"]["mscale_all_dim"] = 1.0;
  llama["rope_scaling"]["mscale"] = 1.0;
  CHECK_THAT(error_of([&] { hf_model_lines(write_config(t, llama), 0, "deck:1"); }),
             Catch::Contains("mscale_all_dim 1 with model_type llama: Llama's attention does not scale its scores"));
}

TEST_CASE("hf config: V3's gate, groups and MTP; every refusal names its key", "[hf][hf_config]") {
  TempDir t;
  json c = v2_lite();
  c.erase("rope_scaling");
  c.update(json{{"model_type", "deepseek_v3"}, {"seq_aux", false}, {"scoring_func", "sigmoid"},
                {"topk_method", "noaux_tc"}, {"norm_topk_prob", true}, {"n_group", 8}, {"topk_group", 4},
                {"num_nextn_predict_layers", 1}, {"routed_scaling_factor", 2.5}});
  std::string dir = write_config(t, c);
  // V3's groups (8, 4 kept) are group-limited routing, now built
  const auto lines = hf_model_lines(dir, 128, "deck:1");
  CHECK_THAT(lines_text(lines), Catch::Contains("gate sigmoid balance bias balance_coef 0.001 seq_aux 0 route_scale 2.5 "
                                                "groups 8 topk_groups 4 layer_freq 1") &&
                                    Catch::Contains("mtp depth 1") && Catch::Contains("seq 128"));
  for (const auto& l : lines)
    for (const auto& k : l.keywords)
      if (k.name == "balance_coef" || k.name == "seq") CHECK(k.key.empty());  // training settings: not config.json's
  struct Bad {
    std::string key;
    json value;
    std::string says;
  };
  for (const Bad& b : std::vector<Bad>{{"norm_topk_prob", false, "xuanxue's sigmoid gate normalises"},
                                       {"topk_method", "greedy", "with scoring_func sigmoid (expected noaux_tc)"},
                                       {"rope_interleave", false, "rope_interleave is false"},
                                       {"moe_layer_freq", 0, "'moe_layer_freq' is 0 (expected an integer >= 1)"},
                                       {"n_group", 3, "n_group 3 does not divide n_routed_experts 64"},
                                       {"n_group", 128, "n_group 128 exceeds 64 (expected n_group <= 64"},
                                       {"n_group", 64, "n_group 64 leaves 1 expert per group (expected at least 2"},
                                       {"topk_group", 9, "topk_group 9 exceeds n_group 8 (expected 1 <= topk_group"},
                                       {"topk_group", 0, "'topk_group' is 0 (expected an integer >= 1)"},
                                       {"num_experts_per_tok", 40, "num_experts_per_tok 40 exceeds the 32 experts of "
                                                                   "topk_group 4 groups of 8"},
                                       {"hidden_act", "gelu", "hidden_act 'gelu'"},
                                       {"vocab_size", -3, "'vocab_size' is -3"},
                                       {"attention_bias", true, "no bias"},
                                       {"quantization_config", json{{"quant_method", "awq"}}, "quant_method fp8"},
                                       {"sliding_window", 4096, "key 'sliding_window' is not one xuanxue reads"}}) {
    CAPTURE(b.key);
    json bad = c;
    bad[b.key] = b.value;
    dir = write_config(t, bad);
    CHECK_THAT(error_of([&] { hf_model_lines(dir, 0, "deck:1"); }),
               Catch::StartsWith(dir + "/config.json:" + std::to_string(line_of(bad, b.key)) + ": ") &&
                   Catch::Contains(b.says));
  }
  t.write("model/config.json", "{\"model_type\": ");
  CHECK_THAT(error_of([&] { hf_model_lines(dir, 0, "deck:1"); }), Catch::Contains("not JSON"));
}

TEST_CASE("hf config: group-limited routing and moe_layer_freq onto the moe line", "[hf][hf_config]") {
  TempDir t;
  // DeepSeek-V2-shaped (V2-Lite's file with the full V2's routing: 160 experts,
  // group_limited_greedy keeping 3 of 8 groups, routed_scaling_factor 16)
  json c = v2_lite();
  c["rope_scaling"] = nullptr;
  c["seq_aux"] = false;
  c.update(json{{"n_routed_experts", 160}, {"n_group", 8}, {"topk_group", 3},
                {"topk_method", "group_limited_greedy"}, {"routed_scaling_factor", 16.0}});
  auto moe_line = [&](const json& config) {
    for (const auto& line : hf_model_lines(write_config(t, config), 0, "deck:1"))
      if (line.command == "moe") return lines_text({line});
    return std::string();
  };
  CHECK(moe_line(c) == "moe on dense_layers 1 shared 2 routed 160 topk 6 ffn 1408 gate softmax balance aux "
                       "balance_coef 0.001 aux_scope batch route_scale 16 groups 8 topk_groups 3 layer_freq 1\n");
  // plain greedy ignores n_group and topk_group, as HF's gate does
  json greedy = c;
  greedy["topk_method"] = "greedy";
  CHECK_THAT(moe_line(greedy), Catch::EndsWith("groups 1 topk_groups 1 layer_freq 1\n"));
  // MoE on every other layer past the first
  json every_other = c;
  every_other["moe_layer_freq"] = 2;
  CHECK_THAT(moe_line(every_other), Catch::EndsWith("groups 8 topk_groups 3 layer_freq 2\n"));
  // V3's class defaults: noaux_tc over 8 groups, 4 kept
  json v3 = c;
  v3.update(json{{"model_type", "deepseek_v3"}, {"scoring_func", "sigmoid"}, {"norm_topk_prob", true},
                 {"n_routed_experts", 256}, {"num_experts_per_tok", 8}, {"first_k_dense_replace", 3}});
  for (const char* key : {"topk_method", "n_group", "topk_group"}) v3.erase(key);
  CHECK_THAT(moe_line(v3), Catch::StartsWith("moe on dense_layers 3 shared 2 routed 256 topk 8 ffn 1408 gate sigmoid "
                                             "balance bias") &&
                               Catch::EndsWith("groups 8 topk_groups 4 layer_freq 1\n"));

  // the expanded deck builds the model with them; a later line may repeat them, not change them
  const std::string dir = write_config(t, every_other);
  auto expand = [&](const std::string& text) { return expand_hf_init(read_deck(t.write("g.deck", text), {})); };
  const Program p = build_program(expand("init hf " + dir + " seq 64\ndata bytes x.txt\nrun 1\n"), false);
  const MoeConfig& moe = p.phases[0].config.model.moe;
  CHECK((moe.groups == 8 && moe.kept_groups() == 3 && moe.layer_freq == 2));
  std::vector<int> moe_blocks;
  for (int l = 0; l < 8; ++l)
    if (moe.is_moe_layer(l)) moe_blocks.push_back(l);
  CHECK(moe_blocks == std::vector<int>{2, 4, 6});
  CHECK(expand("init hf " + dir + "\nmoe on groups 8 topk_groups 3 layer_freq 2\ndata bytes x.txt\nrun 1\n").size() ==
        8);
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nmoe on topk_groups 4\ndata bytes x.txt\nrun 1\n"); }),
             Catch::Contains("moe topk_groups 4 contradicts " + dir + "/config.json's topk_group (it gives "
                             "topk_groups 3)"));
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nmoe on layer_freq 1\ndata bytes x.txt\nrun 1\n"); }),
             Catch::Contains("config.json's moe_layer_freq (it gives layer_freq 2)"));
  // greedy's groups come from topk_method: a deck line cannot add groups HF's model does not route with
  const std::string plain = write_config(t, greedy);
  CHECK_THAT(error_of([&] { expand("init hf " + plain + "\nmoe on groups 4\ndata bytes x.txt\nrun 1\n"); }),
             Catch::Contains("config.json's topk_method (it gives groups 1)"));
}

TEST_CASE("hf config: expand_hf_init puts the lines under the init, once, and checks the deck's own",
          "[hf][hf_config]") {
  TempDir t;
  json c = v2_lite();
  c["rope_scaling"] = nullptr;
  c["seq_aux"] = false;
  const std::string dir = write_config(t, c);
  auto expand = [&](const std::string& text) { return expand_hf_init(read_deck(t.write("ft.deck", text), {})); };
  const std::string deck = "init hf " + dir + " seq 64\nmoe on ep 8\nmtp weight 0.5\ndata bytes x.txt\nrun 1\n";
  const auto lines = expand(deck);
  REQUIRE(lines.size() == 9);
  CHECK(lines[0].text == "init hf " + dir + " seq 64 expanded yes");
  CHECK(lines[1].file == dir + "/config.json");
  CHECK(lines[1].line == line_of(c, "vocab_size"));
  CHECK(lines[1].words[0] == "model");
  CHECK(lines[5].text == "moe on ep 8");
  const Program p = build_program(lines, false);
  const ModelConfig& m = p.phases[0].config.model;
  CHECK((m.dim == 2048 && m.seq == 64 && m.moe.routed == 64 && m.moe.ep == 8 && m.mtp.weight == 0.5));
  // the resolved deck is not expanded again (DIR may be gone)
  CHECK(expand_hf_init(lines).size() == lines.size());
  // a deck line may repeat config.json's values, not change them
  CHECK(expand("init hf " + dir + "\nmoe on routed 64 ep 8\ndata bytes x.txt\nrun 1\n").size() == 8);
  const std::string deck_file = t.file("ft.deck");
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nmoe on routed 32\ndata bytes x.txt\nrun 1\n"); }),
             Catch::StartsWith(deck_file + ":2: moe routed 32 contradicts " + dir +
                               "/config.json's n_routed_experts (it gives routed 64)"));
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nattention mha\ndata bytes x.txt\nrun 1\n"); }),
             Catch::StartsWith(deck_file + ":2: 'attention mha' changes the attention config.json describes"));
  CHECK_THAT(error_of([&] { expand("init hf " + t.file("nowhere") + "\nrun 1\n"); }),
             Catch::StartsWith(deck_file + ":1: cannot read " + t.file("nowhere") + "/config.json"));
  // config.json without rope scaling says nothing of it: a fine-tune may extend the context with YaRN
  const Program extended = build_program(
      expand("init hf " + dir + "\nrope_scaling yarn factor 4 original_seq 4096\ndata bytes x.txt\nrun 1\n"), false);
  CHECK((extended.phases[0].config.model.rope_scaling.yarn() &&
         extended.phases[0].config.model.rope_scaling.factor == 4));
  // HF's latent eps is the model's: a deck line may not change it
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nattention mla latent_eps 1e-5\ndata bytes x.txt\nrun 1\n"); }),
             Catch::StartsWith(deck_file + ":2: attention latent_eps 1e-5 contradicts " + dir + "/config.json's"));
}

TEST_CASE("hf config: config.json's YaRN is the model's: repeated, not changed; latent_eps and norm_eps apart",
          "[hf][hf_config]") {
  TempDir t;
  json c = v2_lite();
  c["seq_aux"] = false;
  c["rms_norm_eps"] = 1e-5;
  const std::string dir = write_config(t, c);
  auto expand = [&](const std::string& text) { return expand_hf_init(read_deck(t.write("ft.deck", text), {})); };
  const auto lines = expand("init hf " + dir + " seq 64\nrope_scaling yarn mscale 0.707\ndata bytes x.txt\nrun 1\n");
  REQUIRE(lines.size() == 9);
  CHECK(lines[5].text ==
        "rope_scaling yarn factor 40 original_seq 4096 beta_fast 32 beta_slow 1 mscale 0.707 mscale_all_dim 0.707");
  CHECK(lines[5].line == line_of(c, "rope_scaling"));
  const ModelConfig m = build_program(lines, false).phases[0].config.model;
  CHECK((m.rope_scaling.yarn() && m.rope_scaling.factor == 40 && m.rope_scaling.original_seq == 4096 &&
         m.rope_scaling.mscale == 0.707 && m.rope_scaling.mscale_all_dim == 0.707));
  CHECK((m.norm_eps == 1e-5 && m.attention.latent_eps == 1e-6 && m.latent_eps() == 1e-6));
  const std::string deck_file = t.file("ft.deck");
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nrope_scaling yarn factor 8\ndata bytes x.txt\nrun 1\n"); }),
             Catch::StartsWith(deck_file + ":2: rope_scaling factor 8 contradicts " + dir +
                               "/config.json's rope_scaling.factor (it gives factor 40)"));
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nrope_scaling off\ndata bytes x.txt\nrun 1\n"); }),
             Catch::StartsWith(deck_file + ":2: 'rope_scaling off' changes the rope_scaling config.json describes"));
}

TEST_CASE("hf config: seq_aux is the sequence-wise balance loss under either gate, aux_loss_alpha its alpha",
          "[hf][hf_config]") {
  TempDir t;
  // V2-Lite and a V3-shaped config as published (seq_aux true): what refuses them is not seq_aux
  json v2 = v2_lite();
  json v3 = v2_lite();
  v3.update(json{{"model_type", "deepseek_v3"}, {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"},
                 {"norm_topk_prob", true}, {"n_group", 8}, {"topk_group", 4}, {"num_nextn_predict_layers", 1},
                 {"routed_scaling_factor", 2.5}});
  for (const json* published : {&v2, &v3}) {
    const std::string error = error_of([&] { hf_model_lines(write_config(t, *published), 0, "deck:1"); });
    CAPTURE(error);
    CHECK(error.find("seq_aux") == std::string::npos);
    CHECK(error.find("sequence-wise") == std::string::npos);
  }
  // the moe line each gate's seq_aux and aux_loss_alpha give (the other keys' refusals set aside)
  auto moe_line = [&](json c, bool seq_aux, double alpha) {
    c.erase("rope_scaling"), c["topk_group"] = c["n_group"];
    c["seq_aux"] = seq_aux, c["aux_loss_alpha"] = alpha;
    for (const auto& l : hf_model_lines(write_config(t, c), 64, "deck:1"))
      if (l.command == "moe") return lines_text({l});
    return std::string();
  };
  const std::string v2_experts = "moe on dense_layers 1 shared 2 routed 64 topk 6 ffn 1408 ";
  const std::string v2_routing = " groups 1 topk_groups 1 layer_freq 1\n", v3_routing = " groups 8 topk_groups 8 layer_freq 1\n";
  CHECK(moe_line(v2, true, 0.003) ==
        v2_experts + "gate softmax balance aux balance_coef 0.003 aux_scope sequence route_scale 1" + v2_routing);
  CHECK(moe_line(v2, false, 0.003) ==
        v2_experts + "gate softmax balance aux balance_coef 0.003 aux_scope batch route_scale 1" + v2_routing);
  CHECK(moe_line(v3, true, 0.0001) ==
        v2_experts + "gate sigmoid balance bias balance_coef 0.001 seq_aux 0.0001 route_scale 2.5" + v3_routing);
  CHECK(moe_line(v3, false, 0.0001) ==
        v2_experts + "gate sigmoid balance bias balance_coef 0.001 seq_aux 0 route_scale 2.5" + v3_routing);

  // expanded into a deck: the loss it resolves to, and a later line may not change it
  json c = v2;
  c.erase("rope_scaling"), c["aux_loss_alpha"] = 0.003;
  const std::string dir = write_config(t, c);
  auto expand = [&](const std::string& text) { return expand_hf_init(read_deck(t.write("ft.deck", text), {})); };
  const MoeConfig m =
      build_program(expand("init hf " + dir + "\ndata bytes x.txt\nrun 1\n"), false).phases[0].config.model.moe;
  CHECK((m.aux_scope == AuxScope::sequence && m.batch_loss_coef() == 0 && m.sequence_loss_coef() == 0.003));
  CHECK_THAT(error_of([&] { expand("init hf " + dir + "\nmoe on aux_scope batch\ndata bytes x.txt\nrun 1\n"); }),
             Catch::StartsWith(t.file("ft.deck") + ":2: moe aux_scope batch contradicts " + dir +
                               "/config.json's seq_aux (it gives aux_scope sequence)"));
  c["scoring_func"] = "sigmoid", c["topk_method"] = "noaux_tc", c["norm_topk_prob"] = true;
  const std::string v3_dir = write_config(t, c);
  CHECK_THAT(error_of([&] { expand("init hf " + v3_dir + "\nmoe on seq_aux 0.5\ndata bytes x.txt\nrun 1\n"); }),
             Catch::StartsWith(t.file("ft.deck") + ":2: moe seq_aux 0.5 contradicts " + v3_dir +
                               "/config.json's aux_loss_alpha (it gives seq_aux 0.003)"));
}

namespace {

using Entry = xx::test::StEntry;
void write_safetensors(const std::string& path, const std::vector<Entry>& entries) {
  xx::test::write_bytes(path, xx::test::safetensors_bytes(entries));
}
std::string f32(const std::vector<float>& v) { return xx::test::raw_bytes(v); }

// An HF value per element that says where it came from: tensor k, row r, column c.
float tag(int k, int64_t r, int64_t c) { return float(k * 10000 + r * 100 + c); }

}  // namespace

TEST_CASE("hf import: Llama's q/k rows and V3's eh_proj columns come back in our order; FP8 blocks scale",
          "[hf][hf_import]") {
  TempDir t;
  // Llama: 1 layer, dim 8, 2 heads (head_dim 4), ffn 4, vocab 6
  ModelConfig m;
  m.vocab = 6, m.dim = 8, m.layers = 1, m.heads = 2, m.ffn = 4, m.seq = 4;
  const Frame frame = whole_frame(ParamLayout(m));
  std::vector<Entry> entries;
  int k = 0;
  std::map<std::string, int> tags;
  // the HF names are import's own mapping: checked by name below for the ones that matter
  const std::map<std::string, std::string> hf = {
      {"embed", "model.embed_tokens.weight"}, {"norm", "model.norm.weight"}, {"head", "lm_head.weight"},
      {"layers.0.attn_norm", "model.layers.0.input_layernorm.weight"},
      {"layers.0.attn.wq", "model.layers.0.self_attn.q_proj.weight"},
      {"layers.0.attn.wk", "model.layers.0.self_attn.k_proj.weight"},
      {"layers.0.attn.wv", "model.layers.0.self_attn.v_proj.weight"},
      {"layers.0.attn.wo", "model.layers.0.self_attn.o_proj.weight"},
      {"layers.0.ffn_norm", "model.layers.0.post_attention_layernorm.weight"},
      {"layers.0.ffn.w1", "model.layers.0.mlp.gate_proj.weight"},
      {"layers.0.ffn.w3", "model.layers.0.mlp.up_proj.weight"},
      {"layers.0.ffn.w2", "model.layers.0.mlp.down_proj.weight"}};
  REQUIRE(frame.size() == hf.size());
  for (const auto& ft : frame) {
    const int64_t rows = ft.shape.size() == 2 ? ft.shape[0] : 1, cols = ft.shape.size() == 2 ? ft.shape[1] : ft.size;
    std::vector<float> v(size_t(ft.size));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v[size_t(r * cols + c)] = tag(k, r, c);
    tags[ft.name] = k++;
    entries.push_back({hf.at(ft.name), "F32", ft.shape, f32(v)});
  }
  t.write("llama/config.json", "{}");
  write_safetensors(t.file("llama/model.safetensors"), entries);
  const HfWeights w(t.file("llama"), m, frame);
  for (const auto& ft : frame) CHECK(hf_tensor_name(m, ft.name) == hf.at(ft.name));
  for (const auto& ft : frame) {
    CAPTURE(ft.name);
    const int64_t cols = ft.shape.size() == 2 ? ft.shape[1] : ft.size;
    // read in odd ranges: every element once, across row ends
    std::vector<float> got(size_t(ft.size));
    for (int64_t at = 0; at < ft.size; at += 3) w.read(ft, at, std::min<int64_t>(3, ft.size - at), got.data() + at);
    const bool permuted = ft.name.ends_with("attn.wq") || ft.name.ends_with("attn.wk");
    for (int64_t i = 0; i < ft.size; ++i) {
      const int64_t r = i / cols, c = i % cols;
      // our row 2p + s of a head of 4 rows is HF's row s * 2 + p
      const int64_t head = r / 4, within = r % 4;
      const int64_t hf_row = permuted ? head * 4 + (within % 2) * 2 + within / 2 : r;
      if (got[size_t(i)] != tag(tags[ft.name], hf_row, c)) {
        FAIL_CHECK("element " << i << ": " << got[size_t(i)] << ", expected HF row " << hf_row << " column " << c);
        break;
      }
    }
  }

  // DeepSeek-V3-shaped with MTP depth 1 and the selection bias, every 2-D
  // weight in FP8 with 4x4 blocks: element (r, c) of HF's tensor is code
  // (r * cols + c) % 100 + 1 times its block's scale; the MTP eh_proj (8 x 16)
  // holds our columns [8..15 | 0..7]
  ModelConfig d = m;
  d.kind = ModelKind::deepseek;
  d.attention.kind = AttentionKind::mla;
  d.attention.kv_lora_rank = 4, d.attention.q_lora_rank = 0, d.attention.qk_nope_dim = 2;
  d.attention.rope_dim = 2, d.attention.v_dim = 2;
  d.moe.mode = MoeMode::on, d.moe.dense_layers = 1, d.moe.routed = 2, d.moe.topk = 1, d.moe.ffn = 4;
  d.moe.shared = 0, d.moe.gate = Gate::sigmoid, d.moe.balance = Balance::bias;
  d.mtp.depth = 1;
  const Frame dframe = whole_frame(ParamLayout(d));
  auto code = [](int64_t r, int64_t c, int64_t cols) { return uint8_t((r * cols + c) % 100 + 1); };
  auto scale = [](int64_t br, int64_t bc) { return float(1 + br * 10 + bc); };
  std::vector<Entry> v3;
  k = 0;
  tags.clear();
  for (const auto& ft : dframe) {
    const std::string name = hf_tensor_name(d, ft.name);
    if (ft.shape.size() == 1) {
      std::vector<float> v(size_t(ft.size));
      for (int64_t c = 0; c < ft.size; ++c) v[size_t(c)] = tag(k, 0, c);
      tags[ft.name] = k++;
      v3.push_back({name, "F32", ft.shape, f32(v)});
      continue;
    }
    const int64_t rows = ft.shape[0], cols = ft.shape[1];
    std::string q(size_t(ft.size), '\0');
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) q[size_t(r * cols + c)] = char(code(r, c, cols));
    std::vector<float> s(size_t(((rows + 3) / 4) * ((cols + 3) / 4)));
    for (int64_t br = 0; br < (rows + 3) / 4; ++br)
      for (int64_t bc = 0; bc < (cols + 3) / 4; ++bc) s[size_t(br * ((cols + 3) / 4) + bc)] = scale(br, bc);
    v3.push_back({name, "F8_E4M3", ft.shape, q});
    v3.push_back({name + "_scale_inv", "F32", {(rows + 3) / 4, (cols + 3) / 4}, f32(s)});
  }
  v3.push_back({"model.layers.1.mlp.gate.e_score_correction_bias", "F32", {2}, f32({0.25f, -0.5f})});
  // the MTP layer's copies of the shared embedding and head are not ours: left alone
  v3.push_back({"model.layers.1.embed_tokens.weight", "F32", {6, 8}, f32(std::vector<float>(48, 7.0f))});
  v3.push_back({"model.layers.1.shared_head.head.weight", "F32", {6, 8}, f32(std::vector<float>(48, 7.0f))});
  t.write("v3/config.json", R"({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                 "weight_block_size": [4, 4]}})");
  write_safetensors(t.file("v3/model.safetensors"), v3);
  const HfWeights w3(t.file("v3"), d, dframe);
  CHECK_THAT(w3.summary(), Catch::Contains("FP8 dequantized with 4x4 weight_scale_inv blocks"));
  CHECK(w3.selection_bias("mtp.0.") == std::vector<float>{0.25f, -0.5f});
  CHECK(hf_tensor_name(d, "mtp.0.proj") == "model.layers.1.eh_proj.weight");
  CHECK(hf_tensor_name(d, "mtp.0.attn.wkv_a") == "model.layers.1.self_attn.kv_a_proj_with_mqa.weight");
  CHECK(hf_tensor_name(d, "mtp.0.ffn.experts.1.w2") == "model.layers.1.mlp.experts.1.down_proj.weight");
  for (const auto& ft : dframe) {
    CAPTURE(ft.name);
    std::vector<float> got(size_t(ft.size));
    for (int64_t at = 0; at < ft.size; at += 5) w3.read(ft, at, std::min<int64_t>(5, ft.size - at), got.data() + at);
    const int64_t cols = ft.shape.size() == 2 ? ft.shape[1] : ft.size;
    const bool swapped = ft.name == "mtp.0.proj";
    for (int64_t i = 0; i < ft.size; ++i) {
      const int64_t r = i / cols, c = i % cols, hc = swapped ? (c + cols / 2) % cols : c;
      const float want = ft.shape.size() == 1 ? tag(tags[ft.name], 0, c)
                                              : f8_e4m3_to_float(code(r, hc, cols)) * scale(r / 4, hc / 4);
      if (std::memcmp(&got[size_t(i)], &want, 4) != 0) {
        FAIL_CHECK("element " << i << ": " << got[size_t(i)] << ", expected " << want);
        break;
      }
    }
  }

  // the files must be the model's: a tensor more, a scale missing
  auto refused = [&](std::vector<Entry> entries) {
    write_safetensors(t.file("v3/model.safetensors"), entries);
    return error_of([&] { HfWeights(t.file("v3"), d, dframe); });
  };
  std::vector<Entry> more = v3;
  more.push_back({"model.layers.0.mlp.extra.weight", "F32", {1}, f32({1.0f})});
  CHECK_THAT(refused(more), Catch::Contains("tensor 'model.layers.0.mlp.extra.weight' has no place in the model"));
  std::vector<Entry> unscaled;
  for (const auto& e : v3)
    if (e.name != "model.layers.0.self_attn.o_proj.weight_scale_inv") unscaled.push_back(e);
  CHECK_THAT(refused(unscaled), Catch::Contains("FP8 tensor 'model.layers.0.self_attn.o_proj.weight' has no "
                                               "'model.layers.0.self_attn.o_proj.weight_scale_inv'"));
  std::vector<Entry> no_bias;
  for (const auto& e : v3)
    if (e.name.find("e_score_correction_bias") == std::string::npos) no_bias.push_back(e);
  CHECK_THAT(refused(no_bias), Catch::Contains("no tensor 'model.layers.1.mlp.gate.e_score_correction_bias'"));
}

TEST_CASE("hf config: the published DeepSeek-V2-Lite and V3 config.json (tests/data/hf_configs) expand in full",
          "[hf][hf_config]") {
  const std::string data = std::string(XX_SOURCE_DIR) + "/tests/data/hf_configs/";
  // V2-Lite: the file expands as the values the first test case writes (its published ones)
  TempDir t;
  CHECK(lines_text(hf_model_lines(data + "deepseek-v2-lite", 4096, "deck:1")) ==
        lines_text(hf_model_lines(write_config(t, v2_lite()), 4096, "deck:1")));
  // V3: the query latent, 256 experts top-8 in 4 of 8 groups (noaux_tc, sigmoid with the bias), the
  // sequence-wise loss beside it, MTP depth 1, YaRN, FP8 weights in 128 x 128 blocks
  const std::string v3 = data + "deepseek-v3";
  CHECK(lines_text(hf_model_lines(v3, 4096, "deck:1")) ==
        "model deepseek vocab 129280 dim 7168 layers 61 heads 128 ffn 18432 seq 4096 rope_theta 10000 norm_eps 1e-06 "
        "init_std 0.02 tie_embeddings no\n"
        "attention mla kv_lora_rank 512 q_lora_rank 1536 qk_nope_dim 128 rope_dim 64 v_dim 128 latent_eps 1e-06\n"
        "moe on dense_layers 3 shared 1 routed 256 topk 8 ffn 2048 gate sigmoid balance bias balance_coef 0.001 "
        "seq_aux 0.001 route_scale 2.5 groups 8 topk_groups 4 layer_freq 1\n"
        "mtp depth 1\n"
        "rope_scaling yarn factor 40 original_seq 4096 beta_fast 32 beta_slow 1 mscale 1 mscale_all_dim 1\n");
  CHECK(hf_fp8_block(v3) == std::pair<int, int>{128, 128});
}
