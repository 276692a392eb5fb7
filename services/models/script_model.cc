#include "services/models/script_model.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "services/models/batch_norm.h"

namespace stagewise::models {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The line of a TorchScript interpreter error that says what went wrong: the
// exception text starts with the interpreter's frame and ends with Python's
// "RuntimeError: ..." line.
std::string Reason(const std::string& what) {
  std::vector<std::string> lines = absl::StrSplit(what, '\n', absl::SkipWhitespace());
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (absl::StrContains(*it, "Error:")) return std::string(absl::StripAsciiWhitespace(*it));
  }
  return lines.empty() ? what : std::string(absl::StripAsciiWhitespace(lines.front()));
}

std::string FileOf(const ModelSpec& spec) {
  return spec.script_file.empty() ? spec.path : spec.script_file;
}

// The blocks of a loaded file, or why it does not follow the convention.
absl::StatusOr<std::vector<torch::jit::Module>> BlocksOf(const std::string& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model.path: TorchScript file not found (or not a file): ", file));
  }
  torch::jit::Module model;
  try {
    model = torch::jit::load(file, torch::kCPU);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", file,
                     " is not a TorchScript file (torch.jit.script(model).save(path) "
                     "writes one): ",
                     what));
  }
  if (!model.hasattr("blocks") || !model.attr("blocks").isModule()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", file,
                     " has no `blocks` (an nn.ModuleList of the model's blocks, in order; ",
                     "see docs/torchscript.md)"));
  }
  std::vector<torch::jit::Module> blocks;
  for (const auto& child : model.attr("blocks").toModule().named_children()) {
    blocks.push_back(child.value);
  }
  if (blocks.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", file, ": `blocks` is empty; the model needs at least one"));
  }
  return blocks;
}

bool HasInverse(const torch::jit::Module& m) { return m.find_method("inverse").has_value(); }

int64_t CountParameters(const torch::jit::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) {
    if (p.requires_grad()) n += p.numel();
  }
  return n;
}

}  // namespace

ScriptBlock::ScriptBlock(const BlockInfo& info, torch::jit::Module module)
    : ReversibleBlock(info, CustomF{}), module_(std::move(module)) {
  // nn::Module names cannot hold dots: "body.layers.0.weight" is registered
  // as "body_layers_0_weight" (the scripted module keeps its own names).
  for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
    register_parameter(absl::StrReplaceAll(p.name, {{".", "_"}}), p.value, p.value.requires_grad());
  }
  for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
    register_buffer(absl::StrReplaceAll(b.name, {{".", "_"}}), b.value);
    Buffer buffer{module_, b.name, b.value};
    // "body.layers.1.running_mean": owner body.layers.1, attribute running_mean.
    for (size_t dot = buffer.name.find('.'); dot != std::string::npos;
         dot = buffer.name.find('.')) {
      buffer.owner = buffer.owner.attr(buffer.name.substr(0, dot)).toModule();
      buffer.name = buffer.name.substr(dot + 1);
    }
    buffers_.push_back(std::move(buffer));
  }
}

torch::Tensor ScriptBlock::KeepingBuffers(const std::function<torch::Tensor()>& fn) {
  if (buffers_.empty() || !is_training()) return fn();
  {
    torch::NoGradGuard no_grad;
    for (Buffer& b : buffers_) b.owner.setattr(b.name, b.tensor.clone());
  }
  struct Restore {
    std::vector<Buffer>& buffers;
    ~Restore() {
      for (Buffer& b : buffers) b.owner.setattr(b.name, b.tensor);
    }
  } restore{buffers_};
  return fn();
}

torch::Tensor ScriptBlock::forward(const torch::Tensor& x) {
  auto run = [&] { return module_.forward({x}).toTensor(); };
  // A frozen pass (PETRA's forward, the profiler) normalises with batch
  // statistics but must leave the running ones as they were; the scripted
  // BatchNorm cannot be told, so its buffers are put back afterwards.
  return FreezeRunningStats::active() ? KeepingBuffers(run) : run();
}

torch::Tensor ScriptBlock::inverse(const torch::Tensor& y) {
  TORCH_CHECK(reversible(), "block ", info().index, " (script) exports no inverse");
  return KeepingBuffers([&] { return module_.get_method("inverse")({y}).toTensor(); });
}

std::pair<torch::Tensor, torch::Tensor> ScriptBlock::RebuildBackward(const torch::Tensor& y,
                                                                     const torch::Tensor& dy,
                                                                     bool input_grad) {
  torch::Tensor x;
  {
    torch::NoGradGuard no_grad;
    x = inverse(y);
  }
  torch::Tensor leaf = x.detach().requires_grad_(input_grad);
  forward(leaf).backward(dy);
  return {x, input_grad ? leaf.grad() : torch::Tensor()};
}

torch::Tensor ScriptBlock::F(const torch::Tensor&) {
  TORCH_CHECK(false, "block ", info().index, " (script) has no coupling function F");
}

void ScriptBlock::train(bool on) {
  torch::nn::Module::train(on);
  module_.train(on);
}

