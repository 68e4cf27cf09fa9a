// workerd/device/cpu_device.h: the CPU device backend (brief §9): device pools in their own arenas, copies
// completed asynchronously by one copy thread (in dependency order, not issue order, like independent streams),
// reader tracking in memory.
//
// Fast path: a batch issued with every dependency already done, that the hook lets run, while no other batch is
// running or runnable, is executed on the issuing thread before the call returns (its event may already be done).
// The copy engine stays one serial engine: batches still execute one at a time and in the order the copy thread
// would run them (a runnable queued batch goes first), and the copy thread never runs one while an issuing thread
// does. This removes the two thread hand-offs (issue -> copy thread -> waiter) that dominated small batches. Batches
// of more than inline_limit bytes (SetInlineLimit; default kDefaultInlineLimit) always go to the copy thread, so a
// large copy the issuer does not wait for at once still overlaps the issuer's work.
//
// Link model (optional, off by default; link_model.h): host<->device batches complete when a modelled PCIe link
// would have delivered them. The bytes still move at once; only the event's completion (Done, Status, Wait) waits
// for the modelled time, and Wait sleeps until then rather than spinning.
//
// Asynchronous mode (issue 28; AsyncDeviceConfig, off by default): the device behaves like a GPU whose streams run
// behind the host. Time is counted in device steps: every copy issued, every BeginReaders / EndReaders, and every
// poll (Done, Wait) of one of its pending events from outside the device is one step. A batch executes (its bytes
// move, read from its source and written to its destination at that moment) and completes 1..copy_steps_max steps
// after it became runnable, and a reader ended by EndReaders really ends reader_steps_min..reader_steps_max steps
// later (the fences waiting for it complete then; ReadersBusy stays true until then); the delays are drawn from a
// generator seeded by `seed`, so the same sequence of calls gives the same schedule. Wait completes what its event
// waits for at once, as a GPU synchronizing on one event: its batch and the batches it depends on run, the readers
// of the fences among them end (those their owner ended); other readers keep reading. Nothing runs on the copy thread and there is no fast path. Checks (read hazards,
// ReadHazards): a batch that writes bytes a reader still reads, and a range Freed while a reader still reads it,
// are recorded (a Freed range is filled with kPoisonByte in any case) (or abort the process, fatal_hazards): on a GPU that
// reader would return foreign bytes. A Wait that cannot progress for stuck_after (its event waits for readers their
// owner has not ended, a held copy, or another device's event) returns DEADLINE_EXCEEDED naming what it waits for,
// instead of hanging; at once when it waits for a reader the waiting thread began and has not ended (a wait that can
// never end). The link model is not applied in this mode.
//
// Test seam: a CopyHook decides, when a batch is issued, whether it runs, is held (until ReleaseHeld) or fails (its
// event reports the failure; no byte is written).
//
// Thread-safety: every method is thread-safe. The hook runs on the issuing thread and must not call into the device.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <utility>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "workerd/device/device.h"
#include "workerd/device/device_bookkeeping.h"
#include "workerd/device/link_model.h"

