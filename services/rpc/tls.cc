#include "services/rpc/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <ctime>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "services/common/status_macros.h"
#include "services/rpc/openssl_ptr.h"

namespace stagewise::rpc {
namespace {

constexpr char kCertFlag[] = "--tls-cert";
constexpr char kKeyFlag[] = "--tls-key";
constexpr char kCaFlag[] = "--tls-ca";
// Certificates and keys are small; this bounds a mistaken --tls-cert=/dev/zero.
constexpr size_t kMaxPemBytes = 1 << 20;

using openssl::BioPtr;
using openssl::PkeyPtr;
using openssl::StoreCtxPtr;
using openssl::StorePtr;
using openssl::X509Ptr;
using openssl::X509StackPtr;

// Never prompts on the terminal for a passphrase: encrypted keys just fail.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*userdata*/) { return -1; }

std::string ErrnoMessage(int error) { return std::generic_category().message(error); }

// The whole of `path`, or INVALID_ARGUMENT "<flag>: cannot read <path>: <reason>".
absl::StatusOr<std::string> ReadPemFile(const char* flag, const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read ", path, ": ", ErrnoMessage(errno)));
  }
  std::string contents;
  char buffer[16384];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": cannot read ", path, ": ", ErrnoMessage(error)));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
    if (contents.size() > kMaxPemBytes) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": cannot read ", path, ": larger than 1 MiB, not a PEM file"));
    }
  }
  close(fd);
  return contents;
}

BioPtr MemoryBio(const std::string& data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// Every certificate in `pem`, in order; INVALID_ARGUMENT when there is none or
// one is malformed.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const char* flag, const std::string& path,
                                                       const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  if (bio == nullptr) return absl::InternalError(absl::StrCat(flag, ": out of memory"));
  std::vector<X509Ptr> certs;
  ERR_clear_error();
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
    certs.emplace_back(cert);
  }
  // Running out of input ends the loop with PEM_R_NO_START_LINE; anything else
  // is a damaged certificate.
  const unsigned long error = ERR_peek_last_error();
  const bool clean_end = error == 0 || (ERR_GET_LIB(error) == ERR_LIB_PEM &&
                                        ERR_GET_REASON(error) == PEM_R_NO_START_LINE);
  ERR_clear_error();
  if (!clean_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", path, ": malformed PEM certificate (certificate #", certs.size() + 1, ")"));
  }
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, ": no PEM certificate found"));
  }
  return certs;
}

absl::StatusOr<PkeyPtr> ParsePrivateKey(const std::string& path, const std::string& pem) {
  if (absl::StrContains(pem, "ENCRYPTED")) {
    return absl::InvalidArgumentError(absl::StrCat(
        kKeyFlag, ": ", path,
        ": encrypted private keys are not supported (decrypt it: openssl pkey -in KEY -out KEY)"));
  }
  BioPtr bio = MemoryBio(pem);
  if (bio == nullptr) return absl::InternalError(absl::StrCat(kKeyFlag, ": out of memory"));
  ERR_clear_error();
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kKeyFlag, ": ", path, ": no PEM private key found"));
  }
  return key;
}

std::string FormatAsn1Time(const ASN1_TIME* time) {
  struct tm parts = {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &parts) != 1) return "(unreadable date)";
  char text[64];
  if (std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &parts) == 0) {
    return "(unreadable date)";
  }
  return text;
}

std::string SubjectOf(X509* cert) {
  if (cert == nullptr) return "?";
  char text[256];
  if (X509_NAME_oneline(X509_get_subject_name(cert), text, sizeof(text)) == nullptr) return "?";
  return text;
}

// The leaf is within its validity period now.
absl::Status CheckValidity(const std::string& path, X509* leaf) {
  const ASN1_TIME* not_before = X509_get0_notBefore(leaf);
  const ASN1_TIME* not_after = X509_get0_notAfter(leaf);
  if (X509_cmp_time(not_before, nullptr) >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(kCertFlag, ": not valid before ",
                                                      FormatAsn1Time(not_before), " (", path, ")"));
  }
  if (X509_cmp_time(not_after, nullptr) <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kCertFlag, ": expired on ", FormatAsn1Time(not_after), " (", path, ")"));
  }
  return absl::OkStatus();
}

