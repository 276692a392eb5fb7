// Validation of a parsed job spec, as the parser calls it. Internal to
// services/spec/ (everyone else calls ValidateJobSpec, job_spec.h).
#ifndef STAGEWISE_SERVICES_SPEC_VALIDATE_H_
#define STAGEWISE_SERVICES_SPEC_VALIDATE_H_

#include "absl/status/status.h"
#include "services/spec/job_spec.h"

namespace stagewise::spec {

// Required keys without a default that a document left out; their structs
// hold a placeholder value (an enum's first), so the parser says which.
struct MissingKeys {
  bool model_name = false;
  bool data_dataset = false;
};

// ValidateJobSpec, reporting a missing required key where the check of its
// section stands: the first error is the same whatever the order of reading.
absl::Status ValidateParsed(const JobSpec& spec, const MissingKeys& missing);

// validate_text.cc: the gpt/reformer keys, the text datasets' keys, and the
// rules between a text model, text data and the algorithms.
absl::Status ValidateTextModel(const ModelSpec& model);
absl::Status ValidateTextData(const DataSpec& data);
absl::Status ValidateModelFitsData(const JobSpec& spec);

}  // namespace stagewise::spec

#endif  // STAGEWISE_SERVICES_SPEC_VALIDATE_H_
