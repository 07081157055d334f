// Writes what the PyTorch reference (tools/torch_reference.py) checks us
// against: a checkpoint of a randomly initialised model of one named
// architecture (through the real checkpoint writer, deck lines and MoE
// selection biases included), and for one fixed batch our loss, its balance
// part (aux) and every gradient.
//   parity_dump OUT_DIR CONFIG [PRECISION]  ->  OUT_DIR/ckpt/step_00000000.h5, OUT_DIR/grads.h5
// CONFIG: dense | mla | mla_qlora | moe_aux | moe_bias | deepseek | moe_groups | moe_bias_groups | mla_yarn |
//         dense_yarn | moe_seq_aux | moe_bias_seq_aux | tied | deepseek_tied
// PRECISION: fp32 (default) | bf16 | fp16: what the GEMM operands are; the
// deck attribute says so, and the reference widens its tolerances to it.
#include <hdf5.h>
#include <mpi.h>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include <Kokkos_Core.hpp>
#include "core/device_memory.h"
#include "ckpt/checkpoint.h"
#include "deck/deck.h"
#include "kernels/elementwise.h"
#include "model/transformer.h"

using namespace xx;

namespace {

// seq 80 spans a full and a partial attention block; ffn is not a multiple of dim.
const std::string kModelDense = "model dense vocab 256 dim 64 layers 2 heads 4 ffn 96 seq 80 rope_theta 10000 norm_eps 1e-5";
const std::string kModelDeepseek =
    "model deepseek vocab 256 dim 64 layers 2 heads 4 ffn 96 seq 80 rope_theta 10000 norm_eps 1e-5";
const std::string kMla = "attention mla kv_lora_rank 32 q_lora_rank 0 qk_nope_dim 16 rope_dim 8 v_dim 16";
const std::string kMlaQ = "attention mla kv_lora_rank 32 q_lora_rank 24 qk_nope_dim 16 rope_dim 8 v_dim 16";
const std::string kMoeAux =
    "moe on dense_layers 1 shared 1 routed 8 topk 2 ffn 32 gate softmax balance aux balance_coef 0.01";
const std::string kMoeBias =
    "moe on dense_layers 1 shared 2 routed 8 topk 2 ffn 32 gate sigmoid balance bias balance_coef 0.001 "
    "route_scale 1.5";
// The sequence-wise balance loss: V2's (softmax, in place of the batch-level
// loss; alpha large enough that the loss and the gate gradients see it) and
// V3's beside the selection bias (with MTP, whose blocks route too).
const std::string kMoeSeqAux =
    "moe on dense_layers 1 shared 1 routed 8 topk 2 ffn 32 gate softmax balance aux balance_coef 0.1 "
    "aux_scope sequence";
const std::string kMoeBiasSeqAux =
    "moe on dense_layers 1 shared 2 routed 8 topk 2 ffn 32 gate sigmoid balance bias balance_coef 0.001 "
    "seq_aux 0.01 route_scale 1.5";
const std::string kMtp = "mtp depth 2 weight 0.3";
// Group-limited routing. Softmax (V2's group_limited_greedy, a group ranked by
// its largest score): only a top-k wider than the kept groups can differ from
// the plain top-k, so topk 3 from 2 of 4 groups. layer_freq 2 over 3 layers and
// MTP depth 2: blocks 0 (dense_layers) and 1, 3 (odd) dense, blocks 2 and 4 MoE.
const std::string kModelDeepseek3 =
    "model deepseek vocab 256 dim 64 layers 3 heads 4 ffn 96 seq 80 rope_theta 10000 norm_eps 1e-5";
const std::string kMoeGroups =
    "moe on dense_layers 1 shared 1 routed 8 topk 3 ffn 32 gate softmax balance aux balance_coef 0.01 groups 4 "
    "topk_groups 2 layer_freq 2";
// Sigmoid with the selection bias (V3's noaux_tc, a group ranked by its two
// largest score + bias): 2 of 4 groups of 2.
const std::string kMoeBiasGroups =
    "moe on dense_layers 1 shared 2 routed 8 topk 2 ffn 32 gate sigmoid balance bias balance_coef 0.001 "
    "route_scale 1.5 groups 4 topk_groups 2";
// YaRN with a ramp inside the rotary width: MLA's 8 rope pairs keep their
// frequency below pair 2, are divided by 4 from pair 6 (beta 0.5 and 0.02
// over 64 positions), the tables times mscale(4, 1) / mscale(4, 0.8) = 1.025,
// the scores times mscale(4, 0.8)^2 = 1.23; the latent norms at HF's 1e-6,
// the others at 1e-5.
const std::string kMlaYarn =
    "attention mla kv_lora_rank 32 q_lora_rank 24 qk_nope_dim 16 rope_dim 16 v_dim 16 latent_eps 1e-6";
const std::string kYarnRamp = "rope_scaling yarn factor 4 original_seq 64 beta_fast 0.5 beta_slow 0.02 mscale 1 "
                              "mscale_all_dim 0.8";
// MHA's 8 pairs of head_dim 16 with DeepSeek's defaults (beta 32 and 1,
// mscale 1, mscale_all_dim 0): at theta 50 the ramp spans pairs 0 to 5; the
// tables times mscale(4, 1) = 1.14, the scores unchanged.
const std::string kModelDenseYarn =
    "model dense vocab 256 dim 64 layers 2 heads 4 ffn 96 seq 80 rope_theta 50 norm_eps 1e-5";
const std::string kYarnDefaults = "rope_scaling yarn factor 4 original_seq 64";

// Tied embeddings: the head is the embedding (its gradient sums both uses);
// dense, and DeepSeek with MoE and MTP, whose depths share that head too.
const std::string kTied = " tie_embeddings yes";

// The architecture lines of each configuration, in deck syntax.
const std::map<std::string, std::vector<std::string>> kConfigs = {
    {"dense", {kModelDense}},
    {"mla", {kModelDeepseek, kMla}},
    {"mla_qlora", {kModelDeepseek, kMlaQ}},
    {"moe_aux", {kModelDeepseek, kMla, kMoeAux}},
    {"moe_bias", {kModelDeepseek, kMla, kMoeBias}},
    {"deepseek", {kModelDeepseek, kMla, kMoeAux, kMtp}},
    {"moe_groups", {kModelDeepseek3, kMla, kMoeGroups, kMtp}},
    {"moe_bias_groups", {kModelDeepseek, kMla, kMoeBiasGroups}},
    {"mla_yarn", {kModelDeepseek, kMlaYarn, kYarnRamp}},
    {"dense_yarn", {kModelDenseYarn, kYarnDefaults}},
    {"moe_seq_aux", {kModelDeepseek, kMla, kMoeSeqAux}},
    {"moe_bias_seq_aux", {kModelDeepseek, kMla, kMoeBiasSeqAux, kMtp}},
    {"tied", {kModelDense + kTied}},
    {"deepseek_tied", {kModelDeepseek + kTied, kMla, kMoeAux, kMtp}},
};

void write_dataset(hid_t loc, const std::string& name, hid_t type, const std::vector<hsize_t>& dims, const void* data) {
  hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t ds = H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
  H5Sclose(space);
}

// The model the deck lines describe, through the real deck parser (so the
// checkpoint's deck and the model we run cannot drift apart).
ModelConfig parse_model(const std::vector<std::string>& arch) {
  std::vector<std::string> text = arch;
  text.push_back("data bytes /dev/null");
  text.push_back("run 1");
  std::vector<DeckLine> lines;
  for (size_t i = 0; i < text.size(); ++i) {
    DeckLine l;
    l.file = "parity_dump";
    l.line = int(i + 1);
    l.text = text[i];
    std::istringstream in(text[i]);
    for (std::string w; in >> w;) l.words.push_back(w);
    lines.push_back(std::move(l));
  }
  return build_program(lines, false).phases.front().config.model;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string precision = argc > 3 ? argv[3] : "fp32";
  if (argc < 3 || argc > 4 || !kConfigs.count(argv[2]) ||
      (precision != "fp32" && precision != "bf16" && precision != "fp16")) {
    std::string names;
    for (const auto& [name, lines] : kConfigs) names += (names.empty() ? "" : " | ") + name;
    std::fprintf(stderr, "usage: parity_dump OUT_DIR CONFIG [fp32|bf16|fp16]\n  CONFIG: %s\n", names.c_str());
    MPI_Finalize();
    return 2;
  }
  const std::string out = argv[1], name = argv[2];
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const auto& arch = kConfigs.at(name);
    const ModelConfig m = parse_model(arch);
    std::string deck;
    for (const auto& line : arch) deck += line + "\n";
    deck += "precision " + precision + "\n";
    const int B = 3;
    Transformer<float> model(m, B, *mode_from_name<Precision>(precision));
    model.init(2024);

    // Selection biases: non-zero and distinct in bias mode, so that top-k
    // selection really depends on them; zero (as trained) otherwise.
    CheckpointData data;
    int layer_index = 0;
    for (auto& [prefix, ffn] : model.moe_layers()) {
      auto bias = xx::host_staging(ffn->bias());
      for (int64_t e = 0; e < int64_t(bias.extent(0)); ++e)
        bias(e) = m.moe.balance == Balance::bias ? float(0.004 * double((5 * e + 3 * layer_index) % 8) - 0.014) : 0.0f;
      Kokkos::deep_copy(ffn->bias(), bias);
      data.buffers[prefix + "ffn.gate_bias"].assign(bias.data(), bias.data() + bias.extent(0));
      ++layer_index;
    }

    std::vector<int32_t> in(B * m.seq), tgt(B * m.seq);
    uint64_t x = 7;
    for (size_t i = 0; i < in.size(); ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      in[i] = int32_t((x >> 33) % m.vocab);
      tgt[i] = int32_t((x >> 17) % m.vocab);
    }
    Kokkos::View<int32_t*, MemSpace> din("in", in.size()), dtgt("tgt", tgt.size());
    Kokkos::deep_copy(din, Kokkos::View<int32_t*, Kokkos::HostSpace, Unmanaged>(in.data(), in.size()));
    Kokkos::deep_copy(dtgt, Kokkos::View<int32_t*, Kokkos::HostSpace, Unmanaged>(tgt.data(), tgt.size()));
    Tokens ti(din.data(), din.extent(0)), tt(dtgt.data(), dtgt.extent(0));
    // fp16 as training runs it: the backward starts from the loss times 2^16
    // (else small gradients underflow in fp16), and the gradients are unscaled.
    const double scale = precision == "fp16" ? 65536.0 : 1.0;
    model.set_loss_scale(scale);
    const LossParts parts = model.forward(ti, tt);
    const double loss = parts.total;
    model.zero_grads();
    model.backward(ti, tt);
    if (scale != 1.0) kernels::scale_inplace<float>(Vec<float>(model.grads().data(), model.grads().extent(0)), float(1.0 / scale));

    auto hp = xx::host_copy(model.params());
    data.params.assign(hp.data(), hp.data() + hp.extent(0));
    data.adam_m.assign(data.params.size(), 0.0f);
    data.adam_v.assign(data.params.size(), 0.0f);
    data.deck = deck;
    const std::string ckpt = write_checkpoint(out + "/ckpt", whole_frame(model.layout()), data);

    auto hg = xx::host_copy(model.grads());
    hid_t f = H5Fcreate((out + "/grads.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const std::vector<hsize_t> tok_dims = {hsize_t(B), hsize_t(m.seq)};
    write_dataset(f, "inputs", H5T_NATIVE_INT32, tok_dims, in.data());
    write_dataset(f, "targets", H5T_NATIVE_INT32, tok_dims, tgt.data());
    write_dataset(f, "loss", H5T_NATIVE_DOUBLE, {1}, &loss);
    write_dataset(f, "aux", H5T_NATIVE_DOUBLE, {1}, &parts.aux);  // the balance loss alone
    hid_t g = H5Gcreate2(f, "grads", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (const auto& t : model.layout().tensors())
      write_dataset(g, t.name, H5T_NATIVE_FLOAT, std::vector<hsize_t>(t.shape.begin(), t.shape.end()),
                    hg.data() + t.offset);
    H5Gclose(g);
    H5Fclose(f);
    std::printf("config %s\nloss %.8f (main %.8f mtp %.8f aux %.8f)\ncheckpoint %s\ngradients %s/grads.h5\n",
                name.c_str(), loss, parts.main, parts.mtp, parts.aux, ckpt.c_str(), out.c_str());
  }
  MPI_Finalize();
  return 0;
}
