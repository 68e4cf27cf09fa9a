/* examples/serve_two.c: two requests served through libdhs (include/dhs/dhs.h) against a running memd.
 * Usage: serve_two RUN_DIR   (memd started with --page-bytes 2304: p * (S * d_KV + L_idx * d_idx) below)
 * Each request appends a prompt, then decodes: every step appends its row and resolves a top-k selection (here the
 * k newest rows and some old ones, as an indexer might pick); the bytes at every returned location are checked
 * against the rows appended. Prints "served 2 requests ... exact" and exits 0, or names the failed call and exits 1. */
#define _POSIX_C_SOURCE 200809L
#include <dhs/dhs.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { S = 2, ROW = 64, IDX = 1, KEY = 16, P = 16, K = 8, PROMPT = 40, OUT = 24, MAX = PROMPT + OUT };

static dhs_worker* w;
#define CALL(x) do { int rc_ = (x); if (rc_ != DHS_OK) { \
  fprintf(stderr, "%s: %s: %s\n", #x, dhs_status_name(rc_), dhs_worker_errmsg(w)); return 1; } } while (0)

/* The row of (request r, source s, position t): a pattern the check recomputes. */
static void make_row(uint64_t r, int s, int64_t t, unsigned char* row) {
  for (int b = 0; b < ROW; ++b) row[b] = (unsigned char)(r * 131 + (uint64_t)s * 31 + (uint64_t)t * 7 + (uint64_t)b);
}

static int append(uint64_t r, int64_t first, uint32_t n) {
  unsigned char rows[PROMPT * S * ROW];
  float keys[IDX * PROMPT * (KEY / 4)];
  for (uint32_t i = 0; i < n; ++i)
    for (int s = 0; s < S; ++s) make_row(r, s, first + i, rows + (i * S + s) * ROW);
  for (uint32_t i = 0; i < n * (KEY / 4); ++i) keys[i] = (float)(first * 4 + i);
  CALL(dhs_request_append(w, r, first, n, rows, (size_t)n * S * ROW, keys, (size_t)n * KEY));
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) { fprintf(stderr, "usage: serve_two RUN_DIR\n"); return 2; }
  dhs_worker_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c; c.abi_version = DHS_ABI_VERSION; c.run_dir = argv[1];
  c.mode = DHS_MODE_ADAPTIVE; c.backend = DHS_BACKEND_CPU;
  c.sources = S; c.row_bytes = ROW; c.indexers = IDX; c.index_key_bytes = KEY;
  c.page_rows = P; c.top_k = K; c.hot_rows = 4 * K; c.tail_rows = 2 * P; c.slots = 2;
  c.hbm_budget_bytes = 16 * P * S * ROW; /* M = 16 pages: 5 required per request + their prompts' 2 each */
  if (dhs_worker_open(&c, &w) != DHS_OK) {
    fprintf(stderr, "open: %s\n", dhs_worker_errmsg(w)); dhs_worker_close(w); return 1;
  }
  dhs_pool_desc pool;
  memset(&pool, 0, sizeof pool);
  pool.struct_size = sizeof pool; pool.kind = DHS_POOLS_LIBRARY;
  CALL(dhs_pools_register(w, &pool));

  uint64_t id[2];
  dhs_request_desc d = { .struct_size = sizeof d, .input_rows = PROMPT, .max_rows = MAX };
  for (int i = 0; i < 2; ++i) CALL(dhs_request_submit(w, &d, &id[i]));
  int granted = 0;
  for (int spin = 0; granted < 2 && spin < 10000; ++spin) {  /* the grants come through poll (10 s at most) */
    const struct timespec ms = {0, 1000000};
    dhs_event ev[8];
    size_t n = 0;
    CALL(dhs_worker_poll(w, ev, 8, &n));
    for (size_t e = 0; e < n; ++e) {
      if (ev[e].kind == DHS_EVENT_GRANTED) ++granted;
      else if (ev[e].kind == DHS_EVENT_REJECTED || ev[e].kind == DHS_EVENT_FAILED) {
        fprintf(stderr, "request %llu: %s\n", (unsigned long long)ev[e].request, ev[e].message); return 1;
      }
    }
    if (n == 0) nanosleep(&ms, NULL);
  }
  if (granted < 2) { fprintf(stderr, "no grant from memd\n"); return 1; }
  for (int i = 0; i < 2; ++i) if (append(id[i], 0, PROMPT)) return 1;

  long checked = 0;
  for (int64_t t = PROMPT; t < MAX; ++t) {             /* one decode step: both requests in one batch */
    int64_t sel[2][K], loc[2][K];
    dhs_query q[2];
    for (int i = 0; i < 2; ++i) {
      if (append(id[i], t, 1)) return 1;
      for (int j = 0; j < K; ++j) sel[i][j] = j < K / 2 ? t - j : (t * 5 + j * 3 + i) % (t - K);  /* newest + old */
      sel[i][K - 1] = -1;                               /* padding stays -1 */
      q[i].request = id[i]; q[i].selection = sel[i]; q[i].length = K; q[i].reserved = 0; q[i].locations = loc[i];
    }
    for (uint32_t s = 0; s < S; ++s) {
      CALL(dhs_resolve(w, &s, 1, q, 2));
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < K; ++j) {
          unsigned char want[ROW];
          if (sel[i][j] < 0) { if (loc[i][j] != -1) { fprintf(stderr, "padding got a row\n"); return 1; } continue; }
          make_row(id[i], (int)s, sel[i][j], want);
          if (memcmp((unsigned char*)pool.base + loc[i][j], want, ROW) != 0) {
            fprintf(stderr, "request %d source %u position %lld: wrong bytes\n", i, s, (long long)sel[i][j]);
            return 1;
          }
          ++checked;
        }
      CALL(dhs_readers_done(w, &s, 1));                 /* the attention read them */
    }
    size_t n = 0;
    dhs_event ev[8];
    CALL(dhs_worker_poll(w, ev, 8, &n));                /* memd's orders are served here */
  }
  for (int i = 0; i < 2; ++i) CALL(dhs_request_complete(w, id[i]));
  char stats[2048];
  size_t need = 0;
  CALL(dhs_worker_stats_json(w, stats, sizeof stats, &need));
  printf("stats %s\n", stats);
  printf("served 2 requests, %ld selected rows checked, exact\n", checked);
  return dhs_worker_close(w) == DHS_OK ? 0 : 1;
}
