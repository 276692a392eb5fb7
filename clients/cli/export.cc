// `stagewise export`: the shards of a committed checkpoint -> the whole model
// in one LibTorch archive (model.pt), with the job spec and a README.
//
// A shard (one per stage) is an archive whose "model" sub-archive is the
// stage's models::Model as saved by Module::save. Blocks are named by their
// global index, so the names in every shard are names of the whole model that
// models::BuildModel builds from the job spec: export builds that model,
// loads every shard into it by name (checking that nothing is missing, extra
// or of another shape) and saves it.
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/flags.h"
#include "clients/cli/format.h"
#include "clients/cli/job_format.h"
#include "clients/cli/job_watch.h"
#include "clients/client/coordinator_client.h"
#include "services/checkpoint/checkpoint.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"

namespace stagewise::cli {
namespace {
namespace fs = std::filesystem;

constexpr char kModelFile[] = "model.pt";
constexpr char kJobFile[] = "job.yaml";
constexpr char kReadmeFile[] = "README.txt";
constexpr size_t kMaxNamesShown = 5;

std::string JoinSome(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kMaxNamesShown));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kMaxNamesShown) {
    absl::StrAppend(&text, " and ", names.size() - kMaxNamesShown, " more");
  }
  return text;
}

// What Module::save writes, by dotted name: every defined parameter and buffer
// of `module` and of its serializable children, recursively.
void SavedTensors(const torch::nn::Module& module, const std::string& prefix,
                  std::map<std::string, torch::Tensor>* out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (p.value().defined()) (*out)[prefix + p.key()] = p.value();
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (b.value().defined()) (*out)[prefix + b.key()] = b.value();
  }
  for (const auto& child : module.named_children()) {
    if (child.value()->is_serializable()) {
      SavedTensors(*child.value(), prefix + child.key() + ".", out);
    }
  }
}

// Every tensor in `archive`, recursively, by dotted name. Other attributes
// (a module's "training" flag) are not tensors and are skipped.
void ArchiveTensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                    std::map<std::string, torch::Tensor>* out) {
  for (const std::string& key : archive.keys()) {
    torch::Tensor tensor;
    if (archive.try_read(key, tensor)) {
      (*out)[prefix + key] = tensor;
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) ArchiveTensors(child, prefix + key + ".", out);
  }
}

// The global block index a tensor belongs to: its name's first component.
std::optional<int> BlockOf(const std::string& name) {
  int block = -1;
  const absl::string_view head = absl::string_view(name).substr(0, name.find('.'));
  if (!absl::SimpleAtoi(head, &block)) return std::nullopt;
  return block;
}

std::string ShapeText(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "] ", c10::toString(t.scalar_type()));
}

// Loads one shard's "model" sub-archive into the blocks [begin, end) of
// `whole`'s tensors, by name.
absl::Status LoadShard(const std::string& path, int begin, int end,
                       const std::map<std::string, torch::Tensor>& whole) {
  std::map<std::string, torch::Tensor> found;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    torch::serialize::InputArchive model;
    if (!archive.try_read("model", model)) {
      return absl::DataLossError(
          absl::StrCat(path, ": no \"model\" archive in the shard (not a stagewise checkpoint?)"));
    }
    ArchiveTensors(model, "", &found);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": cannot read the shard: ", e.what()));
  }
  std::vector<std::string> extra, missing, mismatched;
  for (const auto& [name, tensor] : found) {
    const std::optional<int> block = BlockOf(name);
    const auto it = whole.find(name);
    if (!block.has_value() || *block < begin || *block >= end || it == whole.end()) {
      extra.push_back(name);
    } else if (it->second.sizes() != tensor.sizes() ||
               it->second.scalar_type() != tensor.scalar_type()) {
      mismatched.push_back(absl::StrCat(name, " is ", ShapeText(tensor), ", the model's is ",
                                        ShapeText(it->second)));
    }
  }
  for (const auto& [name, tensor] : whole) {
    const std::optional<int> block = BlockOf(name);
    if (block.has_value() && *block >= begin && *block < end && found.count(name) == 0) {
      missing.push_back(name);
    }
  }
  std::vector<std::string> problems;
  if (!missing.empty()) {
    problems.push_back(absl::StrCat(missing.size(), " tensor(s) of blocks [", begin, ", ", end,
                                    ") missing: ", JoinSome(missing)));
  }
  if (!extra.empty()) {
    problems.push_back(absl::StrCat(extra.size(), " tensor(s) the model of blocks [", begin, ", ",
                                    end, ") does not have: ", JoinSome(extra)));
  }
  if (!mismatched.empty()) {
    problems.push_back(
        absl::StrCat(mismatched.size(), " tensor(s) of another shape: ", JoinSome(mismatched)));
  }
  if (!problems.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " does not match the job's model: ", absl::StrJoin(problems, "; ")));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : found) whole.at(name).copy_(tensor);
  return absl::OkStatus();
}

