// Transport: one stage-to-stage stream against what the machine and gRPC
// allow, on loopback, plaintext (TLS would add its cipher to every column but
// iperf3's). For each tensor size it measures, interleaved, every round:
//   iperf3     a single TCP stream (iperf3 -c 127.0.0.1), once per round
//   grpc       a plain gRPC stream of the same bytes: a prebuilt StageMessage
//              written by a synchronous client, counted by a bare reactor (the
//              protobuf serialization and parse gRPC itself makes, no more)
//   copy       the worker's path: PutTensor (encode) -> DownstreamStream's
//              outbox -> UpstreamStream -> a sink that decodes with a copy
//              (DecodeTensor(const TensorProto&), the path before 2026-11)
//   adopt      the same, decoding by taking the parsed buffer over
//              (DecodeTensor(TensorProto*), what workers do now)
// and the round trip of one message with an empty reply (grpc and adopt).
// With --link-delay-ms D also, interleaved:
//   delayed    adopt through the emulated link latency (worker/link_delay.h:
//              every message held D ms before the sink takes it), its MB/s
//              counted without the one delay the last message waits
//              (n x size / (time - D)); "delayed/adopt" ~ 1 says the
//              emulation keeps the link's bandwidth.
// Medians over rounds; ratios are taken within a round, then their median and
// spread (max - min over the median) printed. Never a test.
//
//   build/bin/stagewise_transport_bench [options]
//     --sizes 1K,64K,1M,8M,64M   tensor payloads (K/M suffixes: KiB/MiB)
//     --rounds 3
//     --bytes 512M               payload streamed per measurement (at least
//                                4 and at most 5000 messages)
//     --pings 20                 round trips per latency measurement
//     --iperf3 iperf3            the iperf3 binary ("" or missing: no column)
//     --link-delay-ms 0          the delayed column's one-way latency (0: none)
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "services/rpc/server.h"
#include "services/tensor/codec.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/free_port.h"
#include "worker/link_delay.h"
#include "worker/peer_stream.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = stagewise::v1;
using stagewise::worker::DownstreamStream;
using stagewise::worker::MessageSink;
using stagewise::worker::UpstreamStream;

struct Options {
  std::vector<int64_t> sizes = {1 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20};
  int rounds = 3;
  int64_t bytes = int64_t{512} << 20;
  int pings = 20;
  std::string iperf3 = "iperf3";
  double link_delay_ms = 0;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "stagewise_transport_bench: " << why
            << "\nusage: stagewise_transport_bench [--sizes 1K,64K,1M,8M,64M] [--rounds 3]"
               " [--bytes 512M] [--pings 20] [--iperf3 PATH] [--link-delay-ms 0]\n";
  std::exit(why == "help" ? 0 : 2);
}

int64_t ParseSize(const std::string& flag, std::string text) {
  int64_t unit = 1;
  if (!text.empty() && (text.back() == 'K' || text.back() == 'M' || text.back() == 'G')) {
    unit = text.back() == 'K' ? 1 << 10 : text.back() == 'M' ? 1 << 20 : 1 << 30;
    text.pop_back();
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < 1 || v > (int64_t{1} << 40) / unit || v * unit < 4) {
    Usage(absl::StrCat(flag, ": bad size '", text, "' (at least 4 bytes)"));
  }
  return v * unit;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") Usage("help");
    if (i + 1 >= argc) Usage(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[++i];
    if (flag == "--sizes") {
      o.sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        o.sizes.push_back(ParseSize(flag, std::string(s)));
      }
      if (o.sizes.empty()) Usage("--sizes: empty");
    } else if (flag == "--rounds") {
      if (!absl::SimpleAtoi(value, &o.rounds) || o.rounds < 1) Usage("--rounds: bad value");
    } else if (flag == "--bytes") {
      o.bytes = ParseSize(flag, value);
    } else if (flag == "--pings") {
      if (!absl::SimpleAtoi(value, &o.pings) || o.pings < 1) Usage("--pings: bad value");
    } else if (flag == "--iperf3") {
      o.iperf3 = value;
    } else if (flag == "--link-delay-ms") {
      if (!absl::SimpleAtod(value, &o.link_delay_ms) || o.link_delay_ms < 0 ||
          o.link_delay_ms > 60000) {
        Usage("--link-delay-ms: bad value");
      }
    } else {
      Usage(absl::StrCat("unknown option ", flag));
    }
  }
  return o;
}

