#include "services/planner/plan_proto.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stagewise::planner {

// The proto values are the spec's plus one (0 is UNSPECIFIED).
static_assert(static_cast<int>(v1::PIPELINE_SCHEDULE_GPIPE) ==
                  static_cast<int>(PipelineSchedule::kGpipe) + 1 &&
              static_cast<int>(v1::PIPELINE_SCHEDULE_1F1B) ==
                  static_cast<int>(PipelineSchedule::kOneFOneB) + 1 &&
              static_cast<int>(v1::PIPELINE_SCHEDULE_ZB_H1) ==
                  static_cast<int>(PipelineSchedule::kZbH1) + 1 &&
              static_cast<int>(v1::PIPELINE_SCHEDULE_INTERLEAVED) ==
                  static_cast<int>(PipelineSchedule::kInterleaved) + 1 &&
              EnumSpellings<PipelineSchedule>::kNames.size() == 4);
static_assert(static_cast<int>(v1::BLOCK_MODE_STORE) == static_cast<int>(BlockMode::kStore) + 1 &&
              static_cast<int>(v1::BLOCK_MODE_REBUILD) ==
                  static_cast<int>(BlockMode::kRebuild) + 1 &&
              EnumSpellings<BlockMode>::kNames.size() == 2);

v1::PipelineSchedule ToProto(std::optional<PipelineSchedule> schedule) {
  if (!schedule.has_value()) return v1::PIPELINE_SCHEDULE_UNSPECIFIED;
  return static_cast<v1::PipelineSchedule>(static_cast<int>(*schedule) + 1);
}

absl::StatusOr<std::optional<PipelineSchedule>> ScheduleFromProto(v1::PipelineSchedule schedule,
                                                                  const std::string& field) {
  if (schedule == v1::PIPELINE_SCHEDULE_UNSPECIFIED) return std::nullopt;
  const int value = static_cast<int>(schedule) - 1;
  if (value < 0 || value >= static_cast<int>(EnumSpellings<PipelineSchedule>::kNames.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": unknown pipeline schedule ", static_cast<int>(schedule)));
  }
  return static_cast<PipelineSchedule>(value);
}

v1::BlockMode ToProto(BlockMode mode) {
  return static_cast<v1::BlockMode>(static_cast<int>(mode) + 1);
}

v1::Compression ToProto(Compression compression) {
  switch (compression) {
    case Compression::kFp16:
      return v1::COMPRESSION_FP16;
    case Compression::kBf16:
      return v1::COMPRESSION_BF16;
    case Compression::kInt8:
      return v1::COMPRESSION_INT8;
    case Compression::kInt4:
      return v1::COMPRESSION_INT4;
    case Compression::kNone:
    case Compression::kAuto:
      break;
  }
  return v1::COMPRESSION_NONE;
}

absl::StatusOr<Compression> CompressionFromProto(v1::Compression compression,
                                                 const std::string& field) {
  switch (compression) {
    case v1::COMPRESSION_NONE:
      return Compression::kNone;
    case v1::COMPRESSION_FP16:
      return Compression::kFp16;
    case v1::COMPRESSION_BF16:
      return Compression::kBf16;
    case v1::COMPRESSION_INT8:
      return Compression::kInt8;
    case v1::COMPRESSION_INT4:
      return Compression::kInt4;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown compression ", static_cast<int>(compression)));
}

absl::StatusOr<std::vector<BlockMode>> ModesFromProto(
    const google::protobuf::RepeatedField<int>& modes, const std::string& field) {
  std::vector<BlockMode> out;
  out.reserve(modes.size());
  for (int i = 0; i < modes.size(); ++i) {
    if (modes[i] != v1::BLOCK_MODE_STORE && modes[i] != v1::BLOCK_MODE_REBUILD) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: unknown block mode ",
                                                     modes[i], " (expected store or rebuild)"));
    }
    out.push_back(static_cast<BlockMode>(modes[i] - 1));
  }
  return out;
}

namespace {

// Each BlockProfile field with its proto accessors, once.
template <typename Fn>
void ForEachTime(BlockProfile& b, Fn fn) {
  fn("forward_s", &b.forward_s);
  fn("forward_nograd_s", &b.forward_nograd_s);
  fn("backward_s", &b.backward_s);
  fn("rebuild_backward_s", &b.rebuild_backward_s);
  fn("inverse_s", &b.inverse_s);
  fn("step_s", &b.step_s);
  fn("message_s", &b.message_s);
  fn("aux_head_s", &b.aux_head_s);
}
template <typename Fn>
void ForEachSize(BlockProfile& b, Fn fn) {
  fn("input_bytes", &b.input_bytes);
  fn("output_bytes", &b.output_bytes);
  fn("graph_bytes", &b.graph_bytes);
  fn("forward_transient_bytes", &b.forward_transient_bytes);
  fn("backward_transient_bytes", &b.backward_transient_bytes);
  fn("rebuild_transient_bytes", &b.rebuild_transient_bytes);
  fn("parameter_bytes", &b.parameter_bytes);
  fn("buffer_bytes", &b.buffer_bytes);
  fn("optimizer_bytes", &b.optimizer_bytes);
}

}  // namespace

