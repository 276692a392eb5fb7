#include "worker/algorithms/common.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/models/blocks.h"
#include "services/models/loss.h"
#include "services/models/memory_meter.h"
#include "services/tensor/codec.h"
#include "services/training/optimizer.h"
#include "worker/wire_residuals.h"

namespace stagewise::worker {

v1::StageMessage NewMessage(v1::StageMessage::Kind kind, int64_t step, int micro_batch) {
  v1::StageMessage m;
  m.set_kind(kind);
  m.set_step(step);
  m.set_micro_batch(micro_batch);
  return m;
}

absl::Status PutTensor(v1::StageMessage* message, const std::string& name,
                       const torch::Tensor& tensor, const EncodeOptions& options) {
  return EncodeTensor(tensor.detach(), &(*message->mutable_tensors())[name], options);
}

absl::Status PutTensor(v1::StageMessage* message, const std::string& name,
                       const torch::Tensor& tensor, v1::Compression compression) {
  EncodeOptions options;
  options.compression = compression;
  return PutTensor(message, name, tensor, options);
}

absl::StatusOr<torch::Tensor> GetTensor(v1::StageMessage& message, const std::string& name,
                                        torch::Device device) {
  auto it = message.mutable_tensors()->find(name);
  if (it == message.mutable_tensors()->end()) {
    return absl::InvalidArgumentError(absl::StrCat("StageMessage.tensors: missing '", name, "' in ",
                                                   v1::StageMessage::Kind_Name(message.kind()),
                                                   " message of step ", message.step()));
  }
  // The taken-over buffer counts towards the stage's memory like a tensor
  // LibTorch allocated (the planner's peak memory is checked against it).
  DecodeOptions options;
  options.charge = [](int64_t bytes) { return models::ChargeForeignBytes(bytes); };
  options.device = device;
  auto t = DecodeTensor(&it->second, options);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageMessage.tensors['", name, "']: ", t.status().message()));
  }
  return *t;
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

absl::Status SendGrad(StageContext& ctx, int64_t step, int micro_batch, const torch::Tensor& grad,
                      const torch::Tensor& x, int64_t origin) {
  if (ctx.first()) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  v1::StageMessage back = NewMessage(v1::StageMessage::BACKWARD, step, micro_batch);
  if (origin >= 0) back.set_origin_stage(static_cast<int32_t>(origin));
  std::vector<OutgoingTensor> tensors;
  if (x.defined()) tensors.push_back({"x", x.detach(), ctx.Wire(false)});
  EncodeOptions wire = ctx.Wire(false);
  if (WireResiduals* residuals = ctx.wire_residuals()) wire.residual = residuals->Slot(micro_batch);
  tensors.push_back({"grad", grad.detach(), wire});
  absl::Status sent = ctx.SendTensorsTo(Side::kPrev, std::move(back), std::move(tensors));
  TraceSpan(ctx, v1::SPAN_SEND, step, micro_batch, t0);
  return sent;
}

absl::StatusOr<torch::Tensor> ReceiveGrad(StageContext& ctx, int64_t step, int micro_batch,
                                          torch::Tensor* x) {
  STAGEWISE_ASSIGN_OR_RETURN(v1::StageMessage msg, ctx.ReceiveFromNext());
  STAGEWISE_RETURN_IF_ERROR(ExpectMessage(msg, v1::StageMessage::BACKWARD, step, micro_batch));
  if (x != nullptr) {
    STAGEWISE_ASSIGN_OR_RETURN(*x, GetTensor(msg, "x", ctx.device()));
  }
  return GetTensor(msg, "grad", ctx.device());
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void TraceSpan(StageContext& ctx, v1::SpanKind kind, int64_t step, int micro_batch,
               std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1) {
  if (Tracer* tracer = ctx.tracer()) tracer->Record(kind, step, micro_batch, t0, t1);
}

void TimeCompute(StageContext& ctx, const char* phase, int64_t step, int micro_batch,
                 std::chrono::steady_clock::time_point t0,
                 std::chrono::steady_clock::time_point t1) {
  // An emulated device's work ends with the span (services/models/blocks.h).
  if (models::FlushEmulatedWaits()) t1 = std::max(t1, std::chrono::steady_clock::now());
  ctx.stage_metrics().ObserveCompute(phase, std::chrono::duration<double>(t1 - t0).count());
  const std::string_view name(phase);
  v1::SpanKind kind = v1::SPAN_KIND_UNSPECIFIED;
  if (name == "forward") kind = v1::SPAN_FORWARD;
  if (name == "backward") kind = v1::SPAN_BACKWARD;
  if (name == "backward_weight") kind = v1::SPAN_BACKWARD_WEIGHT;
  if (name == "recompute") kind = v1::SPAN_RECOMPUTE;
  if (name == "step") kind = v1::SPAN_STEP;
  if (name == "aux") kind = v1::SPAN_AUX;
  TraceSpan(ctx, kind, step, micro_batch, t0, t1);
}

int64_t TensorBytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

int64_t TensorBytes(const std::vector<torch::Tensor>& ts) {
  int64_t bytes = 0;
  for (const auto& t : ts) bytes += TensorBytes(t);
  return bytes;
}

std::vector<int64_t> MicroBatchSizes(int64_t batch_size, int micro_batches) {
  std::vector<int64_t> sizes;
  for (int m = 0; m < micro_batches; ++m) {
    sizes.push_back(batch_size / micro_batches + (m < batch_size % micro_batches));
  }
  return sizes;
}

absl::Status CheckOutputShape(const std::string& name, c10::IntArrayRef got, c10::IntArrayRef want,
                              const char* what) {
  if (got.equals(want)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("StageMessage.tensors['", name, "']: shape ",
                                                 c10::str(got), " does not match ", what, " ",
                                                 c10::str(want)));
}

void StepAt(torch::optim::Optimizer& optimizer, double lr) {
  training::SetLearningRate(optimizer, lr);
  optimizer.step();
}

absl::Status StepOptimizer(StageContext& ctx, int64_t step, double lr,
                           torch::optim::Optimizer* extra) {
  STAGEWISE_RETURN_IF_ERROR(ctx.AverageReplicaGradients(extra));
  const auto t0 = std::chrono::steady_clock::now();
  StepAt(ctx.optimizer(), lr);
  if (extra != nullptr) StepAt(*extra, lr);
  TimeCompute(ctx, "step", step, 0, t0);
  ctx.stage_metrics().IncSteps();
  return ctx.SyncReplicas(extra);
}

double LossBackward(StageContext& ctx, int64_t step, const ForwardInput& in) {
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor x = in.x;
  if (!ctx.first()) x.requires_grad_(true);
  torch::Tensor loss = models::CrossEntropy(ctx.model().forward(x), in.labels);
  const auto t1 = std::chrono::steady_clock::now();
  loss.backward();
  const auto t2 = std::chrono::steady_clock::now();
  ctx.stage_metrics().ObserveCompute("forward", std::chrono::duration<double>(t2 - t0).count());
  TraceSpan(ctx, v1::SPAN_FORWARD, step, 0, t0, t1);
  TraceSpan(ctx, v1::SPAN_BACKWARD, step, 0, t1, t2);
  return loss.item<double>();
}

bool ReportHeldInputs(StageContext& ctx, int64_t held, int64_t bytes, int64_t* peak) {
  ctx.stage_metrics().SetMemory("inputs", bytes);
  if (held <= *peak) return false;
  *peak = held;
  ctx.Summarize("peak_inputs", static_cast<double>(held));
  ctx.Summarize("peak_input_bytes", static_cast<double>(bytes));
  return true;
}

void ReportStaleness(StageContext& ctx, int64_t stale, int64_t* max) {
  ctx.stage_metrics().SetStaleness(stale);
  if (stale <= *max) return;
  *max = stale;
  ctx.Summarize("staleness_steps", static_cast<double>(stale));
}

absl::Status RecomputeBackward(StageContext& ctx, int64_t step, const torch::Tensor& input,
                               const torch::Tensor& grad) {
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor out;
  {
    models::FreezeRunningStats freeze;
    out = ctx.model().forward(input);
  }
  TimeCompute(ctx, "recompute", step, 0, t0);
  STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("grad", grad.sizes(), out.sizes()));
  const auto t1 = std::chrono::steady_clock::now();
  out.backward(grad);
  TimeCompute(ctx, "backward", step, 0, t1);
  return absl::OkStatus();
}

std::unique_ptr<torch::optim::Optimizer> SetUpAuxModule(StageContext& ctx,
                                                        torch::nn::Module& module,
                                                        const std::string& name) {
  module.to(ctx.device());
  module.train();
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  ctx.Summarize(name, static_cast<double>(count));
  ctx.stage_metrics().SetMemory(name, TensorBytes(module.parameters()));
  return training::MakeOptimizer(ctx.spec().optimizer, module);
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
  STAGEWISE_ASSIGN_OR_RETURN(v1::StageMessage msg, ctx.ReceiveFromPrev());
  STAGEWISE_RETURN_IF_ERROR(ExpectMessage(msg, v1::StageMessage::FORWARD, step, micro_batch));
  ForwardInput in;
  STAGEWISE_ASSIGN_OR_RETURN(in.x, GetTensor(msg, "x", ctx.device()));
  auto it = msg.tensors().find("labels");
  if (it == msg.tensors().end()) {
    return absl::InvalidArgumentError("StageMessage.tensors: FORWARD message without 'labels'");
  }
  in.labels_proto = it->second;
  // Passed on later, after the next receive may have returned the original's
  // lease: a copy of its own.
  STAGEWISE_RETURN_IF_ERROR(InlineLentPayload(&in.labels_proto));
  if (ctx.last() || decode_labels) {
    STAGEWISE_ASSIGN_OR_RETURN(in.labels, GetTensor(msg, "labels", ctx.device()));
  }
  return in;
}

absl::Status SendForward(StageContext& ctx, int64_t step, int micro_batch, const torch::Tensor& out,
                         const torch::Tensor& labels, v1::TensorProto labels_proto) {
  const auto t0 = std::chrono::steady_clock::now();
  v1::StageMessage fwd = NewMessage(v1::StageMessage::FORWARD, step, micro_batch);
  if (ctx.first()) {
    STAGEWISE_RETURN_IF_ERROR(PutTensor(&fwd, "labels", labels));
  } else {
    (*fwd.mutable_tensors())["labels"] = std::move(labels_proto);
  }
  absl::Status sent =
      ctx.SendTensorsTo(Side::kNext, std::move(fwd), {{"x", out.detach(), ctx.Wire(true)}});
  TraceSpan(ctx, v1::SPAN_SEND, step, micro_batch, t0);
  return sent;
}

namespace {

std::string TorchMessage(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

absl::Status MissingState(const std::string& key, const std::string& what) {
  return absl::DataLossError(absl::StrCat("resume state: ", what, " '", key, "' is missing"));
}

}  // namespace

absl::StatusOr<torch::serialize::InputArchive*> ResumeState(StageContext& ctx,
                                                            const std::string& algorithm) {
  if (ctx.first_step() == 0 || ctx.resharded()) return nullptr;
  torch::serialize::InputArchive* state = ctx.resume_state();
  if (state == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        algorithm, ": the phase resumes at step ", ctx.first_step(), " without its saved state"));
  }
  return state;
}