std::string SizeName(int64_t bytes) {
  if (bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes % (1 << 10) == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

// A float32 tensor message of `bytes` payload, as PutTensor builds it.
v1::StageMessage TensorMessage(const at::Tensor& t, int64_t step) {
  v1::StageMessage m;
  m.set_job_id("bench");
  m.set_kind(v1::StageMessage::FORWARD);
  m.set_step(step);
  if (!stagewise::EncodeTensor(t, &(*m.mutable_tensors())["x"]).ok()) std::abort();
  return m;
}

// ---- what receives ----------------------------------------------------------

// Counts deliveries; decodes the tensor (copy or adopt); replies to pings.
class BenchSink : public MessageSink {
 public:
  enum class Decode { kCopy, kAdopt };

  // The delayed column: messages go through an emulated link latency first.
  void SetDelay(absl::Duration delay) {
    line_ = std::make_unique<stagewise::worker::LinkDelay>(
        delay, 4096, int64_t{256} << 20,
        [this](v1::StageMessage m) { return Take(std::move(m)).ok(); });
  }

  absl::StatusOr<bool> Deliver(v1::StageMessage message, std::function<void()> resume) override {
    bool delayed;
    {
      absl::MutexLock lock(&mu_);
      delayed = delayed_;
    }
    if (delayed && line_ != nullptr) return line_->Hold(std::move(message), std::move(resume));
    return Take(std::move(message));
  }

  absl::StatusOr<bool> Take(v1::StageMessage message) {
    Decode decode;
    {
      absl::MutexLock lock(&mu_);
      decode = decode_;
    }
    auto it = message.mutable_tensors()->find("x");
    if (it != message.mutable_tensors()->end()) {
      auto t = decode == Decode::kCopy ? stagewise::DecodeTensor(it->second)
                                       : stagewise::DecodeTensor(&it->second);
      if (!t.ok()) return t.status();
    }
    std::shared_ptr<UpstreamStream> reply;
    {
      absl::MutexLock lock(&mu_);
      ++received_;
      if (message.kind() == v1::StageMessage::AUX) reply = upstream_;
    }
    // One ping in flight: the outbox never blocks this reaction.
    if (reply != nullptr) {
      v1::StageMessage pong;
      pong.set_job_id("bench");
      pong.set_kind(v1::StageMessage::BACKWARD);
      (void)reply->Send(std::move(pong));
    }
    return true;
  }
  void StreamClosed(const absl::Status&) override {}

  void Reset(Decode decode, bool delayed = false) {
    absl::MutexLock lock(&mu_);
    decode_ = decode;
    delayed_ = delayed;
    received_ = 0;
  }
  void WaitReceived(int64_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return received_ >= n; };
    mu_.Await(absl::Condition(&ready));
  }
  void SetUpstream(std::shared_ptr<UpstreamStream> s) {
    absl::MutexLock lock(&mu_);
    upstream_ = std::move(s);
  }
  std::shared_ptr<UpstreamStream> upstream() {
    absl::MutexLock lock(&mu_);
    return upstream_;
  }

 private:
  absl::Mutex mu_;
  Decode decode_ ABSL_GUARDED_BY(mu_) = Decode::kAdopt;
  bool delayed_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<stagewise::worker::LinkDelay> line_;  // set before the stream opens
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<UpstreamStream> upstream_ ABSL_GUARDED_BY(mu_);
};

// Counts the client end's replies.
class ReplySink : public MessageSink {
 public:
  absl::StatusOr<bool> Deliver(v1::StageMessage, std::function<void()>) override {
    absl::MutexLock lock(&mu_);
    ++received_;
    return true;
  }
  void StreamClosed(const absl::Status&) override {}
  void WaitReceived(int64_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return received_ >= n; };
    mu_.Await(absl::Condition(&ready));
  }
  int64_t received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  absl::Mutex mu_;
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
};

