#include "worker/stage_runtime.h"

#include <chrono>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/path_policy.h"
#include "services/common/retry_policy.h"
#include "services/common/status_macros.h"
#include "services/tensor/stage_message.h"
#include "services/training/optimizer.h"
#include "worker/algorithms/common.h"
#include "worker/stage_assignment.h"

namespace stagewise::worker {

StageRuntime::StageRuntime(RuntimeEnv env) : env_(std::move(env)) {}

StageRuntime::~StageRuntime() {
  Stop(absl::CancelledError("runtime destroyed"));
  Join();
  // The streams call back into their sinks until gRPC is done; Stop closed
  // them, so soon (~StageStreams waits). The send pipes first: they send to them.
  to_next_pipe_.reset();
  to_prev_pipe_.reset();
  streams_.reset();
}

absl::StatusOr<std::shared_ptr<StageRuntime>> StageRuntime::Create(
    const v1::StageAssignment& assignment, RuntimeEnv env) {
  std::shared_ptr<StageRuntime> rt(new StageRuntime(std::move(env)));
  rt->assignment_ = assignment;
  rt->shards_ = std::make_unique<StageShards>(*rt, rt->assignment_, rt->env_.device);
  StageStreams::Setup setup{assignment.job_id(),
                            assignment.stage(),
                            assignment.num_stages(),
                            assignment.attempt(),
                            assignment.replay(),
                            assignment.prev_identity(),
                            rt->env_.rpc,
                            rt->env_.inbox_capacity,
                            rt->env_.outbox_capacity,
                            rt->env_.shared_memory_dir,
                            rt->env_.shared_ring_bytes,
                            rt->env_.device.is_cpu()};
  StageStreams::Hooks hooks;
  StageRuntime* raw = rt.get();
  hooks.validate = [raw](const v1::StageMessage& m, bool from_prev) {
    return raw->ValidateIncoming(m, from_prev);
  };
  hooks.stopped = [raw] { return !raw->Interrupted().ok(); };
  hooks.received = [raw](int64_t bytes, bool from_prev) {
    raw->metrics_->AddBytes(false, bytes);
    raw->metrics_->SetInboxDepth(static_cast<int64_t>(
        (from_prev ? raw->streams_->from_prev() : raw->streams_->from_next()).size()));
    if (raw->replaying()) raw->replay_bytes_ += bytes;
  };
  hooks.fail = [raw](const absl::Status& s) { raw->Fail(s); };
  rt->streams_ = std::make_unique<StageStreams>(std::move(setup), std::move(hooks));
  for (const bool next : {true, false}) {
    auto deliver = [raw, next](v1::StageMessage m, int64_t step) {
      return raw->SendStamped(std::move(m),
                              next ? raw->streams_->to_next() : raw->streams_->to_prev(), step);
    };
    // A failed send fails the stage (unless it is stopping already).
    auto failed = [raw](const absl::Status& s) {
      if (raw->Interrupted().ok()) raw->Fail(s);
    };
    (next ? rt->to_next_pipe_ : rt->to_prev_pipe_) =
        std::make_unique<SendPipe>(SendPipe::kStageCapacity, std::move(deliver), std::move(failed));
  }
  STAGEWISE_ASSIGN_OR_RETURN(StageParts parts, BuildStageParts(assignment, rt->env_, rt->memory_));
  rt->spec_ = std::move(parts.spec);
  rt->resolved_ = std::move(parts.resolved);
  rt->place_ = std::move(parts.place);
  rt->phases_ = std::move(parts.phases);
  rt->model_ = std::move(parts.model);
  rt->data_ = std::move(parts.data);
  rt->train_ = std::move(parts.train);
  rt->test_ = std::move(parts.test);
  rt->replicas_ = std::make_unique<StageReplicas>(
      rt->spec_.sync,
      [raw = rt.get()](const std::string& key, double value) { raw->Summarize(key, value); });
  if (assignment.replay() && assignment.num_replicas() > 1) {
    // A lost replica is replaced inside the attempt: a failed average waits
    // for the group to form again (docs/fault_tolerance.md).
    StageRuntime* raw = rt.get();
    rt->replicas_->EnableRegroup({.publish =
                                      [raw](int generation, const std::string& token) {
                                        checkpoint::ShardPosition at;
                                        at.phase = raw->phases_->current();
                                        at.stage = raw->stage();
                                        at.block_begin = raw->assignment_.block_begin();
                                        at.block_end = raw->assignment_.block_end();
                                        return raw->replica_copy_.Publish(
                                            generation, token, at, raw->phases_->offset(),
                                            *raw->model_, *raw->optimizer_);
                                      },
                                  .release = [raw] { raw->replica_copy_.Release(); }});
  }
  rt->metrics_ = std::make_unique<metrics::StageMetrics>(
      *rt->env_.registry, rt->env_.job_labels.Of(assignment.job_id()), assignment.stage(),
      rt->spec_.algorithm.name(), assignment.num_replicas() > 1 ? assignment.replica() : -1);
  v1::WorkerEvent envelope;
  envelope.set_job_id(assignment.job_id());
  envelope.set_stage(assignment.stage());
  envelope.set_attempt(assignment.attempt());
  envelope.set_replica(assignment.replica());
  rt->reporter_ = std::make_unique<StageReporter>(rt->env_.emit, std::move(envelope),
                                                  assignment.stage() == assignment.num_stages() - 1,
                                                  rt->metrics_.get());
  if (rt->spec_.trace.enabled) {
    rt->tracer_ = std::make_unique<Tracer>(rt->spec_.trace.from, rt->spec_.trace.to,
                                           rt->spec_.trace.max_spans);
  }
  // Optimizer state counts towards the stage's memory too.
  models::ScopedMemoryAccount charge(rt->memory_);
  try {
    if (absl::Status s = rt->EnterPhase(0); !s.ok()) return s;
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("setting up stage ", assignment.stage(), ": ", e.what()));
  }
  if (!rt->spec_.checkpoint.dir.empty()) {
    // Fail before the job starts, not at its first checkpoint.
    absl::Status s = checkpoint::ProbeWritable(
        checkpoint::JobDir(rt->spec_.checkpoint.dir, assignment.job_id()));
    if (!s.ok()) return absl::FailedPreconditionError(s.message());
  }
  if (assignment.has_replica_source()) {
    try {
      if (absl::Status s = rt->LoadReplicaCopy(); !s.ok()) return s;
    } catch (const std::exception& e) {
      return absl::DataLossError(
          absl::StrCat("loading the copy of a surviving replica: ", e.what()));
    }
  } else if (assignment.has_resume()) {
    try {
      if (absl::Status s = rt->LoadResume(assignment.resume()); !s.ok()) return s;
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat("loading the checkpoint shard ",
                                              assignment.resume().shard_path(), ": ", e.what()));
    }
  }
  int64_t param_bytes = 0;
  for (const auto& p : rt->model_->parameters()) param_bytes += p.numel() * p.element_size();
  rt->metrics_->SetMemory("parameters", param_bytes);
  rt->streams_->PrepareRing();  // the ring made here, not in a reaction
  return rt;
}