void WriteStateInt(torch::serialize::OutputArchive& archive, const std::string& key,
                   int64_t value) {
  archive.write(key, c10::IValue(value));
}

void WriteStateTensor(torch::serialize::OutputArchive& archive, const std::string& key,
                      const torch::Tensor& tensor) {
  archive.write(key, tensor.detach());
}

void WriteStateModule(torch::serialize::OutputArchive& archive, const std::string& key,
                      const torch::nn::Module& module) {
  torch::serialize::OutputArchive nested;
  module.save(nested);
  archive.write(key, nested);
}

void WriteStateOptimizer(torch::serialize::OutputArchive& archive, const std::string& key,
                         const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive nested;
  optimizer.save(nested);
  archive.write(key, nested);
}

absl::StatusOr<int64_t> ReadStateInt(torch::serialize::InputArchive& archive,
                                     const std::string& key) {
  c10::IValue value;
  try {
    if (!archive.try_read(key, value)) return MissingState(key, "integer");
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("resume state: '", key, "': ", TorchMessage(e)));
  }
  if (!value.isInt()) {
    return absl::DataLossError(absl::StrCat("resume state: '", key, "' is not an integer"));
  }
  return value.toInt();
}

absl::StatusOr<torch::Tensor> ReadStateTensor(torch::serialize::InputArchive& archive,
                                              const std::string& key, torch::Device device) {
  torch::Tensor tensor;
  try {
    if (!archive.try_read(key, tensor) || !tensor.defined()) return MissingState(key, "tensor");
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("resume state: '", key, "': ", TorchMessage(e)));
  }
  // A copy of its own (the archive's tensor may share storage with it).
  return tensor.detach().clone().to(device);
}