// `chain[0]` verifies against the CAs, through chain[1..] as intermediates.
absl::Status CheckChain(const TlsConfig& config, const std::vector<X509Ptr>& chain,
                        const std::vector<X509Ptr>& cas) {
  StorePtr store(X509_STORE_new());
  X509StackPtr untrusted(sk_X509_new_null());
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (store == nullptr || untrusted == nullptr || ctx == nullptr) {
    return absl::InternalError(absl::StrCat(kCaFlag, ": out of memory"));
  }
  for (const X509Ptr& ca : cas) {
    if (X509_STORE_add_cert(store.get(), ca.get()) != 1) {
      ERR_clear_error();  // a duplicate certificate in the file: harmless
    }
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    if (sk_X509_push(untrusted.get(), chain[i].get()) <= 0) {
      return absl::InternalError(absl::StrCat(kCertFlag, ": out of memory"));
    }
  }
  if (X509_STORE_CTX_init(ctx.get(), store.get(), chain[0].get(), untrusted.get()) != 1) {
    ERR_clear_error();
    return absl::InternalError(absl::StrCat(kCaFlag, ": cannot set up verification"));
  }
  const int ok = X509_verify_cert(ctx.get());
  const int error = X509_STORE_CTX_get_error(ctx.get());
  X509* failed = X509_STORE_CTX_get_current_cert(ctx.get());
  ERR_clear_error();
  if (ok == 1) return absl::OkStatus();
  const std::string files = absl::StrCat(" (", config.cert_file, ", ", config.ca_file, ")");
  switch (error) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return absl::InvalidArgumentError(
          absl::StrCat(kCertFlag, ": not signed by ", kCaFlag, files));
    case X509_V_ERR_CERT_HAS_EXPIRED:
    case X509_V_ERR_CERT_NOT_YET_VALID:
      // The leaf's dates were checked before: this is a CA or an intermediate.
      return absl::FailedPreconditionError(
          absl::StrCat(kCertFlag, ": does not verify against ", kCaFlag, files, ": ",
                       X509_verify_cert_error_string(error), " (", SubjectOf(failed), ")"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(kCertFlag, ": does not verify against ", kCaFlag, files, ": ",
                       X509_verify_cert_error_string(error), " (", SubjectOf(failed), ")"));
  }
}

bool AnyFileGiven(const TlsConfig& config) {
  return !config.cert_file.empty() || !config.key_file.empty() || !config.ca_file.empty();
}

