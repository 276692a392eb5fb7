// Transport security: certificates (pki.h), TLS configuration and real mutual
// TLS handshakes through an in-process gRPC server (tls.h), and bearer tokens
// (tokens.h). Everything is written to one temporary directory that the suite
// removes when it ends.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/rpc/pki.h"
#include "services/rpc/server.h"
#include "services/rpc/tls.h"
#include "services/rpc/tokens.h"
#include "stagewise/v1/coordinator.grpc.pb.h"

namespace stagewise::rpc {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// ---- helpers ----------------------------------------------------------------

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "stagewise_security_test.XXXXXX";
  const char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr) << "mkdtemp " << pattern;
  return dir == nullptr ? "" : std::string(dir);
}

// A temporary directory, removed with everything in it when it goes out of
// scope (also when an ASSERT ends the test early).
class ScopedTempDir {
 public:
  ScopedTempDir() : path_(MakeTempDir()) {}
  ~ScopedTempDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::trunc);
  out << contents;
}

mode_t ModeOf(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return 0;
  return info.st_mode & 07777;
}

struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

X509Ptr LoadCert(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return nullptr;
  X509Ptr cert(PEM_read_X509(file, nullptr, nullptr, nullptr));
  std::fclose(file);
  return cert;
}

// A certificate spec valid from `from` to `to` relative to now.
CertSpec SpecFor(const std::string& common_name, absl::Duration from, absl::Duration to) {
  CertSpec spec;
  spec.common_name = common_name;
  spec.not_before = absl::Now() + from;
  spec.not_after = absl::Now() + to;
  return spec;
}

// ---- a PKI shared by the suites ----------------------------------------------

// <dir>/ca.* and coordinator/worker/client (CreateLocalPki), plus:
//   other-ca.*   an unrelated CA;   stranger.*  a leaf signed by it
//   expired.*    signed by ca, expired yesterday
//   future.*     signed by ca, valid from tomorrow
//   cluster.*    signed by ca, hosts {"stagewise.cluster"} only
class Pki {
 public:
  // Made on first use, so suites that need no certificates make none.
  static Pki& Get() {
    if (instance_ == nullptr) instance_ = new Pki();
    return *instance_;
  }
  // Removes the directory, if the PKI was made (from the environment's TearDown).
  static void RemoveIfMade() {
    if (instance_ != nullptr && !instance_->root_.empty()) {
      std::filesystem::remove_all(instance_->root_);
    }
  }
  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& file) const { return dir_ + "/" + file; }
  const absl::Status& status() const { return status_; }

 private:
  Pki() : root_(MakeTempDir()), dir_(root_ + "/pki") { status_ = Create(); }
  absl::Status Create() {
    if (absl::Status s = CreateLocalPki(dir_); !s.ok()) return s;
    if (absl::Status s = CreateCa(dir_, "other-ca", "other CA", absl::Hours(24)); !s.ok()) return s;
    if (absl::Status s = IssueCert(dir_, "other-ca", dir_, "stranger",
                                   SpecFor("client", -absl::Hours(1), absl::Hours(24)));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = IssueCert(dir_, "ca", dir_, "expired",
                                   SpecFor("client", -absl::Hours(48), -absl::Hours(24)));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = IssueCert(dir_, "ca", dir_, "future",
                                   SpecFor("client", absl::Hours(24), absl::Hours(48)));
        !s.ok()) {
      return s;
    }
    CertSpec cluster = SpecFor("coordinator", -absl::Hours(1), absl::Hours(24));
    cluster.hosts = {"stagewise.cluster"};
    return IssueCert(dir_, "ca", dir_, "cluster", cluster);
  }

  static inline Pki* instance_ = nullptr;
  const std::string root_;
  const std::string dir_;
  absl::Status status_;
};

// Removes the shared PKI's temporary directory after all tests.
class PkiCleanup : public ::testing::Environment {
 public:
  void TearDown() override { Pki::RemoveIfMade(); }
};
[[maybe_unused]] const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new PkiCleanup);

class SharedPkiTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Pki::Get().status().ok()) << Pki::Get().status(); }
  static const Pki& pki() { return Pki::Get(); }
  static TlsConfig Config(const std::string& cert, const std::string& key,
                          const std::string& ca = "ca") {
    TlsConfig config;
    config.cert_file = Pki::Get().Path(cert + ".pem");
    config.key_file = Pki::Get().Path(key + ".key");
    config.ca_file = Pki::Get().Path(ca + ".pem");
    return config;
  }
};

// ---- pki.h --------------------------------------------------------------------

