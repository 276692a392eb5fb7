// The checks of the text keys: the gpt/reformer models, the fortunes and
// text_file datasets, and the rules between them and the other sections.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/spec/job_spec.h"
#include "services/spec/text.h"
#include "services/spec/validate.h"

namespace stagewise::spec {
namespace {

constexpr int64_t kMaxSequenceLength = 4096;
constexpr int64_t kMaxTextWidth = 8192;
constexpr int kMaxHeads = 256;
constexpr int kMaxTextDepth = 1024;
constexpr int64_t kMaxTextTrainSize = 10'000'000;

absl::Status AlgorithmFitsText(const AlgorithmSpec& algorithm, ModelKind model) {
  const auto* nwise = algorithm.get_if<NwiseOptions>();
  if (nwise != nullptr && nwise->aux_head != "linear") {
    return KeyError("algorithm.aux_head",
                    absl::StrCat("'", nwise->aux_head, "' is an image head; ", NameOf(model),
                                 " takes `linear`: a language-model head per module (a LayerNorm "
                                 "and a projection to the 256 byte values)"));
  }
  if (algorithm.kind() == AlgorithmKind::kAuxNet) {
    return KeyError("algorithm",
                    absl::StrCat("auxnet does not carry over to ", NameOf(model),
                                 ": its auxiliary networks are convolutional image models that "
                                 "learn a stage's input from the previous stage's feature maps "
                                 "(use nwise, petra, delayed or backprop)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTextModel(const ModelSpec& model) {
  const std::string name(NameOf(model.name));
  if (model.depth < 1 || model.depth > kMaxTextDepth) {
    return KeyError("model.depth", absl::StrCat(name, ": the number of Transformer blocks, in [1, ",
                                                kMaxTextDepth, "], got ", model.depth));
  }
  if (model.width < 0 || model.width > kMaxTextWidth) {
    return KeyError("model.width", absl::StrCat(name, ": the embedding width, in [0, ",
                                                kMaxTextWidth, "] (0 = 128), got ", model.width));
  }
  if (model.heads < 1 || model.heads > kMaxHeads) {
    return KeyError("model.heads",
                    absl::StrCat("must be in [1, ", kMaxHeads, "], got ", model.heads));
  }
  const int64_t width = model.width == 0 ? 128 : model.width;
  if (width % model.heads != 0) {
    return KeyError("model.heads", absl::StrCat(model.heads, " heads do not divide model.width ",
                                                width, " (each head takes width / heads values)"));
  }
  if (!model.blocks.empty()) return KeyError("model.blocks", absl::StrCat("not used by ", name));
  return absl::OkStatus();
}

absl::Status ValidateTextData(const DataSpec& data) {
  if (data.dataset == DatasetKind::kTextFile && data.path.empty()) {
    return KeyError("data.path", "required for text_file: the UTF-8 text file to train on");
  }
  if (data.sequence_length < 2 || data.sequence_length > kMaxSequenceLength) {
    return KeyError("data.sequence_length", absl::StrCat("must be in [2, ", kMaxSequenceLength,
                                                         "], got ", data.sequence_length));
  }
  if (data.min_sequence_length != 0 &&
      (data.min_sequence_length < 1 || data.min_sequence_length > data.sequence_length)) {
    return KeyError("data.min_sequence_length",
                    absl::StrCat("must be 0 or in [1, data.sequence_length = ",
                                 data.sequence_length, "], got ", data.min_sequence_length));
  }
  if (data.train_size < 1 || data.train_size > kMaxTextTrainSize) {
    return KeyError("data.train_size", absl::StrCat("text: sequences per epoch, in [1, ",
                                                    kMaxTextTrainSize, "], got ", data.train_size));
  }
  if (data.augment) return KeyError("data.augment", "image augmentation; not for text");
  return absl::OkStatus();
}

absl::Status ValidateModelFitsData(const JobSpec& spec) {
  const bool text_data = IsText(spec.data.dataset);
  const bool text_model = IsTextModel(spec.model.name);
  if (text_model && !text_data) {
    return KeyError("data.dataset",
                    absl::StrCat("model ", NameOf(spec.model.name),
                                 " is a byte-level language model: use fortunes or text_file, not ",
                                 NameOf(spec.data.dataset)));
  }
  if (text_data && !text_model && spec.model.name != ModelKind::kTorchScript) {
    return KeyError("model.name",
                    absl::StrCat("dataset ", NameOf(spec.data.dataset),
                                 " is text: use gpt or reformer, not ", NameOf(spec.model.name)));
  }
  if (!text_model) return absl::OkStatus();
  const std::vector<PhaseSpec> phases = Phases(spec);
  for (size_t i = 0; i < phases.size(); ++i) {
    absl::Status status = AlgorithmFitsText(phases[i].algorithm, spec.model.name);
    if (!status.ok()) return spec.phases.empty() ? status : InPhase(i, status);
  }
  return absl::OkStatus();
}

}  // namespace stagewise::spec
