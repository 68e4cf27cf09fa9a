// tests/workerd/worker_test_util.h: an in-process fake memd (the MemdLink a Worker talks to, and the MemdTransport
// libdhs's EmbeddedWorker is opened over (EmbeddedWorker::OpenOver), emitting AdmitGrant,
// ReclaimOrder and PopulateOrder in a seeded random order, following docs/protocol.md's conversation contract), a
// recording ClientSink, the oracle (the model run alone on ResidentKvAccess, one request at a time) and a worker-side
// safety check (every row that left the tail is ready on GPU or has a completed host copy, brief §4).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <utility>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"
#include "workerd/model/model.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/sampling.h"
#include "workerd/model/weights.h"
#include "workerd/serving.h"
#include "workerd/worker.h"

namespace dhs::test {

inline std::unique_ptr<model::Model> MakePresetModel(const std::string& preset, uint64_t seed = 7) {
  auto config = model::PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  auto writer = model::GenerateWeights(*config, seed);
  EXPECT_TRUE(writer.ok()) << writer.status();
  auto file = model::SafetensorsFile::Parse(writer->Serialize());
  EXPECT_TRUE(file.ok()) << file.status();
  auto m = model::Model::FromSafetensors(*file);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

// Pseudo-text prompt bytes, independent of the code under test.
inline std::vector<uint8_t> Prompt(size_t n, uint32_t salt) {
  std::vector<uint8_t> t(n);
  uint32_t x = salt * 2654435761u + 12345u;
  for (auto& v : t) {
    x = x * 1103515245u + 12345u;
    v = static_cast<uint8_t>((x >> 16) & 0xff);
  }
  return t;
}

struct Generated {
  std::vector<int> tokens;
  std::vector<uint64_t> digests;
};

// The stream a re-attached client holds in the end (a resume test): the first `had` tokens and digests of the
// uninterrupted run `want` (what it received from the worker that died), then `tail` (the resumed worker's chunks).
// Equal to `want` exactly when nothing was lost and nothing was sent twice.
inline Generated StitchedStream(const Generated& want, size_t had, const Generated& tail) {
  Generated stream;
  stream.tokens.assign(want.tokens.begin(), want.tokens.begin() + had);
  stream.digests.assign(want.digests.begin(), want.digests.begin() + had);
  stream.tokens.insert(stream.tokens.end(), tail.tokens.begin(), tail.tokens.end());
  stream.digests.insert(stream.digests.end(), tail.digests.begin(), tail.digests.end());
  return stream;
}

// The oracle: the model alone, one request, every row resident; prefill at once, then one token per step. Token t is
// drawn at DrawKey{seed, client_id, t} (the worker's key: the client's request id).
inline Generated Oracle(const model::Model& m, const std::vector<model::Token>& input, uint32_t max_new,
                        float temperature = 0, float top_p = 1, uint64_t seed = 0, uint64_t client_id = 0) {
  auto kv = model::ResidentKvAccess::ForModel(m.config(), size_t{64} << 20, 16);
  model::ModelSession s = m.NewSession(1);
  Generated g;
  std::vector<model::Token> feed = input;
  for (uint32_t i = 0; i < max_new; ++i) {
    model::StepInput in{&s, feed};
    model::StepOutput out;
    auto st = m.Step(std::span<model::StepInput>(&in, 1), *kv, std::span<model::StepOutput>(&out, 1));
    EXPECT_TRUE(st.ok()) << st;
    std::span<const float> last = std::span<const float>(out.logits).last(model::kVocab);
    const model::Token t = temperature == 0 ? model::Argmax(last)
                                            : model::Sample(last, model::SamplingParams{temperature, top_p},
                                                            model::DrawKey{seed, client_id, i});
    g.tokens.push_back(t);
    g.digests.push_back(LogitsDigest(last));
    feed = {t};
  }
  return g;
}

class RecordingSink final : public ClientSink {
 public:
  void Accepted(const ClientRef&, const wire::SubmitAcceptedT& a) override { accepted.push_back(a.request); }
  // Refuses (RESOURCE_EXHAUSTED) every chunk that is not final once `accept_chunks` chunks were taken (a client that
  // stopped reading), as ServingFrontend does when the client's buffer is full.
  absl::Status Chunk(const ClientRef& client, const wire::TokenChunkT& c) override {
    if (on_chunk) on_chunk(c);
    if (!c.finished && chunks.size() >= accept_chunks) {
      ++refused;
      return absl::ResourceExhaustedError("client not reading (test)");
    }
    Generated& by = by_peer[{client.peer, c.request}];
    for (uint8_t t : c.tokens) by.tokens.push_back(t);
    for (uint64_t d : c.logits_digests) by.digests.push_back(d);
    Generated& g = out[c.request];
    for (uint8_t t : c.tokens) g.tokens.push_back(t);
    for (uint64_t d : c.logits_digests) g.digests.push_back(d);
    if (c.finished) finished.insert(c.request);
    if (c.error != wire::ErrorCode::OK) errors[c.request] = c.error_message;
    chunks.push_back(c);
    return absl::OkStatus();
  }
  size_t accept_chunks = SIZE_MAX;
  std::function<void(const wire::TokenChunkT&)> on_chunk;  // runs first on every chunk offered
  size_t refused = 0;
  std::vector<RequestId> accepted;
  std::map<RequestId, Generated> out;
  std::map<std::pair<std::string, RequestId>, Generated> by_peer;  // (ClientRef.peer, client id) -> what it got
  std::set<RequestId> finished;
  std::map<RequestId, std::string> errors;
  std::vector<wire::TokenChunkT> chunks;
};

// A fake memd: host pool in plain memory, GPU page accounting of M pages, admission (resident-first optional history)
// into one of `slots` request slots (memd owns the slot: a request waits for a free one, granted in admission order),
// and, with chaos, reclaim and population orders drawn from a seeded generator.
// Issue 28, what the real memd also does (each off by default): admissions that wait some Pumps before their grant
// (admission_wait_max), several orders in flight for one request (overlapping_orders: populates beside populates, a
// reclaim while populates are in flight, taking their pages too), and failed copies answered as memd answers them
// (accept_failed_copies: a failed backup aborts its reclaim and the victim keeps its pages, a failed populate frees
// its GPU page, a failed host copy stays unconfirmed).
class FakeMemd final : public MemdTransport {
 public:
  FakeMemd(uint32_t capacity_pages, uint64_t host_page_bytes, uint32_t page_rows, uint32_t host_pages, uint64_t seed,
           bool chaos, uint32_t slots)
      : host(uint64_t{host_pages} * host_page_bytes), p_(page_rows), rng_(seed), chaos_(chaos) {
    for (uint32_t i = 0; i < capacity_pages; ++i) free_gpu_.insert(i);
    for (uint32_t i = 0; i < host_pages; ++i) free_host_.insert(i);
    free_host_total_ = host_pages;
    for (uint32_t i = 0; i < slots; ++i) free_slots_.insert(i);
  }

  absl::Status SendAdmitRequest(const wire::AdmitRequestT& m) override {
    admitted_ids.push_back(m.request);
    admits.push_back(m);
    if (m.record) {  // a resumed request's record opens with its committed tokens
      records[m.request] = *m.record;
      committed[m.request].assign(m.record->tokens.begin(), m.record->tokens.end());
    }
    Req& r = reqs_[m.request];
    r.optional_history = m.optional_history;
    if (m.optional_history) ++admits_with_optional_history;
    if (m.resume_of != 0) TakeOver(m, r);
    const uint64_t wait = admission_wait_max == 0 ? 0 : rng_() % (admission_wait_max + 1);
    waiting_.push_back(Admission{m.request, m.history_rows, m.complete_pages, pumps_ + wait});
    GrantWaiting();
    return absl::OkStatus();
  }
  absl::Status SendHostCopyWritten(const wire::HostCopyWrittenT& m) override {
    EXPECT_EQ(m.history_pages.size(), m.host_pages.size());
    ++host_copy_messages;
    if (!m.ok) {  // memd: the pages stay unconfirmed (covered by the worker's tail)
      EXPECT_TRUE(accept_failed_copies) << m.message;
      ++failed_copy_reports;
      return absl::OkStatus();
    }
    Req& r = reqs_[m.request];
    for (size_t i = 0; i < m.history_pages.size(); ++i) {
      const uint32_t j = m.history_pages[i];
      EXPECT_LT(j, r.host.size());
      if (j < r.host.size() && i < m.host_pages.size()) {
        EXPECT_EQ(m.host_pages[i].page(), r.host[j]);
      }
      EXPECT_EQ(m.checksums.size(), m.history_pages.size()) << "HostCopyWritten without checksums (issue 22)";
      if (j < r.host.size() && i < m.checksums.size()) host_checksums[r.host[j]] = m.checksums[i];
      r.host_copy.insert(j);
    }
    return absl::OkStatus();
  }
  // Grants waiting admissions in order while a slot is free (and, with admission_wait_max, the first one's wait is
  // over: later ones wait behind it, as in memd's queue).
  void GrantWaiting() {
    while (!waiting_.empty() && !free_slots_.empty() && waiting_.front().ready_at_pump <= pumps_) {
      const Admission m = waiting_.front();
      waiting_.pop_front();
      Grant(m, *free_slots_.begin());
      free_slots_.erase(free_slots_.begin());
    }
  }
  struct Admission {
    RequestId request;
    uint64_t history_rows;
    uint32_t complete_pages;
    uint64_t ready_at_pump = 0;  // admission_wait_max: not granted before this Pump
  };
  void Grant(const Admission& m, SlotIndex slot) {
    Req& r = reqs_[m.request];
    r.slot = slot;
    const uint64_t pages = (m.history_rows + p_ - 1) / p_;
    const auto kept = static_cast<uint32_t>(r.taken.size());  // a resume's taken-over pages
    EXPECT_LE(pages - kept, free_host_.size()) << "fake memd: host pool too small";
    auto grant = std::make_unique<wire::AdmitGrantT>();
    grant->request = m.request;
    grant->slot = slot;
    for (uint32_t j = 0; j < pages; ++j) {
      if (auto t = r.taken.find(j); t != r.taken.end()) {  // as memd: same history page, confirmed
        r.host.push_back(t->second);
        r.host_copy.insert(j);
        grant->host_backed_pages.push_back(j);
        grant->host_backed_checksums.push_back(host_checksums[t->second]);  // as memd: the confirmed copy's
        if (j == grant->imported_pages) ++grant->imported_pages;
        continue;
      }
      r.host.push_back(*free_host_.begin());
      free_host_.erase(free_host_.begin());
    }
    r.taken.clear();
    for (uint32_t j = 0; kept == 0 && j < m.complete_pages && !free_gpu_.empty(); ++j) {
      const uint32_t dp = *free_gpu_.begin();
      free_gpu_.erase(free_gpu_.begin());
      grant->optional_pages.push_back(dp);
      grant->optional_history_pages.push_back(j);
      r.optional[j] = dp;
    }
    for (PageIndex h : r.host) grant->backup_host_pages.emplace_back(0, h);
    inbox_.push_back(std::move(grant));
  }
  absl::Status SendBackupComplete(const wire::BackupCompleteT& m) override {
    ++backup_messages;
    Req& r = reqs_[m.request];
    if (!m.ok) {  // memd aborts the reclaim: the victim keeps its pages as they were, no ReadersDone follows
      EXPECT_TRUE(accept_failed_copies) << m.message;
      ++failed_copy_reports;
      ++reclaims_aborted;
      reclaims_.erase(m.order);
      r.reclaiming = false;
      return absl::OkStatus();
    }
    if (m.order == 0) {
      ADD_FAILURE() << "BackupComplete with order 0 (protocol version 3: HostCopyWritten)";
    } else {
      auto it = reclaims_.find(m.order);
      if (it == reclaims_.end()) {  // only for an order that crossed the request's Complete
        EXPECT_EQ(r.host.size(), 0u) << "BackupComplete for unknown order " << m.order;
        reqs_.erase(m.request);
        return absl::OkStatus();
      }
      for (size_t i = 0; i < m.pages.size(); ++i) {
        const uint32_t dp = m.pages[i];
        // A deferred page (contract §4) has no host copy yet: it comes later with order 0.
        if (std::find(m.deferred_pages.begin(), m.deferred_pages.end(), dp) == m.deferred_pages.end()) {
          EXPECT_EQ(m.checksums.size(), m.pages.size()) << "BackupComplete without checksums (issue 22)";
          if (i < m.checksums.size() && i < m.host_pages.size()) {
            host_checksums[m.host_pages[i].page()] = m.checksums[i];
          }
          r.host_copy.insert(HistoryOf(r, dp));
        } else {
          ++deferred_pages;
        }
      }
      it->second.backed = true;
    }
    return absl::OkStatus();
  }
  absl::Status SendReadersDone(const wire::ReadersDoneT& m) override {
    auto it = reclaims_.find(m.order);
    if (it == reclaims_.end()) {  // only for an order that crossed the request's Complete
      EXPECT_FALSE(reqs_.contains(m.request)) << "ReadersDone for unknown order " << m.order;
      return absl::OkStatus();
    }
    EXPECT_TRUE(it->second.backed || it->second.needed_backup == false) << "ReadersDone before BackupComplete";
    Req& r = reqs_[m.request];
    auto retire = std::make_unique<wire::RetireT>();
    retire->order = m.order;
    retire->request = m.request;
    retire->pages = m.pages;
    for (uint32_t dp : m.pages) {
      // A page whose populate failed was freed by its ReadyPublish already (and may be in use again).
      if (std::erase_if(r.optional, [&](const auto& e) { return e.second == dp; }) > 0) free_gpu_.insert(dp);
    }
    r.reclaiming = false;
    reclaims_.erase(it);
    inbox_.push_back(std::move(retire));
    ++reclaims_done;
    return absl::OkStatus();
  }
  absl::Status SendReadyPublish(const wire::ReadyPublishT& m) override {
    auto found = reqs_.find(m.request);
    if (found == reqs_.end()) return absl::OkStatus();  // an order that crossed the request's Complete
    EXPECT_TRUE(m.ok || accept_failed_copies)
        << "populate of request " << m.request << " failed: code " << static_cast<int>(m.error);
    if (!m.ok) ++failed_copy_reports;
    Req& r = found->second;
    if (r.populates > 0) --r.populates;
    for (size_t i = 0; i < m.pages.size(); ++i) {
      r.populating.erase(m.pages[i]);
      r.populating_history.erase(m.pages[i]);
      if (m.ok) {
        r.optional[m.history_pages[i]] = m.pages[i];
        ++pages_populated;
      } else {
        free_gpu_.insert(m.pages[i]);
      }
    }
    return absl::OkStatus();
  }
  absl::Status SendComplete(const wire::CompleteT& m) override {
    std::erase_if(waiting_, [&](const Admission& a) { return a.request == m.request; });  // as memd: a queued one ends
    auto it = reqs_.find(m.request);
    if (it != reqs_.end()) {
      for (const auto& [j, dp] : it->second.optional) free_gpu_.insert(dp);
      for (uint32_t dp : it->second.populating) free_gpu_.insert(dp);  // a populate that crossed the Complete
      for (PageIndex h : it->second.host) free_host_.insert(h);
      for (const auto& [j, h] : it->second.taken) free_host_.insert(h);  // a queued resume's
      if (it->second.slot) free_slots_.insert(*it->second.slot);
      std::erase_if(reclaims_, [&](const auto& e) { return e.second.request == m.request; });
      reqs_.erase(it);
    }
    ++completes;
    complete_messages.push_back(m);
    GrantWaiting();
    return absl::OkStatus();
  }
  // Keeps each request's committed tokens as memd's record would (in order, no gap, no repeat); answered at the next
  // Pump, as memd's TokensCommittedAck (one in flight: a second message before that answer is a defect). An entry of a
  // request in `refuse_tokens_of` is refused as memd refuses a bad entry (Daemon::OnTokensCommitted): the other
  // entries are applied, and the answer is an error (OnTokensRefused) that does not say whose.
  absl::Status SendTokensCommitted(const wire::TokensCommittedT& m) override {
    ++commit_messages;
    EXPECT_FALSE(commit_answer_.has_value()) << "a TokensCommitted sent before memd answered the previous one";
    commit_answer_ = absl::OkStatus();
    for (const auto& e : m.entries) {
      if (refuse_tokens_of.contains(e->request)) {
        commit_answer_ = absl::InvalidArgumentError(absl::StrCat("request ", e->request, ": record refused"));
        ++commits_refused;
        continue;
      }
      std::vector<uint8_t>& have = committed[e->request];
      // A repeat only after a refusal (its entries go again from what memd acknowledged); memd takes an equal resend.
      EXPECT_TRUE(e->from == have.size() || (commits_refused > 0 && e->from < have.size()))
          << "request " << e->request << ": a gap or a repeat (from " << e->from << ", memd has " << have.size() << ")";
      EXPECT_EQ(e->tokens.size(), e->logits_digests.size());
      const size_t from = std::min<size_t>(e->from, have.size());
      const size_t skip = std::min(e->tokens.size(), have.size() - from);  // tokens memd has already
      for (size_t i = 0; i < skip; ++i) EXPECT_EQ(have[from + i], e->tokens[i]) << "a resend that differs";
      have.insert(have.end(), e->tokens.begin() + skip, e->tokens.end());
      if (auto rec = records.find(e->request); rec != records.end()) {  // as memd's record: tokens appended
        rec->second.tokens.insert(rec->second.tokens.end(), e->tokens.begin() + skip, e->tokens.end());
        rec->second.logits_digests.insert(rec->second.logits_digests.end(), e->logits_digests.begin() + skip,
                                          e->logits_digests.end());
      }
    }
    return absl::OkStatus();
  }

  // The worker is gone (memd's FenceGpu): every request becomes interrupted and keeps exactly the host pages with a
  // reported host copy (`interrupted`); its other host pages, GPU pages and slot are freed, every order is dropped.
  // keep_host = false: no host copy is kept either (what a resume finds when nothing was confirmed).
  void Fence(bool keep_host = true) {
    for (auto& [id, r] : reqs_) {
      std::map<uint32_t, PageIndex>& kept = interrupted[id];
      kept.insert(r.taken.begin(), r.taken.end());  // a queued resume keeps what it took over
      for (uint32_t j = 0; j < r.host.size(); ++j) {
        if (keep_host && r.host_copy.contains(j)) {
          kept[j] = r.host[j];
        } else {
          free_host_.insert(r.host[j]);
        }
      }
      for (const auto& [j, dp] : r.optional) free_gpu_.insert(dp);
      for (uint32_t dp : r.populating) free_gpu_.insert(dp);
      if (r.slot) free_slots_.insert(*r.slot);
    }
    reqs_.clear();
    reclaims_.clear();
    inbox_.clear();
    waiting_.clear();
    commit_answer_.reset();  // the fenced worker's message is never answered
  }
  // A re-Hello's report (memd restarted, the worker survived): each reported record replaces the one kept, as memd's
  // Daemon::ReHello does (the fake's accounting of the requests stays: the same memd state stands in for the adopted
  // one).
  void AdoptReport(const std::vector<std::unique_ptr<wire::ReportedRequestT>>& report) {
    commit_answer_.reset();  // the dead memd's answer never comes
    for (const auto& rep : report) {
      if (!rep->record) continue;
      records[rep->request] = *rep->record;
      committed[rep->request].assign(rep->record->tokens.begin(), rep->record->tokens.end());
    }
    ++rehellos;
  }
  // From now on (the next worker's life), with `gpu_pages` GPU pages 0 .. gpu_pages-1 to hand out: Pump emits reclaim
  // and populate orders too (populating imported pages, reclaiming populated ones).
  void EnableChaos(uint32_t gpu_pages) {
    chaos_ = true;
    for (uint32_t i = 0; i < gpu_pages; ++i) free_gpu_.insert(i);
  }
  // Host pages in use (held by a request or an interrupted one); GPU pages free.
  size_t host_pages_held() const { return free_host_total_ - free_host_.size(); }
  size_t gpu_pages_free() const { return free_gpu_.size(); }
  size_t slots_free() const { return free_slots_.size(); }
  size_t admissions_waiting() const { return waiting_.size(); }

  // Delivers queued messages, then (with chaos) maybe emits one reclaim or populate order.
  // The worker's invariants (Worker::CheckInvariants) are checked before (after its last iteration or event) and
  // after memd's messages are delivered.
  void Pump(Worker& w) {
    Pump(w.memd_inbox(), [&w] { ExpectInvariants(w); });
  }
  // The same to any MemdHandler (libdhs's EmbeddedWorker through Poll); `check` runs where Pump(Worker&) checks the
  // worker's invariants.
  void Pump(MemdHandler& h, const std::function<void()>& check) {
    ++pumps_;
    if (check) check();
    if (std::optional<absl::Status> answer = std::exchange(commit_answer_, std::nullopt)) {
      if (answer->ok()) {
        h.OnTokensCommitted();
      } else {
        h.OnTokensRefused(*answer);
      }
    }
    GrantWaiting();
    while (!inbox_.empty()) {
      auto msg = std::move(inbox_.front());
      inbox_.pop_front();
      std::visit([&](auto& m) { Deliver(h, *m); }, msg);
    }
    if (check) check();
    if (!chaos_) return;
    const uint64_t dice = rng_() % 8;
    std::vector<RequestId> ids;
    for (const auto& [id, r] : reqs_) {
      if (!r.reclaiming && (overlapping_orders || r.populates == 0)) ids.push_back(id);
    }
    if (ids.empty()) return;
    const RequestId id = ids[rng_() % ids.size()];
    Req& r = reqs_[id];
    if (dice < 2 && !r.optional.empty()) {  // reclaim all optional pages of a whole request (brief §4)
      OrderReclaim(id);
    } else if (dice < 4 && !free_gpu_.empty() && r.optional_history) {  // repopulate up to 2 host-copied pages
      OrderPopulate(id, 2);
    }
  }

  // A PopulateOrder of up to `most` host-copied pages of request `id` not on GPU nor being populated, into free GPU
  // pages, delivered at the next Pump. Returns the pages ordered (0: none). Pump orders them at random with chaos.
  size_t OrderPopulate(RequestId id, size_t most) {
    auto found = reqs_.find(id);
    if (found == reqs_.end() || !found->second.optional_history) return 0;
    Req& r = found->second;
    auto o = std::make_unique<wire::PopulateOrderT>();
    for (uint32_t j : r.host_copy) {
      if (r.optional.contains(j) || free_gpu_.empty() || o->pages.size() == most) continue;
      if (std::any_of(r.populating_history.begin(), r.populating_history.end(),
                      [&](const auto& e) { return e.second == j; })) {
        continue;  // its populate is in flight already (overlapping_orders)
      }
      const uint32_t dp = *free_gpu_.begin();
      free_gpu_.erase(free_gpu_.begin());
      r.populating.insert(dp);
      r.populating_history[dp] = j;
      o->pages.push_back(dp);
      o->history_pages.push_back(j);
      o->host_pages.emplace_back(0, r.host[j]);
    }
    if (o->pages.empty()) return 0;
    const size_t ordered = o->pages.size();
    o->order = next_order_++;
    o->request = id;
    if (r.populates > 0) ++populates_overlapping;
    ++r.populates;
    inbox_.push_back(std::move(o));
    return ordered;
  }

  // A ReclaimOrder for every optional page of request `id` (brief §4: whole requests), delivered at the next Pump;
  // pages without a host copy are backed up first. False (nothing ordered) when it has none, or a reclaim of it is
  // in flight. Pump orders them at random with chaos; a test orders one where it wants it.
  bool OrderReclaim(RequestId id) {
    auto found = reqs_.find(id);
    if (found == reqs_.end() || found->second.optional.empty() || found->second.reclaiming) return false;
    Req& r = found->second;
    auto o = std::make_unique<wire::ReclaimOrderT>();
    o->order = next_order_++;
    o->request = id;
    Reclaim rc{id, false, false};
    for (const auto& [j, dp] : r.optional) {
      o->pages.push_back(dp);
      if (!r.host_copy.contains(j)) {
        o->backup_pages.push_back(dp);
        o->backup_targets.emplace_back(0, r.host[j]);
        rc.needed_backup = true;
      }
    }
    // overlapping_orders: pages whose populate is in flight are reclaimed too (memd reclaims whole requests); they
    // hold a host copy (populated from it), so they need no backup.
    for (const auto& [dp, j] : r.populating_history) o->pages.push_back(dp);
    reclaims_[o->order] = rc;
    r.reclaiming = true;
    ++reclaims_ordered;
    if (r.populates > 0) ++reclaims_over_populates;
    inbox_.push_back(std::move(o));
    return true;
  }

  // memd's AdmitWait for the admission of `id` (queue position `position`), delivered at the next Pump (the fake
  // itself answers a waiting admission with nothing until its grant).
  void AnswerWait(RequestId id, uint32_t position) {
    auto w = std::make_unique<wire::AdmitWaitT>();
    w->request = id;
    w->queue_position = position;
    inbox_.push_back(std::move(w));
  }
  // memd's AdmitReject of the admission of `id` (waiting for its grant), delivered at the next Pump. `took_effect`:
  // decided after memd took the admission (ResidencyManager's NeverFits): a resume's taken-over pages are freed, its
  // interrupted request is gone and the reject names it (took_over). Else a bad admission refused before any change
  // (memd's Admit failed): a resume's interrupted request is kept as it was, took_over = 0.
  void RejectAdmission(RequestId id, const absl::Status& why, bool took_effect) {
    std::erase_if(waiting_, [&](const Admission& a) { return a.request == id; });
    wire::AdmitRejectT m;
    if (auto it = reqs_.find(id); it != reqs_.end()) {
      const Req& r = it->second;
      if (r.resume_of != 0 && !took_effect) {  // the resume never happened: its request is interrupted as it was
        interrupted[r.resume_of] = r.taken;
        pages_taken_over -= static_cast<uint32_t>(r.taken.size());
        --resumes;
      } else {  // memd ended the taken-over request with the resume
        for (const auto& [j, h] : r.taken) free_host_.insert(h);
        m.took_over = r.resume_of;
      }
      reqs_.erase(it);
    }
    m.request = id;
    m.code = ToWireError(why);
    m.reason = std::string(why.message());
    inbox_.push_back(std::make_unique<wire::AdmitRejectT>(m));
  }

  // MemdTransport (libdhs's EmbeddedWorker::OpenOver): the host pool is `host`; Poll is a Pump (nothing while the
  // session is away, as MemdClient); PollAway answers once `take_rehello` is set: the report adopted (AdoptReport),
  // refused_reports / interrupted_requests / interrupted_records as set below, the session connected again.
  std::span<uint8_t> host_pages() const override {
    return std::span<uint8_t>(const_cast<uint8_t*>(host.data()), host.size());
  }
  uint64_t worker_epoch() const override { return epoch; }
  const std::vector<uint64_t>& interrupted_requests() const override { return listed_interrupted; }
  const std::vector<std::unique_ptr<wire::RequestRecordT>>& interrupted_records() const override {
    return listed_records;
  }
  absl::Status Poll(MemdHandler& h, const MemdLoad&) override {
    if (session().away()) return absl::OkStatus();
    Pump(h, {});
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<wire::HelloReplyT>> PollAway(
      const std::function<wire::HelloT()>& make_hello) override {
    if (!session().away()) return std::nullopt;
    if (!take_rehello) return std::nullopt;
    take_rehello = false;
    wire::HelloT hello = make_hello();
    rehello_reports.clear();
    for (const auto& rep : hello.report) rehello_reports.push_back(rep->request);
    AdoptReport(hello.report);
    wire::HelloReplyT reply;
    reply.accepted = true;
    reply.worker_epoch = epoch;
    reply.refused_reports = refuse_reports;
    reply.interrupted_requests = listed_interrupted;
    for (const auto& rec : listed_records) {
      reply.interrupted_records.push_back(std::make_unique<wire::RequestRecordT>(*rec));
    }
    if (absl::Status s = session().Accepted(); !s.ok()) return s;
    return std::optional<wire::HelloReplyT>(std::move(reply));
  }
  uint64_t epoch = 1;
  std::vector<uint64_t> listed_interrupted;                        // HelloReply.interrupted_requests
  std::vector<std::unique_ptr<wire::RequestRecordT>> listed_records;  // HelloReply.interrupted_records
  bool take_rehello = false;            // PollAway answers the next re-Hello
  std::vector<uint64_t> refuse_reports;  // its HelloReply.refused_reports
  std::vector<RequestId> rehello_reports;  // the requests the latest re-Hello reported

  static void ExpectInvariants(const Worker& w) {
    const absl::Status s = w.CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }

  std::vector<uint8_t> host;
  // Issue 28 knobs (see the class comment); set before the first message.
  uint32_t admission_wait_max = 0;
  bool overlapping_orders = false;
  bool accept_failed_copies = false;
  int failed_copy_reports = 0;      // BackupComplete / HostCopyWritten / ReadyPublish with ok = false
  int reclaims_aborted = 0;         // by a failed backup
  int reclaims_ordered = 0;
  int reclaims_over_populates = 0;  // reclaims ordered while a populate of the request was in flight
  int populates_overlapping = 0;    // populates ordered while another of the request was in flight
  int reclaims_done = 0;
  int pages_populated = 0;
  int backup_messages = 0;
  int host_copy_messages = 0;
  int deferred_pages = 0;  // reclaimed pages reported deferred (no host copy yet)
  std::vector<RequestId> admitted_ids;   // AdmitRequest.request in order (node request ids)
  std::vector<wire::AdmitRequestT> admits;  // every AdmitRequest as sent (issue 13: its speculation share)
  int admits_with_optional_history = 0;  // AdmitRequests that allow optional history (adaptive mode only)
  int completes = 0;
  std::vector<wire::CompleteT> complete_messages;  // every Complete as sent
  int commit_messages = 0;                              // TokensCommitted messages (one per step with tokens)
  int commits_refused = 0;                              // TokensCommitted refused (refuse_tokens_of)
  std::set<RequestId> refuse_tokens_of;                 // requests whose TokensCommitted entries memd refuses
  std::map<RequestId, std::vector<uint8_t>> committed;  // node id -> tokens committed (TokensCommitted)
  std::map<RequestId, wire::RequestRecordT> records;    // node id -> AdmitRequest.record + committed tokens
  std::map<RequestId, std::map<uint32_t, PageIndex>> interrupted;  // Fence: node id -> kept history -> host page
  std::map<PageIndex, uint64_t> host_checksums;  // host page -> the checksum its confirmation carried (issue 22)
  int rehellos = 0;              // AdoptReport calls
  int resumes = 0;               // admissions with resume_of (memd's resume: the interrupted id ends there)
  uint32_t pages_taken_over = 0;  // kept host pages those resumes took over (every one)

 private:
  struct Req {
    std::vector<PageIndex> host;
    std::map<uint32_t, PageIndex> taken;    // a resume's kept host pages (history page -> host page) until its grant
    RequestId resume_of = 0;                // a resume: the interrupted request it took over (TakeOver)
    std::map<uint32_t, uint32_t> optional;  // history page -> GPU page (ready or kept)
    std::set<uint32_t> populating;          // GPU pages of a populate order in flight (freed by Complete)
    std::set<uint32_t> host_copy;           // history pages with a reported host copy
    bool optional_history = true;           // AdmitRequest.optional_history: false = never populated (hisparse)
    bool reclaiming = false;                // a reclaim order is in flight
    int populates = 0;                      // populate orders in flight
    std::map<uint32_t, uint32_t> populating_history;  // GPU page of a populate in flight -> its history page
    std::optional<SlotIndex> slot;          // granted into it
  };
  struct Reclaim {
    RequestId request;
    bool needed_backup;
    bool backed;
  };
  using Msg = std::variant<std::unique_ptr<wire::AdmitGrantT>, std::unique_ptr<wire::ReclaimOrderT>,
                           std::unique_ptr<wire::RetireT>, std::unique_ptr<wire::PopulateOrderT>,
                           std::unique_ptr<wire::AdmitWaitT>, std::unique_ptr<wire::AdmitRejectT>>;
  static uint32_t HistoryOf(const Req& r, uint32_t dp) {
    for (const auto& [j, d] : r.optional) {
      if (d == dp) return j;
    }
    if (auto it = r.populating_history.find(dp); it != r.populating_history.end()) return it->second;
    ADD_FAILURE() << "fake memd: unknown GPU page " << dp;
    return 0;
  }
  // As memd's core: the new request takes over every kept host page of the interrupted one (same history page, gaps
  // and all), the interrupted one ends.
  void TakeOver(const wire::AdmitRequestT& m, Req& r) {
    EXPECT_TRUE(m.host_backed) << "resume_of without host_backed";
    auto it = interrupted.find(m.resume_of);
    if (it == interrupted.end()) {
      ADD_FAILURE() << "fake memd: request " << m.request << " resumes unknown request " << m.resume_of;
      return;
    }
    r.taken = it->second;
    pages_taken_over += static_cast<uint32_t>(r.taken.size());
    r.resume_of = m.resume_of;
    interrupted.erase(it);
    ++resumes;
  }
  void Deliver(MemdHandler& h, const wire::AdmitGrantT& m) { h.OnAdmitGrant(m); }
  void Deliver(MemdHandler& h, const wire::ReclaimOrderT& m) { h.OnReclaimOrder(m); }
  void Deliver(MemdHandler& h, const wire::RetireT& m) { h.OnRetire(m); }
  void Deliver(MemdHandler& h, const wire::PopulateOrderT& m) { h.OnPopulateOrder(m); }
  void Deliver(MemdHandler& h, const wire::AdmitWaitT& m) { h.OnAdmitWait(m); }
  void Deliver(MemdHandler& h, const wire::AdmitRejectT& m) { h.OnAdmitReject(m); }

  uint32_t p_;
  std::mt19937_64 rng_;
  bool chaos_;
  std::set<uint32_t> free_gpu_;
  std::set<uint32_t> free_host_;
  size_t free_host_total_ = 0;
  std::set<SlotIndex> free_slots_;
  std::deque<Admission> waiting_;
  std::map<RequestId, Req> reqs_;
  std::map<uint64_t, Reclaim> reclaims_;
  std::deque<Msg> inbox_;
  std::optional<absl::Status> commit_answer_;  // the TokensCommitted in flight: its answer at the next Pump
  uint64_t next_order_ = 1;
  uint64_t pumps_ = 0;
};

// Worker-side safety (brief §4): every row of `request` that left the tail is ready on GPU or has a host copy.
inline void ExpectSafe(Worker& w, RequestId request) {
  HierarchicalKvAccess* h = w.hierarchical();
  if (h == nullptr) return;
  const RequestKv* kv = h->Find(request);
  if (kv == nullptr) return;
  const Position n = *std::min_element(kv->appended.begin(), kv->appended.end());
  const Position p = h->layout().config().page_rows, t = h->layout().config().tail_rows;
  for (Position j = 0; (j + 1) * p <= n - t; ++j) {
    const KvPage& pg = kv->pages[static_cast<size_t>(j)];
    EXPECT_TRUE(pg.Ready() || pg.HostReady()) << "request " << request << " page " << j << " is neither on GPU nor on host";
  }
}

}  // namespace dhs::test