TEST(PkiTest, CreateLocalPkiWritesFilesWithPermissions) {
  const ScopedTempDir temp;
  const std::string& root = temp.path();
  const std::string dir = root + "/a/b";  // created with its parent
  ASSERT_TRUE(CreateLocalPki(dir).ok());
  EXPECT_EQ(ModeOf(root + "/a"), 0700u);
  EXPECT_EQ(ModeOf(dir), 0700u);
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files.insert(entry.path().filename().string());
  }
  // Exactly these: no temporary files left behind.
  EXPECT_EQ(files, (std::set<std::string>{"ca.pem", "ca.key", "coordinator.pem", "coordinator.key",
                                          "worker.pem", "worker.key", "client.pem", "client.key"}));
  for (const char* name : {"ca", "coordinator", "worker", "client"}) {
    EXPECT_EQ(ModeOf(absl::StrCat(dir, "/", name, ".pem")), 0644u) << name;
    EXPECT_EQ(ModeOf(absl::StrCat(dir, "/", name, ".key")), 0600u) << name;
  }
  X509Ptr ca = LoadCert(dir + "/ca.pem");
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(X509_check_ca(ca.get()), 1);
  X509Ptr worker = LoadCert(dir + "/worker.pem");
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ(X509_check_ca(worker.get()), 0);
  EXPECT_EQ(X509_check_host(worker.get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(worker.get(), "127.0.0.1", 0), 1);
  EXPECT_EQ(X509_check_ip_asc(worker.get(), "::1", 0), 1);
  EXPECT_EQ(X509_check_host(worker.get(), "example.com", 0, 0, nullptr), 0);
  EXPECT_EQ(X509_check_purpose(worker.get(), X509_PURPOSE_SSL_SERVER, 0), 1);
  EXPECT_EQ(X509_check_purpose(worker.get(), X509_PURPOSE_SSL_CLIENT, 0), 1);
  char common_name[64] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(worker.get()), NID_commonName, common_name,
                            sizeof(common_name));
  EXPECT_STREQ(common_name, "worker");

  const TlsConfig config = TlsConfigFor(dir, "worker");
  EXPECT_EQ(config.cert_file, dir + "/worker.pem");
  EXPECT_EQ(config.key_file, dir + "/worker.key");
  EXPECT_EQ(config.ca_file, dir + "/ca.pem");
  EXPECT_TRUE(config.enabled());
  for (const char* name : {"coordinator", "worker", "client"}) {
    EXPECT_TRUE(ValidateTlsConfig(TlsConfigFor(dir, name)).ok()) << name;
  }
  // Serials are random: two certificates never share one.
  X509Ptr client = LoadCert(dir + "/client.pem");
  ASSERT_NE(client, nullptr);
  EXPECT_NE(
      ASN1_INTEGER_cmp(X509_get0_serialNumber(worker.get()), X509_get0_serialNumber(client.get())),
      0);
}