absl::Status ReadStateModule(torch::serialize::InputArchive& archive, const std::string& key,
                             torch::nn::Module& module) {
  try {
    torch::serialize::InputArchive nested;
    if (!archive.try_read(key, nested)) return MissingState(key, "module");
    module.load(nested);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("resume state: '", key, "': ", TorchMessage(e)));
  }
  return absl::OkStatus();
}

absl::Status ReadStateOptimizer(torch::serialize::InputArchive& archive, const std::string& key,
                                torch::optim::Optimizer& optimizer) {
  try {
    torch::serialize::InputArchive nested;
    if (!archive.try_read(key, nested)) return MissingState(key, "optimizer");
    optimizer.load(nested);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("resume state: '", key, "': ", TorchMessage(e)));
  }
  return absl::OkStatus();
}

void AverageWindowGrads(const std::vector<torch::Tensor>& params, int64_t k) {
  if (k <= 1) return;
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(1.0 / static_cast<double>(k));
  }
}

void WritePartialGrads(torch::serialize::OutputArchive& archive,
                       const std::vector<torch::Tensor>& params, bool open_window) {
  WriteStateInt(archive, "partial_grads", open_window ? static_cast<int64_t>(params.size()) : 0);
  for (size_t i = 0; open_window && i < params.size(); ++i) {
    const torch::Tensor& g = params[i].grad();
    WriteStateInt(archive, absl::StrCat("has_grad_", i), g.defined() ? 1 : 0);
    if (g.defined()) WriteStateTensor(archive, absl::StrCat("grad_", i), g);
  }
}

