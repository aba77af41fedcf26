/* tests/offload/test_err_threads.c — error messages read while other
 * threads set them: two threads fail at once, again and again, on one
 * memory manager (ferry_mem_last_error) and on one engine
 * (ferry_engine_last_error), each reading the message after its own
 * failure. Every message read is whole (one of the two the threads set);
 * under TSan no read races a write (the accessors copy under the lock).
 */
#include "offload/engine_impl.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <pthread.h>
#include <string.h>

#define ROUNDS 3000

static ferry_engine *eng;
static float buf[64];

typedef struct {
  int who;   /* 0 or 1: which failure this thread causes */
  int torn;  /* messages read that were neither of the two */
  char last[160];
} worker;

static const char *const mem_msg[2] = {"register: tensor name is NULL",
                                       "register: tensor name is empty"};
static const char *const eng_msg[2] = {"param read: no parameter '(null)'",
                                       "param read: no parameter 'no-such-tensor'"};

static void *fail_mem(void *arg) {
  worker *w = arg;
  int64_t n = 1;
  uint32_t id;
  for (int i = 0; i < ROUNDS; i++) {
    int rc = ferry_mem_register(eng->mem, w->who ? "" : NULL, FERRY_DT_F32, 1, &n, 0,
                                FERRY_ROLE_PARAM, &id);
    const char *msg = ferry_mem_last_error(eng->mem);
    if (rc != FERRY_EINVAL || (strcmp(msg, mem_msg[0]) && strcmp(msg, mem_msg[1]))) {
      w->torn++;
      snprintf(w->last, sizeof w->last, "%s", msg);
    }
  }
  return NULL;
}

static void *fail_engine(void *arg) {
  worker *w = arg;
  for (int i = 0; i < ROUNDS; i++) {
    int rc = ferry_param_read(eng, w->who ? "no-such-tensor" : NULL, buf, 64);
    const char *msg = ferry_engine_last_error(eng);
    if (rc != FERRY_ENOENT || (strcmp(msg, eng_msg[0]) && strcmp(msg, eng_msg[1]))) {
      w->torn++;
      snprintf(w->last, sizeof w->last, "%s", msg);
    }
  }
  return NULL;
}

static void race(void *(*fn)(void *), const char *what) {
  worker w[2];
  pthread_t th[2];
  memset(w, 0, sizeof w);
  for (int t = 0; t < 2; t++) {
    w[t].who = t;
    REQUIRE(pthread_create(&th[t], NULL, fn, &w[t]) == 0);
  }
  for (int t = 0; t < 2; t++) {
    pthread_join(th[t], NULL);
    if (w[t].torn)
      fprintf(stderr, "%s: thread %d read %d wrong messages, the last \"%s\"\n", what, t,
              w[t].torn, w[t].last);
    EXPECT(w[t].torn == 0);
  }
  printf("%s: %d failures in each of two threads, every message whole\n", what, ROUNDS);
}

int main(void) {
  eng = eu_engine("device = \"host\";\n"
                  "tiers: { gpu: { budget = \"16M\"; }; host: { budget = \"16M\"; pinned = false; }; };\n"
                  "optimizer: { type = \"sgd\"; lr = 0.01; threads = 1; };\n",
                  NULL);
  int64_t shape[1] = {64};
  REQUIRE(ferry_param_register(eng, "w", shape, 1, 0, buf, NULL, NULL) == 0);
  int rc = ferry_engine_finalize(eng);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(eng));
  REQUIRE(rc == 0);
  race(fail_mem, "memory manager");
  race(fail_engine, "engine");
  ferry_engine_destroy(eng);
  return test_finish("offload.err_threads");
}