TEST(PkiTest, ErrorsNameThePath) {
  const ScopedTempDir temp;
  const std::string& root = temp.path();
  absl::Status s =
      IssueCert(root, "nope", root, "leaf", SpecFor("x", -absl::Hours(1), absl::Hours(1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr(root + "/nope.pem"));

  ASSERT_TRUE(CreateLocalPki(root).ok());
  // A leaf is no CA.
  s = IssueCert(root, "worker", root, "leaf", SpecFor("x", -absl::Hours(1), absl::Hours(1)));
  EXPECT_THAT(std::string(s.message()), HasSubstr(root + "/worker.pem: not a CA certificate"));
  // A CA key that is not the CA certificate's.
  std::filesystem::copy_file(root + "/ca.pem", root + "/mixed.pem");
  std::filesystem::copy_file(root + "/client.key", root + "/mixed.key");
  s = IssueCert(root, "mixed", root, "leaf", SpecFor("x", -absl::Hours(1), absl::Hours(1)));
  EXPECT_THAT(std::string(s.message()), HasSubstr(root + "/mixed.key: does not match"));
  // Bad specs.
  EXPECT_EQ(
      IssueCert(root, "ca", root, "leaf", SpecFor("", -absl::Hours(1), absl::Hours(1))).code(),
      absl::StatusCode::kInvalidArgument);
  CertSpec empty_period = SpecFor("x", -absl::Hours(1), absl::Hours(1));
  empty_period.not_after = empty_period.not_before;
  EXPECT_EQ(IssueCert(root, "ca", root, "leaf", empty_period).code(),
            absl::StatusCode::kInvalidArgument);
  CertSpec bad_host = SpecFor("x", -absl::Hours(1), absl::Hours(1));
  bad_host.hosts = {"a host"};
  EXPECT_EQ(IssueCert(root, "ca", root, "leaf", bad_host).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      IssueCert(root, "ca", root, "a/b", SpecFor("x", -absl::Hours(1), absl::Hours(1))).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCa(root, "ca2", "CA", absl::ZeroDuration()).code(),
            absl::StatusCode::kInvalidArgument);
  // A directory that cannot be created.
  WriteFile(root + "/file", "x");
  s = CreateCa(root + "/file/sub", "ca", "CA", absl::Hours(1));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(root + "/file/"));
  EXPECT_FALSE(std::filesystem::exists(root + "/leaf.pem"));
}

// ---- tls.h: configuration ------------------------------------------------------

TEST(TlsConfigTest, Modes) {
  TlsConfig none;
  EXPECT_FALSE(none.enabled());
  EXPECT_TRUE(ValidateTlsConfig(none).ok());
  TlsConfig insecure;
  insecure.insecure = true;
  EXPECT_FALSE(insecure.enabled());
  EXPECT_TRUE(ValidateTlsConfig(insecure).ok());
  TlsConfig half;
  half.ca_file = "/some/ca.pem";
  EXPECT_TRUE(half.enabled());
  insecure.cert_file = "/some/cert.pem";
  const absl::Status conflict = ValidateTlsConfig(insecure);
  EXPECT_EQ(conflict.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(conflict.message()), StartsWith("--insecure: conflicts with"));
  EXPECT_FALSE(MakeServerCredentials(insecure).ok());
  EXPECT_FALSE(MakeChannelCredentials(insecure).ok());
  // Plaintext modes give insecure credentials.
  EXPECT_TRUE(MakeServerCredentials(none).ok());
  EXPECT_TRUE(MakeChannelCredentials(none).ok());
}

TEST_F(SharedPkiTest, ValidationErrorsNameTheFlag) {
  struct Case {
    std::string what;
    TlsConfig config;
    absl::StatusCode code;
    std::string message_start;
  };
  TlsConfig missing_key = Config("client", "client");
  missing_key.key_file = "";
  TlsConfig missing_cert = Config("client", "client");
  missing_cert.cert_file = "";
  TlsConfig missing_ca = Config("client", "client");
  missing_ca.ca_file = "";
  TlsConfig no_file = Config("client", "client");
  no_file.cert_file = pki().Path("nope.pem");
  TlsConfig directory = Config("client", "client");
  directory.ca_file = pki().dir();
  const std::string garbage = pki().Path("garbage.txt");
  WriteFile(garbage, "not a certificate\n");
  TlsConfig not_pem = Config("client", "client");
  not_pem.ca_file = garbage;
  TlsConfig not_key = Config("client", "client");
  not_key.key_file = pki().Path("client.pem");
  const std::string expired_on =
      absl::FormatTime("%Y-%m-%d", absl::Now() - absl::Hours(24), absl::UTCTimeZone());
  const std::vector<Case> cases = {
      {"no --tls-key", missing_key, absl::StatusCode::kInvalidArgument,
       "--tls-key: missing: TLS needs all of --tls-cert, --tls-key and --tls-ca"},
      {"no --tls-cert", missing_cert, absl::StatusCode::kInvalidArgument,
       "--tls-cert: missing: TLS needs all of --tls-cert, --tls-key and --tls-ca"},
      {"no --tls-ca", missing_ca, absl::StatusCode::kInvalidArgument,
       "--tls-ca: missing: TLS needs all of --tls-cert, --tls-key and --tls-ca"},
      {"missing file", no_file, absl::StatusCode::kInvalidArgument,
       "--tls-cert: cannot read " + pki().Path("nope.pem") + ": No such file or directory"},
      {"directory", directory, absl::StatusCode::kInvalidArgument,
       "--tls-ca: cannot read " + pki().dir() + ": Is a directory"},
      {"not PEM", not_pem, absl::StatusCode::kInvalidArgument,
       "--tls-ca: " + garbage + ": no PEM certificate found"},
      {"certificate as key", not_key, absl::StatusCode::kInvalidArgument,
       "--tls-key: " + pki().Path("client.pem") + ": no PEM private key found"},
      {"key of another certificate", Config("client", "worker"), absl::StatusCode::kInvalidArgument,
       "--tls-key: does not match --tls-cert"},
      {"certificate of another CA", Config("stranger", "stranger"),
       absl::StatusCode::kInvalidArgument, "--tls-cert: not signed by --tls-ca"},
      {"CA of another PKI", Config("client", "client", "other-ca"),
       absl::StatusCode::kInvalidArgument, "--tls-cert: not signed by --tls-ca"},
      {"expired", Config("expired", "expired"), absl::StatusCode::kFailedPrecondition,
       "--tls-cert: expired on " + expired_on},
      {"not yet valid", Config("future", "future"), absl::StatusCode::kFailedPrecondition,
       "--tls-cert: not valid before "},
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateTlsConfig(c.config);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), StartsWith(c.message_start)) << c.what;
    EXPECT_FALSE(MakeServerCredentials(c.config).ok()) << c.what;
    EXPECT_FALSE(MakeChannelCredentials(c.config).ok()) << c.what;
  }
  // A CA certificate verifies against itself but may neither serve nor dial.
  const TlsConfig ca_as_leaf = Config("ca", "ca");
  EXPECT_TRUE(ValidateTlsConfig(ca_as_leaf).ok());
  EXPECT_THAT(std::string(MakeServerCredentials(ca_as_leaf).status().message()),
              StartsWith("--tls-cert: not usable by a TLS server"));
  EXPECT_THAT(std::string(MakeChannelCredentials(ca_as_leaf).status().message()),
              StartsWith("--tls-cert: not usable by a TLS client"));
  // A certificate file may carry the chain; a CA file several CAs.
  const std::string bundle = pki().Path("bundle.pem");
  WriteFile(bundle, ReadFile(pki().Path("other-ca.pem")) + ReadFile(pki().Path("ca.pem")));
  TlsConfig with_bundle = Config("client", "client");
  with_bundle.ca_file = bundle;
  EXPECT_TRUE(ValidateTlsConfig(with_bundle).ok()) << ValidateTlsConfig(with_bundle);
  std::filesystem::remove(bundle);
  std::filesystem::remove(garbage);
}