absl::Status StageRuntime::NeighbourReplaced(const v1::NeighbourReplaced& replaced) {
  return streams_->Replaced(replaced);
}

void StageRuntime::CheckpointCommitted(int64_t step) { streams_->Trim(step); }

absl::Status StageRuntime::Start() {
  started_at_ = std::chrono::steady_clock::now();
  if (!last()) {
    STAGEWISE_RETURN_IF_ERROR(streams_->Dial(assignment_.next_address(), assignment_.replacing()));
  }
  reporter_->Start();
  {
    absl::MutexLock lock(&mu_);
    // Stopped before it started: the thread starts and ends at once (it sees
    // the error), so that outcome() and Join() behave as for any stage.
    Transition(Lifecycle::kRunning);
  }
  compute_ = std::thread([this] { ComputeLoop(); });
  return absl::OkStatus();
}

absl::Status StageRuntime::EnterPhase(int p) {
  const PhaseSpec& phase = phases_->Enter(p);
  // Algorithms read the phase's settings through spec().
  spec_.algorithm = phase.algorithm;
  spec_.optimizer = phase.optimizer;
  spec_.schedule = phase.schedule;
  algorithm_ = MakeAlgorithm(phase.algorithm);  // the previous phase's state (aux heads, ...) goes
  if (p == 0 || phase.reset_optimizer) {
    optimizer_ = training::MakeOptimizer(phase.optimizer, *model_);
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::ReleasePhase(int phase, bool strict) {
  return phases_->Release(phase, strict);
}

absl::Status StageRuntime::RunPhases() {
  if (resume_.at_end()) return absl::OkStatus();  // nothing left to train
  for (int p = resume_.start_phase(); p < phases_->count(); ++p) {
    if (p > resume_.start_phase()) {
      // Every message of phase p-1 was consumed; phase p traffic cannot exist
      // yet (no stage starts it before every stage reported PhaseDone).
      if (streams_->from_prev().size() != 0 || streams_->from_next().size() != 0) {
        return absl::InternalError(absl::StrCat("messages left over at the end of phase ", p - 1));
      }
      const bool released = phases_->Released(p);  // a replacing stage's replay
      if (!released && reporter_->connected()) {
        v1::WorkerEvent event = reporter_->NewEvent();
        event.mutable_phase_done()->set_phase(p - 1);
        reporter_->Emit(std::move(event));
      } else if (!released) {
        STAGEWISE_RETURN_IF_ERROR(phases_->Release(p, /*strict=*/true));  // no coordinator: go on
      }
      STAGEWISE_RETURN_IF_ERROR(phases_->Await(p));
      STAGEWISE_RETURN_IF_ERROR(EnterPhase(p));
      resume_.NextPhase();
      // A checkpoint that falls on a phase boundary is taken at the start of
      // the next phase (its optimizer reset done, no algorithm state yet).
      if (CheckpointScheduled(phases_->offset())) STAGEWISE_RETURN_IF_ERROR(WriteShard(0, false));
    }
    // The trace window counts this phase's steps from where it starts.
    if (tracer_) tracer_->Advance(resume_.first_step());
    STAGEWISE_RETURN_IF_ERROR(algorithm_->Run(*this));
    STAGEWISE_RETURN_IF_ERROR(DrainSends());
    streams_->ReapRead();  // payloads lent to messages the phase did not read
  }
  return absl::OkStatus();
}

void StageRuntime::ComputeLoop() {
  absl::Status status;
  {
    models::ScopedMemoryAccount charge(memory_);
    // This worker's emulated device, as fast as it is now, waiting once per
    // compute span (services/models/blocks.h).
    models::EmulatedWaitWindow emulated_waits;
    // A CPU stage makes its outputs in the same-host rings (output_placement.h).
    if (device().is_cpu() && env_.place_outputs) {
      placement_.emplace(first(), last(), [this](bool next) { return Wire(next); });
    }
    std::optional<models::ScopedEmulatedSpeed> speed;
    if (env_.emulated_speed_source != nullptr) speed.emplace(env_.emulated_speed_source);
    if (env_.emulated_speed_source == nullptr) speed.emplace(env_.emulated_speed);
    try {
      status = num_replicas() > 1 ? JoinReplicas() : absl::OkStatus();
      if (status.ok()) status = RunPhases();
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("stage ", stage(), ": ", e.what()));
    }
    placement_.reset();
  }
  Summarize("peak_memory_bytes", static_cast<double>(memory_->peak()));
  metrics_->SetMemory("tensors_peak", memory_->peak());
  if (status.ok()) {
    // Everything this stage had to send is queued: close and let it drain.
    streams_->Finish();
    // The final state is the last committed checkpoint (the model
    // `stagewise export` writes): one layout for checkpoint.dir
    // (services/checkpoint/checkpoint.h). Not again when the job resumed from it.
    if (!spec_.checkpoint.dir.empty() && !resume_.at_end()) {
      status = WriteShard(phases_->steps(), false);
    }
  }
  // The run is over: close the replica group now, not when the runtime is
  // destroyed (which may be much later), so that a replica still waiting in
  // a collective with this one fails at once instead of waiting out
  // --collective-timeout and missing the recovery's assignment.
  replicas_->Close();
  bool report = false;
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && !first_error_.ok()) status = first_error_;  // the root cause, not the echo
    report = lifecycle_ != Lifecycle::kStopping;
    Transition(Lifecycle::kFinished);
    outcome_ = status;
  }
  if (!status.ok()) Abort(status);
  // Before the result: the job ends once every stage's result is in.
  if (report) EmitTrace();
  // The stage is over: its series leave /metrics now, not at the next job.
  metrics_->Retire();
  if (report) reporter_->Finish(status, phases_->total_steps(), stage());
}