absl::Status ReadPartialGrads(torch::serialize::InputArchive& archive,
                              std::vector<torch::Tensor>& params, bool open_window,
                              torch::Device device, const std::string& algorithm) {
  STAGEWISE_ASSIGN_OR_RETURN(const int64_t count, ReadStateInt(archive, "partial_grads"));
  const int64_t want = open_window ? static_cast<int64_t>(params.size()) : 0;
  if (count != want) {
    return absl::DataLossError(absl::StrCat("resume state: ", algorithm, " saved ", count,
                                            " partial gradients, expected ", want));
  }
  for (int64_t i = 0; i < count; ++i) {
    STAGEWISE_ASSIGN_OR_RETURN(const int64_t has,
                               ReadStateInt(archive, absl::StrCat("has_grad_", i)));
    if (has == 0) continue;
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor g,
                               ReadStateTensor(archive, absl::StrCat("grad_", i), device));
    if (!g.sizes().equals(params[i].sizes())) {
      return absl::DataLossError(absl::StrCat("resume state: ", algorithm, " grad_", i,
                                              " has shape ", c10::str(g.sizes()),
                                              ", the parameter ", c10::str(params[i].sizes())));
    }
    params[i].mutable_grad() = g;
  }
  return absl::OkStatus();
}

absl::Status RunEvaluation(StageContext& ctx, int64_t steps_done) {
  // One span for the pass; its sends and receives are not traced apart.
  Tracer::Scope span(ctx.tracer(), v1::SPAN_EVAL, steps_done);
  torch::NoGradGuard no_grad;
  ctx.model().eval();
  double loss_sum = 0;
  int64_t correct = 0, samples = 0;
  auto score = [&](const torch::Tensor& logits, const torch::Tensor& y) {
    loss_sum += models::CrossEntropy(logits, y, /*sum=*/true).item<double>();
    correct += models::CountCorrect(logits, y);
    samples += y.numel();  // targets: samples, or bytes of text
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
      status.Update(PutTensor(&m, "x", out, ctx.Wire(true)));
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
      if (!x.ok()) {
        status = x.status();
        break;
      }
      // Only the last stage decodes the labels (taking their buffer over);
      // the others pass the (already validated) proto on as it came.
      auto labels = m->mutable_tensors()->find("labels");
      if (labels == m->mutable_tensors()->end()) {
        status = absl::InvalidArgumentError("StageMessage.tensors: EVAL message without 'labels'");
        break;
      }
      torch::Tensor out = ctx.model().forward(*x);
      if (ctx.last()) {
        auto y = GetTensor(*m, "labels", ctx.device());
        if (!y.ok()) {
          status = y.status();
          break;
        }
        score(out, *y);
        continue;
      }
      v1::StageMessage fwd = NewMessage(v1::StageMessage::EVAL, steps_done, m->micro_batch());
      status.Update(PutTensor(&fwd, "x", out, ctx.Wire(true)));
      (*fwd.mutable_tensors())["labels"] = std::move(labels->second);
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