TEST(TlsFlagsTest, FlagsAndEnvironment) {
  {
    CLI::App app;
    TlsConfig config;
    AddTlsFlags(&app, &config);
    app.parse("--tls-cert c.pem --tls-key c.key --tls-ca ca.pem --tls-server-name n", false);
    EXPECT_EQ(config.cert_file, "c.pem");
    EXPECT_EQ(config.key_file, "c.key");
    EXPECT_EQ(config.ca_file, "ca.pem");
    EXPECT_EQ(config.server_name, "n");
    EXPECT_FALSE(config.insecure);
  }
  setenv("STAGEWISE_TLS_CERT", "/env/c.pem", 1);
  setenv("STAGEWISE_TLS_KEY", "/env/c.key", 1);
  setenv("STAGEWISE_TLS_CA", "/env/ca.pem", 1);
  setenv("STAGEWISE_TLS_SERVER_NAME", "env.name", 1);
  setenv("STAGEWISE_INSECURE", "true", 1);
  {
    CLI::App app;
    TlsConfig config;
    AddTlsFlags(&app, &config);
    app.parse("--tls-ca flag.pem", false);  // a flag beats its variable
    EXPECT_EQ(config.cert_file, "/env/c.pem");
    EXPECT_EQ(config.key_file, "/env/c.key");
    EXPECT_EQ(config.ca_file, "flag.pem");
    EXPECT_EQ(config.server_name, "env.name");
    EXPECT_TRUE(config.insecure);
  }
  for (const char* value : {"1", "0"}) {
    setenv("STAGEWISE_INSECURE", value, 1);
    CLI::App app;
    TlsConfig config;
    AddTlsFlags(&app, &config);
    app.parse("", false);
    EXPECT_EQ(config.insecure, std::string(value) == "1") << value;
  }
  for (const char* name : {"STAGEWISE_TLS_CERT", "STAGEWISE_TLS_KEY", "STAGEWISE_TLS_CA",
                           "STAGEWISE_TLS_SERVER_NAME", "STAGEWISE_INSECURE"}) {
    unsetenv(name);
  }
  CLI::App app;
  TlsConfig config;
  AddTlsFlags(&app, &config);
  app.parse("--insecure", false);
  EXPECT_TRUE(config.insecure);
  const std::string help = app.help();
  for (const char* flag :
       {"--tls-cert", "--tls-key", "--tls-ca", "--tls-server-name", "--insecure"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
  EXPECT_THAT(help, HasSubstr("STAGEWISE_TLS_CERT"));
}

// ---- tls.h: listen policy -------------------------------------------------------

TEST(ListenPolicyTest, IsLoopbackAddress) {
  const std::vector<std::pair<std::string, bool>> cases = {
      {"127.0.0.1:7070", true},
      {"127.1.2.3:0", true},
      {"localhost:7070", true},
      {"LocalHost:7070", true},
      {"localhost", true},
      {"[::1]:7070", true},
      {"::1", true},
      {"[::ffff:127.0.0.1]:7070", true},
      {"ipv4:127.0.0.1:7070", true},
      {"ipv6:[::1]:7070", true},
      {"unix:/tmp/stagewise.sock", true},
      {"unix-abstract:stagewise", true},
      {"0.0.0.0:7070", false},
      {"0.0.0.0:0", false},
      {"[::]:7070", false},
      {"::", false},
      {":7070", false},
      {"10.1.2.3:7070", false},
      {"128.0.0.1:7070", false},
      {"[::2]:7070", false},
      {"example.com:7070", false},
      {"localhost.example.com:7070", false},
      {"[::1", false},
      {"[::1]x", false},
      {"", false},
  };
  for (const auto& [address, loopback] : cases) {
    EXPECT_EQ(IsLoopbackAddress(address), loopback) << address;
  }
}

TEST(ListenPolicyTest, CheckListenPolicy) {
  TlsConfig none;
  TlsConfig insecure;
  insecure.insecure = true;
  const TlsConfig tls = TlsConfigFor("/pki", "coordinator");
  const absl::Status refused = CheckListenPolicy("0.0.0.0:7070", none);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            "refusing to serve plaintext on 0.0.0.0:7070: give --tls-cert/--tls-key/--tls-ca, or "
            "--insecure to accept it");
  EXPECT_FALSE(CheckListenPolicy("[::]:0", none).ok());
  EXPECT_FALSE(CheckListenPolicy("10.0.0.1:7070", none).ok());
  EXPECT_TRUE(CheckListenPolicy("127.0.0.1:0", none).ok());
  EXPECT_TRUE(CheckListenPolicy("localhost:7070", none).ok());
  EXPECT_TRUE(CheckListenPolicy("unix:/tmp/s", none).ok());
  EXPECT_TRUE(CheckListenPolicy("0.0.0.0:7070", insecure).ok());
  EXPECT_TRUE(CheckListenPolicy("0.0.0.0:7070", tls).ok());
}

// ---- tls.h: real handshakes -----------------------------------------------------

// ListWorkers answers with one worker whose id is the caller's PeerIdentity,
// and, when the server has tokens, labels "principal" and "role" from its
// bearer token (UNAUTHENTICATED without a valid one).
class IdentityService final : public v1::Coordinator::Service {
 public:
  explicit IdentityService(const TokenTable* tokens) : tokens_(tokens) {}
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    v1::WorkerInfo* worker = response->add_workers();
    worker->set_worker_id(PeerIdentity(*context->auth_context()));
    if (tokens_ != nullptr) {
      absl::StatusOr<Principal> principal = tokens_->Authenticate(*context);
      if (!principal.ok()) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            std::string(principal.status().message()));
      }
      (*worker->mutable_labels())["principal"] = principal->name;
      (*worker->mutable_labels())["role"] = std::string(RoleName(principal->role));
    }
    return grpc::Status::OK;
  }

 private:
  const TokenTable* tokens_;
};

