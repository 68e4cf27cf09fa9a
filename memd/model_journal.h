// memd/model_journal.h: each GPU's model fingerprint (Hello.model_fingerprint, issue 26) kept in a file of the run
// directory, so that a memd restarted after a SIGKILL still knows which model wrote the host pages it adopts. Without
// it the first worker of a GPU after the restart set the model again, and a worker of another model would have resumed
// the adopted requests from, or been granted the adopted shared prefix pages of, rows the other model wrote: wrong rows.
//
// File: RUN_DIR/models, mode 0600, one line per GPU whose worker said its model: "<gpu> <fingerprint, 16 hex digits>",
// ascending GPU, rewritten whole through a temporary file renamed over it (a kill leaves the old file or the new one).
// What a restarted memd keeps of it (Daemon::AdoptLeftovers): the models of the GPUs with adopted requests (those that
// hold host pages, and those with only a record: conservative), and with prefix sharing every GPU's when shared pages
// were adopted; the rest is forgotten (nothing of that model is left: the GPU's next worker may serve another).
//
// Thread-safety: none; memd's loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::memd {

using ModelFingerprints = std::map<GpuId, uint64_t>;  // GPU -> model fingerprint (never 0: 0 is "not said")

class ModelJournal {
 public:
  explicit ModelJournal(const std::string& run_dir) : path_(run_dir + "/models") {}

  // The file's fingerprints; empty when there is no file. Errors: INVALID_ARGUMENT naming the line of a malformed file
  // (not a "<gpu> <16 hex digits>" line, a GPU twice, a fingerprint 0), INTERNAL when it cannot be read.
  absl::StatusOr<ModelFingerprints> Load() const;
  // Replaces the file with `models` (none: the file is removed). Errors: INTERNAL (errno text).
  absl::Status Save(const ModelFingerprints& models) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dhs::memd
