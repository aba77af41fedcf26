/* tests/core/test_par.c — core/par.h: ferry_par_run runs every part once
 * (more parts than FERRY_PAR_MAX are cut to it), and ferry_par_zero zeroes
 * exactly its range, on one thread below FERRY_PAR_MIN_BYTES and on
 * several from it (an odd length, slices of whole pages).
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

int main(void) {
  ferry_par_run(5, count_part, NULL);
  for (int k = 0; k < FERRY_PAR_MAX; k++) EXPECT(atomic_load(&g_runs[k]) == (k < 5));
  memset(g_runs, 0, sizeof g_runs);
  ferry_par_run(FERRY_PAR_MAX + 3, count_part, NULL);
  for (int k = 0; k < FERRY_PAR_MAX; k++) EXPECT(atomic_load(&g_runs[k]) == 1);
  EXPECT(ferry_par_threads() >= 1 && ferry_par_threads() <= FERRY_PAR_MAX);
  zero_between(12345, 4);
  zero_between(FERRY_PAR_MIN_BYTES + 4099, 3);
  return test_finish("core.par");
}
