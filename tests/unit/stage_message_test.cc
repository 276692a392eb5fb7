// ValidateStageMessage: what a stage accepts from its neighbours before any
// of a message is used.
#include "services/tensor/stage_message.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stagewise {
namespace {

using ::testing::HasSubstr;

v1::StageMessage Message(v1::StageMessage::Kind kind) {
  v1::StageMessage m;
  m.set_job_id("job-1");
  m.set_kind(kind);
  m.set_attempt(2);
  return m;
}

TEST(StageMessage, KindsFollowTheDirection) {
  const StageMessageExpectation from_prev{"job-1", 1, true};
  const StageMessageExpectation from_next{"job-1", 1, false};
  for (auto kind : {v1::StageMessage::FORWARD, v1::StageMessage::EVAL, v1::StageMessage::AUX,
                    v1::StageMessage::OPEN}) {
    EXPECT_TRUE(ValidateStageMessage(Message(kind), from_prev).ok()) << kind;
  }
  for (auto kind : {v1::StageMessage::BACKWARD, v1::StageMessage::AUX}) {
    EXPECT_TRUE(ValidateStageMessage(Message(kind), from_next).ok()) << kind;
  }
  for (auto kind : {v1::StageMessage::BACKWARD, v1::StageMessage::KIND_UNSPECIFIED}) {
    EXPECT_THAT(std::string(ValidateStageMessage(Message(kind), from_prev).message()),
                HasSubstr("cannot come from stage 0"));
  }
  // A stage opens its stream towards the next one, never the other way.
  EXPECT_THAT(
      std::string(ValidateStageMessage(Message(v1::StageMessage::OPEN), from_next).message()),
      HasSubstr("OPEN cannot come from stage 2"));
  v1::StageMessage other_job = Message(v1::StageMessage::FORWARD);
  other_job.set_job_id("job-2");
  EXPECT_THAT(std::string(ValidateStageMessage(other_job, from_prev).message()),
              HasSubstr("StageMessage.job_id"));
}

TEST(StageMessage, AnOpenMessageCarriesNothing) {
  const StageMessageExpectation from_prev{"job-1", 1, true};
  v1::StageMessage with_scalar = Message(v1::StageMessage::OPEN);
  (*with_scalar.mutable_scalars())["loss"] = 1;
  EXPECT_EQ(ValidateStageMessage(with_scalar, from_prev).code(),
            absl::StatusCode::kInvalidArgument);
  v1::StageMessage with_tensor = Message(v1::StageMessage::OPEN);
  (*with_tensor.mutable_tensors())["x"];
  EXPECT_THAT(std::string(ValidateStageMessage(with_tensor, from_prev).message()),
              HasSubstr("OPEN message carries no tensors or scalars"));
}

TEST(StageMessage, OnlyForwardAndAuxFromThePreviousStageCarryACheckpointStep) {
  const StageMessageExpectation from_prev{"job-1", 1, true};
  const StageMessageExpectation from_next{"job-1", 1, false};
  for (const auto kind : {v1::StageMessage::FORWARD, v1::StageMessage::AUX}) {
    v1::StageMessage m = Message(kind);
    m.set_checkpoint_step(57);
    EXPECT_TRUE(ValidateStageMessage(m, from_prev).ok());
    m.set_checkpoint_step(-1);
    EXPECT_THAT(std::string(ValidateStageMessage(m, from_prev).message()),
                HasSubstr("StageMessage.checkpoint_step"));
  }
  v1::StageMessage eval = Message(v1::StageMessage::EVAL);
  eval.set_checkpoint_step(57);
  EXPECT_EQ(ValidateStageMessage(eval, from_prev).code(), absl::StatusCode::kInvalidArgument);
  v1::StageMessage backward = Message(v1::StageMessage::BACKWARD);
  backward.set_checkpoint_step(57);
  EXPECT_EQ(ValidateStageMessage(backward, from_next).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagewise
