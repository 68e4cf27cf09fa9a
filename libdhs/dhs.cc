// libdhs/dhs.cc: the C ABI of include/dhs/dhs.h over dhs::lib::EmbeddedWorker (the thin wrapper of LevelDB's c.cc):
// handles, argument checks of the C structs, one status mapping, the message per handle. No exception leaves a
// function here (each body runs inside Guard).
#include "dhs/dhs.h"

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libdhs/embedded_worker.h"

struct dhs_worker {
  std::mutex mu;
  std::unique_ptr<dhs::lib::EmbeddedWorker> worker;  // null: closed, or an open that failed
  bool closed = false;
  std::string message;  // the latest failed call's message ("" after a success)
  // $DHS_CHECK_INVARIANTS=1 at open (the fuzz target, tests): after every call the worker's invariants are checked
  // (EmbeddedWorker::CheckInvariants) and a broken one aborts the process with its name (a library defect).
  bool check_invariants = false;
};

namespace {

using dhs::lib::EmbeddedWorker;

// Every handle this library ever returned. A closed handle stays (its worker freed), so a use after close is
// recognised; a pointer that was never returned is not in the set.
std::mutex g_handles_mu;
std::unordered_set<const dhs_worker*> g_handles;

bool Known(const dhs_worker* w) {
  std::lock_guard<std::mutex> l(g_handles_mu);
  return g_handles.contains(w);
}

int ToCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return DHS_OK;
    case absl::StatusCode::kInvalidArgument: return DHS_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound: return DHS_ERR_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kAlreadyExists: return DHS_ERR_FAILED_PRECONDITION;
    case absl::StatusCode::kOutOfRange: return DHS_ERR_OUT_OF_RANGE;
    case absl::StatusCode::kResourceExhausted: return DHS_ERR_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: return DHS_ERR_UNAVAILABLE;
    case absl::StatusCode::kUnimplemented: return DHS_ERR_UNIMPLEMENTED;
    case absl::StatusCode::kDataLoss: return DHS_ERR_DATA_LOSS;
    case absl::StatusCode::kAborted: return DHS_ERR_ABORTED;
    default: return DHS_ERR_INTERNAL;
  }
}

int Fail(dhs_worker* w, int code, std::string message) {
  if (w != nullptr) w->message = std::move(message);
  return code;
}

int Done(dhs_worker* w, const absl::Status& s) {
  if (s.ok()) {
    w->message.clear();
    return DHS_OK;
  }
  return Fail(w, ToCode(s), std::string(s.message()));
}