void StageRuntime::EmitTrace() {
  if (!tracer_ || !reporter_->connected()) return;
  v1::WorkerEvent event = reporter_->NewEvent();
  v1::TraceChunk* chunk = event.mutable_trace();
  *chunk = tracer_->TakeChunk();
  if (chunk->spans().empty() && chunk->dropped() == 0) return;
  chunk->set_phase(phases_->current());
  // One offset for every chunk of the stage: a newer one would move later spans.
  if (!trace_clock_.has_value())
    trace_clock_ = env_.clock ? env_.clock->Get() : ClockSync::Estimate{};
  chunk->set_clock_offset_us(trace_clock_->offset_us);
  chunk->set_clock_rtt_us(trace_clock_->rtt_us);
  reporter_->Emit(std::move(event));
}

void StageRuntime::Abort(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    RecordError(why);
  }
  if (env_.turns) env_.turns->Cancel(why);  // the worker's other chunks wake
  if (phases_) phases_->Cancel(why);        // a wait for the next phase ends
  for (SendPipe* pipe : {to_next_pipe_.get(), to_prev_pipe_.get()}) {
    if (pipe != nullptr) pipe->Close(why);  // a compute thread blocked in a send wakes
  }
  if (replicas_) replicas_->Cancel(why);  // a wait for a lost replica's replacement ends
  if (streams_) streams_->Close(why);
}

