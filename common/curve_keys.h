// common/curve_keys.h: the ZeroMQ CURVE keys of a worker's TCP serving socket (issue 22; docs/operations.md "Serving
// over TCP"). One key pair per node run directory: <run_dir>/serving-curve.secret (the server's secret key, mode 0600)
// and <run_dir>/serving-curve.pub (its public key, mode 0644, handed to the routers that may connect: a client needs it
// to complete the handshake; one without it, or with another key, is never served). Keys are Z85 text, 40 characters,
// one line. Created by the first worker started with --listen tcp://, reused by every later one (a restart keeps the
// key its clients hold).
//
// Thread-safety: free functions; the creation is safe against workers of one run directory starting together (the
// secret is written to a private temporary file and linked to its name: the first link wins, the others read it).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dhs {

inline constexpr char kCurveSecretFile[] = "serving-curve.secret";
inline constexpr char kCurvePublicFile[] = "serving-curve.pub";
inline constexpr size_t kCurveKeyChars = 40;  // Z85 of a 32-byte key

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// Whether this libzmq was built with CURVE (zmq_has("curve"); libsodium).
bool CurveAvailable();

// The server key pair of `run_dir`: read from serving-curve.secret (its public key derived with zmq_curve_public), or
// created (zmq_curve_keypair) when absent; serving-curve.pub is (re)written to match. Errors: FAILED_PRECONDITION
// (CURVE not available; the secret file grants anything to group or others, or is not a regular file), INVALID_ARGUMENT
// (the secret file does not hold one Z85 key), the file system's (PERMISSION_DENIED, NOT_FOUND for a missing run
// directory, INTERNAL).
absl::StatusOr<CurveKeyPair> LoadOrCreateServerKeys(std::string_view run_dir);

// A public key file's key (40 Z85 characters, surrounding whitespace ignored). Errors: NOT_FOUND / PERMISSION_DENIED
// (open), INVALID_ARGUMENT naming the file (anything else in it).
absl::StatusOr<std::string> ReadCurvePublicKey(std::string_view path);

}  // namespace dhs