class TestServer {
 public:
  static std::unique_ptr<TestServer> Start(const TlsConfig& config,
                                           const TokenTable* tokens = nullptr) {
    auto server = std::unique_ptr<TestServer>(new TestServer(tokens));
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        MakeServerCredentials(config);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return nullptr;
    grpc::ServerBuilder builder;
    ConfigureServerBuilder({}, &builder);  // also enables the health service
    builder.AddListeningPort("127.0.0.1:0", *credentials, &server->port_);
    builder.RegisterService(&server->service_);
    server->server_ = builder.BuildAndStart();
    EXPECT_NE(server->server_, nullptr);
    EXPECT_NE(server->port_, 0);
    if (server->server_ == nullptr || server->port_ == 0) return nullptr;
    return server;
  }
  ~TestServer() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }
  std::string target(const std::string& host = "127.0.0.1") const {
    return absl::StrCat(host, ":", port_);
  }

 private:
  explicit TestServer(const TokenTable* tokens) : service_(tokens) {}
  IdentityService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

struct CallResult {
  grpc::Status status;
  v1::ListWorkersResponse response;
  absl::Duration took;
  std::string identity() const {
    return response.workers_size() > 0 ? response.workers(0).worker_id() : "<none>";
  }
};

CallResult CallListWorkers(const std::string& target,
                           const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                           const grpc::ChannelArguments& args = {}, const std::string& token = "") {
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  auto stub = v1::Coordinator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) AddBearerToken(&context, token);
  CallResult result;
  const absl::Time start = absl::Now();
  result.status = stub->ListWorkers(&context, v1::ListWorkersRequest(), &result.response);
  result.took = absl::Now() - start;
  return result;
}

// Credentials straight from files, bypassing LoadTlsMaterial's checks, so the
// server is what rejects them.
std::shared_ptr<grpc::ChannelCredentials> RawCredentials(const std::string& cert,
                                                         const std::string& key,
                                                         const std::string& ca) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadFile(ca);
  if (!key.empty()) options.pem_private_key = ReadFile(key);
  if (!cert.empty()) options.pem_cert_chain = ReadFile(cert);
  return grpc::SslCredentials(options);
}

