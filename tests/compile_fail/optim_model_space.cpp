// expect: the model's parameters live in another memory space
// A host optimizer built from a model whose parameters live on the device.
// Control: the model's parameters live on the host.
#include <kiln/optim/adam.hpp>

struct DeviceModel {
#ifdef KILN_COMPILE_FAIL_CONTROL
  using space = kiln::host;
#else
  using space = kiln::cuda;
#endif
  kiln::optim::ParamTable param_table() const { return {}; }
};

int main() {
  DeviceModel m;
  kiln::optim::AdamW<kiln::host> opt(m, {});
  (void)opt;
}
