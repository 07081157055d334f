// A named window into a flat buffer: what layers below the model (comm's
// compressed sync) know of a tensor, without knowing the model's layout.
// The model builds them (ParamLayout::spans(), model/params.h).
#pragma once
#include <cstdint>
#include <string>

namespace xx {

struct TensorSpan {
  std::string name;     // e.g. "layers.3.attn.wq"
  int64_t offset = 0;   // into the flat buffer, in elements
  int64_t size = 0;
};

}  // namespace xx