void StageRuntime::Stop(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    Transition(Lifecycle::kStopping);
  }
  Abort(why);
}

void StageRuntime::Fail(const absl::Status& why) { Abort(why); }

bool StageRuntime::Transition(Lifecycle to) {
  const Lifecycle from = lifecycle_;
  bool allowed = false;
  switch (to) {
    case Lifecycle::kCreated:
      break;
    case Lifecycle::kRunning:
      allowed = from == Lifecycle::kCreated;
      break;
    case Lifecycle::kStopping:
      allowed = from == Lifecycle::kCreated || from == Lifecycle::kRunning;
      break;
    case Lifecycle::kFinished:
      allowed = from == Lifecycle::kRunning || from == Lifecycle::kStopping;
      break;
  }
  if (allowed) lifecycle_ = to;
  return allowed;
}

void StageRuntime::RecordError(const absl::Status& why) {
  if (first_error_.ok()) first_error_ = why;
}

void StageRuntime::Join() {
  absl::MutexLock lock(&join_mu_);
  if (compute_.joinable()) compute_.join();
}

bool StageRuntime::started() const { return compute_.joinable(); }

bool StageRuntime::running() const {
  absl::MutexLock lock(&mu_);
  return compute_.joinable() && lifecycle_ != Lifecycle::kFinished;
}

std::optional<absl::Status> StageRuntime::outcome() const {
  absl::MutexLock lock(&mu_);
  if (lifecycle_ != Lifecycle::kFinished) return std::nullopt;
  return outcome_;
}

absl::Status StageRuntime::ValidateIncoming(const v1::StageMessage& m, bool from_prev) const {
  return ValidateStageMessage(m, {job_id(), stage(), from_prev});
}

