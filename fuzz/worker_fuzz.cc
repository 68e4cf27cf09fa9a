// fuzz/worker_fuzz.cc: libFuzzer target for the worker's side of the conversation (issue 12): memd's messages to a
// Worker (AdmitGrant, AdmitWait, AdmitReject, ReclaimOrder, Retire, PopulateOrder, CompleteAck), the clients'
// SubmitRequest (ValidateSubmit and Worker::Submit), interleaved with serving iterations: a sequence of messages.
//
// Each input runs a fresh adaptive / hisparse / resident Worker on a CpuDevice with the dsv4flash-like preset (built
// once), p = 16 rows, 2 slots, a 16-page GPU budget and a 64-page host pool in plain memory, behind a quiet MemdLink
// that records what the worker sends. The input is a list of records [kind][fields...]: a SubmitRequest, a memd
// message built from small field values (so they meet the state), a grant made to fit a submitted request (a slot, one
// host page per page of its context, some optional pages), a Retire answering a ReadersDone the worker sent, one to
// four Iterate() calls, or wire bytes (a typed message with bytes flipped, or raw) decoded and dispatched as
// MemdClient does. The worker must not crash, and its invariants (Worker::CheckInvariants: the request book, the token
// ledger, the requests served = the book's) hold after every record (memd is trusted for safety: a lying memd may
// make the worker serve wrong rows, not crash it or break its own books).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/protocol.h"
#include "fuzz/fuzz_input.h"
#include "tests/workerd/recording_transport.h"
#include "spdlog/spdlog.h"
#include "workerd/device/cpu_device.h"
#include "workerd/model/model.h"
#include "workerd/model/safetensors.h"
#include "workerd/model/weights.h"
#include "workerd/serving.h"
#include "workerd/worker.h"

