// kiln::kernels: the CPU's fused causal attention (kiln/backend/cpu/attention.hpp) for float, forward and
// backward, compiled once. Other element types (double, for gradient checks) are compiled where used.
#include "kiln/backend/cpu/attention.hpp"

namespace kiln::cpu {

template void causal_attention_forward<float>(const float*, float*, float*, const AttentionDims&, index_t, index_t);
template void causal_attention_backward<float>(const float*, const float*, const float*, const float*, float*, bool,
                                               const AttentionDims&, index_t, index_t);

}  // namespace kiln::cpu