// `example`: the name of one of the model's tensors.
std::string Readme(const v1::CheckpointManifest& m, const JobSpec& spec,
                   const std::string& step_dir, int64_t num_parameters,
                   const std::string& example) {
  return absl::StrCat(
      "Exported by `stagewise export` from the checkpoint\n  ", step_dir, "\nof job ", m.job_id(),
      " (", spec.name, ") after step ", m.step(), " of ", m.total_steps(), ".\n\n", "model.pt   ",
      NameOf(spec.model.name), " with ", num_parameters,
      " parameters, as one LibTorch archive (torch::serialize::OutputArchive):\n",
      "           parameters and buffers named <block>.<path>, e.g. \"", example, "\",\n",
      "           the names of models::BuildModel's whole model (no optimizer state).\n",
      "job.yaml   the job as submitted: the model, the data and the seed.\n\n",
      "Python (PyTorch):\n", "  import torch\n",
      "  m = torch.jit.load(\"model.pt\")         # a container of the weights, no forward()\n",
      "  state = m.state_dict()                  # {\"", example, "\": tensor, ...}\n",
      "  for name, p in m.named_parameters(): print(name, tuple(p.shape))\n",
      "  Copy `state` into an equivalent torch.nn.Module of your own (load_state_dict), mapping\n",
      "  names where your module's differ.\n\n", "C++ (LibTorch and stagewise's models library):\n",
      "  auto spec = stagewise::LoadJobSpec(\"job.yaml\");\n",
      "  auto model = stagewise::models::BuildModel(spec->model, spec->seed).value();\n",
      "  torch::load(model, \"model.pt\");    // or model->load(archive) from an InputArchive\n");
}

std::string ScriptReadme(const v1::CheckpointManifest& m, const JobSpec& spec,
                         const std::string& step_dir, int64_t num_parameters) {
  return absl::StrCat(
      "Exported by `stagewise export` from the checkpoint\n  ", step_dir, "\nof job ", m.job_id(),
      " (", spec.name, ") after step ", m.step(), " of ", m.total_steps(), ".\n\n",
      "model.pt   your TorchScript model (", spec.model.script_file, ") with the trained\n",
      "           weights and BatchNorm statistics, ", num_parameters, " parameters.\n",
      "job.yaml   the job as submitted: the model, the data and the seed.\n\n",
      "Python (PyTorch):\n", "  import torch\n", "  m = torch.jit.load(\"model.pt\")\n",
      "  m.eval()\n", "  logits = m(x)        # x: [N, ",
      absl::StrJoin(spec.model.input_shape, ", "), "]\n");
}

