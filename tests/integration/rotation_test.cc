// Rotating certificates and tokens while a job trains (docs/security.md,
// "Rotating certificates and tokens"): real coordinator and worker processes
// with --tls-reload-seconds 1 and a tokens file reloaded on SIGHUP. The CA
// bundle gains a second CA, every process gets a certificate of the new CA,
// a token is replaced; the job goes on without a recovery and succeeds, the
// processes present the new certificates (a client that trusts only the new
// CA gets through), the new token works and the old one is refused.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/client/coordinator_client.h"
#include "services/rpc/pki.h"
#include "services/rpc/server.h"
#include "services/rpc/tls.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

using testing::ProcessCluster;

constexpr char kOps[] = "ops-0123456789abcdef";       // stays in the file
constexpr char kOldCi[] = "ci-old-0123456789abcdef";  // rotated out
constexpr char kNewCi[] = "ci-new-0123456789abcdef";  // rotated in

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Temporary file, then rename: a reader sees the old file or the new one.
void WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".rotating";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
  }
  std::filesystem::permissions(
      tmp, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::filesystem::rename(tmp, path);
}

std::string Tokens(const std::string& ci_secret) {
  return absl::StrCat("# secret role name\n", kOps, " admin ops\n", ci_secret, " submit ci\n");
}

// Does a TLS handshake with `target` succeed for a client presenting
// `config`'s certificate and trusting only `config`'s CA file?
bool Handshakes(const std::string& target, rpc::TlsConfig config) {
  config.reload_seconds = 0;
  rpc::RpcOptions options;
  if (absl::Status s = rpc::ApplyTls(config, &options); !s.ok()) {
    ADD_FAILURE() << s;
    return false;
  }
  auto channel = rpc::MakeChannel(target, options);
  return channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
}

TEST(Rotation, CertificatesAndTokensRotateWhileAJobTrains) {
  ProcessCluster::Options o;
  o.workers = 2;
  o.tls_reload_seconds = 1;
  o.tokens = Tokens(kOldCi);
  o.client_token = kOps;
  o.coordinator_args = {"--tokens-reload-seconds", "0"};  // SIGHUP only
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string pki = cluster.pki_dir();
  const std::string coordinator = cluster.coordinator_address();
  auto as = [&](const std::string& token) {
    rpc::RpcOptions options = cluster.RpcOptionsFor("client");
    options.bearer_token = token;
    return std::make_unique<client::CoordinatorClient>(coordinator, absl::Seconds(10), options);
  };

  // About 25 s of training: each step's four blocks sleep 120 ms.
  auto id = as(kOldCi)->Submit(R"(name: rotation
model: {name: emulated, depth: 4, forward_ms: 10, backward_ms: 20}
data: {dataset: synthetic, shape: [2, 8, 8], train_size: 4096, test_size: 64}
stages: 2
batch_size: 16
steps: 200
)");
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitFor(
      *id, [](const v1::JobStatus& s) { return s.step() >= 5; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();

  // A second CA; the bundle every process reads holds both.
  const std::string old = cluster.dir() + "/old";
  std::filesystem::create_directories(old);
  for (const char* file : {"ca.pem", "client.pem", "client.key"}) {
    WriteAtomically(old + "/" + file, Read(pki + "/" + file));
  }
  const std::string next = cluster.dir() + "/next-ca";
  ASSERT_TRUE(rpc::CreateCa(next, "ca", "stagewise rotated CA", absl::Hours(24)).ok());
  WriteAtomically(pki + "/ca.pem", Read(pki + "/ca.pem") + Read(next + "/ca.pem"));
  absl::SleepFor(absl::Seconds(3));  // every process has looked again
  // Every certificate replaced by one of the new CA.
  for (const char* name : {"coordinator", "worker", "worker-0", "worker-1", "client"}) {
    rpc::CertSpec spec;
    spec.common_name = name;
    ASSERT_TRUE(rpc::IssueCert(next, "ca", pki, name, spec).ok()) << name;
  }
  absl::SleepFor(absl::Seconds(3));

  // The processes present the new certificates: a client trusting only the
  // new CA gets through; one trusting only the old CA does not.
  rpc::TlsConfig only_new = rpc::TlsConfigFor(pki, "client");
  only_new.ca_file = next + "/ca.pem";
  EXPECT_TRUE(Handshakes(coordinator, only_new)) << "the coordinator kept its old certificate";
  EXPECT_FALSE(Handshakes(coordinator, rpc::TlsConfigFor(old, "client")))
      << "the coordinator still presents a certificate of the old CA";
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(Handshakes(absl::StrCat("127.0.0.1:", cluster.worker_port(w)), only_new))
        << "worker " << w << " kept its old certificate";
  }

  // The tokens: ci's secret replaced, then SIGHUP.
  WriteAtomically(cluster.dir() + "/tokens", Tokens(kNewCi));
  EXPECT_TRUE(as(kOldCi)->GetJob(*id).ok()) << "reloaded before SIGHUP";
  ASSERT_EQ(::kill(cluster.coordinator_pid(), SIGHUP), 0);
  absl::Status old_refused;
  for (int i = 0; i < 50 && old_refused.ok(); ++i) {
    old_refused = as(kOldCi)->GetJob(*id).status();
    if (old_refused.ok()) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(old_refused.code(), absl::StatusCode::kUnauthenticated) << old_refused;
  auto seen = as(kNewCi)->GetJob(*id);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->state(), v1::RUNNING)
      << "the job ended before the rotation was over: " << seen->reason();

  // A broken tokens file keeps the tokens in force.
  WriteAtomically(cluster.dir() + "/tokens", "not a tokens file\n");
  ASSERT_EQ(::kill(cluster.coordinator_pid(), SIGHUP), 0);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_TRUE(as(kNewCi)->GetJob(*id).ok()) << Read(cluster.CoordinatorLog());

  // The job never noticed: it ends as it would have, on its first attempt.
  auto end = cluster.WaitForEnd(*id, absl::Seconds(180));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  EXPECT_EQ(end->attempt(), 0) << "a recovery happened during the rotation";
  EXPECT_EQ(end->step(), 200);
  EXPECT_NE(Read(cluster.CoordinatorLog()).find("--tokens not reloaded (SIGHUP)"),
            std::string::npos)
      << "the broken file was not reported";
}

}  // namespace
}  // namespace stagewise
