#include "services/common/version.h"

#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "clients/cli/commands.h"

namespace stagewise::cli {

std::string VersionString() {
  return absl::StrCat("stagewise ", Version(), " (LibTorch ", TORCH_VERSION, ")");
}

}  // namespace stagewise::cli