// Runs `body(worker)` on handle `w` under its mutex, after the handle checks; catches every exception.
template <typename Body>
int Guard(dhs_worker* w, const char* what, Body body) {
  if (w == nullptr) return DHS_ERR_INVALID_ARGUMENT;
  if (!Known(w)) return DHS_ERR_BAD_HANDLE;
  std::lock_guard<std::mutex> l(w->mu);
  if (w->closed) return Fail(w, DHS_ERR_CLOSED, absl::StrCat(what, ": the worker was closed"));
  // A handle whose open failed keeps the open's message (why) for dhs_worker_errmsg; every call is refused.
  if (w->worker == nullptr) return DHS_ERR_FAILED_PRECONDITION;
  try {
    const int rc = body(*w->worker);
    if (w->check_invariants && w->worker != nullptr) {
      if (const absl::Status s = w->worker->CheckInvariants(); !s.ok()) {
        std::fprintf(stderr, "libdhs: after %s: invariant broken: %s\n", what, s.ToString().c_str());
        std::abort();
      }
    }
    return rc;
  } catch (const std::bad_alloc&) {
    return Fail(w, DHS_ERR_RESOURCE_EXHAUSTED, absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return Fail(w, DHS_ERR_INTERNAL, absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return Fail(w, DHS_ERR_INTERNAL, absl::StrCat(what, ": unknown exception"));
  }
}

// A NUL-terminated text (`text()`) into the caller's buf of `capacity` bytes; *needed = its bytes with the NUL.
// Errors: INVALID_ARGUMENT (needed NULL, or buf NULL with a capacity), RESOURCE_EXHAUSTED (capacity below *needed:
// nothing written but *needed).
template <typename Text>
int CopyText(dhs_worker* w, const char* what, char* buf, size_t capacity, size_t* needed, Text text) {
  if (needed == nullptr || (buf == nullptr && capacity > 0)) {
    return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat(what, ": needed or buf is NULL"));
  }
  const std::string s = text();
  *needed = s.size() + 1;
  if (capacity < *needed) {
    return Fail(w, DHS_ERR_RESOURCE_EXHAUSTED, absl::StrCat(what, ": ", *needed, " bytes needed, capacity ", capacity));
  }
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return Done(w, absl::OkStatus());
}

// A versioned struct: non-null and of this header's size.
template <typename T>
int CheckStruct(dhs_worker* w, const T* p, const char* name) {
  if (p == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat(name, " is NULL"));
  if (p->struct_size != sizeof(T)) {
    return Fail(w, DHS_ERR_VERSION, absl::StrCat(name, ".struct_size is ", p->struct_size, "; this library (ABI ",
                                                 DHS_ABI_MAJOR, ".", DHS_ABI_MINOR, ") takes ", sizeof(T)));
  }
  return DHS_OK;
}

// The C config as the C++ core's (its checks are the core's; the enum fields are checked by the caller). The 1.1
// fields are read only from a 1.1-sized struct.
dhs::lib::EmbeddedConfig ToEmbedded(const dhs_worker_config& config) {
  dhs::lib::EmbeddedConfig c;
  c.run_dir = config.run_dir != nullptr ? config.run_dir : "";
  c.gpu = config.gpu;
  c.mode = config.mode == DHS_MODE_HISPARSE   ? dhs::WorkerMode::kHisparse
           : config.mode == DHS_MODE_ADAPTIVE ? dhs::WorkerMode::kAdaptive
                                              : dhs::WorkerMode::kResident;
  c.sources = config.sources;
  c.row_bytes = config.row_bytes;
  c.indexers = config.indexers;
  c.index_key_bytes = config.index_key_bytes;
  c.page_rows = config.page_rows;
  c.top_k = config.top_k;
  c.hot_rows = config.hot_rows;
  c.tail_rows = config.tail_rows;
  c.slots = config.slots;
  c.hbm_budget_bytes = config.hbm_budget_bytes;
  c.connect_timeout_ms = config.connect_timeout_ms == 0 ? 5000 : config.connect_timeout_ms;
  if (config.struct_size >= DHS_WORKER_CONFIG_SIZE_1_1) {  // the 1.1 fields (a 1.0 struct ends before them)
    c.engine_pool = static_cast<uint8_t*>(config.engine_pool);
    c.engine_pool_bytes = config.engine_pool_bytes;
  }
  if (config.struct_size >= DHS_WORKER_CONFIG_SIZE_1_2) c.model_fingerprint = config.model_fingerprint;  // 1.2
  // 1.3: the source groups, `sources` entries (read only when sources is in range: the core refuses it otherwise).
  if (config.struct_size >= DHS_WORKER_CONFIG_SIZE_1_3 && config.source_groups != nullptr && config.sources >= 1 &&
      config.sources <= 4096) {
    c.source_groups.assign(config.source_groups, config.source_groups + config.sources);
  }
  if (config.struct_size >= DHS_WORKER_CONFIG_SIZE_1_5) {  // 1.5: staging arenas
    c.staging_arenas = config.staging_arenas;
    c.round_queries = config.round_queries;
  }
  if (config.struct_size >= sizeof(dhs_worker_config)) {  // 1.8: consumers, fetched rows, the drafter's ring
    if (config.source_consumers != nullptr && config.sources >= 1 && config.sources <= 4096) {
      c.source_consumers.assign(config.source_consumers, config.source_consumers + config.sources);
    }
    if (config.fetched_rows_per_token != 0) c.fetched_rows_per_token = config.fetched_rows_per_token;
    c.draft_ring_rows = config.draft_ring_rows;
    c.draft_bytes_per_row = config.draft_bytes_per_row;
    c.drafter_window = config.drafter_window;
  }
  return c;
}

// The sizes dhs_worker_config had: this header's (1.8), 1.5's (to 1.7), 1.3's (and 1.4's), 1.2's, 1.1's and 1.0's.
bool KnownMode(uint32_t mode) {
  return mode == DHS_MODE_HISPARSE || mode == DHS_MODE_ADAPTIVE || mode == DHS_MODE_RESIDENT;
}

bool KnownConfigSize(uint32_t size) {
  return size == sizeof(dhs_worker_config) || size == DHS_WORKER_CONFIG_SIZE_1_5 ||
         size == DHS_WORKER_CONFIG_SIZE_1_3 || size == DHS_WORKER_CONFIG_SIZE_1_2 ||
         size == DHS_WORKER_CONFIG_SIZE_1_1 || size == DHS_WORKER_CONFIG_SIZE_1_0;
}
static_assert(sizeof(dhs_worker_config) == DHS_WORKER_CONFIG_SIZE_1_8 &&
              offsetof(dhs_worker_config, reserved) + sizeof(uint32_t) == DHS_WORKER_CONFIG_SIZE_1_8 &&
              sizeof(dhs_worker_config) > DHS_WORKER_CONFIG_SIZE_1_5 &&
              offsetof(dhs_worker_config, source_consumers) == DHS_WORKER_CONFIG_SIZE_1_5 &&
              DHS_WORKER_CONFIG_SIZE_1_5 > DHS_WORKER_CONFIG_SIZE_1_3 &&
              sizeof(dhs_worker_config) > DHS_WORKER_CONFIG_SIZE_1_3 &&
              DHS_WORKER_CONFIG_SIZE_1_3 > DHS_WORKER_CONFIG_SIZE_1_2 &&
              DHS_WORKER_CONFIG_SIZE_1_2 > DHS_WORKER_CONFIG_SIZE_1_1 &&
              DHS_WORKER_CONFIG_SIZE_1_1 > DHS_WORKER_CONFIG_SIZE_1_0);

int CheckConfigStruct(dhs_worker* w, const dhs_worker_config* config) {
  if (config == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_worker_config is NULL");
  if (!KnownConfigSize(config->struct_size)) {
    return Fail(w, DHS_ERR_VERSION, absl::StrCat("dhs_worker_config.struct_size is ", config->struct_size,
                                                 "; this library (ABI ", DHS_ABI_MAJOR, ".", DHS_ABI_MINOR,
                                                 ") takes ", sizeof(dhs_worker_config), " (1.8), ",
                                                 DHS_WORKER_CONFIG_SIZE_1_5, " (1.5 .. 1.7), ",
                                                 DHS_WORKER_CONFIG_SIZE_1_3, " (1.3, 1.4), ",
                                                 DHS_WORKER_CONFIG_SIZE_1_2, " (1.2), ",
                                                 DHS_WORKER_CONFIG_SIZE_1_1, " (1.1) or ",
                                                 DHS_WORKER_CONFIG_SIZE_1_0, " (1.0)"));
  }
  if (config->struct_size >= DHS_WORKER_CONFIG_SIZE_1_8 && config->reserved != 0) {
    return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_worker_config.reserved must be 0");
  }
  return DHS_OK;
}

}  // namespace

extern "C" {

uint32_t dhs_version(void) { return DHS_ABI_VERSION; }

const char* dhs_status_name(int status) {
  static const char* const kNames[] = {
      "DHS_OK", "DHS_ERR_INVALID_ARGUMENT", "DHS_ERR_VERSION", "DHS_ERR_BAD_HANDLE", "DHS_ERR_CLOSED",
      "DHS_ERR_NOT_FOUND", "DHS_ERR_FAILED_PRECONDITION", "DHS_ERR_OUT_OF_RANGE", "DHS_ERR_RESOURCE_EXHAUSTED",
      "DHS_ERR_UNAVAILABLE", "DHS_ERR_UNIMPLEMENTED", "DHS_ERR_DATA_LOSS", "DHS_ERR_ABORTED", "DHS_ERR_INTERNAL"};
  if (status < 0 || status >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return "DHS_ERR_UNKNOWN";
  return kNames[status];
}

int dhs_worker_open(const dhs_worker_config* config, dhs_worker** out) {
  if (out == nullptr) return DHS_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  dhs_worker* w = nullptr;
  try {
    w = new dhs_worker;
    {
      std::lock_guard<std::mutex> l(g_handles_mu);
      g_handles.insert(w);
    }
  } catch (...) {
    delete w;
    return DHS_ERR_RESOURCE_EXHAUSTED;
  }
  *out = w;
  std::lock_guard<std::mutex> l(w->mu);
  if (int rc = CheckConfigStruct(w, config); rc != DHS_OK) return rc;
  if ((config->abi_version >> 16) != DHS_ABI_MAJOR) {
    return Fail(w, DHS_ERR_VERSION, absl::StrCat("the caller speaks ABI ", config->abi_version >> 16, ".",
                                                 config->abi_version & 0xffff, "; this library speaks ",
                                                 DHS_ABI_MAJOR, ".", DHS_ABI_MINOR));
  }
  if (config->run_dir == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_worker_config: run_dir is NULL");
#ifndef DHS_HAVE_CUDA
  if (config->backend == DHS_BACKEND_CUDA) {
    return Fail(w, DHS_ERR_UNIMPLEMENTED,
                "dhs_worker_config: the CUDA backend is not offered: this libdhs was built without CUDA (meson -Dcuda)");
  }
#endif
  if (config->backend != DHS_BACKEND_CPU && config->backend != DHS_BACKEND_CUDA) {
    return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat("dhs_worker_config: backend ", config->backend,
                                                          " is not a dhs_backend"));
  }
  if (!KnownMode(config->mode)) {
    return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat("dhs_worker_config: mode ", config->mode,
                                                          " is not DHS_MODE_HISPARSE, DHS_MODE_ADAPTIVE or DHS_MODE_RESIDENT"));
  }
  try {
    dhs::lib::EmbeddedConfig c = ToEmbedded(*config);
    dhs::lib::RegionBackend backend = dhs::lib::kCpuRegion;
#ifdef DHS_HAVE_CUDA
    if (config->backend == DHS_BACKEND_CUDA) backend = dhs::lib::kCudaRegion;
#endif
    absl::StatusOr<std::unique_ptr<EmbeddedWorker>> opened = EmbeddedWorker::Open(c, backend);
    if (!opened.ok()) return Fail(w, ToCode(opened.status()), std::string(opened.status().message()));
    w->worker = *std::move(opened);
    const char* check = std::getenv("DHS_CHECK_INVARIANTS");
    w->check_invariants = check != nullptr && std::string_view(check) == "1";
  } catch (const std::bad_alloc&) {
    return Fail(w, DHS_ERR_RESOURCE_EXHAUSTED, "dhs_worker_open: out of memory");
  } catch (const std::exception& e) {
    return Fail(w, DHS_ERR_INTERNAL, absl::StrCat("dhs_worker_open: ", e.what()));
  }
  w->message.clear();
  return DHS_OK;
}

int dhs_pool_bytes_needed(const dhs_worker_config* config, uint64_t* bytes) {
  if (bytes == nullptr) return DHS_ERR_INVALID_ARGUMENT;
  if (int rc = CheckConfigStruct(nullptr, config); rc != DHS_OK) return rc;  // NULL, struct size, reserved
  if (!KnownMode(config->mode)) return DHS_ERR_INVALID_ARGUMENT;
  try {
    absl::StatusOr<dhs::lib::RegionLayout> region = dhs::lib::RegionOf(ToEmbedded(*config));  // the shape alone
    if (!region.ok()) return ToCode(region.status());
    *bytes = region->bytes;
    return DHS_OK;
  } catch (...) {
    return DHS_ERR_RESOURCE_EXHAUSTED;
  }
}

int dhs_worker_close(dhs_worker* w) {
  if (w == nullptr) return DHS_ERR_INVALID_ARGUMENT;
  if (!Known(w)) return DHS_ERR_BAD_HANDLE;
  std::lock_guard<std::mutex> l(w->mu);
  if (w->closed) return Fail(w, DHS_ERR_CLOSED, "dhs_worker_close: the worker was closed already");
  try {
    w->worker.reset();
  } catch (...) {
    w->worker.release();  // a destructor that threw: the worker is abandoned, never half-used
  }
  w->closed = true;
  w->message.clear();
  w->message.shrink_to_fit();
  return DHS_OK;
}

const char* dhs_worker_errmsg(const dhs_worker* w) {
  if (w == nullptr) return "dhs_worker_errmsg: NULL worker";
  if (!Known(w)) return "dhs_worker_errmsg: not a worker of this library";
  if (w->closed) return "the worker was closed";
  return w->message.c_str();
}

int dhs_worker_info_get(dhs_worker* w, dhs_worker_info* info) {
  return Guard(w, "dhs_worker_info_get", [&](EmbeddedWorker& e) {
    if (int rc = CheckStruct(w, info, "dhs_worker_info"); rc != DHS_OK) return rc;
    info->gpu = e.config().gpu;
    info->page_bytes = e.page_bytes();
    info->host_page_bytes = e.host_page_bytes();
    info->capacity_pages = e.capacity_pages();
    info->hot_rows = e.config().hot_rows;
    info->tail_rows = e.config().tail_rows;
    info->top_k = e.config().top_k;
    info->worker_epoch = e.worker_epoch();
    return Done(w, absl::OkStatus());
  });
}

int dhs_pools_register(dhs_worker* w, dhs_pool_desc* pools) {
  return Guard(w, "dhs_pools_register", [&](EmbeddedWorker& e) {
    if (int rc = CheckStruct(w, pools, "dhs_pool_desc"); rc != DHS_OK) return rc;
    if (pools->kind != DHS_POOLS_LIBRARY && pools->kind != DHS_POOLS_ENGINE) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat("dhs_pool_desc.kind ", pools->kind,
                                                            " is not a dhs_pool_kind"));
    }
    if ((pools->kind == DHS_POOLS_ENGINE) != e.engine_pool()) {
      return Fail(w, DHS_ERR_FAILED_PRECONDITION,
                  e.engine_pool() ? "dhs_pools_register: this worker was opened with an engine pool (DHS_POOLS_ENGINE)"
                                  : "dhs_pools_register: DHS_POOLS_ENGINE needs dhs_worker_config.engine_pool at open");
    }
    absl::StatusOr<std::span<uint8_t>> pool = e.Pool();
    if (!pool.ok()) return Done(w, pool.status());
    if (pools->kind == DHS_POOLS_ENGINE &&
        (pools->base != e.config().engine_pool || pools->bytes != e.config().engine_pool_bytes)) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT,
                  absl::StrCat("dhs_pools_register: base and bytes (", pools->bytes, ") are not the engine_pool given "
                               "at open (", e.config().engine_pool_bytes, " bytes)"));
    }
    pools->base = pool->data();
    pools->bytes = pools->kind == DHS_POOLS_ENGINE ? e.config().engine_pool_bytes : pool->size();
    pools->row_bytes = e.config().row_bytes;
    return Done(w, absl::OkStatus());
  });
}

