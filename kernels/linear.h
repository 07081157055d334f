// Linear layers: GEMMs through KokkosKernels (BLAS on the host, cuBLAS on CUDA).
// Weights are stored (out, in), as torch.nn.Linear does, so y = x W^T.
// Parameter gradients accumulate (+=); activation gradients are written (=).
#pragma once
#include <KokkosBlas3_gemm.hpp>
#include "core/views.h"

namespace xx::kernels {

// out (N, out) = inp (N, in) . weight^T;   weight (out, in)
// beta = 1 adds into out instead (used to fold a residual add into the GEMM).
template <class T>
void linear_forward(Mat<T> out, Mat<const T> inp, Mat<const T> weight, T beta = T(0)) {
  KokkosBlas::gemm("N", "T", T(1), inp, weight, beta, out);
}

// dinp (N, in) = dout . weight;   dweight (out, in) += dout^T . inp
// dinp_beta = 1 adds into dinp instead (an input that feeds several layers).
template <class T>
void linear_backward(Mat<T> dinp, Mat<T> dweight, Mat<const T> dout, Mat<const T> inp,
                     Mat<const T> weight, T dinp_beta = T(0)) {
  KokkosBlas::gemm("N", "N", T(1), dout, weight, dinp_beta, dinp);
  KokkosBlas::gemm("T", "N", T(1), dout, inp, T(1), dweight);
}

}  // namespace xx::kernels
