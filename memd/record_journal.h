// memd/record_journal.h: the requests' records (memd/request_records.h) kept in files of the run directory, so that a
// memd restarted after a SIGKILL finds them (issue 11, "memd restart": a worker that died too resumes its requests
// from them). memd's loop mirrors every change of its RequestRecordStore here, before the message that caused it is
// answered: AdmitRequest.record -> Open, TokensCommitted -> Commit (before its TokensCommittedAck), the request's
// GrantOrder -> Granted, CompleteAck / a refused admission -> Release.
//
// Files: RUN_DIR/records/<request id, 16 hex digits>.rec, mode 0600, one per request with a record, written with
// O_APPEND. A file is a sequence of frames {type u32, length u32, check u32 (first 4 bytes of the SHA-256 of the
// payload), payload}: one Open frame (the record as a FlatBuffer wire::RequestRecord), then Commit frames
// {from u32, count u32, tokens[count], digests u64[count]} (a Bytes record: a byte per token; an EngineIds record,
// issue 25: its own frame type, a u32 per token) and at most one Granted frame {context_pages u32}. A frame
// cut short by a kill, or one whose check does not match, ends the file: what came before it is kept (a Commit is
// acknowledged only after its frame was written whole, so nothing acknowledged is lost). Written to the page cache
// (no fsync): they survive memd's death, not the machine's (neither does the host pool in /dev/shm).
//
// Thread-safety: none; memd's loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "memd/request_records.h"

namespace dhs::memd {

// One request's file as LoadAll reads it.
struct JournaledRecord {
  RequestRecord record;          // with its committed tokens
  bool granted = false;          // a Granted frame: memd had granted it (its host pages exist)
  uint32_t context_pages = 0;    // from the Granted frame
};

class RecordJournal {
 public:
  // Files under `run_dir`/records (created 0700 when missing). Errors: the directory's (INTERNAL with errno text).
  static absl::StatusOr<RecordJournal> Create(const std::string& run_dir);

  // Each returns the write's error (INTERNAL, errno text); the caller refuses the message that caused it.
  absl::Status Open(RequestId request, const RequestRecord& record);
  absl::Status Commit(RequestId request, uint32_t from, TokenKind kind, const std::vector<uint32_t>& tokens,
                      const std::vector<uint64_t>& digests);
  absl::Status Granted(RequestId request, uint32_t context_pages);
  void Release(RequestId request);  // removes the file (none: nothing to do)

  // Every file's record (a file whose Open frame is unreadable is skipped and logged). Commits replay through
  // RequestRecordStore's rules: one that does not apply ends that file's replay.
  std::map<RequestId, JournaledRecord> LoadAll() const;
  // Removes every file but those of `keep`.
  void RemoveAllBut(const std::map<RequestId, JournaledRecord>& keep) const;
  const std::string& dir() const { return dir_; }

 private:
  explicit RecordJournal(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(RequestId request) const;
  absl::Status Append(RequestId request, uint32_t type, const std::string& payload, bool create);

  std::string dir_;
};

}  // namespace dhs::memd