int dhs_request_submit(dhs_worker* w, const dhs_request_desc* desc, uint64_t* request_id) {
  return Guard(w, "dhs_request_submit", [&](EmbeddedWorker& e) {
    // ABI 1.0's struct (up to resume_of) is still accepted: no chain, the default tenant, no session.
    if (desc == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_desc is NULL");
    if (desc->struct_size != sizeof(dhs_request_desc) && desc->struct_size != DHS_REQUEST_DESC_SIZE_1_0) {
      return Fail(w, DHS_ERR_VERSION, absl::StrCat("dhs_request_desc.struct_size is ", desc->struct_size,
                                                   "; this library (ABI ", DHS_ABI_MAJOR, ".", DHS_ABI_MINOR,
                                                   ") takes ", sizeof(dhs_request_desc), " (1.1) or ",
                                                   DHS_REQUEST_DESC_SIZE_1_0, " (1.0)"));
    }
    if (request_id == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_submit: request_id is NULL");
    if (desc->reserved != 0) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_desc.reserved must be 0");
    dhs::lib::SubmitPrefix prefix;
    if (desc->struct_size == sizeof(dhs_request_desc)) {  // the 1.1 fields (a 1.0 struct ends before them)
      if (desc->tenant != nullptr) {
        const size_t n = ::strnlen(desc->tenant, 256);
        if (n > 255) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_desc.tenant is longer than 255 bytes");
        prefix.tenant.assign(desc->tenant, n);
      }
      prefix.session = desc->session;
      if (desc->token_count > desc->input_rows) {
        return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat("dhs_request_desc.token_count ", desc->token_count,
                                                              " is beyond input_rows ", desc->input_rows));
      }
      if (desc->tokens == nullptr && (desc->token_count > 0 || desc->block_tokens > 0)) {
        return Fail(w, DHS_ERR_INVALID_ARGUMENT,
                    "dhs_request_desc.tokens is NULL with token_count or block_tokens above 0");
      }
      if (desc->block_ids == nullptr && desc->block_id_count > 0) {
        return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_desc.block_ids is NULL with block_id_count above 0");
      }
      if (desc->tokens != nullptr) prefix.tokens = std::span<const int32_t>(desc->tokens, desc->token_count);
      if (desc->block_ids != nullptr) {
        prefix.block_ids = std::span<const uint64_t>(desc->block_ids, desc->block_id_count);
      }
      prefix.block_tokens = desc->block_tokens;
    }
    absl::StatusOr<uint64_t> id = e.Submit(desc->input_rows, desc->max_rows, desc->resume_of, prefix);
    if (!id.ok()) return Done(w, id.status());
    *request_id = *id;
    return Done(w, absl::OkStatus());
  });
}

int dhs_worker_poll(dhs_worker* w, dhs_event* events, size_t capacity, size_t* count) {
  return Guard(w, "dhs_worker_poll", [&](EmbeddedWorker& e) {
    if (count == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_worker_poll: count is NULL");
    *count = 0;
    if (events == nullptr && capacity > 0) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_worker_poll: events is NULL with a capacity above 0");
    }
    const absl::Status s = e.Poll();
    std::deque<dhs::lib::EmbeddedEvent>& q = e.events();
    size_t n = 0;
    for (; n < capacity && !q.empty(); ++n) {
      const dhs::lib::EmbeddedEvent& ev = q.front();
      dhs_event& out = events[n];
      std::memset(&out, 0, sizeof(out));
      out.kind = ev.kind;
      out.code = ToCode(ev.status);
      out.request = ev.request;
      out.slot = ev.slot;
      out.value = ev.value;
      out.pages = ev.pages;
      out.import_first = 0;
      out.import_pages = ev.import_pages;
      out.shared_pages = ev.shared_pages;
      const absl::string_view m = ev.status.message();
      // An OK status's message is an empty view whose data() may be NULL: memcpy's arguments must not be (UBSan, found
      // by the libFuzzer run of fuzz/libdhs_fuzz.cc; corpus crash-655a24bf...).
      if (!m.empty()) std::memcpy(out.message, m.data(), std::min(m.size(), sizeof(out.message) - 1));
      q.pop_front();
    }
    *count = n;
    return Done(w, s);
  });
}

int dhs_request_append(dhs_worker* w, uint64_t request, int64_t first, uint32_t count, const void* rows,
                       size_t rows_bytes, const void* keys, size_t keys_bytes) {
  return Guard(w, "dhs_request_append", [&](EmbeddedWorker& e) {
    if (rows == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_append: rows is NULL");
    if (keys == nullptr && keys_bytes != 0) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_append: keys is NULL with keys_bytes above 0");
    }
    if (first < 0) return Fail(w, DHS_ERR_OUT_OF_RANGE, "dhs_request_append: first is negative");
    const auto* r = static_cast<const uint8_t*>(rows);
    const auto* k = static_cast<const uint8_t*>(keys);
    return Done(w, e.Append(request, first, count, std::span<const uint8_t>(r, rows_bytes),
                            k == nullptr ? std::span<const uint8_t>() : std::span<const uint8_t>(k, keys_bytes)));
  });
}

int dhs_request_append_source(dhs_worker* w, uint64_t request, uint32_t source, int64_t first, uint32_t count,
                              const void* rows, size_t rows_bytes) {
  return Guard(w, "dhs_request_append_source", [&](EmbeddedWorker& e) {
    if (rows == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_append_source: rows is NULL");
    if (first < 0) return Fail(w, DHS_ERR_OUT_OF_RANGE, "dhs_request_append_source: first is negative");
    return Done(w, e.AppendSource(request, source, first, count,
                                  std::span<const uint8_t>(static_cast<const uint8_t*>(rows), rows_bytes)));
  });
}

int dhs_request_append_keys(dhs_worker* w, uint64_t request, uint32_t indexer, int64_t first, uint32_t count,
                            const void* keys, size_t keys_bytes) {
  return Guard(w, "dhs_request_append_keys", [&](EmbeddedWorker& e) {
    if (keys == nullptr) return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_append_keys: keys is NULL");
    if (first < 0) return Fail(w, DHS_ERR_OUT_OF_RANGE, "dhs_request_append_keys: first is negative");
    return Done(w, e.AppendKeys(request, indexer, first, count,
                                std::span<const uint8_t>(static_cast<const uint8_t*>(keys), keys_bytes)));
  });
}

namespace {
// dhs_resolve and dhs_resolve_at: the queries' checks, then one EmbeddedWorker::Resolve (`at` may be NULL).
int ResolveBatch(dhs_worker* w, const char* name, const uint32_t* sources, uint32_t sources_count, dhs_query* queries,
                 uint32_t query_count, const int64_t* at) {
  return Guard(w, name, [&](EmbeddedWorker& e) {
    if (sources == nullptr || sources_count == 0) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat(name, ": sources is NULL or empty"));
    }
    if (queries == nullptr && query_count > 0) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat(name, ": queries is NULL"));
    }
    std::vector<EmbeddedWorker::Query> batch(query_count);
    for (uint32_t i = 0; i < query_count; ++i) {
      const dhs_query& q = queries[i];
      if (q.reserved != 0) {
        return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat(name, ": query ", i, ": reserved must be 0"));
      }
      if (q.length > e.config().top_k) {
        return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat(name, ": query ", i, ": selection of ", q.length,
                                                              " positions is longer than k = ", e.config().top_k));
      }
      if (q.length > 0 && (q.selection == nullptr || q.locations == nullptr)) {
        return Fail(w, DHS_ERR_INVALID_ARGUMENT,
                    absl::StrCat(name, ": query ", i, ": selection or locations is NULL"));
      }
      if (at != nullptr && at[i] < -1) {
        return Fail(w, DHS_ERR_INVALID_ARGUMENT, absl::StrCat(name, ": at[", i, "] = ", at[i], " is below -1"));
      }
      batch[i].request = q.request;
      batch[i].selection = std::span<const int64_t>(q.selection, q.length);
      batch[i].locations = std::span<int64_t>(q.locations, uint64_t{q.length} * sources_count);
      batch[i].at = at != nullptr ? at[i] : dhs::kNoPosition;
    }
    return Done(w, e.Resolve(std::span<const uint32_t>(sources, sources_count), batch));
  });
}
}  // namespace

