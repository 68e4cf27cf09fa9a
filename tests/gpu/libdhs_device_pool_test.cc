// tests/gpu/libdhs_device_pool_test.cc: libdhs's CUDA backend over an engine's own pool, against a real memd ($MEMD):
// plain device memory (cudaMalloc, as a framework's CUDA tensor: never host-visible, so every append, backup, keep copy
// and host recovery must be the device's copies and the resolver kernel's reads) and managed memory
// (cudaMallocManaged). The pool is zeroed at open; each resolved row is copied back with cudaMemcpy from the engine's
// pool at its location and compared with the bytes appended, before and after memd reclaims the request's optional
// pages. Resident mode refuses device memory (its store writes from the host). Exits 77 (skipped) without a GPU. The
// library's own (managed) pool is libdhs_api_test's on the CUDA backend (tools/gpu_check.sh: DHS_TEST_BACKEND=cuda).
#include <dhs/dhs.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"
#include "tests/libdhs/libdhs_fixture.h"

namespace {

using namespace dhs::testing::libdhs;  // libdhs_api_test's shape, row pattern, Config and MemdFixture

// The CUDA backend over the engine's own pool; memd started for each test.
class LibdhsOnGpu : public MemdFixture {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartMemd()); }
  void TearDown() override {
    MemdFixture::TearDown();  // the worker closes before its pool is freed
    w_ = nullptr;
    if (pool_ != nullptr) cudaFree(pool_);
  }
  dhs_worker_config CudaConfig(uint32_t mode) const {
    dhs_worker_config c = Config(dir_.path(), 12);  // M = 12 optional pages
    c.mode = mode;
    c.backend = DHS_BACKEND_CUDA;
    return c;
  }
  // Opens the worker over an engine pool of dhs_pool_bytes_needed bytes, cudaMalloc'd (`managed` false) or
  // cudaMallocManaged, filled with 0xAB (the open must zero it); the open's status.
  int OpenOverDeviceMemory(dhs_worker_config c, bool managed = false) {
    uint64_t need = 0;
    EXPECT_EQ(dhs_pool_bytes_needed(&c, &need), DHS_OK);
    if (managed) {
      GPU_CHECK(cudaMallocManaged(&pool_, need));
    } else {
      GPU_CHECK(cudaMalloc(&pool_, need));  // 256-byte aligned
    }
    GPU_CHECK(cudaMemset(pool_, 0xAB, need));
    GPU_CHECK(cudaDeviceSynchronize());
    pool_bytes_ = need;
    c.engine_pool = pool_;
    c.engine_pool_bytes = need;
    return dhs_worker_open(&c, &w_);
  }
  // Every byte of the engine's pool, copied back from the device.
  std::vector<uint8_t> PoolBytes() const {
    std::vector<uint8_t> bytes(pool_bytes_);
    GPU_CHECK(cudaMemcpy(bytes.data(), pool_, pool_bytes_, cudaMemcpyDefault));
    return bytes;
  }
  // Resolves `sel` of `id` on each source and copies every located row back from the engine's pool (cudaMemcpy).
  void ExpectRows(uint64_t id, const std::vector<int64_t>& sel) {
    ExpectRowsAt(id, sel, id, pool_bytes_, [&](int64_t at, uint8_t* row) {
      GPU_CHECK(cudaMemcpy(row, static_cast<uint8_t*>(pool_) + at, kRow, cudaMemcpyDefault));
    });
  }

  void* pool_ = nullptr;
  uint64_t pool_bytes_ = 0;
};

struct PoolCase {
  uint32_t mode;
  bool managed;  // cudaMallocManaged, else cudaMalloc
};
class DevicePool : public LibdhsOnGpu, public ::testing::WithParamInterface<PoolCase> {};

// ForcedReclaimKeepsRowsExact (libdhs_api_test) over device memory: A (64 rows) keeps or backs up its pages, B's
// admission needs A's optional pages (required 5 each; M = 12), memd reclaims A, and A's old rows then come from the
// host pool through the kernel's mapped reads: the same bytes, read back from the engine's device memory.
TEST_P(DevicePool, RowsAreExactBeforeAndAfterAReclaim) {
  ASSERT_EQ(OpenOverDeviceMemory(CudaConfig(GetParam().mode), GetParam().managed), DHS_OK) << dhs_worker_errmsg(w_);
  const std::vector<uint8_t> zeroed = PoolBytes();
  EXPECT_EQ(std::count(zeroed.begin(), zeroed.end(), 0), static_cast<std::ptrdiff_t>(zeroed.size()))
      << "the open left bytes of the engine's pool unzeroed";
  dhs_pool_desc pd{};
  pd.struct_size = sizeof pd;
  pd.kind = DHS_POOLS_ENGINE;
  pd.base = pool_;
  pd.bytes = pool_bytes_;
  ASSERT_EQ(dhs_pools_register(w_, &pd), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(pd.row_bytes, kRow);
  EXPECT_EQ(Stats()["device"]["backend"], "cuda");
  EXPECT_EQ(Stats()["device"]["resolver"], "kernel");

  const uint64_t a = SubmitGranted(64, 80);
  ASSERT_EQ(Append(a, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  for (int i = 0; i < 50; ++i) {  // the keep copies and backups complete
    dhs_event ev[4];
    size_t got = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &got), DHS_OK);
    ::poll(nullptr, 0, 2);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {0, 17, 33, 63, -1}));

  uint64_t b = 0;
  // Adaptive mode kept A's pages on the GPU, so memd reclaims them for B; hisparse kept none, and B fits anyway.
  ASSERT_NO_FATAL_FAILURE(SubmitReclaiming(a, &b, /*expect_reclaim=*/GetParam().mode == DHS_MODE_ADAPTIVE));
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {1, 2, 3, 18, 40, 41, 5, 6}));
  const nlohmann::json stats = Stats();
  // At least positions 1, 2, 3, 5, 6 and 18 of both sources (not in the tail, not in the hot cache before): from host.
  EXPECT_GE(stats["census"]["host"].get<uint64_t>(), 12u) << stats.dump();
  ASSERT_EQ(Append(b, 0, 16), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(b, {0, 15}));
  EXPECT_EQ(dhs_request_complete(w_, a), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;
}

INSTANTIATE_TEST_SUITE_P(Pools, DevicePool,
                         ::testing::Values(PoolCase{DHS_MODE_ADAPTIVE, false}, PoolCase{DHS_MODE_HISPARSE, false},
                                           PoolCase{DHS_MODE_ADAPTIVE, true}),
                         [](const ::testing::TestParamInfo<PoolCase>& i) {
                           return std::string(i.param.mode == DHS_MODE_ADAPTIVE ? "Adaptive" : "Hisparse") +
                                  (i.param.managed ? "Managed" : "DeviceMemory");
                         });

// Resident mode's store writes its rows from the host: device memory is refused with the reason, nothing left open,
// and the GPU's worker opens afterwards over the library's own (managed) pool.
TEST_F(LibdhsOnGpu, ResidentModeRefusesDeviceMemory) {
  EXPECT_EQ(OpenOverDeviceMemory(CudaConfig(DHS_MODE_RESIDENT)), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("resident mode"), std::string::npos) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_worker_close(w_), DHS_OK);
  const dhs_worker_config c = CudaConfig(DHS_MODE_RESIDENT);
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(Stats()["device"]["backend"], "cuda");
}

}  // namespace

int main(int argc, char** argv) {
  dhs::gpu::ExitUnlessGpu("libdhs_device_pool_test");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