class GrpcTlsTest : public SharedPkiTest {
 protected:
  void SetUp() override {
    SharedPkiTest::SetUp();
    server_ = TestServer::Start(TlsConfigFor(pki().dir(), "coordinator"));
    ASSERT_NE(server_, nullptr);
  }
  // A rejected call fails fast with UNAVAILABLE (the handshake fails, nothing
  // waits for the deadline).
  void ExpectRejected(const CallResult& result, const std::string& what) {
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << what << ": " << result.status.error_message();
    EXPECT_LT(result.took, absl::Seconds(4)) << what;
    RecordProperty(what,
                   absl::StrCat(result.status.error_code(), " '", result.status.error_message(),
                                "' after ", absl::FormatDuration(result.took)));
  }
  std::unique_ptr<TestServer> server_;
};

TEST_F(GrpcTlsTest, ClientWithCertificateIsIdentified) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(TlsConfigFor(pki().dir(), "client"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  for (const char* host : {"127.0.0.1", "localhost"}) {
    const CallResult result = CallListWorkers(server_->target(host), *credentials);
    ASSERT_TRUE(result.status.ok()) << host << ": " << result.status.error_message();
    EXPECT_EQ(result.identity(), "client") << host;
  }
  // The standard health service is served over the same TLS port.
  auto channel = grpc::CreateChannel(server_->target(), *credentials);
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status =
      health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // A worker's certificate identifies a worker.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> worker =
      MakeChannelCredentials(TlsConfigFor(pki().dir(), "worker"));
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(CallListWorkers(server_->target(), *worker).identity(), "worker");
}

TEST_F(GrpcTlsTest, ClientWithoutCertificateIsRejected) {
  ExpectRejected(CallListWorkers(server_->target(), RawCredentials("", "", pki().Path("ca.pem"))),
                 "no client certificate");
}

TEST_F(GrpcTlsTest, ClientCertificateOfAnotherCaIsRejected) {
  ExpectRejected(CallListWorkers(server_->target(),
                                 RawCredentials(pki().Path("stranger.pem"),
                                                pki().Path("stranger.key"), pki().Path("ca.pem"))),
                 "client certificate of another CA");
}

TEST_F(GrpcTlsTest, ExpiredClientCertificateIsRejected) {
  ExpectRejected(CallListWorkers(server_->target(),
                                 RawCredentials(pki().Path("expired.pem"),
                                                pki().Path("expired.key"), pki().Path("ca.pem"))),
                 "expired client certificate");
}

TEST_F(GrpcTlsTest, ServerOfAnotherCaIsRejected) {
  ExpectRejected(CallListWorkers(server_->target(),
                                 RawCredentials(pki().Path("client.pem"), pki().Path("client.key"),
                                                pki().Path("other-ca.pem"))),
                 "server certificate of another CA");
}

TEST_F(GrpcTlsTest, PlaintextClientIsRejected) {
  ExpectRejected(CallListWorkers(server_->target(), grpc::InsecureChannelCredentials()),
                 "plaintext client");
}

TEST_F(GrpcTlsTest, ServerNameOverride) {
  // A server whose certificate names only stagewise.cluster.
  TlsConfig server_config = TlsConfigFor(pki().dir(), "coordinator");
  server_config.cert_file = pki().Path("cluster.pem");
  server_config.key_file = pki().Path("cluster.key");
  std::unique_ptr<TestServer> cluster = TestServer::Start(server_config);
  ASSERT_NE(cluster, nullptr);
  TlsConfig client = TlsConfigFor(pki().dir(), "client");
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(client);
  ASSERT_TRUE(credentials.ok());
  grpc::ChannelArguments plain_args;
  ApplyChannelArgs(client, &plain_args);  // no server_name: no override
  ExpectRejected(CallListWorkers(cluster->target(), *credentials, plain_args),
                 "server certificate without the dialled host");

  client.server_name = "stagewise.cluster";
  grpc::ChannelArguments args;
  ApplyChannelArgs(client, &args);
  const CallResult result = CallListWorkers(cluster->target(), *credentials, args);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.identity(), "client");

  client.server_name = "other.cluster";
  grpc::ChannelArguments wrong_args;
  ApplyChannelArgs(client, &wrong_args);
  ExpectRejected(CallListWorkers(cluster->target(), *credentials, wrong_args),
                 "wrong --tls-server-name");
}

