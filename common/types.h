// common/types.h: the identifiers and units every component shares (brief §2 vocabulary).
//
// Units are part of the names: *_rows, *_pages, *_bytes, *_positions. A location is a 64-bit byte
// offset into a device pool (brief §5); kNoLocation (-1) marks an empty selection entry.
#pragma once

#include <cstdint>

namespace dhs {

using RequestId = uint64_t;   // request r; unique per node for the life of memd (0 and 2^64-1 are reserved)
using GpuId = uint32_t;       // index of a GPU on the node (one workerd each), < kMaxGpus
using SourceId = uint32_t;    // KV source (a physical store of rows), brief §2
using SlotIndex = uint32_t;   // request slot i on a worker
using Position = int64_t;     // token position t; -1 = empty selection entry
using RowIndex = int64_t;     // row s of a source (m positions per row; m = 1 unless compressed)
using PageIndex = uint32_t;   // page number inside one pool (GPU page pool or host segment)
using Location = int64_t;     // byte offset into a device pool; -1 = none

inline constexpr Position kNoPosition = -1;
// GPUs per node: a worker's node request ids carry its GPU in their top 16 bits (workerd/worker.h), and the longest
// socket name a node creates is worker-65535 (CheckSocketPaths, common/transport.h).
inline constexpr uint32_t kMaxGpus = 1u << 16;

// Node request ids (docs/protocol.md, "Request ids"): every id memd sees is (gpu << 48) | ((epoch - 1) mod 2^24) << 24
// | n, n in [1, 2^24). The worker of GPU g gives them (workerd/request_book.h: RequestBook::NodeRequestId); memd
// refuses an id outside the range of the GPU whose worker sent it (memd/daemon.h), so no worker can name another GPU's
// request.
// 24 epoch bits: a GPU's worker may be restarted 16,777,216 times (one restart every 10 s for 5 years) before ids of
// two epochs could meet (8 bits wrapped after 256 restarts); n's 24 bits hold more requests than one worker has in
// flight (--submit-queue <= 2^20 waiting, --slots <= 4096 active).
inline constexpr uint64_t kNodeRequestCounterEnd = uint64_t{1} << 24;  // n < this
inline constexpr uint64_t kNodeRequestEpochs = uint64_t{1} << 24;      // epochs an id tells apart
// The node request id `n` of GPU `gpu` (< kMaxGpus) in its epoch `epoch` (>= 1; HelloReply.worker_epoch).
// n in [1, kNodeRequestCounterEnd); larger values would spill into the epoch's bits (the caller's duty).
constexpr RequestId MakeNodeRequestId(GpuId gpu, uint64_t epoch, uint64_t n) {
  return uint64_t{gpu} << 48 | ((epoch - 1) % kNodeRequestEpochs) << 24 | n;
}
// The epoch node request id `id` was given in, 1..2^24 (the id keeps epoch - 1 mod 2^24).
constexpr uint32_t EpochOfNodeRequestId(RequestId id) {
  return static_cast<uint32_t>((id >> 24) % kNodeRequestEpochs) + 1;
}
// The GPU whose range holds node request id `id` (its top 16 bits; < kMaxGpus).
constexpr GpuId GpuOfNodeRequestId(RequestId id) { return static_cast<GpuId>(id >> 48); }
inline constexpr Location kNoLocation = -1;
inline constexpr SlotIndex kNoSlot = ~SlotIndex{0};  // no slot assigned (an admission still queued)

}  // namespace dhs
