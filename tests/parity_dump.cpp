// Writes what the PyTorch reference (tools/torch_reference.py) checks us
// against: a checkpoint of a randomly initialised model (through the real
// checkpoint writer), and for one fixed batch our loss and every gradient.
//   parity_dump OUT_DIR  ->  OUT_DIR/ckpt/step_00000000.h5, OUT_DIR/grads.h5
#include <hdf5.h>
#include <mpi.h>
#include <cstdio>
#include <string>
#include <vector>
#include <Kokkos_Core.hpp>
#include "ckpt/checkpoint.h"
#include "model/transformer.h"

using namespace xx;

static void write_dataset(hid_t loc, const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
                          const void* data) {
  hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t ds = H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
  H5Sclose(space);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: parity_dump OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    // seq 80 spans a full and a partial attention block; ffn is not a multiple of dim.
    ModelConfig m;
    m.vocab = 256, m.dim = 64, m.layers = 2, m.heads = 4, m.ffn = 96, m.seq = 80, m.rope_theta = 10000.0;
    const int B = 3;
    const std::string deck = "model dense vocab 256 dim 64 layers 2 heads 4 ffn 96 seq 80 rope_theta 10000 norm_eps 1e-5";
    Transformer<float> model(m, B);
    model.init(2024);
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
    const double loss = model.forward(ti, tt).total;
    model.zero_grads();
    model.backward(ti, tt);

    CheckpointData data;
    auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params());
    data.params.assign(hp.data(), hp.data() + hp.extent(0));
    data.adam_m.assign(data.params.size(), 0.0f);
    data.adam_v.assign(data.params.size(), 0.0f);
    data.deck = deck;
    const std::string ckpt = write_checkpoint(out + "/ckpt", model.layout(), data);

    auto hg = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.grads());
    hid_t f = H5Fcreate((out + "/grads.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const std::vector<hsize_t> tok_dims = {hsize_t(B), hsize_t(m.seq)};
    write_dataset(f, "inputs", H5T_NATIVE_INT32, tok_dims, in.data());
    write_dataset(f, "targets", H5T_NATIVE_INT32, tok_dims, tgt.data());
    write_dataset(f, "loss", H5T_NATIVE_DOUBLE, {1}, &loss);
    hid_t g = H5Gcreate2(f, "grads", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (const auto& t : model.layout().tensors())
      write_dataset(g, t.name, H5T_NATIVE_FLOAT, std::vector<hsize_t>(t.shape.begin(), t.shape.end()),
                    hg.data() + t.offset);
    H5Gclose(g);
    H5Fclose(f);
    std::printf("loss %.8f\ncheckpoint %s\ngradients %s/grads.h5\n", loss, ckpt.c_str(), out.c_str());
  }
  MPI_Finalize();
  return 0;
}