absl::Status StageRuntime::AttachUpstream(const v1::StageMessage& message,
                                          const std::string& peer_identity,
                                          std::shared_ptr<UpstreamStream> stream,
                                          MessageSink** sink) {
  // A refused first message refuses this stream only: until a stream is
  // bound it may be anyone's (a stray or hostile dialer must not fail the
  // job). A malformed one is INVALID_ARGUMENT; a well-formed one that is not
  // this stage's OPEN from its assigned upstream is PERMISSION_DENIED. Once
  // bound, bad messages from stage j-1 fail the job (InboxSink).
  if (absl::Status s = ValidateIncoming(message, true); !s.ok()) return s;
  if (message.kind() != v1::StageMessage::OPEN) {
    return absl::PermissionDeniedError(
        "StageMessage.kind: the first message of an Exchange stream must be OPEN");
  }
  if (message.attempt() != assignment_.attempt()) {
    // A stage of an abandoned attempt: refuse it without failing this one.
    return absl::PermissionDeniedError(absl::StrCat("StageMessage.attempt: ", message.attempt(),
                                                    ", but job ", job_id(), " runs attempt ",
                                                    assignment_.attempt(), " here"));
  }
  if (first()) {
    return absl::PermissionDeniedError("stage 0 takes no stream from a previous stage");
  }
  return streams_->Bind(message, peer_identity, std::move(stream), sink);
}

EncodeOptions StageRuntime::Wire(bool to_next) const {
  EncodeOptions options = resolved_.wire(to_next);
  options.ring = streams_->ring(to_next);
  // The stages of a job share a device kind: a CPU stage's neighbour on
  // this host is on the CPU too, and takes rounded float32 over in place.
  options.round_in_ring = device().is_cpu();
  return options;
}

absl::StatusOr<v1::StageMessage> StageRuntime::Receive(BoundedQueue<v1::StageMessage>& queue,
                                                       NeighbourLink& link, v1::SpanKind wait) {
  models::FlushEmulatedWaits();  // the emulated work before a wait is done first
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<v1::StageMessage> m = queue.Pop();
  const auto t1 = std::chrono::steady_clock::now();
  metrics_->AddIdle(std::chrono::duration<double>(t1 - t0).count());
  metrics_->SetInboxDepth(static_cast<int64_t>(queue.size()));
  if (m.has_value()) {
    link.Took(m->seq());
    const bool from_prev = &queue == &streams_->from_prev();
    streams_->Popped(from_prev, m->seq());
    if (placement_) placement_->Received(from_prev ? Side::kPrev : Side::kNext);
    if (tracer_) tracer_->Record(wait, m->step(), m->micro_batch(), t0, t1);
    return std::move(*m);
  }
  absl::MutexLock lock(&mu_);
  return first_error_.ok() ? absl::CancelledError("stopped") : first_error_;
}

absl::StatusOr<v1::StageMessage> StageRuntime::ReceiveFrom(Side side) {
  if (side == Side::kNext) {
    if (last()) return absl::FailedPreconditionError("the last stage has no next stage");
    return Receive(streams_->from_next(), streams_->to_next(), v1::SPAN_WAIT_NEXT);
  }
  if (first()) return absl::FailedPreconditionError("stage 0 has no previous stage");
  absl::StatusOr<v1::StageMessage> m =
      Receive(streams_->from_prev(), streams_->to_prev(), v1::SPAN_WAIT_PREV);
  // A planned checkpoint (CheckpointCommand) reaches every stage this way.
  if (m.ok() && m->checkpoint_step() > 0 && m->checkpoint_step() <= phases_->total_steps()) {
    extra_cuts_.insert(m->checkpoint_step());
  }
  return m;
}

void StageRuntime::RequestCheckpoint() { checkpoint_requested_.store(true); }

void StageRuntime::PlanExtraCut(int64_t step) {
  if (step <= phases_->offset() + resume_.first_step() || step > phases_->total_steps()) return;
  extra_cuts_.insert(step);
  v1::WorkerEvent event = reporter_->NewEvent();
  event.mutable_checkpoint_planned()->set_step(step);
  reporter_->Emit(std::move(event));
}

