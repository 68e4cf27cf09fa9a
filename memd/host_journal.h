// memd/host_journal.h: the host pool's page-ownership journal (issue 11, "memd restart"): one entry per host page
// saying which request owns it, as which history page of a context of how many pages, and whether its host copy is
// confirmed written. memd keeps it in the host-pool segment's journal region (common/host_pool.h), so it survives a
// SIGKILL of memd; the next memd of the same run directory verifies it and adopts the confirmed pages
// (ResidencyManager::AdoptHostPages): they become interrupted requests, exactly what FenceGpu leaves.
//
// Memory layout (little-endian, 8-byte aligned): a 64-byte header {magic "DHSJRNL1", version, pages} written by Format,
// then `pages` entries of 32 bytes: {owner u64, meta u64 = history_page << 32 | context_pages, tag u64, checksum u64};
// tag = state (low 8 bits) | check (high 56 bits, a mix of owner, meta and state, and of the checksum when
// confirmed; a free entry's check covers owner 0 and meta 0, so it does not depend on the bytes a free entry leaves
// behind). checksum (issue 22, host-page integrity; the word was reserved and 0 before, so an older journal verifies
// unchanged with no checksum known): the confirmed host copy's checksum (common/page_checksum.h), 0 = none known.
//
// Crash consistency (memd may be SIGKILLed at any instruction): an entry's owner and meta words are written only while
// its tag says free, and every state change is ONE aligned 8-byte store of the tag (std::atomic_ref, release), made
// after the owner and meta stores it covers:
//   Assign:  (tag is free) store owner, store meta, then store tag = assigned   -- a kill before the tag store leaves
//            a free entry (its owner/meta bytes are ignored); after it, the owner/meta the tag covers are in place.
//   Confirm: store checksum, then tag = confirmed (owner/meta unchanged). An entry confirmed already with another
//            checksum goes through assigned first (tag = assigned, checksum, tag = confirmed): a kill in between leaves
//            a copy that is not confirmed (its rows recomputed), never a checksum its check does not cover.
//   Free:    store tag = free, then clear owner and meta (a kill between leaves a free entry).
// So at every instruction boundary each entry is either free or non-free with the owner and meta its check covers;
// a reader after the writer died sees exactly the stores made before the kill (one shared mapping, no cache of its
// own). The core writes an entry inside the event that changes the page, before any order or reply of that event
// leaves memd: a confirmed entry never claims more than the core had confirmed, and nothing a peer saw is missing.
//
// Thread-safety: one writer (memd's loop). Verify may run on a journal nobody writes (a dead memd's).
#pragma once

#include <cstdint>
#include <map>
#include <span>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::memd {

// kShared (issue 24, the content-addressed host tier, memd/prefix_pages.h): a confirmed shared or cached prefix page;
// its words hold owner = the page's content key, meta = its content digest, checksum = its copy's checksum (the check
// covers all three). A journal without kShared entries is the same bytes as before.
enum class JournalState : uint8_t { kFree = 0, kAssigned = 1, kConfirmed = 2, kShared = 3 };

// The owner the host pool (and a read kShared entry) records for a shared prefix page: never a request id.
inline constexpr RequestId kSharedOwner = ~RequestId{0} - 1;

struct JournalEntry {
  JournalState state = JournalState::kFree;
  RequestId owner = 0;          // valid when not free
  uint32_t history_page = 0;    // valid when not free: the page of the owner's context this host page holds
  uint32_t context_pages = 0;   // valid when not free: pages of the owner's full context
  uint64_t checksum = 0;        // valid when confirmed or shared: its host copy's checksum (0 = none known)
  uint64_t key = 0;             // kShared (owner reads kSharedOwner): the page's content key (PrefixAddress::key)
  uint64_t content = 0;         // kShared: its content digest (PrefixAddress::content)
};

// One shared prefix page as a verified journal shows it (issue 24).
struct JournaledSharedPage {
  uint64_t key = 0;
  uint64_t content = 0;
  uint64_t checksum = 0;
};

// One request as a verified journal shows it.
struct JournaledRequest {
  uint32_t context_pages = 0;
  std::map<uint32_t, PageIndex> confirmed;  // history page -> host page with a confirmed host copy
  std::map<uint32_t, PageIndex> assigned;   // history page -> host page assigned, copy not confirmed
  std::map<uint32_t, uint64_t> checksums;   // history page -> checksum of each confirmed copy (0 = none known)
};

inline constexpr uint64_t kJournalMagic = 0x314c4e524a534844ull;  // "DHSJRNL1"
inline constexpr uint64_t kJournalHeaderBytes = 64;
inline constexpr uint64_t kJournalEntryBytes = 32;

class HostJournal {
 public:
  // Bytes a journal of `pages` host pages needs.
  static uint64_t BytesFor(uint32_t pages) { return kJournalHeaderBytes + kJournalEntryBytes * pages; }
  // A view over `memory` (8-byte aligned, at least BytesFor(pages) bytes), not formatted yet.
  // Errors: InvalidArgument (too small or misaligned).
  static absl::StatusOr<HostJournal> Attach(std::span<uint8_t> memory, uint32_t pages);

  // Writes the header and marks every entry free (a new pool).
  void Format();
  // Host page `page` now belongs to `owner` as history page `history_page` of `context_pages` (not confirmed).
  // Precondition (checked: aborts): page < pages(); the entry is free, or already holds exactly this owner and meta.
  void Assign(PageIndex page, RequestId owner, uint32_t history_page, uint32_t context_pages);
  // The host copy of `page` is confirmed written, its bytes with `checksum` (0 = none known). Precondition (checked):
  // the entry is not free.
  void Confirm(PageIndex page, uint64_t checksum = 0);
  // `page` is free (idempotent).
  void Free(PageIndex page);
  // `page` (any state) becomes a confirmed shared prefix page (issue 24): Free, then the words, then the kShared
  // tag. A kill between leaves the page free: the next memd loses this one copy (its rows are recomputed), never
  // names a wrong owner.
  void Share(PageIndex page, uint64_t key, uint64_t content, uint64_t checksum);

  JournalEntry Read(PageIndex page) const;
  uint32_t pages() const { return pages_; }

  // Checks the header (magic, version, `pages`) and every entry (a known state, its check, an owner that is not
  // 0 / 2^64-1, history_page < context_pages <= pages, one context size per owner, no history page twice) and returns
  // the requests it names. Errors: DataLoss naming the first bad entry; nothing is changed.
  // `shared` (optional): the kShared entries (host page -> key, content, checksum; keys unique, else DataLoss);
  // nullptr: they are skipped (a memd with prefix sharing off frees them at adoption).
  absl::StatusOr<std::map<RequestId, JournaledRequest>> Verify(
      std::map<PageIndex, JournaledSharedPage>* shared = nullptr) const;

 private:
  HostJournal(uint8_t* base, uint32_t pages) : base_(base), pages_(pages) {}
  uint64_t* Word(PageIndex page, int word) const;

  uint8_t* base_ = nullptr;
  uint32_t pages_ = 0;
};

}  // namespace dhs::memd