// The step directory named by --checkpoint: a step directory itself (or its
// MANIFEST), or a job's checkpoint directory (<checkpoint.dir>/<job id>), then
// its newest committed checkpoint or the one after `step`.
absl::StatusOr<std::string> ResolveCheckpointPath(std::string path, int64_t step) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (fs::path(path).filename() == checkpoint::kManifestName) {
    path = fs::path(path).parent_path().string();
  }
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("--checkpoint ", path, ": no such directory"));
  }
  const std::string name = fs::path(path).filename().string();
  if (absl::StartsWith(name, "step-") || fs::exists(fs::path(path) / checkpoint::kManifestName)) {
    return path;
  }
  // A job's directory: pick among its committed checkpoints.
  std::vector<std::string> skipped;
  std::string root = fs::path(path).parent_path().string();
  if (root.empty()) root = ".";
  std::vector<checkpoint::Committed> committed =
      checkpoint::ListCommitted(root, name, /*verify_checksums=*/false, &skipped);
  std::vector<std::string> steps;
  for (const checkpoint::Committed& c : committed) {
    if (step < 0 || c.manifest.step() == step) return c.dir;
    steps.push_back(absl::StrCat(c.manifest.step()));
  }
  std::string message =
      step < 0
          ? absl::StrCat("no committed checkpoint in ", path)
          : absl::StrCat("no committed checkpoint after step ", step, " in ", path,
                         steps.empty() ? "" : " (committed: " + absl::StrJoin(steps, ", ") + ")");
  if (!skipped.empty()) absl::StrAppend(&message, "; skipped: ", absl::StrJoin(skipped, "; "));
  return absl::NotFoundError(message);
}

// The step directory of the job's newest committed checkpoint (or the one
// after `step`), as the coordinator lists it.
absl::StatusOr<std::string> AskCoordinator(const ExportArgs& args) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::ListCheckpointsResponse> listing = client.ListCheckpoints(args.job_id);
  if (!listing.ok()) return listing.status();
  if (listing->dir().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", args.job_id, " keeps no checkpoints (its spec has no checkpoint.dir)"));
  }
  std::vector<std::string> steps;
  for (const v1::CheckpointInfo& c : listing->checkpoints()) {
    if (args.step < 0 || c.step() == args.step) {
      const std::string dir = CheckpointDir(c);
      std::error_code ec;
      if (!fs::exists(fs::path(dir) / checkpoint::kManifestName, ec)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the checkpoint of job ", args.job_id, " after step ", c.step(), " is at ", dir,
            " on the coordinator, which is not readable here: export reads the shards itself, "
            "so run it where the job's checkpoint directory (",
            listing->dir(),
            ") is mounted at the same path, or copy the step directory here "
            "and pass it with --checkpoint"));
      }
      return dir;
    }
    steps.push_back(absl::StrCat(c.step()));
  }
  if (args.step < 0) {
    return absl::NotFoundError(
        absl::StrCat("job ", args.job_id, " has no committed checkpoint in ", listing->dir()));
  }
  return absl::NotFoundError(
      absl::StrCat("job ", args.job_id, " has no committed checkpoint after step ", args.step,
                   steps.empty() ? "" : " (committed: " + absl::StrJoin(steps, ", ") + ")"));
}

struct Exported {
  v1::CheckpointManifest manifest;
  std::string name;                                    // the job's
  std::vector<std::pair<std::string, int64_t>> files;  // path, bytes
  int64_t num_parameters = 0;
  size_t num_tensors = 0;
};

