// common/atomic_file.h: a small file written whole or not at all (a key file, memd's model journal): through a
// temporary file in the same directory renamed over the target, so that a kill leaves the old file or the new one.
//
// Thread-safety: a free function; two writers of one path race (the last rename wins).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace dhs {

// Writes `text` to `path` with mode `mode` through "<path>.tmp.<pid>" renamed over it. Errors (the temporary file
// removed): NOT_FOUND (no such directory), PERMISSION_DENIED, INTERNAL; each message names the step and errno's text.
absl::Status WriteFileAtomically(const std::string& path, std::string_view text, mode_t mode);

// The status of a failed file operation `what` with errno `err`: NOT_FOUND for ENOENT, PERMISSION_DENIED for EACCES /
// EPERM, INTERNAL otherwise; the message is "<what>: <strerror>".
absl::Status FileError(int err, std::string_view what);

}  // namespace dhs