// "127.0.0.0/8", "::1", "::ffff:127.x.y.z" or "localhost".
bool IsLoopbackHost(std::string host) {
  absl::AsciiStrToLower(&host);
  if (host == "localhost" || host == "localhost.") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

bool TlsConfig::enabled() const { return !insecure && AnyFileGiven(*this); }

void AddTlsFlags(CLI::App* app, TlsConfig* config) {
  constexpr char kGroup[] = "Transport security";
  app->add_option("--tls-cert", config->cert_file,
                  "PEM certificate (chain) this process presents to its peers. Giving any of "
                  "--tls-cert/--tls-key/--tls-ca turns on mutual TLS and requires all three")
      ->envname("STAGEWISE_TLS_CERT")
      ->group(kGroup);
  app->add_option("--tls-key", config->key_file,
                  "Unencrypted PEM private key of --tls-cert (keep it mode 0600)")
      ->envname("STAGEWISE_TLS_KEY")
      ->group(kGroup);
  app->add_option("--tls-ca", config->ca_file,
                  "PEM CA certificate(s): every peer's certificate must be signed by one of them")
      ->envname("STAGEWISE_TLS_CA")
      ->group(kGroup);
  app->add_option("--tls-server-name", config->server_name,
                  "Clients: the name to verify in the server's certificate instead of the host "
                  "of the target address (e.g. when connecting by IP)")
      ->envname("STAGEWISE_TLS_SERVER_NAME")
      ->group(kGroup);
  app->add_flag("--insecure", config->insecure,
                "Use plaintext, no TLS at all: anyone on the network can read and forge traffic. "
                "Without TLS flags and without this, servers only listen on loopback addresses")
      ->envname("STAGEWISE_INSECURE")
      ->group(kGroup);
  app->add_option("--tls-reload-seconds", config->reload_seconds,
                  "How often a running process re-reads --tls-cert, --tls-key and --tls-ca and "
                  "uses rotated files for new connections (0: read them once at start)")
      ->envname("STAGEWISE_TLS_RELOAD_SECONDS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->group(kGroup);
}

namespace {

// How the certificate is going to be used, beyond what LoadTlsMaterial checks.
enum class Usage { kAny, kServer, kClient };

// The leaf may serve (or dial) TLS: OpenSSL's own check, the one the handshake
// applies on the other end (extendedKeyUsage, keyUsage).
absl::Status CheckUsage(const TlsConfig& config, X509* leaf, Usage usage) {
  if (usage == Usage::kAny) return absl::OkStatus();
  const bool server = usage == Usage::kServer;
  const int ok =
      X509_check_purpose(leaf, server ? X509_PURPOSE_SSL_SERVER : X509_PURPOSE_SSL_CLIENT, 0);
  ERR_clear_error();
  if (ok == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kCertFlag, ": not usable by a TLS ", server ? "server" : "client",
                   " (its keyUsage/extendedKeyUsage lack ", server ? "serverAuth" : "clientAuth",
                   ") (", config.cert_file, ")"));
}

absl::StatusOr<TlsMaterial> Load(const TlsConfig& config, Usage usage) {
  if (config.insecure) {
    if (AnyFileGiven(config)) {
      return absl::InvalidArgumentError(
          "--insecure: conflicts with --tls-cert/--tls-key/--tls-ca (check the STAGEWISE_TLS_* "
          "and STAGEWISE_INSECURE environment variables); give one or the other");
    }
    return TlsMaterial{};
  }
  if (!config.enabled()) return TlsMaterial{};
  const struct {
    const char* flag;
    const std::string& path;
  } files[] = {
      {kCertFlag, config.cert_file}, {kKeyFlag, config.key_file}, {kCaFlag, config.ca_file}};
  for (const auto& file : files) {
    if (file.path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.flag,
                       ": missing: TLS needs all of --tls-cert, --tls-key and --tls-ca "
                       "(or --insecure for plaintext)"));
    }
  }
  TlsMaterial material;
  STAGEWISE_ASSIGN_OR_RETURN(material.cert_chain_pem, ReadPemFile(kCertFlag, config.cert_file));
  STAGEWISE_ASSIGN_OR_RETURN(material.private_key_pem, ReadPemFile(kKeyFlag, config.key_file));
  STAGEWISE_ASSIGN_OR_RETURN(material.ca_pem, ReadPemFile(kCaFlag, config.ca_file));
  STAGEWISE_ASSIGN_OR_RETURN(
      std::vector<X509Ptr> chain,
      ParseCertificates(kCertFlag, config.cert_file, material.cert_chain_pem));
  STAGEWISE_ASSIGN_OR_RETURN(PkeyPtr key,
                             ParsePrivateKey(config.key_file, material.private_key_pem));
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<X509Ptr> cas,
                             ParseCertificates(kCaFlag, config.ca_file, material.ca_pem));
  ERR_clear_error();
  const bool key_matches = X509_check_private_key(chain[0].get(), key.get()) == 1;
  ERR_clear_error();
  if (!key_matches) {
    return absl::InvalidArgumentError(absl::StrCat(kKeyFlag, ": does not match ", kCertFlag, " (",
                                                   config.key_file, ", ", config.cert_file, ")"));
  }
  STAGEWISE_RETURN_IF_ERROR(CheckValidity(config.cert_file, chain[0].get()));
  STAGEWISE_RETURN_IF_ERROR(CheckChain(config, chain, cas));
  STAGEWISE_RETURN_IF_ERROR(CheckUsage(config, chain[0].get(), usage));
  return material;
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsConfig& config) {
  return Load(config, Usage::kAny);
}

absl::Status ValidateTlsConfig(const TlsConfig& config) { return LoadTlsMaterial(config).status(); }