// Exports the checkpoint in `step_dir` (after step `expect_step` when >= 0).
absl::StatusOr<Exported> ExportStepDir(const std::string& step_dir, int64_t expect_step,
                                       const std::string& out_dir) {
  Exported result;
  absl::StatusOr<v1::CheckpointManifest> manifest = checkpoint::ReadManifest(step_dir);
  if (!manifest.ok()) {
    if (absl::IsNotFound(manifest.status())) {
      return absl::NotFoundError(absl::StrCat(step_dir, " is not a committed checkpoint (no ",
                                              checkpoint::kManifestName, ")"));
    }
    return manifest.status();
  }
  result.manifest = *manifest;
  if (expect_step >= 0 && manifest->step() != expect_step) {
    return absl::InvalidArgumentError(absl::StrCat("--step ", expect_step, ": ", step_dir,
                                                   " is the checkpoint after step ",
                                                   manifest->step()));
  }
  // Every shard first: a damaged checkpoint is refused before anything is built.
  for (const v1::CheckpointShard& shard : manifest->shards()) {
    const std::string path = (fs::path(step_dir) / shard.file()).string();
    if (absl::Status s = checkpoint::VerifyFile(path, shard.bytes(), shard.crc32()); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("shard of stage ", shard.stage(), " is unusable: ", s.message()));
    }
  }
  absl::StatusOr<JobSpec> spec = ParseJobSpec(manifest->job_spec_yaml());
  if (!spec.ok()) {
    return absl::DataLossError(
        absl::StrCat(step_dir, "/", checkpoint::kManifestName,
                     ": its job spec does not parse: ", spec.status().message()));
  }
  result.name = spec->name;
  absl::StatusOr<std::shared_ptr<models::Model>> model =
      models::BuildModel(spec->model, static_cast<uint64_t>(spec->seed));
  if (!model.ok()) return model.status();
  // The shards must cover the model's blocks exactly, in order.
  std::vector<v1::CheckpointShard> shards(manifest->shards().begin(), manifest->shards().end());
  std::sort(shards.begin(), shards.end(),
            [](const auto& a, const auto& b) { return a.block_begin() < b.block_begin(); });
  int covered = 0;
  for (const v1::CheckpointShard& shard : shards) {
    if (shard.block_begin() != covered || shard.block_end() <= shard.block_begin()) {
      return absl::DataLossError(absl::StrCat(step_dir, "/", checkpoint::kManifestName, ": stage ",
                                              shard.stage(), " holds blocks [", shard.block_begin(),
                                              ", ", shard.block_end(),
                                              "), expected a range starting at ", covered));
    }
    covered = shard.block_end();
  }
  if (covered != (*model)->end()) {
    return absl::DataLossError(absl::StrCat(step_dir, "/", checkpoint::kManifestName,
                                            ": the shards hold blocks [0, ", covered, "), the ",
                                            NameOf(spec->model.name), " has ", (*model)->end()));
  }
  std::map<std::string, torch::Tensor> whole;
  SavedTensors(**model, "", &whole);
  result.num_tensors = whole.size();
  result.num_parameters = (*model)->num_parameters();
  for (const v1::CheckpointShard& shard : shards) {
    if (absl::Status s = LoadShard((fs::path(step_dir) / shard.file()).string(),
                                   shard.block_begin(), shard.block_end(), whole);
        !s.ok()) {
      return s;
    }
  }

  std::string model_bytes;
  const bool script = spec->model.name == ModelKind::kTorchScript;
  try {
    std::ostringstream stream;
    if (script) {
      // The user's own TorchScript model back, with the trained weights: the
      // file the job was submitted with, its tensors replaced by name.
      torch::jit::Module m = torch::jit::load(spec->model.script_file, torch::kCPU);
      torch::NoGradGuard no_grad;
      int index = 0;
      for (const auto& block : m.attr("blocks").toModule().named_children()) {
        auto copy_in = [&](const std::string& name, torch::Tensor target) -> absl::Status {
          const std::string key = absl::StrCat(index, ".", absl::StrReplaceAll(name, {{".", "_"}}));
          auto it = whole.find(key);
          if (it == whole.end() || !it->second.sizes().equals(target.sizes())) {
            return absl::FailedPreconditionError(absl::StrCat(
                spec->model.script_file, " does not match the checkpoint at block ", index, " (",
                name, "); was the file changed after the job was submitted?"));
          }
          target.copy_(it->second);
          return absl::OkStatus();
        };
        for (const auto& p : block.value.named_parameters()) {
          if (absl::Status s = copy_in(p.name, p.value); !s.ok()) return s;
        }
        for (const auto& b : block.value.named_buffers()) {
          if (absl::Status s = copy_in(b.name, b.value); !s.ok()) return s;
        }
        ++index;
      }
      m.save(stream);
    } else {
      torch::serialize::OutputArchive archive;
      (*model)->save(archive);
      archive.save_to(stream);
    }
    model_bytes = stream.str();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot serialize the model: ", e.what()));
  }
  const std::vector<std::pair<std::string, std::string>> files = {
      {kModelFile, model_bytes},
      {kJobFile, manifest->job_spec_yaml()},
      {kReadmeFile, script ? ScriptReadme(*manifest, *spec, step_dir, result.num_parameters)
                           : Readme(*manifest, *spec, step_dir, result.num_parameters,
                                    (*model)->named_parameters().size() > 0
                                        ? (*model)->named_parameters().begin()->key()
                                        : std::string("0.weight"))}};
  for (const auto& [name, bytes] : files) {
    const std::string path = (fs::path(out_dir) / name).string();
    if (absl::Status s = checkpoint::WriteFileAtomically(path, bytes); !s.ok()) return s;
    result.files.emplace_back(path, static_cast<int64_t>(bytes.size()));
  }
  return result;
}

}  // namespace

