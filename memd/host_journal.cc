// memd/host_journal.cc: see host_journal.h.
#include "memd/host_journal.h"

#include <atomic>
#include <set>

#include "absl/strings/str_format.h"
#include "common/check.h"

namespace dhs::memd {
namespace {

constexpr uint64_t kJournalVersion = 1;
constexpr int kOwner = 0, kMeta = 1, kTag = 2, kChecksum = 3;

// 56-bit check of an entry (splitmix64 finaliser over the words; the checksum counts only when confirmed, and a
// checksum 0 adds nothing: an entry of a journal before issue 22 has the check it had).
uint64_t Check(RequestId owner, uint64_t meta, JournalState state, uint64_t checksum) {
  if (state != JournalState::kConfirmed && state != JournalState::kShared) checksum = 0;
  uint64_t x = owner ^ (meta * 0x9e3779b97f4a7c15ull) ^ (uint64_t{static_cast<uint8_t>(state)} << 59) ^
               (checksum * 0xd6e8feb86659fd93ull);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x >> 8;
}

uint64_t Tag(RequestId owner, uint64_t meta, JournalState state, uint64_t checksum = 0) {
  if (state == JournalState::kFree) owner = meta = 0;
  return Check(owner, meta, state, checksum) << 8 | static_cast<uint8_t>(state);
}

// A broken precondition of the one writer (a bug, never input): abort with its text.
void Require(bool ok, const char* what) {
  DHS_CHECK_OK(ok ? absl::OkStatus() : absl::InternalError(what));
}

uint64_t Load(const uint64_t* w) { return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(w)).load(std::memory_order_acquire); }
void Store(uint64_t* w, uint64_t v) { std::atomic_ref<uint64_t>(*w).store(v, std::memory_order_release); }

}  // namespace

absl::StatusOr<HostJournal> HostJournal::Attach(std::span<uint8_t> memory, uint32_t pages) {
  if (memory.size() < BytesFor(pages) || reinterpret_cast<uintptr_t>(memory.data()) % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "journal of %d host pages needs %d bytes, 8-byte aligned; got %d bytes", pages, BytesFor(pages),
        memory.size()));
  }
  return HostJournal(memory.data(), pages);
}

uint64_t* HostJournal::Word(PageIndex page, int word) const {
  return reinterpret_cast<uint64_t*>(base_ + kJournalHeaderBytes + kJournalEntryBytes * page) + word;
}

void HostJournal::Format() {
  auto* header = reinterpret_cast<uint64_t*>(base_);
  Store(&header[0], 0);  // no magic while formatting: a kill in between leaves a journal that does not verify
  for (PageIndex p = 0; p < pages_; ++p) {
    Store(Word(p, kTag), Tag(0, 0, JournalState::kFree));
    Store(Word(p, kOwner), 0);
    Store(Word(p, kMeta), 0);
    Store(Word(p, kChecksum), 0);
  }
  Store(&header[1], kJournalVersion);
  Store(&header[2], pages_);
  Store(&header[0], kJournalMagic);
}

void HostJournal::Assign(PageIndex page, RequestId owner, uint32_t history_page, uint32_t context_pages) {
  Require(page < pages_, "journal: host page out of range");
  const uint64_t meta = uint64_t{history_page} << 32 | context_pages;
  const JournalEntry now = Read(page);
  if (now.state != JournalState::kFree) {  // re-assigning what it holds (adoption): only the tag may change
    Require(now.owner == owner && now.history_page == history_page && now.context_pages == context_pages,
            "journal: Assign of a page another request holds");
    if (now.state == JournalState::kAssigned) return;
    Store(Word(page, kTag), Tag(owner, meta, JournalState::kAssigned));
    return;
  }
  Store(Word(page, kOwner), owner);
  Store(Word(page, kMeta), meta);
  Store(Word(page, kTag), Tag(owner, meta, JournalState::kAssigned));  // last: the entry exists from here on
}

void HostJournal::Confirm(PageIndex page, uint64_t checksum) {
  Require(page < pages_, "journal: host page out of range");
  const uint64_t owner = Load(Word(page, kOwner)), meta = Load(Word(page, kMeta));
  const auto state = static_cast<JournalState>(Load(Word(page, kTag)) & 0xFF);
  Require(state != JournalState::kFree, "journal: Confirm of a free page");
  if (state == JournalState::kConfirmed) {
    if (Load(Word(page, kChecksum)) == checksum) return;
    Store(Word(page, kTag), Tag(owner, meta, JournalState::kAssigned));  // the old checksum is ignored from here on
  }
  Store(Word(page, kChecksum), checksum);
  Store(Word(page, kTag), Tag(owner, meta, JournalState::kConfirmed, checksum));  // last: covers the checksum
}