absl::StatusOr<std::vector<ModelSpec::ScriptBlock>> InspectScriptModel(const ModelSpec& spec) {
  const std::string file = FileOf(spec);
  auto blocks = BlocksOf(file);
  if (!blocks.ok()) return blocks.status();
  if (spec.input_shape.empty()) {
    return absl::InvalidArgumentError("model: input shape unknown (data section missing?)");
  }
  std::vector<ModelSpec::ScriptBlock> out;
  torch::NoGradGuard no_grad;
  // Two samples: BatchNorm in training mode needs more than one value per channel.
  std::vector<int64_t> shape = spec.input_shape;
  shape.insert(shape.begin(), 2);
  torch::manual_seed(0);
  torch::Tensor h = torch::randn(shape);
  for (size_t i = 0; i < blocks->size(); ++i) {
    torch::jit::Module& m = (*blocks)[i];
    m.train();
    ModelSpec::ScriptBlock b;
    b.in_shape.assign(h.sizes().begin() + 1, h.sizes().end());
    b.parameters = CountParameters(m);
    torch::Tensor y;
    try {
      // Keep the file's running statistics as they are: the dry run is not training.
      std::vector<torch::Tensor> saved;
      for (const auto& buf : m.buffers()) saved.push_back(buf.clone());
      y = m.forward({h}).toTensor();
      if (HasInverse(m)) {
        torch::Tensor x = m.get_method("inverse")({y}).toTensor();
        const double scale = std::max(1.0, h.abs().max().item<double>());
        const double error =
            x.sizes() == h.sizes() ? (x - h).abs().max().item<double>() / scale : INFINITY;
        if (!(error <= spec.inverse_tolerance)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "model.path: ", file, ": block ", i, " exports `inverse`, but it does not invert ",
              "its forward: max |x - inverse(forward(x))| / max(1, max |x|) = ", error,
              " on a random batch, above model.inverse_tolerance = ", spec.inverse_tolerance));
        }
        b.reversible = true;
      }
      size_t k = 0;
      for (const auto& buf : m.buffers()) buf.copy_(saved[k++]);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.path: ", file, ": block ", i, " fails on input of shape ",
                       ShapeText(b.in_shape), " (per sample): ", Reason(e.what())));
    }
    if (y.dim() < 2 || y.size(0) != h.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.path: ", file, ": block ", i, " must return one output per sample, got shape ",
          ShapeText(y.sizes().vec())));
    }
    if (y.scalar_type() != torch::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat("model.path: ", file, ": block ", i,
                                                     " must return float32, got ",
                                                     c10::toString(y.scalar_type())));
    }
    b.out_shape.assign(y.sizes().begin() + 1, y.sizes().end());
    out.push_back(std::move(b));
    h = y;
  }
  return out;
}

absl::StatusOr<std::vector<std::shared_ptr<Block>>> LoadScriptBlocks(const ModelSpec& spec,
                                                                     int begin, int end) {
  const std::string file = FileOf(spec);
  if (spec.script_bytes > 0) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(file, ec);
    if (!ec && static_cast<int64_t>(size) != spec.script_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("model.path: ", file, " has ", size, " bytes here but ", spec.script_bytes,
                       " where the job was submitted: every worker must load the same file"));
    }
  }
  auto loaded = BlocksOf(file);
  if (!loaded.ok()) return loaded.status();
  const int n = static_cast<int>(loaded->size());
  if (!spec.script_blocks.empty() && static_cast<int>(spec.script_blocks.size()) != n) {
    return absl::FailedPreconditionError(
        absl::StrCat("model.path: ", file, " has ", n, " blocks here but ",
                     spec.script_blocks.size(), " where the job was submitted"));
  }
  if (end < 0) end = n;
  if (begin < 0 || begin >= end || end > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("block range [", begin, ", ", end, ") is outside the model's ", n, " blocks"));
  }
  std::vector<std::shared_ptr<Block>> blocks;
  for (int i = begin; i < end; ++i) {
    torch::jit::Module& m = (*loaded)[i];
    BlockInfo info;
    info.index = i;
    info.kind = "script";
    if (!spec.script_blocks.empty()) {
      const auto& s = spec.script_blocks[i];
      info.reversible = s.reversible;
      info.in_shape = s.in_shape;
      info.out_shape = s.out_shape;
      info.parameters = s.parameters;
      if (s.reversible && !HasInverse(m)) {
        return absl::FailedPreconditionError(
            absl::StrCat("model.path: ", file, ": block ", i,
                         " exports no `inverse` here but did where the ", "job was submitted"));
      }
    } else {
      info.reversible = HasInverse(m);
      info.parameters = CountParameters(m);
    }
    if (!info.in_shape.empty()) info.in_channels = info.in_shape.front();
    if (!info.out_shape.empty()) info.out_channels = info.out_shape.front();
    blocks.push_back(std::make_shared<ScriptBlock>(info, m));
  }
  return blocks;
}

std::string ScriptModelSection(const ModelSpec& model) {
  std::string file = "\"";
  for (char c : model.script_file) {
    if (c == '"' || c == '\\') file += '\\';
    file += c;
  }
  file += '"';
  std::string section = absl::StrCat(
      "\n# Added by the stagewise CLI: what a dry run of model.path found.\n"
      "script_model:\n  file: ",
      file, "\n  bytes: ", model.script_bytes, "\n  blocks:\n");
  for (const auto& b : model.script_blocks) {
    absl::StrAppend(
        &section, "    - {in: ", ShapeText(b.in_shape), ", out: ", ShapeText(b.out_shape),
        ", reversible: ", b.reversible ? "true" : "false", ", parameters: ", b.parameters, "}\n");
  }
  return section;
}

}  // namespace stagewise::models