int Export(const ExportArgs& args, std::ostream& out, std::ostream& err) {
  if (args.job_id.empty() == args.checkpoint.empty()) {
    err << "error: export needs a job id (asks the coordinator for its checkpoints) or "
           "--checkpoint PATH, not both\n";
    return kExitInvalid;
  }
  if (args.out_dir.empty()) {
    err << "error: export needs --output-dir DIR (where model.pt, job.yaml and README.txt go)\n";
    return kExitInvalid;
  }
  absl::StatusOr<std::string> step_dir = args.checkpoint.empty()
                                             ? AskCoordinator(args)
                                             : ResolveCheckpointPath(args.checkpoint, args.step);
  if (!step_dir.ok()) return ReportError(step_dir.status(), err);
  absl::StatusOr<Exported> exported = ExportStepDir(*step_dir, args.step, args.out_dir);
  if (!exported.ok()) return ReportError(exported.status(), err);
  const v1::CheckpointManifest& m = exported->manifest;
  out << "exported job " << m.job_id() << " (" << exported->name << ") after step " << m.step()
      << " from " << *step_dir << ": " << m.shards_size() << " shard(s), " << exported->num_tensors
      << " tensors, " << HumanCount(exported->num_parameters) << " parameters\n";
  for (const auto& [path, bytes] : exported->files) {
    out << "  " << path << "  " << HumanBytes(bytes) << "\n";
  }
  return kExitOk;
}

void AddExportCommand(CommandSet& set) {
  auto args = std::make_shared<ExportArgs>();
  auto old_dir = std::make_shared<std::unique_ptr<DeprecatedSpelling>>();
  CLI::App* cmd = set.Add(
      "export",
      "Write a committed checkpoint's weights as one whole-model file DIR/model.pt (plus\n"
      "job.yaml and README.txt), checking every shard. With JOB_ID the coordinator names the\n"
      "checkpoint, whose files are then read HERE: run it where checkpoint.dir is mounted at\n"
      "the coordinator's path. --checkpoint reads a checkpoint directory offline.",
      [args, old_dir](Invocation& run) {
        if (!(*old_dir)->Apply(args->out_dir, run.err()) ||
            !RequireFlag(args->out_dir, "--output-dir", run.err())) {
          return kExitInvalid;
        }
        return run.WithCoordinator([&](const std::string& coordinator) {
          args->coordinator = coordinator;
          return Export(*args, run.out(), run.err());
        });
      });
  cmd->add_option("job_id", args->job_id, "Job id (asks the coordinator; not with --checkpoint)");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "A checkpoint's step directory (<checkpoint.dir>/<job id>/step-...), or "
                  "a job's checkpoint directory (then its newest checkpoint, or --step)");
  cmd->add_option("--step", args->step,
                  "The checkpoint taken after this step (default: the newest committed one)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--output-dir", args->out_dir,
                  "Directory to write model.pt, job.yaml and README.txt to (created; required)");
  *old_dir = std::make_unique<DeprecatedSpelling>(cmd, "-o", "stagewise export -o DIR",
                                                  "--output-dir DIR");
}

}  // namespace stagewise::cli