int dhs_resolve(dhs_worker* w, const uint32_t* sources, uint32_t sources_count, dhs_query* queries,
                uint32_t query_count) {
  return ResolveBatch(w, "dhs_resolve", sources, sources_count, queries, query_count, nullptr);
}

int dhs_resolve_at(dhs_worker* w, const uint32_t* sources, uint32_t sources_count, dhs_query* queries,
                   uint32_t query_count, const int64_t* at) {
  return ResolveBatch(w, "dhs_resolve_at", sources, sources_count, queries, query_count, at);
}

int dhs_readers_done(dhs_worker* w, const uint32_t* sources, uint32_t sources_count) {
  return Guard(w, "dhs_readers_done", [&](EmbeddedWorker& e) {
    if (sources == nullptr && sources_count > 0) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_readers_done: sources is NULL");
    }
    return Done(w, e.ReadersDone(std::span<const uint32_t>(sources, sources_count)));
  });
}

int dhs_request_hold(dhs_worker* w, uint64_t request, int64_t from) {
  return Guard(w, "dhs_request_hold", [&](EmbeddedWorker& e) { return Done(w, e.Hold(request, from)); });
}

int dhs_request_commit(dhs_worker* w, uint64_t request, int64_t length) {
  return Guard(w, "dhs_request_commit", [&](EmbeddedWorker& e) { return Done(w, e.Commit(request, length)); });
}

