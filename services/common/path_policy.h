// Confines the paths a job spec names (data.path, checkpoint.dir) to roots
// the operator gave a process on its command line (--data-root,
// --checkpoint-root), so whoever may submit a job cannot make a worker or the
// coordinator read or write anywhere else on its host.
#ifndef STAGEWISE_SERVICES_COMMON_PATH_POLICY_H_
#define STAGEWISE_SERVICES_COMMON_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagewise {

// The roots one kind of path may live under.
struct PathRoots {
  // false: every path is accepted as it is (in-process tests, embedders that
  // do their own checks). The binaries always confine.
  bool confine = false;
  // Directories, absolute or relative to the working directory. An empty
  // list with confine = true refuses every path.
  std::vector<std::string> roots;
  // The command-line flag that sets `roots`, named in refusals.
  std::string flag;
};

// The path `value` of spec key `key`, made absolute and resolved (symlinks
// of its existing prefix followed, "." removed), when it lies inside one of
// `policy.roots` (also resolved). INVALID_ARGUMENT naming `key` when it does
// not, when it has a ".." component, a NUL or other control character, or is
// longer than 4096 bytes. With policy.confine false the value comes back
// unchanged. An empty value is returned as is (keys use "" for "none").
//
// A symlink created inside a root after this check can still lead out of it:
// the check guards against what a job spec says, not against someone who can
// already write inside the root.
absl::StatusOr<std::string> ConfinePath(const std::string& key, const std::string& value,
                                        const PathRoots& policy);

// A torchscript job's model file (script_model.file, else model.path),
// confined to `policy`; on success model->script_file is the resolved path
// the worker then loads. Other models pass unchanged.
struct ModelSpec;
absl::Status ConfineModelFile(ModelSpec* model, const PathRoots& policy);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_PATH_POLICY_H_
