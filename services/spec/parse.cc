// The job document to a JobSpec: one pass over the YAML, each section read
// from its field list (fields.h); the checks that need more than one key are
// in validate.cc.
#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/spec/errors.h"
#include "services/spec/fields.h"
#include "services/spec/job_spec.h"
#include "services/spec/text.h"
#include "services/spec/validate.h"
#include "services/spec/yaml_reader.h"

namespace stagewise {

namespace {

using spec::KeyError;
using spec::MarkSuffix;
using spec::Section;
using spec::TypeError;

// A job spec is a few KiB; the cap only keeps hostile input (or a mistaken
// path such as /dev/zero) from costing memory or time (docs/security.md).
constexpr size_t kMaxJobSpecBytes = 1 << 20;
constexpr std::uintmax_t kMaxSpecFileBytes = kMaxJobSpecBytes;

// algorithm: either a bare name or {name: ..., <params>}.
absl::Status ParseAlgorithm(const YAML::Node& node, AlgorithmSpec* spec) {
  if (node.IsNull()) return absl::OkStatus();
  if (node.IsScalar()) {
    const spec::AlgorithmSchema* schema = spec::FindAlgorithm(node.Scalar());
    if (schema == nullptr) {
      return KeyError("algorithm",
                      absl::StrCat(spec::UnknownAlgorithmMessage(node.Scalar()), MarkSuffix(node)));
    }
    spec->options = schema->defaults;
    return absl::OkStatus();
  }
  if (!node.IsMap()) {
    return TypeError(node, "algorithm", "an algorithm name or a map");
  }
  Section section(node, "algorithm");
  std::string name(NameOf(spec->kind()));
  section.Read("name", &name);
  if (!section.status().ok()) return section.status();
  const spec::AlgorithmSchema* schema = spec::FindAlgorithm(name);
  if (schema == nullptr) {
    const YAML::Node* name_node = section.Find("name");
    return KeyError("algorithm.name", absl::StrCat(spec::UnknownAlgorithmMessage(name),
                                                   name_node ? MarkSuffix(*name_node) : ""));
  }
  // All keys before any value, so a misspelt key is reported as such.
  const std::vector<std::string> keys = spec::ParamKeys(*schema);
  for (const auto& [key, value] : section.entries()) {
    if (key != "name" && !spec::Contains(keys, key)) {
      return KeyError(section.PathOf(spec::Clip(key)),
                      absl::StrCat(spec::UnknownParamMessage(*schema, key), MarkSuffix(value)));
    }
  }
  spec->options = schema->defaults;
  for (const spec::ParamField& param : schema->params) {
    const YAML::Node* value = section.Find(param.key);
    if (value == nullptr) continue;
    if (!value->IsScalar()) {
      return TypeError(*value, section.PathOf(param.key), spec::ExpectedText(param.type));
    }
    absl::StatusOr<std::string> canonical = spec::CanonicalParam(param, value->Scalar());
    if (!canonical.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(canonical.status().message(), MarkSuffix(*value)));
    }
    param.set(&spec->options, *canonical);
  }
  return absl::OkStatus();
}

absl::Status ParseMemoryBudget(const Section& section, StagesSpec* stages) {
  const YAML::Node* budget = section.Find("memory_budget");
  if (budget == nullptr || budget->IsNull()) return absl::OkStatus();
  auto bytes = budget->IsScalar() ? ParseByteSize(budget->Scalar())
                                  : absl::InvalidArgumentError("expected a size");
  if (!bytes.ok() || *bytes <= 0) {
    return KeyError(
        section.PathOf("memory_budget"),
        absl::StrCat("must be a positive size such as 2GiB or 512MiB, got '",
                     budget->IsScalar() ? spec::Clip(budget->Scalar()) : "?", "'",
                     bytes.ok() ? "" : absl::StrCat(" (", bytes.status().message(), ")"),
                     MarkSuffix(*budget)));
  }
  stages->memory_budget = *bytes;
  return absl::OkStatus();
}

// partition: balanced | even | auto | [[b, e], ...].
absl::Status ParsePartition(const Section& section, StagesSpec* stages) {
  const YAML::Node* partition = section.Find("partition");
  if (partition == nullptr || partition->IsNull()) return absl::OkStatus();
  const std::string path = section.PathOf("partition");
  if (partition->IsScalar()) {
    const std::optional<Partition> value = EnumFromName<Partition>(partition->Scalar());
    if (!value || *value == Partition::kExplicit) {
      return KeyError(
          path,
          absl::StrCat("must be balanced, even, auto or a list of [begin, end) block ranges, got '",
                       spec::Clip(partition->Scalar()), "'", MarkSuffix(*partition)));
    }
    stages->partition = *value;
    return absl::OkStatus();
  }
  if (!partition->IsSequence()) {
    return TypeError(*partition, path,
                     "balanced, even, auto or a list of [begin, end) block ranges");
  }
  std::vector<std::pair<int, int>> ranges;
  for (size_t i = 0; i < partition->size(); ++i) {
    const YAML::Node range = (*partition)[i];
    const std::string range_path = absl::StrCat(path, "[", i, "]");
    if (!range.IsSequence() || range.size() != 2) {
      return TypeError(range, range_path, "a [begin, end) pair");
    }
    std::pair<int, int> value;
    absl::Status status = spec::Convert(range[0], range_path, &value.first);
    if (status.ok()) status = spec::Convert(range[1], range_path, &value.second);
    if (!status.ok()) return status;
    ranges.push_back(value);
  }
  if (ranges.empty()) {
    return KeyError(path,
                    absl::StrCat("needs at least one [begin, end) range", MarkSuffix(*partition)));
  }
  // Interleaved: the ranges are the virtual stages, chunks_per_worker per worker.
  const size_t chunks = static_cast<size_t>(std::max(1, stages->chunks_per_worker));
  if (ranges.size() % chunks != 0) {
    return KeyError(path, absl::StrCat(ranges.size(), " ranges are not a multiple of ",
                                       section.PathOf("chunks_per_worker"), " (", chunks, ")",
                                       MarkSuffix(*partition)));
  }
  if (const YAML::Node* count = section.Find("count");
      count != nullptr && static_cast<size_t>(stages->count) * chunks != ranges.size()) {
    return KeyError(
        section.PathOf("count"),
        absl::StrCat(stages->count, chunks > 1 ? absl::StrCat(" x ", chunks, " chunks") : "",
                     " does not match the ", ranges.size(), " ranges in ", path,
                     MarkSuffix(*count)));
  }
  stages->partition = Partition::kExplicit;
  stages->count = static_cast<int>(ranges.size() / chunks);
  stages->ranges = std::move(ranges);
  return absl::OkStatus();
}

// stages: a count, or {count, replicas, chunks_per_worker, partition, modes,
// memory_budget}.
absl::Status ParseStages(const YAML::Node& node, StagesSpec* stages) {
  if (node.IsNull()) return absl::OkStatus();
  if (node.IsScalar()) return spec::Convert(node, "stages", &stages->count);
  if (!node.IsMap()) {
    return TypeError(node, "stages", "a stage count or a map");
  }
  Section section(node, "stages");
  section.CheckKeys({"count", "replicas", "chunks_per_worker", "partition", "modes",
                     "memory_budget", "bottleneck"});
  section.Read("count", &stages->count);
  section.Read("replicas", &stages->replicas);
  section.Read("chunks_per_worker", &stages->chunks_per_worker);
  if (!section.status().ok()) return section.status();
  if (const YAML::Node* modes = section.Find("modes"); modes != nullptr && !modes->IsNull()) {
    const std::string value = modes->IsScalar() ? modes->Scalar() : "";
    const std::optional<BlockModes> parsed = EnumFromName<BlockModes>(value);
    if (!parsed) {
      return KeyError(section.PathOf("modes"),
                      absl::StrCat("must be auto, store or rebuild, got '", spec::Clip(value), "'",
                                   MarkSuffix(*modes)));
    }
    stages->modes = *parsed;
  }
  if (absl::Status s = ParseMemoryBudget(section, stages); !s.ok()) return s;
  if (const YAML::Node* b = section.Find("bottleneck"); b != nullptr && !b->IsNull()) {
    if (!b->IsMap()) return TypeError(*b, section.PathOf("bottleneck"), "a map like {rank: 16}");
    Section bottleneck(*b, section.PathOf("bottleneck"));
    bottleneck.CheckKeys({"rank"});
    bottleneck.Read("rank", &stages->bottleneck.rank);
    if (!bottleneck.status().ok()) return bottleneck.status();
  }
  return ParsePartition(section, stages);
}

// script_model: {file, bytes, blocks: [{in, out, reversible, parameters}]},
// what the CLI's dry run of a torchscript model found.
absl::Status ParseScriptModel(const YAML::Node& node, ModelSpec* model) {
  Section section(node, "script_model");
  section.CheckKeys({"file", "bytes", "blocks"});
  section.Read("file", &model->script_file);
  section.Read("bytes", &model->script_bytes);
  if (!section.status().ok()) return section.status();
  const YAML::Node* blocks = section.Find("blocks");
  if (blocks == nullptr || !blocks->IsSequence()) {
    return KeyError("script_model.blocks", "required: a list of {in, out, reversible, parameters}");
  }
  for (size_t i = 0; i < blocks->size(); ++i) {
    Section b((*blocks)[i], absl::StrCat("script_model.blocks[", i, "]"));
    b.CheckKeys({"in", "out", "reversible", "parameters"});
    ModelSpec::ScriptBlock block;
    b.Read("in", &block.in_shape);
    b.Read("out", &block.out_shape);
    b.Read("reversible", &block.reversible);
    b.Read("parameters", &block.parameters);
    if (!b.status().ok()) return b.status();
    for (const auto* shape : {&block.in_shape, &block.out_shape}) {
      if (shape->empty() ||
          std::any_of(shape->begin(), shape->end(), [](int64_t d) { return d < 1; })) {
        return KeyError(b.PathOf(shape == &block.in_shape ? "in" : "out"),
                        "must be a non-empty list of positive sizes");
      }
    }
    model->script_blocks.push_back(std::move(block));
  }
  return absl::OkStatus();
}

// A sub-section of `parent` read from its field list (an absent key keeps
// *out as it is, so a phase's section overrides the job's).
template <typename S>
absl::Status ReadSection(const Section& parent, absl::string_view key,
                         const std::vector<spec::Field<S>>& fields, S* out) {
  const YAML::Node* node = parent.Find(key);
  Section section(node ? *node : YAML::Node(), parent.PathOf(key));
  return spec::ReadFields(fields, section, out);
}

// transport.forward / transport.backward: the top-level keys, then each
// direction's own.
absl::Status ParseTransportDirections(const Section& top, TransportSpec* transport) {
  WireFormatSpec both;
  both.compression = transport->compression;
  both.block = transport->block;
  both.rotate = transport->rotate;
  transport->forward = both;
  transport->backward = both;
  const YAML::Node* node = top.Find("transport");
  const Section section(node ? *node : YAML::Node(), top.PathOf("transport"));
  if (absl::Status s =
          ReadSection(section, "forward", spec::WireFormatFields(), &transport->forward);
      !s.ok()) {
    return s;
  }
  return ReadSection(section, "backward", spec::WireFormatFields(), &transport->backward);
}

// Whether a section names a required key (a map holding it).
bool HasKey(const Section& parent, absl::string_view key, absl::string_view name) {
  const YAML::Node* node = parent.Find(key);
  return node != nullptr && node->IsMap() && (*node)[std::string(name)];
}

// phases: a list of {name, epochs | steps, algorithm, optimizer, schedule,
// reset_optimizer}; each inherits the job's optimizer and schedule.
absl::Status ParsePhases(const YAML::Node& node, JobSpec* spec) {
  if (!node.IsSequence() || node.size() == 0) {
    return TypeError(node, "phases", "a non-empty list of phases");
  }
  for (size_t i = 0; i < node.size(); ++i) {
    PhaseSpec phase;
    phase.name = absl::StrCat("phase", i);
    phase.optimizer = spec->optimizer;
    phase.schedule = spec->schedule;
    Section section(node[i], absl::StrCat("phases[", i, "]"));
    section.CheckKeys(
        {"name", "epochs", "steps", "algorithm", "optimizer", "schedule", "reset_optimizer"});
    section.Read("name", &phase.name);
    section.Read("epochs", &phase.epochs);
    section.Read("steps", &phase.steps);
    section.Read("reset_optimizer", &phase.reset_optimizer);
    if (!section.status().ok()) return section.status();
    const YAML::Node* algorithm = section.Find("algorithm");
    if (algorithm == nullptr) {
      return KeyError(section.PathOf("algorithm"), "required: the algorithm this phase runs");
    }
    if (absl::Status s = ParseAlgorithm(*algorithm, &phase.algorithm); !s.ok()) {
      return spec::InPhase(i, s);
    }
    if (absl::Status s =
            ReadSection(section, "optimizer", spec::OptimizerFields(), &phase.optimizer);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadSection(section, "schedule", spec::ScheduleFields(), &phase.schedule);
        !s.ok()) {
      return s;
    }
    spec->phases.push_back(std::move(phase));
  }
  return absl::OkStatus();
}

// trace: {steps: [from, to], max_spans}; present (even empty) turns it on.
absl::Status ParseTrace(const YAML::Node& node, TraceSpec* trace_spec) {
  trace_spec->enabled = true;
  Section trace(node.IsNull() ? YAML::Node(YAML::NodeType::Map) : node, "trace");
  trace.CheckKeys({"steps", "max_spans"});
  std::vector<int64_t> steps = {trace_spec->from, trace_spec->to};
  trace.Read("steps", &steps);
  trace.Read("max_spans", &trace_spec->max_spans);
  if (!trace.status().ok()) return trace.status();
  if (steps.size() != 2 || steps[0] < 0 || steps[1] <= steps[0]) {
    return KeyError("trace.steps", absl::StrCat("must be [from, to] with 0 <= from < to, got [",
                                                absl::StrJoin(steps, ", "), "]"));
  }
  trace_spec->from = steps[0];
  trace_spec->to = steps[1];
  if (trace_spec->max_spans < 1 || trace_spec->max_spans > 1000000) {
    return KeyError("trace.max_spans",
                    absl::StrCat("must be in [1, 1000000], got ", trace_spec->max_spans));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseDocument(const YAML::Node& root, spec::MissingKeys* missing) {
  JobSpec spec;
  Section top(root, "");
  if (absl::Status s = spec::ReadFields(spec::TopLevelFields(), top, &spec); !s.ok()) return s;

  if (absl::Status s = ReadSection(top, "model", spec::ModelFields(), &spec.model); !s.ok()) {
    return s;
  }
  missing->model_name = !HasKey(top, "model", "name");
  if (const YAML::Node* node = top.Find("script_model")) {
    if (absl::Status s = ParseScriptModel(*node, &spec.model); !s.ok()) return s;
  }
  if (absl::Status s = ReadSection(top, "data", spec::DataFields(), &spec.data); !s.ok()) {
    return s;
  }
  missing->data_dataset = !HasKey(top, "data", "dataset");
  if (const YAML::Node* node = top.Find("algorithm")) {
    if (absl::Status s = ParseAlgorithm(*node, &spec.algorithm); !s.ok()) return s;
  }
  if (const YAML::Node* node = top.Find("stages")) {
    if (absl::Status s = ParseStages(*node, &spec.stages); !s.ok()) return s;
  }
  for (absl::Status s : {
           ReadSection(top, "optimizer", spec::OptimizerFields(), &spec.optimizer),
           ReadSection(top, "schedule", spec::ScheduleFields(), &spec.schedule),
           ReadSection(top, "eval", spec::EvalFields(), &spec.eval),
           ReadSection(top, "checkpoint", spec::CheckpointFields(), &spec.checkpoint),
           ReadSection(top, "recovery", spec::RecoveryFields(), &spec.recovery),
           ReadSection(top, "sync", spec::SyncFields(), &spec.sync),
           ReadSection(top, "placement", spec::PlacementFields(), &spec.placement),
           ReadSection(top, "transport", spec::TransportFields(), &spec.transport),
           ReadSection(top, "rebalance", spec::RebalanceFields(), &spec.rebalance),
       }) {
    if (!s.ok()) return s;
  }
  if (absl::Status s = ParseTransportDirections(top, &spec.transport); !s.ok()) return s;
  if (const YAML::Node* node = top.Find("trace")) {
    if (absl::Status s = ParseTrace(*node, &spec.trace); !s.ok()) return s;
  }
  if (const YAML::Node* node = top.Find("phases")) {
    // With phases, the algorithm and the length are given per phase.
    for (const char* key : {"algorithm", "epochs", "steps"}) {
      if (const YAML::Node* given = top.Find(key)) {
        return KeyError(key, absl::StrCat("not allowed with phases: give phases[i].", key,
                                          " instead", MarkSuffix(*given)));
      }
    }
    if (absl::Status s = ParsePhases(*node, &spec); !s.ok()) return s;
    spec.algorithm = spec.phases.front().algorithm;
    for (const PhaseSpec& phase : spec.phases) {
      spec.epochs += phase.epochs;
      spec.steps += phase.steps;
    }
  }
  return spec;
}

}  // namespace

namespace {

// One parse of a document: its keys, then the rules between them.
absl::StatusOr<JobSpec> ParseTree(const YAML::Node& root) {
  spec::MissingKeys missing;
  absl::StatusOr<JobSpec> spec = ParseDocument(root, &missing);
  if (!spec.ok()) return spec.status();
  absl::Status status = spec::ValidateParsed(*spec, missing);
  if (status.ok()) status = FillDataShape(spec->data, &spec->model);
  if (!status.ok()) return status;
  spec->model.batch_size = spec->batch_size;
  if (spec->stages.bottleneck.rank > 0) {
    spec->model.bottleneck = {spec->stages.bottleneck.rank, VirtualStages(spec->stages),
                              spec->stages.partition, spec->stages.ranges};
  }
  return spec;
}

// The --set assignments applied to `root` in place (OverrideKeys); the key
// paths they wrote go to `set_paths`.
absl::Status ApplyOverrides(YAML::Node root, const std::vector<std::string>& assignments,
                            std::vector<std::string>* set_paths);

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text) {
  return ParseJobSpec(yaml_text, {});
}

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text,
                                     const std::vector<std::string>& assignments) {
  if (yaml_text.size() > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the job spec is ", yaml_text.size(),
                                                   " bytes; at most ", kMaxJobSpecBytes,
                                                   " are accepted"));
  }
  // yaml-cpp reports everything by exception; none may escape (a bad spec
  // must never take down the coordinator).
  try {
    YAML::Node root = YAML::Load(yaml_text);
    std::vector<std::string> set_paths;
    if (!assignments.empty()) {
      if (!root.IsMap()) return absl::InvalidArgumentError("job spec: expected a map of keys");
      if (absl::Status s = ApplyOverrides(root, assignments, &set_paths); !s.ok()) return s;
    }
    return spec::ParseReportingAll(root, set_paths, ParseTree);
  } catch (const YAML::Exception& e) {
    return spec::YamlError(e);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("parsing job spec: ", e.what()));
  }
}