v1::ModelProfile ToProto(const ModelProfile& p) {
  v1::ModelProfile out;
  out.set_key(p.key);
  out.set_model(p.model);
  out.set_batch_size(p.batch_size);
  out.set_device(p.device);
  out.set_threads(p.threads);
  out.set_repeats(p.repeats);
  out.set_label_bytes(p.label_bytes);
  out.set_aux_head(p.aux_head);
  for (const BlockProfile& b : p.blocks) {
    v1::BlockProfile* o = out.add_blocks();
    o->set_index(b.index);
    o->set_kind(b.kind);
    o->set_reversible(b.reversible);
    o->set_forward_s(b.forward_s);
    o->set_forward_nograd_s(b.forward_nograd_s);
    o->set_backward_s(b.backward_s);
    o->set_rebuild_backward_s(b.rebuild_backward_s);
    o->set_inverse_s(b.inverse_s);
    o->set_step_s(b.step_s);
    o->set_message_s(b.message_s);
    o->set_aux_head_s(b.aux_head_s);
    o->set_input_bytes(b.input_bytes);
    o->set_output_bytes(b.output_bytes);
    o->set_graph_bytes(b.graph_bytes);
    o->set_forward_transient_bytes(b.forward_transient_bytes);
    o->set_backward_transient_bytes(b.backward_transient_bytes);
    o->set_rebuild_transient_bytes(b.rebuild_transient_bytes);
    o->set_parameter_bytes(b.parameter_bytes);
    o->set_buffer_bytes(b.buffer_bytes);
    o->set_optimizer_bytes(b.optimizer_bytes);
  }
  return out;
}

absl::StatusOr<ModelProfile> ProfileFromProto(const v1::ModelProfile& in) {
  ModelProfile p;
  p.key = in.key();
  p.model = in.model();
  p.batch_size = in.batch_size();
  p.device = in.device();
  p.threads = in.threads();
  p.repeats = in.repeats();
  p.label_bytes = in.label_bytes();
  p.aux_head = in.aux_head();
  if (p.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelProfile.batch_size: must be >= 1, got ", p.batch_size));
  }
  if (in.blocks().empty()) return absl::InvalidArgumentError("ModelProfile.blocks: empty");
  for (int i = 0; i < in.blocks_size(); ++i) {
    const v1::BlockProfile& o = in.blocks(i);
    const std::string at = absl::StrCat("ModelProfile.blocks[", i, "]");
    if (o.index() != i) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".index: ", o.index(), ", expected ", i));
    }
    BlockProfile b;
    b.index = o.index();
    b.kind = o.kind();
    b.reversible = o.reversible();
    b.forward_s = o.forward_s();
    b.forward_nograd_s = o.forward_nograd_s();
    b.backward_s = o.backward_s();
    b.rebuild_backward_s = o.rebuild_backward_s();
    b.inverse_s = o.inverse_s();
    b.step_s = o.step_s();
    b.message_s = o.message_s();
    b.aux_head_s = o.aux_head_s();
    b.input_bytes = o.input_bytes();
    b.output_bytes = o.output_bytes();
    b.graph_bytes = o.graph_bytes();
    b.forward_transient_bytes = o.forward_transient_bytes();
    b.backward_transient_bytes = o.backward_transient_bytes();
    b.rebuild_transient_bytes = o.rebuild_transient_bytes();
    b.parameter_bytes = o.parameter_bytes();
    b.buffer_bytes = o.buffer_bytes();
    b.optimizer_bytes = o.optimizer_bytes();
    absl::Status bad;
    ForEachTime(b, [&](const char* name, double* t) {
      if (bad.ok() && !(std::isfinite(*t) && *t >= 0)) {
        bad = absl::InvalidArgumentError(
            absl::StrCat(at, ".", name, ": must be a finite time >= 0, got ", *t));
      }
    });
    ForEachSize(b, [&](const char* name, int64_t* n) {
      if (bad.ok() && *n < 0) {
        bad = absl::InvalidArgumentError(absl::StrCat(at, ".", name, ": must be >= 0, got ", *n));
      }
    });
    if (!bad.ok()) return bad;
    p.blocks.push_back(std::move(b));
  }
  return p;
}

}  // namespace stagewise::planner