namespace dhs {

enum class CopyFate { kRun, kHold, kFail };

// The asynchronous mode (see the header comment). Delays are in device steps, drawn uniformly in [min, max].
struct AsyncDeviceConfig {
  bool enabled = false;
  uint64_t seed = 1;
  uint32_t copy_steps_max = 4;     // a runnable batch completes 1..copy_steps_max steps later
  uint32_t reader_steps_min = 4;   // an ended reader really ends reader_steps_min..reader_steps_max steps later
  uint32_t reader_steps_max = 32;
  bool fatal_hazards = false;      // a read hazard aborts the process (workerd) instead of being recorded (tests)
  absl::Duration stuck_after = absl::Seconds(10);  // a Wait without progress this long fails (DEADLINE_EXCEEDED)
};
// The byte a range freed while read is filled with (recognisable in a dump: 0xDB, "dead bytes").
inline constexpr uint8_t kPoisonByte = 0xDB;

// What the hook sees of one issued batch.
struct CopyInfo {
  uint64_t id = 0;                  // issue order, from 1
  CopyKind kind = CopyKind::kHostToDevice;
  std::vector<DeviceRange> device;  // the device side of every op (dst for H2D and D2D, src for D2H)
};
using CopyHook = std::function<CopyFate(const CopyInfo&)>;

class CpuDevice final : public Device {
 public:
  CpuDevice();
  // With a link model (ignored when !link.enabled); `clock` (default RealLinkClock()) must outlive the device and
  // every event it returned.
  explicit CpuDevice(const LinkModelConfig& link, const LinkClock* clock = RealLinkClock());
  // In the asynchronous mode when async.enabled (the link model is then not used).
  explicit CpuDevice(const AsyncDeviceConfig& async);
  ~CpuDevice() override;  // waits for runnable copies; held copies are failed
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  absl::StatusOr<PoolId> AllocatePool(uint64_t bytes) override;
  // libdhs's pools in one region (issue 25: the KV pool and its staging arenas, the engine's memory or one pool of this
  // device): each call queues one region of `bytes` bytes at `base`, memory the caller owns (never unmapped here; it
  // must outlive the device); the next AllocatePools take the queued regions in order. An AllocatePool that asks for
  // more than its region's bytes fails with INVALID_ARGUMENT (the region is used up either way).
  void UseCallerMemoryForNextPool(uint8_t* base, uint64_t bytes);
  uint64_t PoolBytes(PoolId pool) const override;
  CopyEvent CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) override;
  CopyEvent CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) override;
  CopyEvent CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops,
                               std::span<const CopyEvent> after) override;
  ReaderId BeginReaders(std::span<const DeviceRange> ranges) override;
  void EndReaders(ReaderId reader) override;
  bool ReadersBusy(const DeviceRange& range) const override;
  CopyEvent ReadersFence(const DeviceRange& range) override;
  uint8_t* HostVisible(PoolId pool, Location offset) override;
  void Freed(const DeviceRange& range) override;
  absl::Status ReadHazards() const override;

  // --- test seam ---
  void SetCopyHook(CopyHook hook);
  std::vector<uint64_t> HeldCopies() const;           // ids of held batches, in issue order
  void ReleaseHeld(uint64_t id, bool fail = false);   // lets a held batch run (or fail it)
  void ReleaseAllHeld();
  void WaitIdle();                                     // until no runnable batch is queued or running
  uint64_t CopiesIssued() const;
  // Largest batch (sum of its ops' bytes) the fast path runs on the issuing thread; 0: every batch goes to the copy
  // thread (the behaviour before the fast path).
  static constexpr uint64_t kDefaultInlineLimit = uint64_t{4} << 20;
  void SetInlineLimit(uint64_t bytes);
  const LinkModelConfig& link_model() const { return link_config_; }
  const AsyncDeviceConfig& async_mode() const { return async_; }
  uint64_t AsyncSteps() const;  // device steps counted so far (asynchronous mode; 0 otherwise)

 private:
  class State;
  using Op = CopyOp;
  using Job = CopyJob<State>;

  uint8_t* Resolve(const DeviceRange& r) const;  // nullptr when out of range
  // One copy batch: its ops as CopyOps (`to_op`; a null side makes the batch invalid), its device ranges for the hook
  // and the asynchronous mode (`device_side`), then Submit.
  template <class Copy, class DeviceSide, class ToOp>
  CopyEvent Enqueue(CopyKind kind, std::span<const Copy> ops, DeviceSide device_side, ToOp to_op,
                    std::span<const CopyEvent> after);
  // `id` and `hook` were taken under mu_ with the ops; `device` is filled only when there is a hook.
  CopyEvent Submit(CopyKind kind, uint64_t id, CopyHook hook, std::vector<Op> ops, std::vector<DeviceRange> device,
                   bool valid, std::span<const CopyEvent> after);
  bool AnyRunnable() const;  // mu_ held: a queued batch not held whose dependencies are all done
  // Executes one batch (dependency check, bytes, completion with the link model); called with `l` unlocked and
  // busy_ set by the caller; returns with `l` locked.
  void Execute(Job& job, std::unique_lock<std::mutex>& l);
  void CopyLoop();
  CpuDevice(const LinkModelConfig& link, const LinkClock* clock, const AsyncDeviceConfig& async);

  // --- asynchronous mode (mu_ held unless said otherwise) ---
  class AsyncLink;  // how an event reaches its device to count a poll as a step (the device may be gone)
  // One step: time moves on by one, due readers end, due runnable batches execute. Returns whether work is still
  // waiting for time (a batch or a reader end scheduled later), or anything completed in this step.
  bool StepLocked();
  bool Step();  // takes mu_
  bool ForceLocked(const EventState* state, int depth);  // AsyncLink::Force
  bool EndNowLocked(ReaderId r);  // ends reader r at once if its owner ended it
  bool WaitsForOwnOpenReaderLocked(const EventState* state, std::thread::id self, int depth) const;
  uint32_t Draw(uint32_t lo, uint32_t hi);  // uniform in [lo, hi], from the seeded generator
  void ExecuteAsync(Job& job);
  void CheckWrite(const Job& job);  // read hazards of the batch's destination ranges
  void Hazard(std::string what);
  std::string DescribeReader(ReaderId r) const;
  std::string DescribeWait(const EventState* state) const;  // what a stuck event waits for

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // A pool is an anonymous private mapping (mmap, MAP_NORESERVE): zero-filled by the kernel, each page taken only
  // when first written, so a multi-GB budget starts in milliseconds and takes memory only where rows are written,
  // instead of the seconds a zero-filling std::vector takes to write every byte (issue 22: start-up that scales).
  // Not calloc: with MALLOC_PERTURB_ set (meson test sets it) glibc's calloc writes every byte.
  struct Pool {
    Pool() = default;
    Pool(uint8_t* d, uint64_t n, bool own = true) : data(d), bytes(n), owned(own) {}
    Pool(Pool&& o) noexcept
        : data(std::exchange(o.data, nullptr)), bytes(std::exchange(o.bytes, 0)), owned(o.owned) {}
    Pool& operator=(Pool&&) = delete;
    ~Pool();
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    bool owned = true;  // false: the caller's memory (UseCallerMemoryForNextPool)
  };
  std::vector<Pool> pools_;
  std::deque<std::pair<uint8_t*, uint64_t>> caller_pools_;  // UseCallerMemoryForNextPool: (base, bytes), in order
  std::deque<Job> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a batch is executing (on the copy thread or, fast path, on an issuing thread)
  int idle_waiters_ = 0;  // threads in WaitIdle
  uint64_t inline_limit_ = kDefaultInlineLimit;
  uint64_t next_copy_id_ = 1;
  CopyHook hook_;
  ReaderFences<State> readers_;
  const LinkModelConfig link_config_;
  const LinkClock* const clock_;
  LinkModel link_;                              // only whoever set busy_ (the executing thread)
  std::vector<absl::Time> link_pending_;        // completion times still ahead, a min-heap; under mu_
  const AsyncDeviceConfig async_;
  std::shared_ptr<AsyncLink> async_link_;  // async mode only
  uint64_t step_ = 0;
  struct Ending {
    ReaderId reader;
    uint64_t ended_at;  // step of its EndReaders
    uint64_t due;       // step at which it really ends
  };
  std::vector<Ending> ending_;                   // readers ended by their owner, still reading
  std::map<ReaderId, uint64_t> reader_begun_;    // reader -> step of its BeginReaders (async mode)
  std::map<ReaderId, std::thread::id> reader_thread_;  // reader -> the thread that began it (async mode)
  std::map<uint64_t, uint64_t> job_due_;          // copy id -> step at which it executes (once runnable)
  uint64_t rng_state_ = 0;
  uint64_t hazard_count_ = 0;
  std::vector<std::string> hazards_;             // the first few, for ReadHazards
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace dhs
