/* tests/core/test_par.c — core/par.h: ferry_par_run runs every part once
 * (more parts than FERRY_PAR_MAX are cut to it), and ferry_par_zero zeroes
 * exactly its range, on one thread below FERRY_PAR_MIN_BYTES and on
 * several from it (an odd length, slices of whole pages); ferry_par_zero_stop
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

/* n bytes zeroed between guard bytes that stay */
static void zero_between(size_t n, int threads) {
  unsigned char *b = malloc(n + 2);
  REQUIRE(b != NULL);
  memset(b, 0xab, n + 2);
  ferry_par_zero(b + 1, n, threads);
  EXPECT(b[0] == 0xab && b[n + 1] == 0xab);
  size_t bad = 0;
  for (size_t i = 1; i <= n; i++) bad += b[i] != 0;
  EXPECT(bad == 0);
  free(b);
}

static atomic_int g_asks;

/* yes from the `*limit`-th ask on */
static int stop_after(void *user) { return atomic_fetch_add(&g_asks, 1) + 1 >= *(int *)user; }

/* a range of pieces and a bit (one thread: 6, more: from FERRY_PAR_MIN_BYTES): never stopped, every piece asked for;
 * stopped at the first ask, nothing zeroed; stopped at the third */
static void zero_stopped(int threads) {
  size_t n = threads > 1 ? FERRY_PAR_MIN_BYTES + 4099 : 6 * FERRY_PAR_PIECE + 4099;
  unsigned char *b = malloc(n);
  REQUIRE(b != NULL);
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
  free(b);
}

int main(void) {
  ferry_par_run(5, count_part, NULL);
  for (int k = 0; k < FERRY_PAR_MAX; k++) EXPECT(atomic_load(&g_runs[k]) == (k < 5));
  memset(g_runs, 0, sizeof g_runs);
  ferry_par_run(FERRY_PAR_MAX + 3, count_part, NULL);
  for (int k = 0; k < FERRY_PAR_MAX; k++) EXPECT(atomic_load(&g_runs[k]) == 1);
  EXPECT(ferry_par_threads() >= 1 && ferry_par_threads() <= FERRY_PAR_MAX);
  zero_between(12345, 4);
  zero_between(FERRY_PAR_MIN_BYTES + 4099, 3);
  zero_stopped(1);
  zero_stopped(3);
  return test_finish("core.par");
}
