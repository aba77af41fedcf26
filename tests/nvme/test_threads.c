/* tests/nvme/test_threads.c — 8 threads write, read back and check their own
 * chunks of one store at once (wait, poll and callback completion mixed),
 * over two directories, with the completion thread checking reads alone
 * and with three check threads beside it; run under TSan in CI.
 */
#include "nvme_test.h"

#include <pthread.h>
#include <stdatomic.h>

#define NT 8
#define PER 3        /* chunks per thread */
#define ROUNDS 6
#define SLOT ((1u << 20) + 333)

static ferry_swap *g_s;
static atomic_int g_fail;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, status;
} cb_wait;

static void on_done(ferry_swap_req *r, int status, void *user) {
  (void)r;
  cb_wait *w = user;
  pthread_mutex_lock(&w->mu);
  w->done = 1;
  w->status = status;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static int finish(ferry_swap_req *r, int how, cb_wait *w) {
  if (how == 0) return ferry_swap_wait(r);
  if (how == 1) {
    int st;
    while ((st = ferry_swap_poll(r)) == FERRY_EAGAIN) usleep(200);
    return st;
  }
  pthread_mutex_lock(&w->mu);
  while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
  int st = w->status;
  w->done = 0;
  pthread_mutex_unlock(&w->mu);
  return st;
}

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  unsigned char *src = nt_alloc(SLOT), *dst = nt_alloc(SLOT);
  cb_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  for (int round = 0; round < ROUNDS; round++) {
    for (int k = 0; k < PER; k++) {
      uint32_t chunk = (uint32_t)(t * PER + k);
      size_t n = SLOT - (size_t)(round * 4099 + k * 7);
      int how = (t + round + k) % 3;
      ferry_swap_req r;
      nt_fill(src, n, (unsigned long long)(chunk * 100 + round));
      int rc = ferry_swap_write(g_s, chunk, src, n, &r, how == 2 ? on_done : NULL, &w);
      if (rc == FERRY_OK) rc = finish(&r, how, &w);
      if (rc == FERRY_OK) {
        rc = ferry_swap_read(g_s, chunk, dst, n, &r, how == 2 ? on_done : NULL, &w);
        if (rc == FERRY_OK) rc = finish(&r, how, &w);
      }
      if (rc != FERRY_OK || memcmp(src, dst, n)) {
        fprintf(stderr, "thread %d chunk %u round %d: %s (%s)\n", t, chunk, round,
                ferry_strerror(rc), ferry_swap_last_error(g_s));
        atomic_fetch_add(&g_fail, 1);
      }
    }
  }
  free(src);
  free(dst);
  return NULL;
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "threads", dir, sizeof dir);
  char d0[1200], d1[1200];
  nt_subdir(dir, 0, d0, sizeof d0);
  nt_subdir(dir, 1, d1, sizeof d1);
  for (unsigned ct = 0; ct <= 3; ct += 3) {
    ferry_swap_config c = ferry_swap_config_default();
    c.paths[0] = d0;
    c.paths[1] = d1;
    c.npaths = 2;
    c.slot_size = SLOT;
    c.nslots = NT * PER;
    c.spare_slots = 3; /* fewer than the writers: some writes wait for a slot */
    c.block_size = 256 << 10;
    c.queue_depth = 16;
    c.check_threads = ct;
    REQUIRE(ferry_swap_open(&c, &g_s) == FERRY_OK);
    pthread_t th[NT];
    for (int t = 0; t < NT; t++)
      REQUIRE(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    EXPECT_EQ_INT(atomic_load(&g_fail), 0);
    ferry_swap_stats st;
    ferry_swap_get_stats(g_s, &st);
    EXPECT_EQ_INT(st.writes, NT * PER * ROUNDS);
    EXPECT_EQ_INT(st.reads, NT * PER * ROUNDS);
    EXPECT(st.read_check_bytes == st.bytes_read);
    ferry_swap_close(g_s);
  }
  nt_cleanup(dir, 2);
  return test_finish("nvme.threads");
}
