// memd/daemon.h: the memory daemon process around the decision core (brief §3, §4; docs/protocol.md).
//
// Daemon owns the host-pool segment (created at Start with every page reserved, removed by the destructor), the
// RouterServer "memd" in the run directory, and the ResidencyManager. One event loop (Serve): each inbound message is
// verified (common Server: a bad message gets an ErrorReply and the loop keeps serving), mapped to one core event,
// then the core's orders are drained and sent to the owning worker (the ROUTER peer that sent that GPU's Hello).
// A periodic tick calls Populate() and, less often, RetryBackups(). dhsctl's IntrospectQuery is answered with the
// shared renderers DumpToJson / DumpToTable. On every tick the Prometheus text is published to a
// mutex-guarded snapshot (metrics()) that the HTTP thread reads.
//
// Wire <-> core mapping (decided in memd/README.md): one wire ReclaimOrder per ReclaimStartOrder (its BackupOrders
// become backup_pages/backup_targets); WithdrawOrder is internal (the worker withdraws after its BackupComplete and
// answers ReadersDone; a ReadersDone that arrives before the core withdrew is held until it does); PopulateOrders of
// one request drained together become one wire PopulateOrder. BackupComplete{order = 0} marks history pages written.
//
// Thread-safety: Serve/Run and the constructor/destructor from one thread; metrics() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/host_pool.h"
#include "common/transport.h"
#include "memd/residency_manager.h"

namespace dhs::memd {

// The default run directory when --run-dir is not given: /tmp/dhs-<uid>.
std::string DefaultRunDir();

struct DaemonOptions {
  std::string run_dir;                      // created with MakeRunDir (0700); holds memd.sock
  uint64_t page_bytes = 0;                  // bytes per page; every worker's Hello must say the same
  uint32_t host_pool_pages = 0;             // pages of the host-pool segment (> 0)
  uint32_t reserve_pages = 0;               // M_res per GPU
  std::string reclaim_policy = "largest-first";  // chosen by replay measurement: memd/README.md
  uint32_t populate_pages_per_attempt = 8;  // bound of one population attempt, pages (>= 1)
  std::chrono::milliseconds tick{20};       // Populate() period
  std::chrono::milliseconds retry_period{1000};  // RetryBackups() period
  std::string segment_name;                 // shm name; empty = "dhs-memd-<pid>"
};

// Counters of the daemon itself (the core's are in Counters), exported to Prometheus.
struct DaemonCounters {
  uint64_t messages = 0;          // inbound messages that reached a handler
  uint64_t hellos = 0;            // accepted Hellos
  uint64_t host_writes = 0;       // history pages confirmed by BackupComplete{order = 0}
  uint64_t host_write_failures = 0;
  uint64_t deferred_backups = 0;  // reclaimed pages the worker had only planned to keep (BackupComplete.deferred_pages)
  uint64_t send_failures = 0;     // orders that could not be sent (worker gone)
};

class Daemon {
 public:
  // Creates the run directory, the host-pool segment and binds memd.sock. Errors: InvalidArgument (bad options),
  // ResourceExhausted (/dev/shm too small for the pool), AlreadyExists (a live memd in the run dir, or the segment).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();  // closes the socket and removes the host-pool segment
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves messages and ticks until keep_going() is false (checked at least every tick).
  absl::Status Run(const std::function<bool()>& keep_going);
  // Serves at most one message (waiting up to `timeout`), then runs the tick if it is due.
  absl::Status ServeOnce(std::chrono::milliseconds timeout);

  // The latest Prometheus text (thread-safe).
  std::string metrics() const;
  const std::string& endpoint() const { return router_->endpoint(); }
  const HostPoolSegment& segment() const { return *segment_; }
  const ResidencyManager& core() const { return *core_; }

 private:
  struct GpuInfo {
    std::string peer;          // ROUTER routing id of the worker
    uint32_t page_rows = 0;    // p
    uint32_t capacity_pages = 0;
    uint32_t request_slots = 0;  // N (0: unlimited)
    uint64_t epoch = 0;
    std::set<SlotIndex> used_slots;
  };
  struct RequestInfo {
    GpuId gpu = 0;
    uint64_t admit_sequence = 0;  // the AdmitRequest's sequence, repeated by its Grant/Wait/Reject
    SlotIndex slot = 0;
  };
  // One wire order in flight (ReclaimOrder or PopulateOrder).
  struct WireOrder {
    bool reclaim = true;
    GpuId gpu = 0;
    RequestId request = 0;
    ReclaimId reclaim_id = 0;
    std::map<PageIndex, CopyId> copies;  // GPU page -> backup (reclaim) or population copy not yet reported
    bool withdrawn = false;              // the core emitted its WithdrawOrder
    bool readers_done = false;           // the worker's ReadersDone arrived before the core withdrew
  };

  Daemon(DaemonOptions options, std::unique_ptr<HostPoolSegment> segment, std::unique_ptr<RouterServer> router,
         std::unique_ptr<ResidencyManager> core);
  void Register();
  absl::StatusOr<std::string> OnHello(const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnAdmit(const Message& m, std::string_view peer);
  absl::StatusOr<std::string> OnBackupComplete(const Message& m);
  absl::StatusOr<std::string> OnReadersDone(const Message& m);
  absl::StatusOr<std::string> OnReadyPublish(const Message& m);
  absl::StatusOr<std::string> OnComplete(const Message& m);
  absl::StatusOr<std::string> OnIntrospect(const Message& m);
  void Tick();
  void FlushOrders();
  void SendToGpu(GpuId gpu, const std::string& bytes);
  void PublishMetrics();

  DaemonOptions options_;
  std::unique_ptr<HostPoolSegment> segment_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<ResidencyManager> core_;
  std::unique_ptr<Server> server_;
  std::map<GpuId, GpuInfo> gpus_;
  std::map<RequestId, RequestInfo> requests_;
  std::map<uint64_t, WireOrder> orders_;            // wire order id -> order
  std::map<ReclaimId, uint64_t> reclaim_orders_;    // core reclaim -> wire order id
  uint64_t next_order_ = 1;
  uint64_t next_sequence_ = 1;
  DaemonCounters counters_;
  std::chrono::steady_clock::time_point next_tick_, next_retry_;
  mutable std::mutex metrics_mu_;
  std::string metrics_;
};

}  // namespace dhs::memd
