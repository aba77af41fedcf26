/* examples/gpt/init.c — the seeded init of the weights on the CPU: each
 * tensor's values from gpt_rng.h's counter-based normals by gpt_init.h's
 * rule, a large tensor split over threads (the values do not depend on the
 * split), stopping early once the set-up is cancelled (gpt_set_cancel).
 * Compiled with -ffp-contract=off (see gpt_rng.h).
 */
#include "gpt_init.h"
#include "gpt_rng.h"

#include <pthread.h>
#include <unistd.h>

static int (*g_cancelled)(void);

void gpt_set_cancel(int (*cancelled)(void)) { g_cancelled = cancelled; }
int gpt_cancelled(void) { return g_cancelled && g_cancelled(); }

/* Values between polls of gpt_cancelled (a few milliseconds of work). */
enum { INIT_POLL = 1 << 16 };

void gpt_init_values(const gpt_schema *s, int i, uint64_t seed, size_t first, size_t n,
                     float *dst) {
  float scale;
  gpt_init_kind kind = gpt_init_rule(s, i, &scale);
  if (kind != GPT_INIT_NORMAL) {
    for (size_t k = 0; k < n; k++) dst[k] = kind == GPT_INIT_ONE ? 1.0f : 0.0f;
    return;
  }
  size_t k = 0, poll = INIT_POLL;
  while (k < n) {
    if (k >= poll) { /* cancelled: the rest is left as it is (the caller fails) */
      if (gpt_cancelled()) return;
      poll = k + INIT_POLL;
    }
    size_t at = first + k, c = at / 4;
    float v[4];
    gpt_rng_normal4(seed, (uint32_t)i, c, v);
    for (size_t j = at % 4; j < 4 && k < n; j++, k++) dst[k] = GPT_RNG_FMUL(v[j], scale);
  }
}

typedef struct {
  const gpt_schema *s;
  int i;
  uint64_t seed;
  size_t first, n;
  float *dst;
} init_part;

static void *init_part_run(void *arg) {
  init_part *p = arg;
  gpt_init_values(p->s, p->i, p->seed, p->first, p->n, p->dst + p->first);
  return NULL;
}

enum { INIT_PART_MIN = 1 << 18, INIT_MAX_THREADS = 64 };

void gpt_init_tensor(const gpt_schema *s, int i, uint64_t seed, float *dst, int threads) {
  size_t numel = s->params[i].numel;
  if (threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    threads = n > 0 ? (int)n : 1;
  }
  if (threads > INIT_MAX_THREADS) threads = INIT_MAX_THREADS;
  if ((size_t)threads > numel / INIT_PART_MIN) threads = (int)(numel / INIT_PART_MIN);
  if (threads <= 1) {
    gpt_init_values(s, i, seed, 0, numel, dst);
    return;
  }
  init_part parts[INIT_MAX_THREADS];
  pthread_t tid[INIT_MAX_THREADS];
  int running[INIT_MAX_THREADS] = {0};
  size_t per = (numel / (size_t)threads + 3) & ~(size_t)3; /* whole counters each */
  for (int t = 0; t < threads; t++) {
    size_t a = per * (size_t)t < numel ? per * (size_t)t : numel;
    size_t b = numel - a > per ? a + per : numel;
    parts[t] = (init_part){s, i, seed, a, b - a, dst};
    /* part 0 runs on this thread, and so does one that gets no thread */
    running[t] = t > 0 && !pthread_create(&tid[t], NULL, init_part_run, &parts[t]);
    if (t > 0 && !running[t]) init_part_run(&parts[t]);
  }
  init_part_run(&parts[0]);
  for (int t = 1; t < threads; t++)
    if (running[t]) pthread_join(tid[t], NULL);
}
