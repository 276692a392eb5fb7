#include <algorithm>

#include "services/data/sizes.h"

namespace stagewise::data {

int64_t NominalTrainSize(const DataSpec& spec) {
  int64_t n = 0;
  if (spec.dataset == "fashion_mnist") n = 60000;
  if (spec.dataset == "cifar10" || spec.dataset == "cifar100") n = 50000;
  if (spec.dataset == "synthetic") n = spec.train_size;
  if (spec.limit_train > 0) n = std::min(n, spec.limit_train);
  return n;
}

}  // namespace stagewise::data