void HostJournal::Free(PageIndex page) {
  Require(page < pages_, "journal: host page out of range");
  Store(Word(page, kTag), Tag(0, 0, JournalState::kFree));  // first: from here on the owner/meta bytes are ignored
  Store(Word(page, kOwner), 0);
  Store(Word(page, kMeta), 0);
  Store(Word(page, kChecksum), 0);
}

void HostJournal::Share(PageIndex page, uint64_t key, uint64_t content, uint64_t checksum) {
  Require(page < pages_, "journal: host page out of range");
  Free(page);  // first: owner/meta are written only under a free tag
  Store(Word(page, kOwner), key);
  Store(Word(page, kMeta), content);
  Store(Word(page, kChecksum), checksum);
  Store(Word(page, kTag), Tag(key, content, JournalState::kShared, checksum));  // last: the shared page exists
}

JournalEntry HostJournal::Read(PageIndex page) const {
  const uint64_t tag = Load(Word(page, kTag));
  JournalEntry e;
  e.state = static_cast<JournalState>(tag & 0xFF);
  if (e.state == JournalState::kFree) return e;
  if (e.state == JournalState::kShared) {
    e.owner = kSharedOwner;
    e.key = Load(Word(page, kOwner));
    e.content = Load(Word(page, kMeta));
    e.checksum = Load(Word(page, kChecksum));
    return e;
  }
  e.owner = Load(Word(page, kOwner));
  const uint64_t meta = Load(Word(page, kMeta));
  e.history_page = static_cast<uint32_t>(meta >> 32);
  e.context_pages = static_cast<uint32_t>(meta);
  if (e.state == JournalState::kConfirmed) e.checksum = Load(Word(page, kChecksum));
  return e;
}

absl::StatusOr<std::map<RequestId, JournaledRequest>> HostJournal::Verify(
    std::map<PageIndex, JournaledSharedPage>* shared) const {
  const auto* header = reinterpret_cast<const uint64_t*>(base_);
  if (Load(&header[0]) != kJournalMagic || Load(&header[1]) != kJournalVersion || Load(&header[2]) != pages_) {
    return absl::DataLossError(absl::StrFormat(
        "journal header: magic %#x version %d pages %d, expected %#x, %d, %d", Load(&header[0]), Load(&header[1]),
        Load(&header[2]), kJournalMagic, kJournalVersion, pages_));
  }
  std::map<RequestId, JournaledRequest> out;
  std::map<PageIndex, JournaledSharedPage> shared_pages;
  std::set<uint64_t> shared_keys;
  for (PageIndex p = 0; p < pages_; ++p) {
    const uint64_t tag = Load(Word(p, kTag));
    const auto state = static_cast<JournalState>(tag & 0xFF);
    const JournalEntry e = Read(p);
    const uint64_t meta = uint64_t{e.history_page} << 32 | e.context_pages;
    auto bad = [&](std::string_view what) {
      return absl::DataLossError(absl::StrFormat("journal entry of host page %d (tag %#x, owner %d, history page %d "
                                                 "of %d): %s", p, tag, e.owner, e.history_page, e.context_pages, what));
    };
    if (static_cast<uint8_t>(state) > static_cast<uint8_t>(JournalState::kShared)) return bad("unknown state");
    if (state == JournalState::kShared) {
      if (tag != Tag(e.key, e.content, state, e.checksum)) return bad("check does not match");
      if (!shared_keys.insert(e.key).second) return bad("a shared page's key stored twice");
      shared_pages[p] = JournaledSharedPage{e.key, e.content, e.checksum};
      continue;
    }
    if (tag != Tag(e.owner, meta, state, e.checksum)) return bad("check does not match");
    if (state == JournalState::kFree) continue;
    if (e.owner == 0 || e.owner == ~RequestId{0}) return bad("reserved owner id");
    if (e.context_pages == 0 || e.context_pages > pages_ || e.history_page >= e.context_pages) {
      return bad("history page outside its context, or a context larger than the pool");
    }
    JournaledRequest& r = out[e.owner];
    if (r.context_pages != 0 && r.context_pages != e.context_pages) return bad("another context size for its owner");
    r.context_pages = e.context_pages;
    if (r.confirmed.contains(e.history_page) || r.assigned.contains(e.history_page)) {
      return bad("history page held by two host pages");
    }
    (state == JournalState::kConfirmed ? r.confirmed : r.assigned)[e.history_page] = p;
    if (state == JournalState::kConfirmed) r.checksums[e.history_page] = e.checksum;
  }
  if (shared != nullptr) *shared = std::move(shared_pages);
  return out;
}

}  // namespace dhs::memd