absl::Status StageRuntime::SendTensorsTo(Side side, v1::StageMessage message,
                                         std::vector<OutgoingTensor> tensors) {
  if (placement_) placement_->Sending(side, &tensors);  // before: the rounding is the device's
  models::FlushEmulatedWaits();  // what the message carries is computed by now
  const bool next = side == Side::kNext;
  if (next ? last() : first()) {
    return absl::FailedPreconditionError(next ? "the last stage has no next stage"
                                              : "stage 0 has no previous stage");
  }
  if (absl::Status s = Interrupted(); !s.ok() && !next) return s;
  if (next &&
      (message.kind() == v1::StageMessage::FORWARD || message.kind() == v1::StageMessage::AUX)) {
    // Stage 0, asked for a checkpoint: after the mini-batch it sends now.
    const int64_t cut = phases_->offset() + message.step() + 1;
    if (first() && checkpoint_requested_.exchange(false)) PlanExtraCut(cut);
    if (extra_cuts_.count(cut) > 0) message.set_checkpoint_step(cut);
  }
  const int64_t step = phases_->offset() + message.step();
  SendPipe& pipe = next ? *to_next_pipe_ : *to_prev_pipe_;
  // A replacement notes when it caught up after each send, and error
  // feedback's residuals are the compute thread's: both send from here.
  if (!replaying() && !spec_.transport.error_feedback) {
    return pipe.Push(std::move(message), std::move(tensors), step);
  }
  STAGEWISE_RETURN_IF_ERROR(pipe.Drain());
  STAGEWISE_RETURN_IF_ERROR(EncodeInto(&message, tensors));
  absl::Status s =
      SendStamped(std::move(message), next ? streams_->to_next() : streams_->to_prev(), step);
  if (s.ok() && replaying()) NoteCaughtUp(step);
  return s;
}

