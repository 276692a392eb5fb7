// Users' own models from TorchScript files (docs/torchscript.md).
//
// The convention: the file holds a scripted module whose attribute `blocks` is
// an nn.ModuleList; block i's output is block i+1's input, and the last block
// outputs one logit per class. A block that also exports `inverse(y)` is
// reversible (PETRA, the rebuild mode), once a dry run shows that it inverts
// its forward within model.inverse_tolerance.
#ifndef STAGEWISE_SERVICES_MODELS_SCRIPT_MODEL_H_
#define STAGEWISE_SERVICES_MODELS_SCRIPT_MODEL_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/models/blocks.h"
#include "services/spec/job_spec.h"

namespace stagewise::models {

// One block of a TorchScript model. Its parameters and buffers are the
// scripted module's own tensors, registered here as well, so optimizers,
// checkpoints and the memory meter see them as they see a zoo block's.
class ScriptBlock : public ReversibleBlock {
 public:
  ScriptBlock(const BlockInfo& info, torch::jit::Module module);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor inverse(const torch::Tensor& y) override;
  // Generic: x = inverse(y) without a graph (running statistics untouched),
  // then forward(x) with one and back-propagate dy through it.
  std::pair<torch::Tensor, torch::Tensor> RebuildBackward(const torch::Tensor& y,
                                                          const torch::Tensor& dy,
                                                          bool input_grad) override;
  torch::Tensor F(const torch::Tensor&) override;
  void train(bool on = true) override;
  torch::jit::Module& script() { return module_; }

 private:
  // Runs `fn` leaving the buffers (BatchNorm running statistics) as they were:
  // the scripted module works on copies meanwhile. (Copying the old values
  // back afterwards would bump the versions of tensors the graph saved.)
  torch::Tensor KeepingBuffers(const std::function<torch::Tensor()>& fn);

  struct Buffer {
    torch::jit::Module owner;  // the submodule holding it
    std::string name;          // its attribute there
    torch::Tensor tensor;      // the buffer itself (also registered here)
  };
  torch::jit::Module module_;
  std::vector<Buffer> buffers_;
};

// What a dry run of spec.path finds: each block's shapes on a random batch of
// spec.input_shape, its parameter count, and whether it is reversible (it
// exports `inverse` and that inverse rebuilds its input within
// spec.inverse_tolerance). Errors name the file and the block.
absl::StatusOr<std::vector<ModelSpec::ScriptBlock>> InspectScriptModel(const ModelSpec& spec);

// Blocks [begin, end) of the model file (script_file when set, else path),
// checked against spec.script_blocks (the file must be the one inspected).
absl::StatusOr<std::vector<std::shared_ptr<Block>>> LoadScriptBlocks(const ModelSpec& spec,
                                                                     int begin, int end);

// The top-level `script_model` section (YAML, appended to a job's text) that
// carries model.script_file, script_bytes and script_blocks to the
// coordinator and the workers.
std::string ScriptModelSection(const ModelSpec& model);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_SCRIPT_MODEL_H_
