/* tests/core/test_par.c — core/par.h: ferry_par_run runs every part once
 * (more parts than FERRY_PAR_MAX are cut to it), and ferry_par_zero zeroes
 * exactly its range, on one thread below FERRY_PAR_MIN_BYTES and on
 * several from it (an odd length, slices of whole pages, a length whose
 * share per thread is whole pages and a byte over); ferry_par_zero_stop
 * asks before each piece and stops at the first yes, on every thread.
 */
#include "core/par.h"

#include "tests/test.h"

#include <stdatomic.h>
#include <string.h>

static atomic_int g_runs[FERRY_PAR_MAX];

static void count_part(void *arg, int k) {
  (void)arg;
  atomic_fetch_add(&g_runs[k], 1);
}

/* One buffer for every case, its pages (and a sanitizer's shadow of them)
 * touched once: a fresh GiB each time took most of the test's time under
 * ThreadSanitizer, in page faults. */
#define BUF_BYTES (FERRY_PAR_MIN_BYTES + 4099 + 2)
static unsigned char *g_buf;

/* the n bytes at b are all zero (compared a block at a time: a byte loop
 * took seconds per GiB under the sanitizers) */
static int all_zero(const unsigned char *b, size_t n) {
  static const unsigned char zero[1 << 16];
  for (size_t at = 0; at < n; at += sizeof zero)
    if (memcmp(b + at, zero, n - at < sizeof zero ? n - at : sizeof zero)) return 0;
  return 1;
}

/* n bytes zeroed between guard bytes that stay */
static void zero_between(size_t n, int threads) {
  unsigned char *b = g_buf;
  REQUIRE(n + 2 <= BUF_BYTES);
  memset(b, 0xab, n + 2);
  ferry_par_zero(b + 1, n, threads);
  EXPECT(b[0] == 0xab && b[n + 1] == 0xab);
  EXPECT(all_zero(b + 1, n));
}

static atomic_int g_asks;

/* yes from the `*limit`-th ask on */
static int stop_after(void *user) { return atomic_fetch_add(&g_asks, 1) + 1 >= *(int *)user; }

/* a range of pieces and a bit (one thread: 6, more: from FERRY_PAR_MIN_BYTES): never stopped, every piece asked for;
 * stopped at the first ask, nothing zeroed; stopped at the third */
static void zero_stopped(int threads) {
  size_t n = threads > 1 ? FERRY_PAR_MIN_BYTES + 4099 : 6 * FERRY_PAR_PIECE + 4099;
  unsigned char *b = g_buf;
  REQUIRE(n <= BUF_BYTES);
  int never = 1 << 30, first = 1, third = 3;
  memset(b, 0xab, n);
  atomic_store(&g_asks, 0);
  EXPECT(ferry_par_zero_stop(b, n, threads, stop_after, &never) == 0);
  EXPECT(b[0] == 0 && b[n / 2] == 0 && b[n - 1] == 0);
  EXPECT(atomic_load(&g_asks) >= (int)(n / FERRY_PAR_PIECE));
  memset(b, 0xab, n);
  atomic_store(&g_asks, 0);
  EXPECT(ferry_par_zero_stop(b, n, threads, stop_after, &first) == 1);
  EXPECT(b[0] == 0xab && b[n - 1] == 0xab);
  if (threads == 1) { /* one thread: two pieces zeroed, then the third ask stops */
    memset(b, 0xab, n);
    atomic_store(&g_asks, 0);
    EXPECT(ferry_par_zero_stop(b, n, 1, stop_after, &third) == 1);
    EXPECT(b[2 * FERRY_PAR_PIECE - 1] == 0 && b[2 * FERRY_PAR_PIECE] == 0xab);
    EXPECT(atomic_load(&g_asks) == 3);
  }
}

int main(void) {
  ferry_par_run(5, count_part, NULL);
  for (int k = 0; k < FERRY_PAR_MAX; k++) EXPECT(atomic_load(&g_runs[k]) == (k < 5));
  memset(g_runs, 0, sizeof g_runs);
  ferry_par_run(FERRY_PAR_MAX + 3, count_part, NULL);
  for (int k = 0; k < FERRY_PAR_MAX; k++) EXPECT(atomic_load(&g_runs[k]) == 1);
  EXPECT(ferry_par_threads() >= 1 && ferry_par_threads() <= FERRY_PAR_MAX);
  REQUIRE((g_buf = malloc(BUF_BYTES)) != NULL);
  zero_between(12345, 4);
  zero_between(FERRY_PAR_MIN_BYTES + 4099, 3);
  /* a length whose share per thread is whole pages with a remainder (2^29
   * pages' worth each and a byte): the last byte too */
  zero_between(FERRY_PAR_MIN_BYTES + 1, 2);
  zero_between(FERRY_PAR_MIN_BYTES + 1, 4);
  zero_stopped(1);
  zero_stopped(3);
  free(g_buf);
  return test_finish("core.par");
}
