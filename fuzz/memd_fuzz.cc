// fuzz/memd_fuzz.cc: libFuzzer target for memd's message decoding and dispatch (issue 12): a sequence of messages.
//
// Each input runs against a fresh Daemon (the real one: its Server decodes, its handlers map to the core, its orders
// go out on its ROUTER socket) started in a private run directory with a 64-page host pool, tick and retry periods 0
// (so Populate() and RetryBackups() run after every message, deterministically). Up to three in-process DEALER peers
// ("worker/0", "worker/1", "dhsctl") send the messages; each is served with Daemon::ServeOnce, then the core's
// CheckInvariants() must hold (else the target aborts). Orders memd sends are left unread (the peers' queues absorb
// them; a full queue only makes a send fail, which the daemon counts).
//
// The input is a list of records: [peer][kind][fields...]. Kinds build a message through the typed encoders from
// small field values (ids, orders and pages mostly small, so the messages meet the state: order ids are sequential,
// an empty page list means "every page of the order"), or send the bytes of such a message mutated (byte flips, a
// cut), or send raw bytes. memd must never abort on any of them.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/host_pool.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "fuzz/fuzz_input.h"
#include "memd/daemon.h"
#include "spdlog/spdlog.h"

namespace dhs::fuzz {
namespace {

constexpr uint64_t kPageBytes = 64;
constexpr uint32_t kHostPages = 64;
constexpr int kMaxRecords = 64;
const char* const kPeers[] = {"worker/0", "worker/1", "dhsctl"};

std::string RunDir() { return absl::StrCat("/tmp/dhs-fuzz-memd-", getpid()); }
std::string SegmentName() { return absl::StrCat("dhs-fuzz-memd-", getpid()); }

std::vector<wire::HostPageRef> HostRefs(Input& in, size_t n) {
  std::vector<wire::HostPageRef> v;
  for (size_t i = 0; i < n; ++i) v.emplace_back(in.Below(8) == 0 ? in.Small32(4) : 0, in.Small32(kHostPages + 4));
  return v;
}

// A request id: mostly small, so the messages meet the state: 0..3 are GPU 0's node ids (0 reserved), 4..7 GPU 1's
// node ids 1..4 (MakeNodeRequestId: memd refuses an id outside the sender's GPU range), sometimes any 64-bit value.
RequestId NodeId(Input& in) {
  const uint64_t v = in.Small64(8);
  return v >= 4 && v < 8 ? MakeNodeRequestId(1, 1, v - 3) : v;
}

// One message built from the input through the typed encoders (kind chooses the body).
std::string Structured(Input& in, uint8_t kind, uint64_t seq, const std::string& sender) {
  switch (kind % 11) {
    case 0: {
      wire::HelloT h;
      h.protocol_version = kProtocolVersion;
      h.gpu = in.Small32(3);
      h.pid = 1;
      h.device_name = "fuzz";
      const uint8_t m = in.U8();  // M: mostly <= 32, 0xf0.. = 2^(m & 15), 0xff = any 32-bit value (see HugeHello)
      h.capacity_pages = m == 0xff ? in.U32() : m >= 0xf0 ? 1u << (m & 15) : m % 33;
      h.page_rows = in.Small32(65);
      h.page_bytes = in.Below(8) == 0 ? in.Small64(256) : kPageBytes;
      h.host_page_bytes = h.page_bytes;  // memd compares its pool page with the host page
      h.request_slots = in.Small32(5);
      return EncodeHello(h, seq, sender);
    }
    case 1: {
      wire::AdmitRequestT a;
      a.request = NodeId(in);
      a.gpu = in.Small32(3);
      a.required_pages = in.Small32(12);
      a.history_rows = in.Small64(2000);
      a.complete_pages = in.Small32(12);
      a.host_backed = in.Below(16) == 0;
      a.optional_history = in.Below(4) != 0;
      return EncodeAdmitRequest(a, seq, sender);
    }
    case 2: {
      wire::BackupCompleteT b;
      b.order = in.Small64(16);
      b.request = NodeId(in);
      b.gpu = in.Small32(3);
      b.pages = in.SmallVector(4, 33);
      b.host_pages = HostRefs(in, b.pages.size());
      b.ok = in.Below(4) != 0;
      b.deferred_pages = in.Below(2) == 0 ? std::vector<uint32_t>{} : in.SmallVector(3, 33);
      return EncodeBackupComplete(b, seq, sender);
    }
    case 3: {
      wire::HostCopyWrittenT w;
      w.request = NodeId(in);
      w.gpu = in.Small32(3);
      w.history_pages = in.SmallVector(4, 40);
      w.host_pages = HostRefs(in, in.Below(4) == 0 ? in.Below(5) : w.history_pages.size());
      w.ok = in.Below(4) != 0;
      return EncodeHostCopyWritten(w, seq, sender);
    }
    case 4: {
      wire::ReadersDoneT r;
      r.order = in.Small64(16);
      r.request = NodeId(in);
      r.gpu = in.Small32(3);
      r.pages = in.SmallVector(3, 33);
      return EncodeReadersDone(r, seq, sender);
    }
    case 5: {
      wire::ReadyPublishT r;
      r.order = in.Small64(16);
      r.gpu = in.Small32(3);
      r.request = NodeId(in);
      r.pages = in.SmallVector(3, 33);
      r.history_pages = in.SmallVector(3, 40);
      r.ok = in.Below(4) != 0;
      return EncodeReadyPublish(r, seq, sender);
    }
    case 6: {
      wire::CompleteT c;
      c.request = NodeId(in);
      c.gpu = in.Small32(3);
      return EncodeComplete(c, seq, sender);
    }
    case 7: {
      wire::IntrospectQueryT q;
      q.what = static_cast<wire::IntrospectWhat>(in.Below(7));  // 6: beyond the enum
      q.request = NodeId(in);
      q.gpu = in.Small32(3);
      q.format = static_cast<wire::IntrospectFormat>(in.Below(3));
      return EncodeIntrospectQuery(q, seq, sender);
    }
    case 8: {
      wire::HeartbeatT h;
      h.sender_time_ns = in.U64();
      h.gpu = in.Small32(3);
      return EncodeHeartbeat(h, seq, sender);
    }
    case 9: {
      wire::HeartbeatAckT h;
      h.sender_time_ns = in.U64();
      return EncodeHeartbeatAck(h, seq, sender);
    }
    default: {  // a message memd does not serve, or a wrong version / unknown body type
      switch (in.Below(3)) {
        case 0: {
          wire::AdmitGrantT g;
          g.request = NodeId(in);
          return EncodeAdmitGrant(g, seq, sender);
        }
        case 1: return internal::EncodeRawEnvelope(in.Small32(5), in.U8(), seq, sender);
        default: {
          wire::SubmitRequestT s;
          s.request = NodeId(in);
          return EncodeSubmitRequest(s, seq, sender);
        }
      }
    }
  }
}

// A Hello with a large but legal M (up to memd::kMaxGpuPages = 2^26) makes memd allocate its page table (~13 bytes a
// page, up to ~870 MB): legal, but it would make every such input slow and memory-hungry, so Hellos with M in
// (2^16, kMaxGpuPages] are not sent (unless DHS_FUZZ_KNOWN=1). Beyond the bound memd refuses the Hello before
// allocating (it used to exhaust its memory: corpus/memd/memd-hello-huge-capacity), and such Hellos are sent.
bool HugeHello(const std::string& bytes) {
  static const bool reproduce = std::getenv("DHS_FUZZ_KNOWN") != nullptr;
  if (reproduce) return false;
  auto m = DecodeEnvelope(bytes);
  if (!m.ok() || m->type != wire::Body::Hello) return false;
  auto h = ReadHello(*m);
  return h.ok() && h->capacity_pages > (1u << 16) && h->capacity_pages <= memd::kMaxGpuPages;
}

struct Node {
  std::unique_ptr<memd::Daemon> daemon;
  std::unique_ptr<DealerClient> peers[3];
};

void Run(const uint8_t* data, size_t size) {
  Input in(data, size);
  memd::DaemonOptions options;
  options.run_dir = RunDir();
  options.page_bytes = kPageBytes;
  options.host_pool_pages = kHostPages;
  const uint8_t config = in.U8();
  options.reserve_pages = config & 3;
  static const char* const kPolicies[] = {"largest-first", "oldest-first", "newest-first", "largest-first"};
  options.reclaim_policy = kPolicies[(config >> 2) & 3];
  options.populate_pages_per_attempt = 1 + ((config >> 4) & 7);
  options.tick = std::chrono::milliseconds(0);
  options.retry_period = std::chrono::milliseconds(0);
  options.segment_name = SegmentName();
  // Each input starts from nothing: a Daemon whose requests still held host pages kept its pool and records for the
  // next memd (issue 11, memd restart); adopting them would carry one input's state into the next.
  (void)HostPoolSegment::Remove(options.segment_name);
  std::error_code ec;
  std::filesystem::remove_all(options.run_dir + "/records", ec);
  Node node;
  auto daemon = memd::Daemon::Start(options);
  DHS_CHECK_OK(daemon.status());
  node.daemon = std::move(*daemon);

  uint64_t seq = 1;
  for (int r = 0; r < kMaxRecords && !in.empty(); ++r) {
    const uint8_t who = in.U8() % 3;
    const uint8_t kind = in.U8();
    std::string bytes;
    if (kind < 200) {
      bytes = Structured(in, kind, seq++, kPeers[who]);
    } else if (kind < 240) {  // a valid message with some bytes flipped, or cut short
      bytes = Structured(in, kind, seq++, kPeers[who]);
      const int flips = 1 + in.Below(4);
      for (int f = 0; f < flips && !bytes.empty(); ++f) {
        const uint16_t at = in.U16();
        bytes[at % bytes.size()] ^= static_cast<char>(in.U8() | 1);
      }
      if (in.Below(4) == 0 && !bytes.empty()) bytes.resize(in.U16() % bytes.size());
    } else {  // raw bytes
      bytes = in.Bytes(512);
    }
    if (HugeHello(bytes)) continue;
    std::unique_ptr<DealerClient>& peer = node.peers[who];
    if (peer == nullptr) {
      DealerClient::Options o;
      o.identity = kPeers[who];
      auto c = DealerClient::Connect(node.daemon->endpoint(), o);
      DHS_CHECK_OK(c.status());
      peer = std::move(*c);
    }
    DHS_CHECK_OK(peer->Send(bytes));
    DHS_CHECK_OK(node.daemon->ServeOnce(std::chrono::milliseconds(2000)));
    DHS_CHECK_OK(node.daemon->core().CheckInvariants());
  }
  if (std::getenv("DHS_FUZZ_VERBOSE") != nullptr) {  // what an input reached (seed checks)
    const memd::Counters& c = node.daemon->core().counters();
    std::fprintf(stderr, "memd: %llu events (%llu refused), %llu grants, %llu waits, %llu rejects, %llu completions, "
                 "%llu reclaims started, %llu retired, %llu populates\n", (unsigned long long)c.events,
                 (unsigned long long)c.event_errors, (unsigned long long)c.grants, (unsigned long long)c.waits,
                 (unsigned long long)c.rejects, (unsigned long long)c.completions,
                 (unsigned long long)c.reclaims_started, (unsigned long long)c.reclaims_retired,
                 (unsigned long long)c.populates_ordered);
  }
}

}  // namespace
}  // namespace dhs::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // every refused message is logged: quiet, and faster
  std::atexit([] {  // the run directory and pool the last Daemon left
    std::error_code ec;
    std::filesystem::remove_all(dhs::fuzz::RunDir(), ec);
    (void)dhs::HostPoolSegment::Remove(dhs::fuzz::SegmentName());
  });
  (void)dhs::HostPoolSegment::Remove(dhs::fuzz::SegmentName());  // one left by a killed process with this pid
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dhs::fuzz::Run(data, size);
  return 0;
}
