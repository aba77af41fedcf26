/* examples/gpt/init.c — the seeded init of the weights on the CPU: each
 * tensor's values from gpt_rng.h's counter-based normals by gpt_init.h's
 * rule, a large tensor split over threads (the values do not depend on the
 * split), stopping early once the set-up is cancelled (gpt_set_cancel).
 * Compiled with -ffp-contract=off (see gpt_rng.h).
 */
#include "gpt_init.h"
#include "gpt_rng.h"
#include "gpt_rng_lanes.h"

#include "core/par.h"

static int (*g_cancelled)(void);

void gpt_set_cancel(int (*cancelled)(void)) { g_cancelled = cancelled; }
int gpt_cancelled(void) { return g_cancelled && g_cancelled(); }

/* Values between polls of gpt_cancelled (a few milliseconds of work). */
enum { INIT_POLL = 1 << 16 };

enum { LANE_VALUES = 4 * GPT_RNG_LANES };

/* `blocks` runs of GPT_RNG_LANES counters from counter c, scaled, into dst:
 * one build per vector width, picked at load time (the lanes' values are
 * the same in each: IEEE operations, none contracted). One build with clang
 * (it refuses target_clones with flatten) and under ThreadSanitizer (a
 * load-time resolver runs before its runtime is up: the program crashes). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4"), flatten))
#endif
static void normal_blocks(uint64_t seed, uint32_t tensor, size_t c, size_t blocks, float scale,
                          float *dst) {
  for (size_t b = 0; b < blocks; b++)
    gpt_rng_lanes_normal(seed, tensor, c + b * GPT_RNG_LANES, scale, dst + b * LANE_VALUES);
}

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
    if (at % 4 == 0 && n - k >= LANE_VALUES) { /* whole counters: GPT_RNG_LANES at once */
      size_t blocks = (n - k) / LANE_VALUES;
      if (blocks > INIT_POLL / LANE_VALUES) blocks = INIT_POLL / LANE_VALUES;
      normal_blocks(seed, (uint32_t)i, c, blocks, scale, dst + k);
      k += blocks * LANE_VALUES;
      continue;
    }
    float v[4];
    gpt_rng_normal4(seed, (uint32_t)i, c, v);
    for (size_t j = at % 4; j < 4 && k < n; j++, k++) dst[k] = GPT_RNG_FMUL(v[j], scale);
  }
}

typedef struct {
  const gpt_schema *s;
  int i;
  uint64_t seed;
  size_t per, numel; /* values per part: whole counters each */
  float *dst;
} init_job;

static void init_part(void *arg, int t) {
  init_job *j = arg;
  size_t a = j->per * (size_t)t < j->numel ? j->per * (size_t)t : j->numel;
  size_t b = j->numel - a > j->per ? a + j->per : j->numel;
  gpt_init_values(j->s, j->i, j->seed, a, b - a, j->dst + a);
}

enum { INIT_PART_MIN = 1 << 18 };

void gpt_init_tensor(const gpt_schema *s, int i, uint64_t seed, float *dst, int threads) {
  size_t numel = s->params[i].numel;
  if (threads <= 0) threads = ferry_par_threads();
  if (threads > FERRY_PAR_MAX) threads = FERRY_PAR_MAX;
  if ((size_t)threads > numel / INIT_PART_MIN) threads = (int)(numel / INIT_PART_MIN);
  if (threads <= 1) {
    gpt_init_values(s, i, seed, 0, numel, dst);
    return;
  }
  init_job j = {s, i, seed, (numel / (size_t)threads + 3) & ~(size_t)3, numel, dst};
  ferry_par_run(threads, init_part, &j);
}
