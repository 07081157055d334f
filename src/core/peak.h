// The MFU denominator: one core's measured SGEMM rate on the model's own
// GEMM shapes (../shared/MEASURING.md).
#pragma once
#include "deck/config.h"

namespace xx {

// GFLOP/s of KokkosBlas::gemm (float) on the forward and backward GEMMs of
// one block of `model` with `batch` sequences: the best of five trials that
// together take about `seconds`.
double measure_sgemm_gflops(const ModelConfig& model, int batch, double seconds = 0.5);

}  // namespace xx