// The worker's stage service, reduced to one stream into a BenchSink.
class StageBenchService : public v1::StageService::CallbackService {
 public:
  explicit StageBenchService(BenchSink* sink) : sink_(sink) {}
  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext*) override {
    return UpstreamStream::Start(
        [this](const v1::StageMessage&, std::shared_ptr<UpstreamStream> stream,
               MessageSink** sink) {
          sink_->SetUpstream(std::move(stream));
          *sink = sink_;
          return absl::OkStatus();
        },
        /*outbox_capacity=*/16);
  }

 private:
  BenchSink* const sink_;
};

// Plain gRPC: reads and counts; answers an AUX message with an empty one.
class PlainReactor : public grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage> {
 public:
  PlainReactor() {
    reply_.set_kind(v1::StageMessage::BACKWARD);
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (in_.kind() == v1::StageMessage::AUX) {
      StartWrite(&reply_);
    } else {
      StartRead(&in_);
    }
  }
  void OnWriteDone(bool) override { StartRead(&in_); }
  void OnDone() override { delete this; }

 private:
  v1::StageMessage in_, reply_;
};

class PlainService : public v1::StageService::CallbackService {
  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext*) override {
    return new PlainReactor();
  }
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  stagewise::rpc::ConfigureServerBuilder(stagewise::rpc::RpcOptions{}, &builder);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  auto server = builder.BuildAndStart();
  if (server == nullptr || *port <= 0) {
    std::cerr << "cannot start a gRPC server on 127.0.0.1\n";
    std::exit(1);
  }
  return server;
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using stagewise::bench::Median;
using stagewise::testing::FreePort;

// ---- iperf3 -----------------------------------------------------------------

// Single-stream loopback MB/s (received), or 0 when iperf3 cannot run.
double Iperf3MBps(const std::string& iperf3) {
  if (iperf3.empty()) return 0;
  const int port = FreePort();
  const std::string server = absl::StrCat(iperf3, " -s -1 -D -p ", port, " >/dev/null 2>&1");
  if (std::system(server.c_str()) != 0) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string client =
      absl::StrCat(iperf3, " -c 127.0.0.1 -p ", port, " -t 3 -J 2>/dev/null");
  FILE* pipe = popen(client.c_str(), "r");
  if (pipe == nullptr) return 0;
  std::string json;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) json.append(buf, n);
  pclose(pipe);
  const size_t sum = json.rfind("\"sum_received\"");
  if (sum == std::string::npos) return 0;
  const std::string key = "\"bits_per_second\":";
  const size_t at = json.find(key, sum);
  if (at == std::string::npos) return 0;
  return std::strtod(json.c_str() + at + key.size(), nullptr) / 8 / 1e6;
}

// ---- one measurement --------------------------------------------------------

struct Stage {
  BenchSink server_sink;
  ReplySink client_sink;
  StageBenchService service{&server_sink};
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::StageService::Stub> stub;
  std::shared_ptr<DownstreamStream> client;
};

// MB/s of n messages of the tensor `t` over the stage stream.
// `delay`: through the sink's link delay, whose one wait at the end is not
// counted (the bandwidth, not the latency).
double StageMBps(Stage& s, const at::Tensor& t, int64_t n, BenchSink::Decode decode,
                 double delay = 0) {
  s.server_sink.Reset(decode, delay > 0);
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    if (!s.client->Send(TensorMessage(t, i)).ok()) std::abort();
  }
  s.server_sink.WaitReceived(n);
  return static_cast<double>(n) * static_cast<double>(t.nbytes()) / (Seconds(t0) - delay) / 1e6;
}