absl::StatusOr<std::string> ReadJobFile(const std::string& path) {
  try {
    std::error_code error;
    const std::filesystem::file_status file = std::filesystem::status(path, error);
    if (!std::filesystem::exists(file)) {
      return absl::NotFoundError(absl::StrCat("job spec file not found: ", path));
    }
    if (std::filesystem::is_directory(file)) {
      return absl::InvalidArgumentError(absl::StrCat("job spec path is a directory: ", path));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open job spec ", path));
    }
    std::string text;
    char buffer[4096];
    while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
      text.append(buffer, static_cast<size_t>(in.gcount()));
      if (text.size() > kMaxSpecFileBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("job spec file is larger than ", kMaxSpecFileBytes, " bytes: ", path));
      }
    }
    if (in.bad()) {
      return absl::DataLossError(absl::StrCat("error reading job spec ", path));
    }
    return text;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reading job spec ", path, ": ", e.what()));
  }
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  absl::StatusOr<std::string> text = ReadJobFile(path);
  if (!text.ok()) return text.status();
  // Parse errors stay exactly as ParseJobSpec reports them (key path first);
  // callers such as the CLI put the file name in front themselves.
  return ParseJobSpec(*text);
}

absl::StatusOr<AuxHeadSpec> ParseAuxHeadSpec(const std::string& text) {
  if (text == "linear") return AuxHeadSpec{};
  if (text == "conv") return AuxHeadSpec{{128, 64}};
  if (absl::StartsWith(text, "conv:")) {
    AuxHeadSpec spec;
    for (absl::string_view part : absl::StrSplit(text.substr(5), ',')) {
      int64_t c = 0;
      if (!absl::SimpleAtoi(part, &c) || c < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "algorithm.aux_head: '", text, "': channel counts must be positive integers"));
      }
      spec.conv_channels.push_back(c);
    }
    return spec;
  }
  return absl::InvalidArgumentError(absl::StrCat("algorithm.aux_head: unknown head '", text,
                                                 "' (known: conv, conv:C1,C2,..., linear)"));
}