namespace dhs::fuzz {
namespace {

constexpr uint32_t kPageRows = 16;
constexpr uint32_t kHostPages = 64;
constexpr int kMaxRecords = 48;
constexpr int kMaxIterations = 24;

const model::Model& TheModel() {
  static const model::Model* m = [] {
    auto config = model::PresetConfig("dsv4flash-like");
    DHS_CHECK_OK(config.status());
    auto writer = model::GenerateWeights(*config, 7);
    DHS_CHECK_OK(writer.status());
    auto file = model::SafetensorsFile::Parse(writer->Serialize());
    DHS_CHECK_OK(file.status());
    auto model = model::Model::FromSafetensors(*file);
    DHS_CHECK_OK(model.status());
    return model->release();
  }();
  return *m;
}

// The MemdLink: accepts everything, keeps the ReadersDone reports (a record can answer one with its Retire).
class QuietMemd final : public RecordingTransport {
 public:
  absl::Status SendAdmitRequest(const wire::AdmitRequestT& m) override {
    admits.push_back(m);
    return absl::OkStatus();
  }
  absl::Status SendBackupComplete(const wire::BackupCompleteT&) override { return absl::OkStatus(); }
  absl::Status SendHostCopyWritten(const wire::HostCopyWrittenT&) override { return absl::OkStatus(); }
  absl::Status SendReadersDone(const wire::ReadersDoneT& m) override {
    readers_done.push_back(m);
    return absl::OkStatus();
  }
  absl::Status SendReadyPublish(const wire::ReadyPublishT&) override { return absl::OkStatus(); }
  absl::Status SendComplete(const wire::CompleteT&) override { return absl::OkStatus(); }
  // Answered after the serving iteration that sent it (as memd's TokensCommittedAck), so the worker's TokenLedger
  // goes on past its first message.
  absl::Status SendTokensCommitted(const wire::TokensCommittedT&) override {
    commit_unanswered = true;
    return absl::OkStatus();
  }
  bool commit_unanswered = false;
  std::vector<wire::AdmitRequestT> admits;
  std::deque<wire::ReadersDoneT> readers_done;
};

class NullSink final : public ClientSink {
 public:
  void Accepted(const ClientRef&, const wire::SubmitAcceptedT&) override {}
  absl::Status Chunk(const ClientRef&, const wire::TokenChunkT&) override { return absl::OkStatus(); }
};

float FuzzFloat(Input& in) {
  switch (in.Below(8)) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return -1.0f;
    case 2: return std::numeric_limits<float>::infinity();
    case 3: return 0.5f;
    case 4: return static_cast<float>(in.U8()) / 100.0f;
    default: return 0.0f;
  }
}

std::vector<wire::HostPageRef> HostRefs(Input& in, size_t n) {
  std::vector<wire::HostPageRef> v;
  for (size_t i = 0; i < n; ++i) v.emplace_back(in.Below(16) == 0 ? in.Small32(3) : 0, in.Small32(kHostPages + 4));
  return v;
}

wire::SubmitRequestT MakeSubmit(Input& in) {
  wire::SubmitRequestT s;
  s.request = in.Small64(6);
  s.prompt.resize(in.Below(48));
  for (uint8_t& t : s.prompt) t = in.U8();
  s.max_new_tokens = in.Below(16) == 0 ? in.Small32(300) : 1 + in.Below(6);
  if (in.Below(4) == 0) {
    s.hash_ids.resize(in.Below(4));
    for (uint64_t& h : s.hash_ids) h = in.Small64(5);
    s.prefix_block_tokens = in.Small32(40);
    s.input_tokens = in.Small32(120);
  }
  if (in.Below(4) == 0) {
    s.temperature = FuzzFloat(in);
    s.top_p = in.Below(2) == 0 ? FuzzFloat(in) : 1.0f;
    s.seed = in.U8();
  }
  return s;
}

// memd's message `kind` built from small field values; returned through `handler`.
void DeliverStructured(Input& in, uint8_t kind, MemdHandler& w) {
  switch (kind % 7) {
    case 0: {
      wire::AdmitGrantT g;
      g.request = in.Small64(6);
      g.slot = in.Small32(3);
      g.required_pages = in.SmallVector(3, 20);
      g.optional_pages = in.SmallVector(3, 20);
      g.optional_history_pages = in.Below(4) == 0 ? in.SmallVector(3, 16) : std::vector<uint32_t>(g.optional_pages.size());
      for (size_t i = 0; i < g.optional_history_pages.size(); ++i) g.optional_history_pages[i] = in.Small32(16);
      g.backup_host_pages = HostRefs(in, in.Below(16));
      return w.OnAdmitGrant(g);
    }
    case 1: {
      wire::AdmitWaitT m;
      m.request = in.Small64(6);
      m.queue_position = in.Small32(4);
      m.deficit_pages = in.Small32(20);
      return w.OnAdmitWait(m);
    }
    case 2: {
      wire::AdmitRejectT m;
      m.request = in.Small64(6);
      m.code = static_cast<wire::ErrorCode>(in.Below(20));
      m.reason = "fuzz";
      return w.OnAdmitReject(m);
    }
    case 3: {
      wire::ReclaimOrderT m;
      m.order = in.Small64(16);
      m.request = in.Small64(6);
      m.pages = in.SmallVector(4, 20);
      m.backup_pages = in.Below(2) == 0 ? m.pages : in.SmallVector(3, 20);
      m.backup_targets = HostRefs(in, in.Below(4) == 0 ? in.Below(4) : m.backup_pages.size());
      return w.OnReclaimOrder(m);
    }
    case 4: {
      wire::RetireT m;
      m.order = in.Small64(16);
      m.request = in.Small64(6);
      m.pages = in.SmallVector(4, 20);
      m.regranted_to = in.Small64(6);
      return w.OnRetire(m);
    }
    case 5: {
      wire::PopulateOrderT m;
      m.order = in.Small64(16);
      m.request = in.Small64(6);
      m.pages = in.SmallVector(3, 20);
      m.history_pages = in.Below(4) == 0 ? in.SmallVector(3, 16) : std::vector<uint32_t>(m.pages.size());
      for (size_t i = 0; i < m.history_pages.size(); ++i) m.history_pages[i] = in.Small32(16);
      m.host_pages = HostRefs(in, in.Below(4) == 0 ? in.Below(4) : m.pages.size());
      return w.OnPopulateOrder(m);
    }
    default: {
      wire::CompleteAckT m;
      m.request = in.Small64(6);
      m.released_pages = in.Small32(20);
      return w.OnCompleteAck(m);
    }
  }
}

// The same message encoded (then maybe flipped) for the wire path: DecodeEnvelope + Read<Msg> + the handler, as
// MemdClient::Dispatch does.
std::string EncodeStructured(Input& in, uint8_t kind) {
  switch (kind % 4) {
    case 0: {
      wire::AdmitGrantT g;
      g.request = in.Small64(6);
      g.slot = in.Small32(3);
      g.optional_pages = in.SmallVector(3, 20);
      g.optional_history_pages = in.SmallVector(3, 16);
      g.backup_host_pages = HostRefs(in, in.Below(16));
      return EncodeAdmitGrant(g, 1, "memd");
    }
    case 1: {
      wire::ReclaimOrderT m;
      m.order = in.Small64(16);
      m.request = in.Small64(6);
      m.pages = in.SmallVector(4, 20);
      m.backup_pages = m.pages;
      m.backup_targets = HostRefs(in, m.pages.size());
      return EncodeReclaimOrder(m, 2, "memd");
    }
    case 2: {
      wire::PopulateOrderT m;
      m.order = in.Small64(16);
      m.request = in.Small64(6);
      m.pages = in.SmallVector(3, 20);
      m.history_pages = in.SmallVector(3, 16);
      m.host_pages = HostRefs(in, m.pages.size());
      return EncodePopulateOrder(m, 3, "memd");
    }
    default: {
      wire::RetireT m;
      m.order = in.Small64(16);
      m.request = in.Small64(6);
      m.pages = in.SmallVector(4, 20);
      return EncodeRetire(m, 4, "memd");
    }
  }
}

void DispatchWire(const std::string& bytes, MemdHandler& handler) {
  absl::StatusOr<Message> msg = DecodeEnvelope(bytes);
  if (!msg.ok()) return;
#define DHS_FUZZ_DISPATCH(Name)                          \
  case wire::Body::Name: {                               \
    absl::StatusOr<wire::Name##T> m = Read##Name(*msg);  \
    if (m.ok()) handler.On##Name(*m);                    \
    return;                                              \
  }
  switch (msg->type) {
    DHS_FUZZ_DISPATCH(AdmitGrant)
    DHS_FUZZ_DISPATCH(AdmitWait)
    DHS_FUZZ_DISPATCH(AdmitReject)
    DHS_FUZZ_DISPATCH(ReclaimOrder)
    DHS_FUZZ_DISPATCH(Retire)
    DHS_FUZZ_DISPATCH(PopulateOrder)
    DHS_FUZZ_DISPATCH(CompleteAck)
    case wire::Body::ErrorReply: (void)ReadErrorStatus(*msg); return;
    default: return;
  }
#undef DHS_FUZZ_DISPATCH
}

void Run(const uint8_t* data, size_t size) {
  Input in(data, size);
  const model::Model& model = TheModel();
  WorkerConfig config;
  const uint8_t mode = in.U8();
  config.mode = mode % 3 == 0 ? WorkerMode::kResident : mode % 3 == 1 ? WorkerMode::kHisparse : WorkerMode::kAdaptive;
  config.page_rows = kPageRows;
  config.tail_rows = 2 * kPageRows;
  config.slots = 2;
  config.max_context_tokens = 200;
  config.prefix_cache_bytes = (mode & 4) ? 0 : uint64_t{1} << 20;
  auto g = ComputeGeometry(model.config(), config);
  DHS_CHECK_OK(g.status());
  config.hbm_budget_bytes = 16 * g->page_bytes;
  std::vector<uint8_t> host(kHostPages * g->host_page_bytes);
  CpuDevice device;
  QuietMemd memd;
  NullSink sink;
  memd.host_span = host;
  auto created = Worker::Create(&model, &device, config, &memd, &sink);
  DHS_CHECK_OK(created.status());
  Worker& w = **created;

  uint32_t next_host = 0;
  int iterations = 0;
  for (int r = 0; r < kMaxRecords && !in.empty(); ++r) {
    const uint8_t kind = in.U8();
    if (kind < 40) {  // a client's request
      const wire::SubmitRequestT s = MakeSubmit(in);
      (void)w.Submit(s, ClientRef{"client", 1});
    } else if (kind < 80) {  // a grant made to fit one the worker asked for
      if (memd.admits.empty()) continue;
      const wire::AdmitRequestT& a = memd.admits[in.Below(static_cast<uint32_t>(memd.admits.size()))];
      wire::AdmitGrantT grant;
      grant.request = a.request;
      grant.slot = in.Below(4) == 0 ? in.Small32(4) : in.Below(2);
      const uint64_t pages = (a.history_rows + kPageRows - 1) / kPageRows;
      for (uint64_t j = 0; j < pages && j < 64; ++j) grant.backup_host_pages.emplace_back(0, (next_host++) % kHostPages);
      const uint32_t keep = std::min<uint32_t>(a.complete_pages, in.Below(4));
      for (uint32_t j = 0; j < keep; ++j) {
        grant.optional_pages.push_back(in.Small32(16));
        grant.optional_history_pages.push_back(j);
      }
      w.memd_inbox().OnAdmitGrant(grant);
    } else if (kind < 150) {  // memd's messages, structured
      DeliverStructured(in, kind, w.memd_inbox());
    } else if (kind < 170) {  // the Retire of a ReadersDone the worker sent
      if (memd.readers_done.empty()) continue;
      const wire::ReadersDoneT rd = memd.readers_done.front();
      memd.readers_done.pop_front();
      wire::RetireT retire;
      retire.order = rd.order;
      retire.gpu = rd.gpu;
      retire.request = rd.request;
      retire.pages = rd.pages;
      w.memd_inbox().OnRetire(retire);
    } else if (kind < 215) {  // serving iterations
      for (uint32_t i = 1 + in.Below(4); i > 0 && iterations < kMaxIterations; --i, ++iterations) {
        (void)w.Iterate();
        if (std::exchange(memd.commit_unanswered, false)) w.memd_inbox().OnTokensCommitted();
      }
    } else if (kind < 245) {  // wire bytes: a typed message, some bytes flipped
      std::string bytes = EncodeStructured(in, kind);
      const int flips = in.Below(4);
      for (int f = 0; f < flips && !bytes.empty(); ++f) {
        const uint16_t at = in.U16();
        bytes[at % bytes.size()] ^= static_cast<char>(in.U8() | 1);
      }
      DispatchWire(bytes, w.memd_inbox());
    } else {  // raw wire bytes
      DispatchWire(in.Bytes(512), w.memd_inbox());
    }
    DHS_CHECK_OK(w.CheckInvariants());  // the book, the ledger, the requests served = the book's (after every record)
  }
  // Drain: the worker must wind down without crashing (every order answered or dropped by the destructor).
  for (int i = 0; i < 4 && iterations < kMaxIterations + 4; ++i, ++iterations) (void)w.Iterate();
  if (std::getenv("DHS_FUZZ_VERBOSE") != nullptr) {  // what an input reached (seed checks)
    const WorkerStats st = w.stats();
    std::fprintf(stderr, "worker: %zu admits, %d iterations, %llu tokens, %llu finished, %llu failed, %llu reclaims, "
                 "%llu populated\n", memd.admits.size(), iterations, (unsigned long long)st.tokens_generated,
                 (unsigned long long)st.finished_requests, (unsigned long long)st.failed_requests,
                 (unsigned long long)st.reclaims_obeyed, (unsigned long long)st.pages_populated);
  }
}

}  // namespace
}  // namespace dhs::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  (void)dhs::fuzz::TheModel();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dhs::fuzz::Run(data, size);
  return 0;
}
