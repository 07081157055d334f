// Linear layers on the GEMM seam (kernels/gemm.h). Weights are stored
// (out, in), as torch.nn.Linear does, so y = x W^T. Inputs are GemmIn: T
// values, or their 16-bit copies under mixed precision; outputs and
// gradients are T. Parameter gradients accumulate (+=); activation gradients
// are written (=).
#pragma once
#include "core/views.h"
#include "kernels/gemm.h"

namespace xx::kernels {

// out (N, out) = inp (N, in) . weight^T;   weight (out, in)
// beta = 1 adds into out instead (used to fold a residual add into the GEMM).
template <class T>
void linear_forward(Mat<T> out, GemmIn<T> inp, GemmIn<T> weight, T beta = T(0)) {
  gemm<T>("N", inp, "T", weight, T(1), beta, out);
}

// dinp (N, in) = dout . weight;   dweight (out, in) += dout^T . inp
// dinp_beta = 1 adds into dinp instead (an input that feeds several layers).
// With 16-bit weights, dout is multiplied as its 16-bit copy too, made once
// for both products.
template <class T>
void linear_backward(Mat<T> dinp, Mat<T> dweight, Mat<const T> dout, GemmIn<T> inp, GemmIn<T> weight,
                     T dinp_beta = T(0)) {
  GemmIn<T> d = as_gemm_input_like<T>(dout, weight, 0);
  d.varying = inp.varying;
  gemm<T>("N", d, "N", weight, T(1), dinp_beta, dinp);
  gemm<T>("T", d, "N", inp, T(1), T(1), dweight);
}

}  // namespace xx::kernels
