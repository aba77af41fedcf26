/* tests/nvme/test_ring_fail.c — the completion thread's io_uring_wait_cqe
 * fails (ferry_swap_fault_ring_wait, EBADF): every request in flight or
 * queued ends with FERRY_EIO (each callback exactly once, the failed
 * write commits nothing), new requests are refused naming the errno, and
 * wait, drain and close return. A watchdog (alarm) fails the test where
 * the store would hang.
 */
#include "nvme_test.h"

#include <signal.h>
#include <stdatomic.h>

#define SLOT (64u << 10)
#define NCH 8
#define NREQ 7 /* reads of chunks 0..5, then a write of chunk 6 */

static atomic_int calls[NREQ];
static int status_of[NREQ];

static void on_done(ferry_swap_req *r, int status, void *user) {
  (void)r;
  int i = (int)(intptr_t)user;
  status_of[i] = status;
  atomic_fetch_add(&calls[i], 1);
}

static void add_delay(ferry_swap *s, int64_t chunk, uint32_t ms) {
  ferry_fault f = {FERRY_FAULT_DELAY, 0, chunk, -1, 1, ms};
  REQUIRE(ferry_swap_fault_add(s, &f) == FERRY_OK);
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "ring_fail", dir, sizeof dir);
  ferry_swap_config c = ferry_swap_config_default();
  c.paths[0] = dir;
  c.npaths = 1;
  c.slot_size = SLOT;
  c.nslots = NCH;
  c.spare_slots = 1;
  c.queue_depth = 2; /* two in flight, the rest queued */
  ferry_swap *s = NULL;
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  if (ferry_swap_fault_ring_wait(s, EBADF) == FERRY_ENOTSUP) {
    ferry_swap_close(s);
    nt_cleanup(dir, 0);
    TEST_SKIP("fault injection not compiled in (FERRY_FAULT_INJECTION=OFF)");
  }
  alarm(60); /* a hang is a failure (SIGALRM ends the test) */
  unsigned char *buf[NREQ];
  for (int i = 0; i < NREQ; i++) buf[i] = nt_alloc(SLOT);
  /* the completion thread may be in its first wait or not there yet: a
   * write then succeeds, fails (the wait failed before its completion was
   * reaped) or is refused; whichever, nothing hangs and close returns */
  nt_fill(buf[0], SLOT, 1);
  ferry_swap_req w0;
  int rc0 = ferry_swap_write(s, 0, buf[0], SLOT, &w0, NULL, NULL);
  if (rc0 == FERRY_OK) rc0 = ferry_swap_wait(&w0);
  EXPECT(rc0 == FERRY_OK || rc0 == FERRY_EIO);
  ferry_swap_close(s);

  /* again, with requests in flight and queued when the wait fails */
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  for (uint32_t ch = 0; ch < NCH; ch++) {
    nt_fill(buf[0], SLOT, 10 + ch);
    ferry_swap_req w;
    REQUIRE(ferry_swap_write(s, ch, buf[0], SLOT, &w, NULL, NULL) == FERRY_OK);
    REQUIRE(ferry_swap_wait(&w) == FERRY_OK);
  }
  /* read 0 lands 3 s late, read 1 after 1 s; once their real completions
   * are parked (the 200 ms sleep), the hook is set: read 1's late
   * completion ends the wait in progress, the completion thread issues
   * read 2, and its next wait fails with reads 0 and 2 in flight, reads
   * 3..5 and the write of chunk 6 (4 KiB shorter than what it holds)
   * queued */
  add_delay(s, 0, 3000);
  add_delay(s, 1, 1000);
  ferry_swap_req req[NREQ];
  for (int i = 0; i < NREQ; i++) {
    ferry_swap_cb cb = i == 4 || i == 5 ? NULL : on_done; /* 4 and 5: ferry_swap_wait */
    void *user = (void *)(intptr_t)i;
    int rc = i < 6 ? ferry_swap_read(s, (uint32_t)i, buf[i], SLOT, &req[i], cb, user)
                   : ferry_swap_write(s, 6, buf[i], SLOT - 4096, &req[i], cb, user);
    REQUIRE(rc == FERRY_OK);
  }
  usleep(200000);
  REQUIRE(ferry_swap_fault_ring_wait(s, EBADF) == FERRY_OK);
  EXPECT_EQ_INT(ferry_swap_wait(&req[4]), FERRY_EIO);
  EXPECT_EQ_INT(ferry_swap_wait(&req[5]), FERRY_EIO);
  ferry_swap_drain(s); /* every callback has run */
  for (int i = 0; i < NREQ; i++) {
    if (i == 4 || i == 5) continue;
    EXPECT_EQ_INT(atomic_load(&calls[i]), 1);
    EXPECT_EQ_INT(status_of[i], i == 1 ? FERRY_OK : FERRY_EIO);
  }
  EXPECT_EQ_INT((int)ferry_swap_chunk_len(s, 6), (int)SLOT); /* the old copy stands */
  /* a new request is refused, naming the errno */
  ferry_swap_req late;
  EXPECT_EQ_INT(ferry_swap_read(s, 7, buf[0], SLOT, &late, on_done, NULL), FERRY_EIO);
  const char *m = ferry_swap_last_error(s);
  EXPECT(strstr(m, "io_uring_wait_cqe") && strstr(m, strerror(EBADF)));
  ferry_swap_close(s);
  for (int i = 0; i < NREQ; i++)
    if (i != 4 && i != 5) EXPECT_EQ_INT(atomic_load(&calls[i]), 1);
  alarm(0);
  for (int i = 0; i < NREQ; i++) free(buf[i]);
  nt_cleanup(dir, 0);
  return test_finish("nvme.ring_fail");
}
