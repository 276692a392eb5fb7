// Throw-away certificates for local clusters and tests (`stagewise certs`,
// `stagewise local`): one private CA and leaf certificates it signs, written as
// PEM files that TlsConfig (tls.h) points at. Keys are ECDSA P-256, signatures
// SHA-256. Not a replacement for an organisation's PKI: there is no revocation.
//
// Files of a certificate `name` in `dir`:
//   <dir>/<name>.pem  the certificate, mode 0644
//   <dir>/<name>.key  its unencrypted private key (PKCS#8), mode 0600
// Both are written atomically (temporary file, then rename), so readers never
// see half a file; `dir` is created (mode 0700, with missing parents) if needed.
// Existing files of the same name are replaced.
#ifndef STAGEWISE_SERVICES_RPC_PKI_H_
#define STAGEWISE_SERVICES_RPC_PKI_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/rpc/tls.h"

namespace stagewise::rpc {

struct CertSpec {
  // Subject Common Name: the identity PeerIdentity (tls.h) reports for the
  // certificate's owner, e.g. "coordinator", "worker", "client". Required.
  std::string common_name;
  // subjectAltName entries: IP addresses (v4 or v6, "[::1]" accepted) become IP
  // entries, anything else a DNS name. Clients check the host they dial (or
  // --tls-server-name) against these. Empty: no subjectAltName.
  std::vector<std::string> hosts = {"localhost", "127.0.0.1", "::1"};
  // Validity period; by default from an hour ago (tolerates clock skew) for a year.
  absl::Time not_before = absl::Now() - absl::Hours(1);
  absl::Time not_after = absl::Now() + absl::Hours(24 * 365);
};

// A self-signed CA certificate <dir>/<name>.pem (and key <dir>/<name>.key) with
// subject CN=`common_name`, valid from an hour ago for `validity`:
// basicConstraints CA:TRUE (critical), keyUsage keyCertSign,cRLSign (critical).
// INVALID_ARGUMENT for an empty name/common_name or a non-positive validity;
// errors writing name the path.
absl::Status CreateCa(const std::string& dir, const std::string& name,
                      const std::string& common_name, absl::Duration validity);

// A leaf certificate <dir>/<name>.pem (and key <dir>/<name>.key) for `spec`,
// signed by the CA <ca_dir>/<ca_name>.pem with key <ca_dir>/<ca_name>.key:
// basicConstraints CA:FALSE, keyUsage digitalSignature,keyEncipherment,
// extendedKeyUsage serverAuth,clientAuth (so one certificate serves and dials),
// a random 128-bit serial. Errors name the path they concern (a CA file that
// cannot be read or parsed, a CA key that does not match its certificate, a
// file that cannot be written); INVALID_ARGUMENT for a bad spec (no
// common_name, not_after <= not_before, an empty host).
absl::Status IssueCert(const std::string& ca_dir, const std::string& ca_name,
                       const std::string& dir, const std::string& name, const CertSpec& spec);

// A complete PKI for one local cluster in `dir`: the CA "ca" (CN "stagewise
// local CA", ten years) and leaf certificates "coordinator", "worker" and
// "client" (CN = the name, default hosts and validity). Replaces any previous one.
absl::Status CreateLocalPki(const std::string& dir);

// One more leaf certificate <dir>/<name>.pem (CN = name) from the CA of a PKI
// made by CreateLocalPki, e.g. "worker-3": one identity per worker, so that
// placement.distinct_identities can tell them apart.
absl::Status IssueLocalIdentity(const std::string& dir, const std::string& name);

// The TlsConfig of the process with identity `name` in a PKI made by
// CreateLocalPki: {dir/name.pem, dir/name.key, dir/ca.pem}. Files are not checked.
TlsConfig TlsConfigFor(const std::string& dir, const std::string& name);

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_PKI_H_
