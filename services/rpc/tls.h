// Transport security for every stagewise process: mutual TLS between the
// coordinator, the workers and the CLI, configured by the same five flags
// everywhere (AddTlsFlags) and turned into gRPC credentials here.
//
// Three modes, decided by TlsConfig:
//   * TLS (enabled()): any of --tls-cert/--tls-key/--tls-ca given. All three are
//     then required. Servers demand and verify a client certificate (mutual
//     TLS); clients present theirs and verify the server's against --tls-ca.
//   * --insecure: plaintext, asked for explicitly. Allowed on any address; the
//     caller should log a WARNING saying so.
//   * Neither: plaintext, but servers may listen on loopback addresses only
//     (CheckListenPolicy), so a forgotten flag never exposes a cluster.
//
// Server wiring:
//   STAGEWISE_RETURN_IF_ERROR(CheckListenPolicy(listen, tls));
//   STAGEWISE_ASSIGN_OR_RETURN(auto creds, MakeServerCredentials(tls));
//   builder.AddListeningPort(listen, creds, &port);
// Client wiring:
//   STAGEWISE_ASSIGN_OR_RETURN(auto creds, MakeChannelCredentials(tls));
//   grpc::ChannelArguments args;  // plus limits and keepalive (see server.h)
//   ApplyChannelArgs(tls, &args);
//   auto channel = grpc::CreateCustomChannel(target, creds, args);
#ifndef STAGEWISE_SERVICES_RPC_TLS_H_
#define STAGEWISE_SERVICES_RPC_TLS_H_

#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/rpc/server.h"

namespace CLI {
class App;
}  // namespace CLI

namespace stagewise::rpc {

struct TlsConfig {
  std::string cert_file;    // --tls-cert: PEM certificate (leaf first, then any
                            // intermediates) this process presents.
  std::string key_file;     // --tls-key: unencrypted PEM private key of cert_file.
  std::string ca_file;      // --tls-ca: PEM CA certificate(s) every peer must chain to.
  std::string server_name;  // --tls-server-name: clients only; the name to verify in the
                            // server's certificate instead of the target's host ("" = host).
  bool insecure = false;    // --insecure: explicit plaintext, no TLS at all.
  // --tls-reload-seconds: how often a running process looks at the three
  // files again and takes rotated ones into use for new connections (its own
  // certificate and key, and the CA bundle); 0 = read once at start.
  int reload_seconds = 60;

  // True when TLS is on: not insecure and any of cert/key/ca given.
  bool enabled() const;
};

// Adds --tls-cert, --tls-key, --tls-ca, --tls-server-name and --insecure to
// `app`, bound to `config`, with the environment fallbacks STAGEWISE_TLS_CERT,
// STAGEWISE_TLS_KEY, STAGEWISE_TLS_CA, STAGEWISE_TLS_SERVER_NAME and
// STAGEWISE_INSECURE (1/true/yes/on; 0/false/no/off) used when a flag is not
// given. `config` must outlive app parsing.
void AddTlsFlags(CLI::App* app, TlsConfig* config);

// The PEM contents of a validated TlsConfig.
struct TlsMaterial {
  std::string cert_chain_pem;  // --tls-cert as read
  std::string private_key_pem;
  std::string ca_pem;
};

// Reads and checks the files of an enabled() config: each is readable and
// parses as PEM, the key matches the first certificate, that certificate is
// currently valid and chains to a CA of --tls-ca (through any intermediates in
// --tls-cert). Errors name the flag first:
//   INVALID_ARGUMENT   "--tls-key: missing: TLS needs all of --tls-cert, --tls-key and --tls-ca
//                       (or --insecure for plaintext)"
//                      "--tls-cert: cannot read /x.pem: No such file or directory"
//                      "--tls-cert: /x.pem: no PEM certificate found"
//                      "--tls-key: does not match --tls-cert (/x.key, /x.pem)"
//                      "--tls-cert: not signed by --tls-ca (/x.pem, /ca.pem)"
//                      "--insecure: conflicts with --tls-cert/--tls-key/--tls-ca"
//   FAILED_PRECONDITION "--tls-cert: expired on 2026-01-01 00:00:00 UTC (/x.pem)"
//                      "--tls-cert: not valid before ... (/x.pem)"
// A config that is not enabled() yields empty material (the insecure/conflict
// check still applies). Files are read on every call; a running process also
// re-reads them every reload_seconds (MakeServerCredentials).
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsConfig& config);

// LoadTlsMaterial(config).status(): for a process to fail at startup.
absl::Status ValidateTlsConfig(const TlsConfig& config);

// Server credentials: mutual TLS (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY)
// when enabled(), grpc::InsecureServerCredentials() otherwise. With
// reload_seconds > 0 the files are watched (gRPC's FileWatcherCertificateProvider):
// a rotated certificate, key or CA bundle serves every handshake after the
// next look, connections already open stay as they are, and a half-written
// rotation (a key that does not match its certificate yet) keeps the previous
// pair until it is complete. Errors as
// LoadTlsMaterial, and INVALID_ARGUMENT "--tls-cert: not usable by a TLS
// server ..." when the certificate's (extended) key usage forbids serving.
// Call CheckListenPolicy first: this does not look at the address.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config);

// Channel credentials: presents cert/key and verifies the server against the
// CA when enabled(), grpc::InsecureChannelCredentials() otherwise; files
// watched as for the server. Errors as
// MakeServerCredentials ("not usable by a TLS client"). Use with
// ApplyChannelArgs on the same config.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& config);

// Client channel arguments of `config`: GRPC_SSL_TARGET_NAME_OVERRIDE_ARG when
// enabled() and server_name is set; nothing otherwise.
void ApplyChannelArgs(const TlsConfig& config, grpc::ChannelArguments* args);

// True when a gRPC listen address only accepts local connections:
// 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z), "localhost", and unix sockets.
// Accepts "host:port", "[v6]:port", a bare host, and the "ipv4:"/"ipv6:"/
// "unix:"/"unix-abstract:" schemes. Wildcards ("0.0.0.0:0", "[::]:7070",
// ":7070") and any other name are not loopback (names are not resolved).
bool IsLoopbackAddress(const std::string& listen);

// May a server with `config` listen on `listen`? OK when TLS is enabled(),
// when config.insecure (the caller logs a WARNING that it serves plaintext),
// or when `listen` is loopback. Otherwise FAILED_PRECONDITION:
//   "refusing to serve plaintext on 0.0.0.0:7070: give --tls-cert/--tls-key/--tls-ca,
//    or --insecure to accept it"
absl::Status CheckListenPolicy(const std::string& listen, const TlsConfig& config);

// The authenticated identity of a call's peer: the Common Name of the client
// certificate the server verified ("x509_common_name"); "" when the channel is
// plaintext or the peer presented no certificate. Server side:
//   PeerIdentity(*server_context->auth_context())
std::string PeerIdentity(const grpc::AuthContext& context);

// Whether a certificate identity (PeerIdentity) is a worker's: "worker",
// "worker-*" or "worker.*". The coordinator's RegisterWorker/Control and the
// workers' Exchange accept only these when TLS is on.
bool IsWorkerIdentity(const std::string& identity);

// Validates `config` and fills the credentials of `options` (server.h): the
// server and channel credentials above, and tls_server_name. Errors as
// LoadTlsMaterial (naming the flag).
absl::Status ApplyTls(const TlsConfig& config, RpcOptions* options);

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_TLS_H_