absl::Status StageRuntime::DrainSends() {
  for (SendPipe* pipe : {to_next_pipe_.get(), to_prev_pipe_.get()}) {
    if (pipe != nullptr) STAGEWISE_RETURN_IF_ERROR(pipe->Drain());
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::SendStamped(v1::StageMessage message, NeighbourLink& link,
                                       int64_t step) {
  message.set_job_id(job_id());
  message.set_attempt(assignment_.attempt());
  auto size = static_cast<int64_t>(message.ByteSizeLong());
  for (const auto& [name, t] : message.tensors()) size += static_cast<int64_t>(t.shared().length());
  const auto kind = message.kind();
  absl::Status s = link.Send(std::move(message), step);
  if (s.ok()) {
    reporter_->CountSent(kind, size);
    return s;
  }
  // The stream refused the message: this stage is stopping, or the stream is
  // closing because its neighbour went away, and the closing may be seen
  // here before the stream reports why (a killed neighbour's stream is
  // cancelled). Another attempt may succeed, so that is UNAVAILABLE.
  if (absl::Status stopped = Interrupted(); !stopped.ok()) return stopped;
  if (s.code() == absl::StatusCode::kFailedPrecondition) return absl::UnavailableError(s.message());
  return s;
}

absl::Status StageRuntime::Interrupted() const {
  absl::MutexLock lock(&mu_);
  if (!first_error_.ok()) return first_error_;
  return lifecycle_ == Lifecycle::kStopping ? absl::CancelledError("stopped") : absl::OkStatus();
}

bool StageRuntime::CheckpointScheduled(int64_t step) const {
  return data::CheckpointScheduled(spec_.checkpoint, step, phases_->total_steps(),
                                   phases_->steps_per_epoch()) ||
         extra_cuts_.count(step) > 0;
}

bool StageRuntime::CheckpointDue(int64_t steps_done) const {
  return steps_done > 0 && steps_done < phases_->steps() &&
         CheckpointScheduled(phases_->offset() + steps_done);
}

absl::Status StageRuntime::Checkpoint(int64_t steps_done) {
  if (!CheckpointDue(steps_done)) {
    return absl::InternalError(absl::StrCat("no checkpoint is due after step ", steps_done,
                                            " of phase ", phases_->current()));
  }
  return WriteShard(steps_done, true);  // SerializeShard turns exceptions into errors
}

void StageRuntime::ReportStep(int64_t phase_steps_done, double train_loss, int64_t samples) {
  if (tracer_) tracer_->Advance(phase_steps_done);
  metrics_->SetMemory("tensors", memory_->current());
  metrics_->SetMemory("tensors_peak", memory_->peak());
  const int64_t steps_done = phases_->offset() + phase_steps_done;
  // A single stage asked for a checkpoint: right after this step.
  if (first() && last() && checkpoint_requested_.exchange(false)) PlanExtraCut(steps_done);
  if (last() && !std::isfinite(train_loss)) {
    // Not retryable: a recovery would replay the same trajectory.
    Fail(absl::FailedPreconditionError(absl::StrCat("training diverged: the loss is ", train_loss,
                                                    " at step ", steps_done,
                                                    " (lower optimizer.lr?)")));
    return;
  }
  if (tracer_ && tracer_->ChunkReady()) EmitTrace();
  // A replacement replays steps the job reported already.
  if (!replaying()) reporter_->Step(steps_done, phases_->total_steps(), train_loss, samples);
}

void StageRuntime::NoteCaughtUp(int64_t step) {
  // Where the lost stage was: every neighbour is attached and holds no more
  // of this stage's messages than it has sent again.
  for (const bool next : {false, true}) {
    if (next ? last() : first()) continue;
    const NeighbourLink& link = next ? streams_->to_next() : streams_->to_prev();
    if (!link.attached() || link.CatchingUp()) return;
  }
  replay_done_ = true;
  const auto marks = resume_.marks().known() ? resume_.marks() : checkpoint::ShardPosition::Marks{};
  v1::WorkerEvent event = reporter_->NewEvent();
  v1::ReplayDone* done = event.mutable_replay_done();
  done->set_from_step(resume_.step());
  done->set_to_step(step);
  const checkpoint::ShardPosition::Marks now = streams_->marks();
  done->set_messages(now.taken_prev - std::max<int64_t>(0, marks.taken_prev) + now.taken_next -
                     std::max<int64_t>(0, marks.taken_next));
  done->set_bytes(replay_bytes_.load());
  done->set_seconds(SecondsSince(started_at_));
  done->set_copied_bytes(replica_copy_.copied_bytes());
  done->set_copy_seconds(replica_copy_.copy_seconds());
  reporter_->Emit(std::move(event));
}

absl::Status StageRuntime::JoinReplicas() {
  const std::string& host = assignment_.collective_host();
  const auto bucket_bytes =
      std::max<int64_t>(1, static_cast<int64_t>(spec_.sync.bucket_mb * (1 << 20)));
  return replicas_->Join(env_.collective_store(assignment_),
                         {.rank = replica(),
                          .size = num_replicas(),
                          .host = host.empty() ? "127.0.0.1" : host,
                          .timeout = env_.collective_timeout,
                          .bucket_bytes = bucket_bytes,
                          .name = absl::StrCat("stage ", stage())},
                         assignment_.replica_source().generation());
}

PhaseWindow StageRuntime::window() const {
  PhaseWindow w;
  w.steps_per_epoch = phases_->steps_per_epoch();
  w.total_steps = phases_->steps();
  w.offset = phases_->offset();
  w.first_step = resume_.first_step();
  w.resharded = resume_.resharded();
  w.base_lr = phases_->base_lr();
  return w;
}

void StageRuntime::ReportEval(int64_t phase_steps_done, double loss, double accuracy,
                              int64_t samples) {
  if (replaying()) return;  // reported when the lost stage ran it
  reporter_->Eval(phases_->offset() + phase_steps_done, loss, accuracy, samples);
}

// --- Checkpoints (StageShards) and a replacing replica's copy ---------------

absl::Status StageRuntime::WriteShard(int64_t phase_step, bool with_algorithm) {
  // Replicas of a stage are equal after every step: replica 0 writes the
  // stage's one shard (docs/replicas.md).
  if (replica() > 0) return absl::OkStatus();
  STAGEWISE_RETURN_IF_ERROR(DrainSends());
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::ShardPosition at;
  at.step = phases_->offset() + phase_step;
  at.phase = phases_->current();
  at.phase_step = phase_step;
  at.stage = stage();
  at.block_begin = assignment_.block_begin();
  at.block_end = assignment_.block_end();
  at.marks = streams_->marks();
  StageShards::SaveAlgorithm algorithm;
  if (with_algorithm) {
    algorithm = [this](auto& archive) { return algorithm_->SaveState(*this, archive); };
  }
  STAGEWISE_ASSIGN_OR_RETURN(const StageShards::Written written, shards_->Write(at, algorithm));
  metrics_->ObserveCompute("checkpoint", SecondsSince(t0));
  if (tracer_)
    tracer_->Record(v1::SPAN_CHECKPOINT, phase_step, 0, t0, std::chrono::steady_clock::now());
  v1::WorkerEvent event = reporter_->NewEvent();
  auto* saved = event.mutable_checkpoint_saved();
  saved->set_step(at.step);
  saved->set_phase(phases_->current());
  saved->set_phase_step(phase_step);
  saved->set_path(written.path);
  saved->set_bytes(written.bytes);
  saved->set_crc32(written.crc32);
  saved->set_seconds(SecondsSince(t0));
  reporter_->Emit(std::move(event));
  return absl::OkStatus();
}

absl::Status StageRuntime::LoadResume(const v1::ResumePoint& resume) {
  STAGEWISE_ASSIGN_OR_RETURN(
      StageShards::Restored restored,
      shards_->Load(resume, [this](const auto& at, const std::string& where) {
        return EnterResumedPhase(at, where);
      }));
  SetResumed(std::move(restored));
  return absl::OkStatus();
}

absl::Status StageRuntime::LoadReplicaCopy() {
  STAGEWISE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardReader> copy,
                             replica_copy_.Fetch(
                                 assignment_, env_.rpc, env_.collective_timeout,
                                 [this] { return !Interrupted().ok(); }, env_.device));
  const std::string where = absl::StrCat("the copy of stage ", stage(), " from replica ",
                                         assignment_.replica_source().replica());
  STAGEWISE_ASSIGN_OR_RETURN(
      StageShards::Restored restored,
      shards_->LoadCopy(std::move(copy), where, [this](const auto& at, const std::string& w) {
        return EnterResumedPhase(at, w);
      }));
  SetResumed(std::move(restored));
  return absl::OkStatus();
}

absl::Status StageRuntime::EnterResumedPhase(const checkpoint::ShardPosition& at,
                                             const std::string& where) {
  if (at.phase < 0 || at.phase >= phases_->count()) {
    return absl::DataLossError(absl::StrCat(where, ": phase ", at.phase, " of a job with ",
                                            phases_->count(), " phase(s)"));
  }
  for (int p = 1; p <= at.phase; ++p) STAGEWISE_RETURN_IF_ERROR(EnterPhase(p));
  if (at.phase_step < 0 || at.phase_step > phases_->steps() ||
      phases_->offset() + at.phase_step != at.step) {
    return absl::DataLossError(absl::StrCat(where, ": step ", at.phase_step, " of phase ", at.phase,
                                            " does not fit this job"));
  }
  return absl::OkStatus();
}

void StageRuntime::SetResumed(StageShards::Restored restored) {
  if (restored.marks.known()) streams_->Resume(restored.marks);
  resume_.Take(std::move(restored), phases_->current(), phases_->total_steps());
  (void)phases_->Release(resume_.start_phase(), /*strict=*/false);
}

void StageRuntime::BeginStep(int64_t phase_step) {
  if (assignment_.replay() && num_replicas() > 1) {
    replica_copy_.NoteStepStart(phase_step, streams_->marks(), *model_);
  }
}

void StageRuntime::ReplicaRegroup(const v1::ReplicaRegroup& regroup) {
  replicas_->Regroup(regroup.generation(), regroup.source_replica() == replica(), regroup.token());
}

}  // namespace stagewise::worker
