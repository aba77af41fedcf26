/* tests/offload/run_fixture.h — the three-param engine the step tests run
 * (offload.missing_grad, offload.step_atomic): a.w and a.b in group 0 and
 * b.w in group 1, of 96, 17 and 80 values, their initial values and each
 * step's grads; an engine of a configuration's text with them registered
 * and finalized and a stream of its device, and its close.
 */
#ifndef FERRY_TESTS_RUN_FIXTURE_H
#define FERRY_TESTS_RUN_FIXTURE_H

#include "tests/offload/engine_util.h"

#include <math.h>
#include <stdlib.h>

#define NP 3
static const char *names[NP] = {"a.w", "a.b", "b.w"};
static const int group_of[NP] = {0, 0, 1};
static const size_t sizes[NP] = {96, 17, 80};

static inline float init_value(int k, size_t i) { return 0.5f * cosf(0.11f * (float)i + (float)k); }

static inline float grad_value(int k, int step, size_t i) {
  return 0.1f * sinf(0.37f * (float)i + 1.3f * (float)step + (float)k);
}

typedef struct {
  ferry_engine *e;
  ferry_stream *s;
  float *init[NP]; /* read by the engine until finalize */
} run_t;

/* The engine of the configuration `text` with the params registered (a.b
 * before a.w when `swap`: a model whose code changed the order) and
 * finalized, and a stream of its device. */
static inline void run_engine(run_t *R, const char *text, int swap) {
  R->e = eu_engine(text, NULL);
  for (int j = 0; j < NP; j++) {
    int k = swap && j < 2 ? 1 - j : j;
    R->init[k] = malloc(sizes[k] * sizeof(float));
    REQUIRE(R->init[k]);
    for (size_t i = 0; i < sizes[k]; i++) R->init[k][i] = init_value(k, i);
    int64_t shape[1] = {(int64_t)sizes[k]};
    REQUIRE(ferry_param_register(R->e, names[k], shape, 1, group_of[k], R->init[k], NULL, NULL) ==
            0);
  }
  REQUIRE(ferry_engine_finalize(R->e) == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(R->e), &R->s) == 0);
}

static inline void run_close(run_t *R) {
  ferry_stream_destroy(R->s);
  ferry_engine_destroy(R->e);
  for (int k = 0; k < NP; k++) free(R->init[k]);
}

#endif