int dhs_request_complete(dhs_worker* w, uint64_t request) {
  return Guard(w, "dhs_request_complete", [&](EmbeddedWorker& e) { return Done(w, e.Complete(request)); });
}

int dhs_request_commit_tokens(dhs_worker* w, uint64_t request, const int32_t* tokens, const uint64_t* digests,
                              uint32_t count) {
  return Guard(w, "dhs_request_commit_tokens", [&](EmbeddedWorker& e) {
    if (tokens == nullptr && count > 0) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_commit_tokens: tokens is NULL");
    }
    return Done(w, e.CommitTokens(request, std::span<const int32_t>(tokens, tokens != nullptr ? count : 0),
                                  digests != nullptr ? std::span<const uint64_t>(digests, count)
                                                     : std::span<const uint64_t>()));
  });
}

int dhs_worker_resumable_tokens(dhs_worker* w, uint64_t request, int32_t* out, size_t capacity, size_t* count,
                                size_t* total, size_t* prompt_tokens) {
  return Guard(w, "dhs_worker_resumable_tokens", [&](EmbeddedWorker& e) {
    if (count == nullptr || total == nullptr || prompt_tokens == nullptr || (out == nullptr && capacity > 0)) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_worker_resumable_tokens: count, total, prompt_tokens or out is "
                                               "NULL");
    }
    absl::StatusOr<EmbeddedWorker::RecordTokens> record = e.ResumableTokens(request);
    if (!record.ok()) return Done(w, record.status());
    *prompt_tokens = record->prompt.size();
    *total = record->prompt.size() + record->generated.size();
    *count = std::min(capacity, *total);
    for (size_t i = 0; i < *count; ++i) {
      const uint32_t t = i < record->prompt.size() ? record->prompt[i] : record->generated[i - record->prompt.size()];
      out[i] = static_cast<int32_t>(t);  // the engine's int32, as its bits were kept
    }
    return Done(w, absl::OkStatus());
  });
}

