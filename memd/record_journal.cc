// memd/record_journal.cc: see record_journal.h.
#include "memd/record_journal.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/protocol.h"
#include "memd/record_wire.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {
namespace {

// kCommitFrame: Bytes tokens (1 byte each); kCommitIdsFrame (issue 25): EngineIds tokens (uint32 each).
constexpr uint32_t kOpenFrame = 0x4f52454e, kCommitFrame = 0x434f4d4d, kCommitIdsFrame = 0x434f4d49,
                   kGrantedFrame = 0x4752414e;

uint32_t FrameCheck(const char* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data, size, digest, &length, EVP_sha256(), nullptr);
  uint32_t check;
  std::memcpy(&check, digest, sizeof(check));
  return check;
}

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool Get(const std::string& in, size_t& at, T& v) {
  if (in.size() - at < sizeof(v) || at > in.size()) return false;
  std::memcpy(&v, in.data() + at, sizeof(v));
  at += sizeof(v);
  return true;
}

// The Open frame: the record without its tokens (each commit appends its own frame).
std::string EncodeRecord(RequestId id, const RequestRecord& r) {
  std::unique_ptr<wire::RequestRecordT> w = ToWireRecord(id, r);
  w->tokens.clear();
  w->token_ids.clear();
  w->logits_digests.clear();
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::RequestRecord::Pack(fbb, w.get()));
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

bool DecodeRecord(const std::string& bytes, GpuId gpu, RequestRecord& r) {
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (!verifier.VerifyBuffer<wire::RequestRecord>(nullptr)) return false;
  wire::RequestRecordT w;
  flatbuffers::GetRoot<wire::RequestRecord>(bytes.data())->UnPackTo(&w);
  absl::StatusOr<RequestRecord> record = FromWireRecord(w, gpu);
  if (!record.ok()) return false;
  r = *std::move(record);
  return true;
}

// Replays one file's frames into `out`; false when its Open frame is unreadable.
bool ReplayFile(const std::string& bytes, RequestId id, JournaledRecord& out) {
  RequestRecordStore store;  // the store's rules decide whether a Commit applies
  size_t at = 0;
  bool opened = false;
  while (at < bytes.size()) {
    uint32_t type = 0, length = 0, check = 0;
    if (!Get(bytes, at, type) || !Get(bytes, at, length) || !Get(bytes, at, check)) break;
    if (bytes.size() - at < length) break;  // cut short by a kill
    const std::string payload = bytes.substr(at, length);
    at += length;
    if (FrameCheck(payload.data(), payload.size()) != check) break;
    if (!opened) {
      if (type != kOpenFrame || !DecodeRecord(payload, GpuOfNodeRequestId(id), out.record) ||
          !store.Open(id, out.record).ok()) {
        return false;
      }
      opened = true;
      continue;
    }
    size_t p = 0;
    if (type == kGrantedFrame) {
      if (!Get(payload, p, out.context_pages)) break;
      out.granted = true;
      continue;
    }
    uint32_t from = 0, count = 0;
    const bool ids = type == kCommitIdsFrame;
    const size_t width = ids ? 4 : 1;  // bytes per token
    if ((type != kCommitFrame && !ids) || !Get(payload, p, from) || !Get(payload, p, count) ||
        payload.size() != 8 + size_t{count} * (width + 8)) {
      break;
    }
    std::vector<uint32_t> tokens(count);
    for (uint32_t i = 0; i < count; ++i) {
      if (ids) {
        std::memcpy(&tokens[i], payload.data() + 8 + size_t{i} * 4, 4);
      } else {
        tokens[i] = static_cast<uint8_t>(payload[8 + i]);
      }
    }
    std::vector<uint64_t> digests(count);
    std::memcpy(digests.data(), payload.data() + 8 + size_t{count} * width, size_t{count} * 8);
    const TokenKind kind = ids ? TokenKind::kEngineIds : TokenKind::kBytes;
    if (!store.Commit(id, from, kind, tokens, digests).ok()) break;
  }
  if (!opened) return false;
  const RequestRecord* r = store.Find(id);
  out.record.tokens = r->tokens;
  out.record.digests = r->digests;
  return true;
}

}  // namespace

absl::StatusOr<RecordJournal> RecordJournal::Create(const std::string& run_dir) {
  const std::string dir = run_dir + "/records";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrFormat("cannot create %s: %s", dir, std::strerror(errno)));
  }
  return RecordJournal(dir);
}

std::string RecordJournal::PathOf(RequestId request) const { return absl::StrFormat("%s/%016x.rec", dir_, request); }

absl::Status RecordJournal::Append(RequestId request, uint32_t type, const std::string& payload, bool create) {
  const std::string path = PathOf(request);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0600);
  if (fd < 0) return absl::InternalError(absl::StrFormat("request record %s: %s", path, std::strerror(errno)));
  std::string frame;
  Put(frame, type);
  Put(frame, static_cast<uint32_t>(payload.size()));
  Put(frame, FrameCheck(payload.data(), payload.size()));
  frame += payload;
  size_t done = 0;
  while (done < frame.size()) {
    const ssize_t n = ::write(fd, frame.data() + done, frame.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrFormat("request record %s: write: %s", path, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status RecordJournal::Open(RequestId request, const RequestRecord& record) {
  if (absl::Status s = Append(request, kOpenFrame, EncodeRecord(request, record), true); !s.ok()) return s;
  if (record.tokens.empty()) return absl::OkStatus();
  // a resumed request brings its committed tokens
  return Commit(request, 0, record.token_kind, record.tokens, record.digests);
}

absl::Status RecordJournal::Commit(RequestId request, uint32_t from, TokenKind kind,
                                   const std::vector<uint32_t>& tokens, const std::vector<uint64_t>& digests) {
  const bool ids = kind == TokenKind::kEngineIds;
  std::string payload;
  Put(payload, from);
  Put(payload, static_cast<uint32_t>(tokens.size()));
  for (uint32_t t : tokens) {
    if (ids) {
      Put(payload, t);
    } else {
      payload.push_back(static_cast<char>(static_cast<uint8_t>(t)));  // <= 255: the store checked the record's kind
    }
  }
  payload.append(reinterpret_cast<const char*>(digests.data()), digests.size() * 8);
  return Append(request, ids ? kCommitIdsFrame : kCommitFrame, payload, false);
}

absl::Status RecordJournal::Granted(RequestId request, uint32_t context_pages) {
  std::string payload;
  Put(payload, context_pages);
  return Append(request, kGrantedFrame, payload, false);
}

void RecordJournal::Release(RequestId request) { ::unlink(PathOf(request).c_str()); }

std::map<RequestId, JournaledRecord> RecordJournal::LoadAll() const {
  std::map<RequestId, JournaledRecord> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    uint64_t id = 0;
    if (name.size() != 20 || !name.ends_with(".rec") || !absl::SimpleHexAtoi(name.substr(0, 16), &id)) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    JournaledRecord r;
    if (!ReplayFile(bytes, id, r)) {
      spdlog::warn("memd: request record {} is unreadable; dropped", entry.path().string());
      continue;
    }
    out.emplace(id, std::move(r));
  }
  return out;
}

void RecordJournal::RemoveAllBut(const std::map<RequestId, JournaledRecord>& keep) const {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    uint64_t id = 0;
    if (name.size() == 20 && name.ends_with(".rec") && absl::SimpleHexAtoi(name.substr(0, 16), &id) &&
        keep.contains(id)) {
      continue;
    }
    std::filesystem::remove(entry.path(), ec);
  }
}

}  // namespace dhs::memd
