#include "worker/algorithms/common.h"

#include "absl/strings/str_cat.h"
#include "services/tensor/codec.h"

namespace stagewise::worker {

v1::StageMessage NewMessage(v1::StageMessage::Kind kind, int64_t step, int micro_batch) {
  v1::StageMessage m;
  m.set_kind(kind);
  m.set_step(step);
  m.set_micro_batch(micro_batch);
  return m;
}

absl::Status PutTensor(v1::StageMessage* message, const std::string& name,
                       const torch::Tensor& tensor) {
  return EncodeTensor(tensor.detach(), &(*message->mutable_tensors())[name]);
}

absl::StatusOr<torch::Tensor> GetTensor(const v1::StageMessage& message, const std::string& name,
                                        torch::Device device) {
  auto it = message.tensors().find(name);
  if (it == message.tensors().end()) {
    return absl::InvalidArgumentError(absl::StrCat("StageMessage.tensors: missing '", name, "' in ",
                                                   v1::StageMessage::Kind_Name(message.kind()),
                                                   " message of step ", message.step()));
  }
  auto t = DecodeTensor(it->second);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageMessage.tensors['", name, "']: ", t.status().message()));
  }
  return device.is_cpu() ? *t : t->to(device);
}

absl::Status ExpectMessage(const v1::StageMessage& message, v1::StageMessage::Kind kind,
                           int64_t step, int micro_batch) {
  if (message.kind() != kind || message.step() != step || message.micro_batch() != micro_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", v1::StageMessage::Kind_Name(kind), " step ", step, " micro-batch ",
        micro_batch, ", got ", v1::StageMessage::Kind_Name(message.kind()), " step ",
        message.step(), " micro-batch ", message.micro_batch()));
  }
  return absl::OkStatus();
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

absl::StatusOr<ForwardInput> StageInput(StageContext& ctx, int64_t step) {
  if (!ctx.first()) return ReceiveForward(ctx, step, 0);
  data::Batch b = ctx.TrainBatch(step);
  ForwardInput in;
  in.x = b.x.to(ctx.device());
  in.labels = b.y.to(ctx.device());
  return in;
}

absl::StatusOr<ForwardInput> ReceiveForward(StageContext& ctx, int64_t step, int micro_batch,
                                            bool decode_labels) {
  auto msg = ctx.ReceiveFromPrev();
  if (!msg.ok()) return msg.status();
  STAGEWISE_RETURN_IF_ERROR(ExpectMessage(*msg, v1::StageMessage::FORWARD, step, micro_batch));
  ForwardInput in;
  auto x = GetTensor(*msg, "x", ctx.device());
  if (!x.ok()) return x.status();
  in.x = *x;
  auto it = msg->tensors().find("labels");
  if (it == msg->tensors().end()) {
    return absl::InvalidArgumentError("StageMessage.tensors: FORWARD message without 'labels'");
  }
  in.labels_proto = it->second;
  if (ctx.last() || decode_labels) {
    auto y = GetTensor(*msg, "labels", ctx.device());
    if (!y.ok()) return y.status();
    in.labels = *y;
  }
  return in;
}

absl::Status SendForward(StageContext& ctx, int64_t step, int micro_batch, const torch::Tensor& out,
                         const torch::Tensor& labels, v1::TensorProto labels_proto) {
  v1::StageMessage fwd = NewMessage(v1::StageMessage::FORWARD, step, micro_batch);
  STAGEWISE_RETURN_IF_ERROR(PutTensor(&fwd, "x", out));
  if (ctx.first()) {
    STAGEWISE_RETURN_IF_ERROR(PutTensor(&fwd, "labels", labels));
  } else {
    (*fwd.mutable_tensors())["labels"] = std::move(labels_proto);
  }
  return ctx.SendToNext(std::move(fwd));
}

absl::Status RunEvaluation(StageContext& ctx, int64_t steps_done) {
  torch::NoGradGuard no_grad;
  ctx.model().eval();
  double loss_sum = 0;
  int64_t correct = 0, samples = 0;
  auto score = [&](const torch::Tensor& logits, const torch::Tensor& y) {
    loss_sum += torch::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
    samples += y.size(0);
  };
  absl::Status status;
  if (ctx.first()) {
    const int64_t n = ctx.test_batches().batches_per_epoch();
    for (int64_t i = 0; i < n && status.ok(); ++i) {
      data::Batch b = ctx.test_batches().Get(0, i);
      torch::Tensor out = ctx.model().forward(b.x.to(ctx.device()));
      if (ctx.last()) {
        score(out, b.y.to(ctx.device()));
        continue;
      }
      v1::StageMessage m = NewMessage(v1::StageMessage::EVAL, steps_done, static_cast<int>(i));
      status.Update(PutTensor(&m, "x", out));
      status.Update(PutTensor(&m, "labels", b.y));
      (*m.mutable_scalars())["last"] = i == n - 1 ? 1.0 : 0.0;
      if (status.ok()) status = ctx.SendToNext(std::move(m));
    }
  } else {
    for (bool done = false; !done && status.ok();) {
      auto m = ctx.ReceiveFromPrev();
      if (!m.ok()) {
        status = m.status();
        break;
      }
      if (m->kind() != v1::StageMessage::EVAL || m->step() != steps_done) {
        status = ExpectMessage(*m, v1::StageMessage::EVAL, steps_done, m->micro_batch());
        break;
      }
      done = m->scalars().count("last") && m->scalars().at("last") > 0;
      auto x = GetTensor(*m, "x", ctx.device());
      auto y = GetTensor(*m, "labels", ctx.device());
      if (!x.ok() || !y.ok()) {
        status = x.ok() ? y.status() : x.status();
        break;
      }
      torch::Tensor out = ctx.model().forward(*x);
      if (ctx.last()) {
        score(out, *y);
        continue;
      }
      v1::StageMessage fwd = NewMessage(v1::StageMessage::EVAL, steps_done, m->micro_batch());
      status.Update(PutTensor(&fwd, "x", out));
      (*fwd.mutable_tensors())["labels"] = m->tensors().at("labels");
      (*fwd.mutable_scalars())["last"] = done ? 1.0 : 0.0;
      if (status.ok()) status = ctx.SendToNext(std::move(fwd));
    }
  }
  ctx.model().train();
  if (status.ok() && ctx.last() && samples > 0) {
    ctx.ReportEval(steps_done, loss_sum / static_cast<double>(samples),
                   static_cast<double>(correct) / static_cast<double>(samples), samples);
  }
  return status;
}

}  // namespace stagewise::worker