int dhs_worker_list_resumable(dhs_worker* w, dhs_resumable* out, size_t capacity, size_t* count, size_t* total) {
  return Guard(w, "dhs_worker_list_resumable", [&](EmbeddedWorker& e) {
    if (count == nullptr || total == nullptr || (out == nullptr && capacity > 0)) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_worker_list_resumable: count, total or out is NULL");
    }
    const std::vector<EmbeddedWorker::Resumable> list = e.ListResumable();
    *total = list.size();
    *count = std::min(capacity, list.size());
    for (size_t i = 0; i < *count; ++i) out[i] = dhs_resumable{list[i].request, list[i].input_rows, list[i].max_rows};
    return Done(w, absl::OkStatus());
  });
}

int dhs_request_import(dhs_worker* w, uint64_t request, uint32_t first, uint32_t count, void* keys_out,
                       size_t keys_bytes) {
  return Guard(w, "dhs_request_import", [&](EmbeddedWorker& e) {
    if (keys_out == nullptr && keys_bytes != 0) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_import: keys_out is NULL with keys_bytes above 0");
    }
    auto* k = static_cast<uint8_t*>(keys_out);
    return Done(w, e.ImportRows(request, first, count,
                                k == nullptr ? std::span<uint8_t>() : std::span<uint8_t>(k, keys_bytes)));
  });
}