// Median round trip (seconds) of a message carrying `t`, empty reply.
double StagePing(Stage& s, const at::Tensor& t, int pings) {
  std::vector<double> rtt;
  for (int i = 0; i < pings; ++i) {
    const int64_t before = s.client_sink.received();
    const auto t0 = Clock::now();
    v1::StageMessage m = TensorMessage(t, i);  // encoding is part of a worker's send
    m.set_kind(v1::StageMessage::AUX);
    if (!s.client->Send(std::move(m)).ok()) std::abort();
    s.client_sink.WaitReceived(before + 1);
    rtt.push_back(Seconds(t0));
  }
  return Median(rtt);
}

double PlainMBps(v1::StageService::Stub* stub, const v1::StageMessage& m, int64_t payload,
                 int64_t n) {
  grpc::ClientContext ctx;
  auto stream = stub->Exchange(&ctx);
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    if (!stream->Write(m)) std::abort();
  }
  stream->WritesDone();
  if (!stream->Finish().ok()) std::abort();
  return static_cast<double>(n) * static_cast<double>(payload) / Seconds(t0) / 1e6;
}

double PlainPing(v1::StageService::Stub* stub, v1::StageMessage m, int pings) {
  m.set_kind(v1::StageMessage::AUX);
  grpc::ClientContext ctx;
  auto stream = stub->Exchange(&ctx);
  std::vector<double> rtt;
  v1::StageMessage reply;
  for (int i = 0; i < pings; ++i) {
    const auto t0 = Clock::now();
    if (!stream->Write(m) || !stream->Read(&reply)) std::abort();
    rtt.push_back(Seconds(t0));
  }
  stream->WritesDone();
  (void)stream->Finish();
  return Median(rtt);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  at::set_num_threads(1);

  Stage stage;
  const double delay_s = o.link_delay_ms / 1e3;
  if (delay_s > 0) stage.server_sink.SetDelay(absl::Milliseconds(o.link_delay_ms));
  int stage_port = 0;
  stage.server = Serve(&stage.service, &stage_port);
  stage.stub = v1::StageService::NewStub(
      stagewise::rpc::MakeChannel(absl::StrCat("127.0.0.1:", stage_port)));
  stage.client = DownstreamStream::Open(stage.stub.get(), &stage.client_sink, 16);

  PlainService plain_service;
  int plain_port = 0;
  auto plain_server = Serve(&plain_service, &plain_port);
  auto plain_stub = v1::StageService::NewStub(
      stagewise::rpc::MakeChannel(absl::StrCat("127.0.0.1:", plain_port)));

  const bool iperf = !o.iperf3.empty() && Iperf3MBps(o.iperf3) > 0;  // also a warm-up
  if (!iperf) std::cout << "(no iperf3: its column is left out; apt-get install iperf3)\n";
  std::cout << "transport bench: " << o.rounds << " rounds, " << std::thread::hardware_concurrency()
            << " cores, loopback, plaintext\n";

  // results[size][column] = per-round values.
  std::map<int64_t, std::map<std::string, std::vector<double>>> results;
  std::vector<double> iperf_mbps;
  for (int round = 0; round < o.rounds; ++round) {
    const double ip = iperf ? Iperf3MBps(o.iperf3) : 0;
    iperf_mbps.push_back(ip);
    for (int64_t size : o.sizes) {
      const at::Tensor t = at::randn({size / 4});
      const int64_t n = std::clamp<int64_t>(o.bytes / size, 4, 5000);
      const v1::StageMessage prebuilt = TensorMessage(t, 0);
      auto& r = results[size];
      // Interleaved, in an order that changes per round.
      const int kinds = delay_s > 0 ? 4 : 3;
      const int k = round % kinds;
      for (int step = 0; step < kinds; ++step) {
        const int which = (step + k) % kinds;
        if (which == 0) r["grpc"].push_back(PlainMBps(plain_stub.get(), prebuilt, t.nbytes(), n));
        if (which == 1) r["copy"].push_back(StageMBps(stage, t, n, BenchSink::Decode::kCopy));
        if (which == 2) r["adopt"].push_back(StageMBps(stage, t, n, BenchSink::Decode::kAdopt));
        if (which == 3) {
          r["delayed"].push_back(StageMBps(stage, t, n, BenchSink::Decode::kAdopt, delay_s));
        }
      }
      if (delay_s > 0) r["delayed/adopt"].push_back(r["delayed"].back() / r["adopt"].back());
      const int pings = size >= (16 << 20) ? std::max(3, o.pings / 4) : o.pings;
      r["grpc_rtt"].push_back(PlainPing(plain_stub.get(), prebuilt, pings));
      stage.server_sink.Reset(BenchSink::Decode::kAdopt);
      r["adopt_rtt"].push_back(StagePing(stage, t, pings));
      if (ip > 0) {
        r["adopt/iperf3"].push_back(r["adopt"].back() / ip);
        r["copy/iperf3"].push_back(r["copy"].back() / ip);
        r["grpc/iperf3"].push_back(r["grpc"].back() / ip);
      }
      r["adopt/grpc"].push_back(r["adopt"].back() / r["grpc"].back());
      r["copy/grpc"].push_back(r["copy"].back() / r["grpc"].back());
      r["adopt/copy"].push_back(r["adopt"].back() / r["copy"].back());
      r["messages/s"].push_back(r["adopt"].back() * 1e6 / static_cast<double>(size));
    }
    std::cerr << "round " << round + 1 << "/" << o.rounds << " done\n";
  }

  auto spread = [](const std::vector<double>& v) {
    const double med = Median(v);
    if (v.empty() || med == 0) return 0.0;
    return (*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end())) / med;
  };
  if (iperf) {
    std::cout << absl::StrFormat("iperf3, one TCP stream on loopback: %.0f MB/s (spread %.0f%%)\n",
                                 Median(iperf_mbps), 100 * spread(iperf_mbps));
  }
  std::cout << absl::StrFormat("%-8s %9s %9s %9s %9s %11s %11s %11s %11s %10s %10s\n", "tensor",
                               "grpc", "copy", "adopt", "msg/s", "adopt/grpc", "copy/grpc",
                               "adopt/iperf", "copy/iperf", "rtt grpc", "rtt adopt");
  std::cout << absl::StrFormat("%-8s %9s %9s %9s %9s %11s %11s %11s %11s %10s %10s\n", "", "MB/s",
                               "MB/s", "MB/s", "", "(spread)", "(spread)", "(spread)", "(spread)",
                               "ms", "ms");
  for (int64_t size : o.sizes) {
    auto& r = results[size];
    auto ratio = [&](const std::string& key) {
      if (r[key].empty()) return std::string("-");
      return absl::StrFormat("%.2f (%2.0f%%)", Median(r[key]), 100 * spread(r[key]));
    };
    std::cout << absl::StrFormat("%-8s %9.0f %9.0f %9.0f %9.0f %11s %11s %11s %11s %10.3f %10.3f\n",
                                 SizeName(size), Median(r["grpc"]), Median(r["copy"]),
                                 Median(r["adopt"]), Median(r["messages/s"]), ratio("adopt/grpc"),
                                 ratio("copy/grpc"), ratio("adopt/iperf3"), ratio("copy/iperf3"),
                                 1e3 * Median(r["grpc_rtt"]), 1e3 * Median(r["adopt_rtt"]));
  }

  if (delay_s > 0) {
    std::cout << absl::StrFormat(
        "\nthrough an emulated link latency of %g ms (MB/s without the last message's wait):\n",
        o.link_delay_ms);
    std::cout << absl::StrFormat("%-8s %9s %9s %15s\n", "tensor", "adopt", "delayed",
                                 "delayed/adopt");
    for (int64_t size : o.sizes) {
      auto& r = results[size];
      std::cout << absl::StrFormat("%-8s %9.0f %9.0f %8.2f (%2.0f%%)\n", SizeName(size),
                                   Median(r["adopt"]), Median(r["delayed"]),
                                   Median(r["delayed/adopt"]), 100 * spread(r["delayed/adopt"]));
    }
  }

  stage.client->Close(absl::OkStatus());
  stage.client->WaitDone();
  if (auto up = stage.server_sink.upstream()) up->WaitDone();
  stage.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  plain_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
