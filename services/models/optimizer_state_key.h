// The key of a parameter in a LibTorch optimizer's per-parameter state map:
// the address of the parameter's TensorImpl, printed as a string in LibTorch
// 1.x (torch/optim/sgd.cpp, adam.cpp) and the pointer itself in 2.x. One
// definition, so code that reads or writes optimizer state (resharding, the
// oracles) compiles against both.
#ifndef STAGEWISE_SERVICES_MODELS_OPTIMIZER_STATE_KEY_H_
#define STAGEWISE_SERVICES_MODELS_OPTIMIZER_STATE_KEY_H_

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace stagewise::models {

using OptimizerStateKeyType =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <typename Key = OptimizerStateKeyType>
Key OptimizerStateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_OPTIMIZER_STATE_KEY_H_