int dhs_request_import_plan(dhs_worker* w, uint64_t request, uint64_t tokens, dhs_host_run* runs, size_t capacity,
                            size_t* count, size_t* total) {
  return Guard(w, "dhs_request_import_plan", [&](EmbeddedWorker& e) {
    if (count == nullptr || total == nullptr || (runs == nullptr && capacity > 0)) {
      return Fail(w, DHS_ERR_INVALID_ARGUMENT, "dhs_request_import_plan: count, total or runs is NULL");
    }
    absl::StatusOr<std::vector<dhs::HostRun>> plan = e.ImportPlan(request, tokens);
    if (!plan.ok()) return Done(w, plan.status());
    *total = plan->size();
    *count = std::min(capacity, plan->size());
    for (size_t i = 0; i < *count; ++i) runs[i] = dhs_host_run{(*plan)[i].first, (*plan)[i].pages};
    return Done(w, absl::OkStatus());
  });
}

int dhs_worker_stats_json(dhs_worker* w, char* buf, size_t capacity, size_t* needed) {
  return Guard(w, "dhs_worker_stats_json", [&](EmbeddedWorker& e) {
    return CopyText(w, "dhs_worker_stats_json", buf, capacity, needed, [&] { return e.StatsJson(); });
  });
}

int dhs_request_timeline_json(dhs_worker* w, uint64_t request, char* buf, size_t capacity, size_t* needed) {
  return Guard(w, "dhs_request_timeline_json", [&](EmbeddedWorker& e) {
    return CopyText(w, "dhs_request_timeline_json", buf, capacity, needed, [&] { return e.TimelineJson(request); });
  });
}

}  // extern "C"
