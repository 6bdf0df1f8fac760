// expect: the model's parameters live in another memory space
// A host optimizer built from a model whose parameters live on the device.
#include <kiln/optim/adam.hpp>

struct DeviceModel {
  using space = kiln::cuda;
  kiln::optim::ParamTable param_table() const { return {}; }
};

int main() {
  DeviceModel m;
  kiln::optim::AdamW<kiln::host> opt(m, {});
  (void)opt;
}
