// kiln::kernels: the host optimizers' loops (kiln/optim/adam.hpp), compiled once.
#include "kiln/optim/adam.hpp"

namespace kiln::optim::detail {

template class AdamBase<false>;
template class AdamBase<true>;

}  // namespace kiln::optim::detail