namespace {

// The three files of an enabled() config, looked at again every
// reload_seconds by a thread of gRPC's.
std::shared_ptr<grpc::experimental::CertificateProviderInterface> WatchedFiles(
    const TlsConfig& config) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config.key_file, config.cert_file, config.ca_file,
      static_cast<unsigned int>(config.reload_seconds));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config) {
  STAGEWISE_ASSIGN_OR_RETURN(TlsMaterial material, Load(config, Usage::kServer));
  if (!config.enabled()) return grpc::InsecureServerCredentials();
  if (config.reload_seconds > 0) {
    grpc::experimental::TlsServerCredentialsOptions options(WatchedFiles(config));
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    std::shared_ptr<grpc::ServerCredentials> credentials =
        grpc::experimental::TlsServerCredentials(options);
    if (credentials == nullptr) {
      return absl::InternalError("--tls-cert: gRPC rejected the TLS server credentials");
    }
    return credentials;
  }
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = std::move(material.ca_pem);
  options.pem_key_cert_pairs.push_back(
      {std::move(material.private_key_pem), std::move(material.cert_chain_pem)});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (credentials == nullptr) {
    return absl::InternalError("--tls-cert: gRPC rejected the TLS server credentials");
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& config) {
  STAGEWISE_ASSIGN_OR_RETURN(TlsMaterial material, Load(config, Usage::kClient));
  if (!config.enabled()) return grpc::InsecureChannelCredentials();
  if (config.reload_seconds > 0) {
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(WatchedFiles(config));
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_verify_server_certs(true);
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        grpc::experimental::TlsCredentials(options);
    if (credentials == nullptr) {
      return absl::InternalError("--tls-cert: gRPC rejected the TLS channel credentials");
    }
    return credentials;
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = std::move(material.ca_pem);
  options.pem_private_key = std::move(material.private_key_pem);
  options.pem_cert_chain = std::move(material.cert_chain_pem);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  if (credentials == nullptr) {
    return absl::InternalError("--tls-cert: gRPC rejected the TLS channel credentials");
  }
  return credentials;
}

void ApplyChannelArgs(const TlsConfig& config, grpc::ChannelArguments* args) {
  if (config.enabled() && !config.server_name.empty()) {
    args->SetSslTargetNameOverride(config.server_name);
  }
}

bool IsLoopbackAddress(const std::string& listen) {
  absl::string_view address = listen;
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  if (absl::StartsWith(address, "ipv4:") || absl::StartsWith(address, "ipv6:")) {
    address.remove_prefix(5);
  }
  absl::string_view host;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return false;
    const absl::string_view rest = address.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return false;
    host = address.substr(1, close - 1);
  } else {
    const size_t colon = address.find(':');
    if (colon == absl::string_view::npos) {
      host = address;  // a bare host
    } else if (address.find(':', colon + 1) == absl::string_view::npos) {
      host = address.substr(0, colon);  // host:port
    } else {
      host = address;  // a bare IPv6 address such as ::1
    }
  }
  if (host.empty()) return false;  // ":7070" listens on every interface
  return IsLoopbackHost(std::string(host));
}

absl::Status CheckListenPolicy(const std::string& listen, const TlsConfig& config) {
  if (config.enabled() || config.insecure || IsLoopbackAddress(listen)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("refusing to serve plaintext on ", listen,
                   ": give --tls-cert/--tls-key/--tls-ca, or --insecure to accept it"));
}

std::string PeerIdentity(const grpc::AuthContext& context) {
  if (!context.IsPeerAuthenticated()) return "";
  const std::vector<grpc::string_ref> names =
      context.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (names.empty()) return "";
  return std::string(names.front().data(), names.front().size());
}

bool IsWorkerIdentity(const std::string& identity) {
  return identity == "worker" || absl::StartsWith(identity, "worker-") ||
         absl::StartsWith(identity, "worker.");
}

absl::Status ApplyTls(const TlsConfig& config, RpcOptions* options) {
  auto server = MakeServerCredentials(config);
  if (!server.ok()) return server.status();
  auto channel = MakeChannelCredentials(config);
  if (!channel.ok()) return channel.status();
  options->server_credentials = *server;
  options->channel_credentials = *channel;
  options->tls_server_name = config.enabled() ? config.server_name : "";
  return absl::OkStatus();
}

}  // namespace stagewise::rpc