absl::Status ResolveAutoSchedule(std::optional<PipelineSchedule> chosen,
                                 std::vector<PhaseSpec>& phases) {
  if (chosen == PipelineSchedule::kInterleaved) {
    return absl::InvalidArgumentError(
        "StageAssignment.schedule: interleaved is not a schedule auto chooses");
  }
  for (PhaseSpec& phase : phases) {
    auto* backprop = std::get_if<BackpropOptions>(&phase.algorithm.options);
    if (backprop != nullptr && !backprop->schedule.has_value()) {
      backprop->schedule = chosen.value_or(PipelineSchedule::kOneFOneB);
    }
  }
  return absl::OkStatus();
}

std::vector<PhaseSpec> Phases(const JobSpec& spec) {
  if (!spec.phases.empty()) return spec.phases;
  PhaseSpec only;
  only.name = "main";
  only.epochs = spec.epochs;
  only.steps = spec.steps;
  only.algorithm = spec.algorithm;
  only.optimizer = spec.optimizer;
  only.schedule = spec.schedule;
  return {only};
}

absl::StatusOr<std::string> OverrideSteps(const std::string& yaml_text, int64_t steps) {
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap()) return absl::InvalidArgumentError("job spec: expected a map of keys");
    auto set = [steps](YAML::Node node) {
      node.remove("epochs");
      node["steps"] = steps;
    };
    if (root["phases"] && root["phases"].IsSequence()) {
      for (YAML::Node phase : root["phases"]) {
        if (phase.IsMap()) set(phase);
      }
    } else {
      set(root);
    }
    YAML::Emitter out;
    out << root;
    return std::string(out.c_str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

namespace {

absl::Status ApplyOverrides(YAML::Node root, const std::vector<std::string>& assignments,
                            std::vector<std::string>* set_paths) {
  for (const std::string& assignment : assignments) {
    const size_t eq = assignment.find('=');
    const std::string path = assignment.substr(0, eq);
    const std::string where = absl::StrCat("--set ", spec::Clip(assignment));
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected KEY=VALUE, e.g. data.limit_test=256"));
    }
    const std::vector<std::string> keys = absl::StrSplit(path, '.');
    YAML::Node value;
    try {
      value = YAML::Load(assignment.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the value is not YAML: ", e.msg));
    }
    // yaml-cpp nodes are handles: walk down, making maps where needed.
    YAML::Node node = root;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      const std::string& key = keys[i];
      if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty key"));
      YAML::Node child = node[key];
      if (child.IsScalar() && (key == "algorithm" || key == "stages") && node.IsMap() && i == 0) {
        // The short forms `algorithm: petra` and `stages: 4` as maps.
        YAML::Node full(YAML::NodeType::Map);
        full[key == "algorithm" ? "name" : "count"] = child.Scalar();
        node[key] = full;
        child = node[key];
      } else if (!child.IsDefined() || child.IsNull()) {
        node[key] = YAML::Node(YAML::NodeType::Map);
        child = node[key];
      } else if (!child.IsMap()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", absl::StrJoin(keys.begin(), keys.begin() + i + 1, "."),
                         " is ", spec::Describe(child), ", not a map"));
      }
      node.reset(child);
    }
    if (keys.back().empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty key"));
    node[keys.back()] = value;
    if (set_paths != nullptr) set_paths->push_back(path);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> OverrideKeys(const std::string& yaml_text,
                                         const std::vector<std::string>& assignments) {
  if (assignments.empty()) return yaml_text;
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap()) return absl::InvalidArgumentError("job spec: expected a map of keys");
    if (absl::Status s = ApplyOverrides(root, assignments, nullptr); !s.ok()) return s;
    YAML::Emitter out;
    out << root;
    return std::string(out.c_str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

}  // namespace stagewise