TEST(GrpcPlaintextTest, PlaintextHasNoIdentity) {
  TlsConfig insecure;
  insecure.insecure = true;
  std::unique_ptr<TestServer> server = TestServer::Start(insecure);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(insecure);
  ASSERT_TRUE(credentials.ok());
  const CallResult result = CallListWorkers(server->target(), *credentials);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.identity(), "");
}

TEST_F(SharedPkiTest, BearerTokensOverTls) {
  absl::StatusOr<std::string> alice = NewToken();
  absl::StatusOr<std::string> bob = NewToken();
  ASSERT_TRUE(alice.ok() && bob.ok());
  absl::StatusOr<TokenTable> tokens =
      TokenTable::Parse(absl::StrCat(*alice, " admin alice\n", *bob, " read bob\n"), "tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  std::unique_ptr<TestServer> server =
      TestServer::Start(TlsConfigFor(pki().dir(), "coordinator"), &*tokens);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(TlsConfigFor(pki().dir(), "client"));
  ASSERT_TRUE(credentials.ok());

  CallResult result = CallListWorkers(server->target(), *credentials, {}, *alice);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.workers(0).labels().at("principal"), "alice");
  EXPECT_EQ(result.response.workers(0).labels().at("role"), "admin");
  result = CallListWorkers(server->target(), *credentials, {}, *bob);
  ASSERT_TRUE(result.status.ok());
  EXPECT_EQ(result.response.workers(0).labels().at("principal"), "bob");

  result = CallListWorkers(server->target(), *credentials);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(result.status.error_message(), "missing bearer token");
  result = CallListWorkers(server->target(), *credentials, {}, std::string(64, 'f'));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(result.status.error_message(), "unknown token");
}

// ---- tokens.h -------------------------------------------------------------------

constexpr char kAlice[] = "alice-secret-0123456789";
constexpr char kBob[] = "bob-secret-0123456789";
constexpr char kCi[] = "ci-secret-0123456789#x";

TEST(TokenTableTest, ParsesAndAuthenticates) {
  const std::string text = absl::StrCat(              //
      "# tokens\n",                                   // 1
      "\n",                                           // 2
      kAlice, " admin alice\n",                       // 3
      "   ", kBob, "\tread\tbob   # the reader\r\n",  // 4
      "  # indented comment\n",                       // 5
      kCi, " submit ci@build.example\n");             // 6, no final newline after
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens.txt");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 3u);
  EXPECT_FALSE(table->empty());
  EXPECT_TRUE(TokenTable().empty());

  const std::vector<std::tuple<std::string, std::string, Role>> good = {
      {absl::StrCat("Bearer ", kAlice), "alice", Role::kAdmin},
      {absl::StrCat("bearer ", kBob), "bob", Role::kRead},
      {absl::StrCat("  BEARER \t", kCi, "  "), "ci@build.example", Role::kSubmit},
  };
  for (const auto& [header, name, role] : good) {
    absl::StatusOr<Principal> principal = table->Authenticate(header);
    ASSERT_TRUE(principal.ok()) << header << ": " << principal.status();
    EXPECT_EQ(principal->name, name);
    EXPECT_EQ(principal->role, role);
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "missing bearer token"},
      {"Bearer", "missing bearer token"},
      {"Bearer    ", "missing bearer token"},
      {kAlice, "missing bearer token"},
      {absl::StrCat("Bearer", kAlice), "missing bearer token"},
      {absl::StrCat("Basic ", kAlice), "missing bearer token"},
      {"Bearer wrong-secret-0123456789", "unknown token"},
      {absl::StrCat("Bearer ", kAlice, "x"), "unknown token"},
      {absl::StrCat("Bearer ", std::string(kAlice).substr(0, 10)), "unknown token"},
      {absl::StrCat("Bearer ", kAlice, " ", kBob), "unknown token"},
  };
  for (const auto& [header, message] : bad) {
    absl::StatusOr<Principal> principal = table->Authenticate(header);
    EXPECT_EQ(principal.status().code(), absl::StatusCode::kUnauthenticated) << header;
    EXPECT_EQ(principal.status().message(), message) << header;
  }
  EXPECT_FALSE(TokenTable().Authenticate(absl::StrCat("Bearer ", kAlice)).ok());
}

TEST(TokenTableTest, ErrorsNameTheLineAndNeverTheSecret) {
  const std::string secret = "super-secret-token-value";
  struct Case {
    std::string text;
    std::string message_start;
  };
  const std::vector<Case> cases = {
      {"# header\n" + secret + " read\n", "f.txt:2: expected '<secret> <role> <name>', found 2"},
      {secret + " read bob extra\n", "f.txt:1: expected '<secret> <role> <name>', found 4"},
      {"\n\nshort-secret read bob\n", "f.txt:3: token is shorter than 16 characters"},
      {secret + " owner bob\n", "f.txt:1: unknown role"},
      {"read " + secret + " bob\n", "f.txt:1: token is shorter"},  // fields swapped
      {secret + " read bo/b\n", "f.txt:1: name must be"},
      {secret + "\x01 read bob\n", "f.txt:1: token has characters other than printable ASCII"},
      {secret + " read bob\nother-secret-0123456789 read bob\n",
       "f.txt:2: duplicate name (also on line 1)"},
      {secret + " read bob\n# x\n" + secret + " admin carol\n",
       "f.txt:3: duplicate token (also on line 1)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(c.text, "f.txt");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(table.status().message()), StartsWith(c.message_start));
    for (const char* leaked : {"super-secret", "short-secret", "other-secret"}) {
      EXPECT_THAT(std::string(table.status().message()), Not(HasSubstr(leaked))) << c.text;
    }
  }
}

TEST(TokenTableTest, Load) {
  const ScopedTempDir temp;
  const std::string& dir = temp.path();
  const std::string path = dir + "/tokens";
  absl::StatusOr<TokenTable> missing = TokenTable::Load(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), StartsWith(path + ": cannot read"));
  WriteFile(path, absl::StrCat(kAlice, " admin alice\n", kBob, " bad bob\n"));
  chmod(path.c_str(), 0600);
  absl::StatusOr<TokenTable> bad = TokenTable::Load(path);
  EXPECT_THAT(std::string(bad.status().message()), StartsWith(path + ":2: unknown role"));
  WriteFile(path, absl::StrCat(kAlice, " admin alice\n"));
  absl::StatusOr<TokenTable> table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->Authenticate(absl::StrCat("Bearer ", kAlice))->name, "alice");
}

TEST(TokenTableTest, RolesAndTokens) {
  EXPECT_EQ(RoleName(Role::kRead), "read");
  EXPECT_EQ(RoleName(Role::kSubmit), "submit");
  EXPECT_EQ(RoleName(Role::kAdmin), "admin");
  EXPECT_EQ(RequiredRole("GetJob"), Role::kRead);
  EXPECT_EQ(RequiredRole("/stagewise.v1.Coordinator/WatchJob"), Role::kRead);
  EXPECT_EQ(RequiredRole("ListWorkers"), Role::kRead);
  EXPECT_EQ(RequiredRole("ListCheckpoints"), Role::kRead);
  EXPECT_EQ(RequiredRole("GetJobMetrics"), Role::kRead);
  EXPECT_EQ(RequiredRole("/stagewise.v1.Coordinator/GetJobTrace"), Role::kRead);
  EXPECT_EQ(RequiredRole("ListJobEvents"), Role::kRead);
  EXPECT_EQ(RequiredRole("/stagewise.v1.Coordinator/BackupDatabase"), Role::kAdmin);
  EXPECT_EQ(RequiredRole("/stagewise.v1.Coordinator/SubmitJob"), Role::kSubmit);
  EXPECT_EQ(RequiredRole("CancelJob"), Role::kSubmit);
  EXPECT_EQ(RequiredRole("ResumeJob"), Role::kSubmit);
  EXPECT_EQ(RequiredRole("SetJobPriority"), Role::kSubmit);
  EXPECT_EQ(RequiredRole("GetGoodput"), Role::kRead);
  EXPECT_EQ(RequiredRole("/stagewise.v1.Coordinator/RegisterWorker"), std::nullopt);
  EXPECT_EQ(RequiredRole("Control"), std::nullopt);
  EXPECT_EQ(RequiredRole("/other.Service/GetJob"), std::nullopt);
  const Principal reader{"r", Role::kRead};
  const Principal submitter{"s", Role::kSubmit};
  const Principal admin{"a", Role::kAdmin};
  EXPECT_TRUE(HasRole(reader, Role::kRead));
  EXPECT_FALSE(HasRole(reader, Role::kSubmit));
  EXPECT_TRUE(HasRole(submitter, Role::kSubmit));
  EXPECT_FALSE(HasRole(submitter, Role::kAdmin));
  EXPECT_TRUE(HasRole(admin, Role::kSubmit));
  EXPECT_FALSE(CanCancel(reader, "r"));
  EXPECT_TRUE(CanCancel(submitter, "s"));
  EXPECT_FALSE(CanCancel(submitter, "other"));
  EXPECT_TRUE(CanCancel(admin, "other"));

  absl::StatusOr<std::string> a = NewToken();
  absl::StatusOr<std::string> b = NewToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(TokenTable::Parse(*a + " read x\n", "t").ok());
}

}  // namespace
}  // namespace stagewise::rpc
