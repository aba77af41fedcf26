/* tests/nvme/test_faults.c — every injected fault (EIO, ENOSPC, short
 * transfer, flipped bit, late completion) and on-disk corruption gives its
 * status and message, and every chunk written before stays readable and
 * correct, with shadow slots and (where promised) in place.
 */
#include "nvme_test.h"

#include <pthread.h>
#include <stdatomic.h>

#define SLOT ((4u << 20) + 5)
#define NCH 4

static unsigned char *good[NCH]; /* what each chunk must hold */
static size_t good_len[NCH];
static unsigned char *rbuf;

static int do_write(ferry_swap *s, uint32_t c, const unsigned char *p, size_t n) {
  ferry_swap_req r;
  int rc = ferry_swap_write(s, c, p, n, &r, NULL, NULL);
  return rc ? rc : ferry_swap_wait(&r);
}

static int do_read(ferry_swap *s, uint32_t c, size_t n) {
  ferry_swap_req r;
  int rc = ferry_swap_read(s, c, rbuf, n, &r, NULL, NULL);
  return rc ? rc : ferry_swap_wait(&r);
}

/* A write whose CRCs come late (FERRY_FAULT_CRC_DELAY): ferry_swap_write
 * itself takes them, so it runs on its own thread; completion by wait or
 * by callback. */
typedef struct {
  ferry_swap *s;
  const unsigned char *src;
  int use_cb, status;
  atomic_int cb_done;
  double seconds;
} late_write;

static void late_cb(ferry_swap_req *r, int status, void *user) {
  (void)r;
  late_write *w = user;
  w->status = status;
  atomic_store(&w->cb_done, 1);
}

static void *late_writer(void *arg) {
  late_write *w = arg;
  ferry_swap_req r;
  double t0 = ferry_now();
  int rc = ferry_swap_write(w->s, 1, w->src, SLOT, &r, w->use_cb ? late_cb : NULL, w);
  if (rc == FERRY_OK && !w->use_cb) rc = ferry_swap_wait(&r);
  if (rc == FERRY_OK && w->use_cb) {
    while (!atomic_load(&w->cb_done)) usleep(1000);
    rc = w->status;
  }
  w->status = rc;
  w->seconds = ferry_now() - t0;
  return NULL;
}

static void add(ferry_swap *s, ferry_fault_kind k, int op, int64_t chunk, int64_t piece,
                uint32_t count, uint32_t delay_ms) {
  ferry_fault f = {k, op, chunk, piece, count, delay_ms};
  REQUIRE(ferry_swap_fault_add(s, &f) == FERRY_OK);
}

/* Every chunk with known contents reads back exactly. */
static void check_all(ferry_swap *s, const char *when) {
  for (uint32_t c = 0; c < NCH; c++) {
    if (!good_len[c]) continue;
    int rc = do_read(s, c, good_len[c]);
    if (rc != FERRY_OK || memcmp(rbuf, good[c], good_len[c])) {
      fprintf(stderr, "after %s: chunk %u unreadable or wrong (%s: %s)\n", when, c,
              ferry_strerror(rc), ferry_swap_last_error(s));
      test_failures++;
    }
  }
}

static void set_good(uint32_t c, const unsigned char *p, size_t n) {
  memcpy(good[c], p, n);
  good_len[c] = n;
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "faults", dir, sizeof dir);
  char dirs[1][1200];
  snprintf(dirs[0], sizeof dirs[0], "%s", dir);
  rbuf = nt_alloc(SLOT);
  unsigned char *a = nt_alloc(SLOT), *b = nt_alloc(SLOT);
  for (int i = 0; i < NCH; i++) good[i] = nt_alloc(SLOT);

  for (int run = 0; run < 4; run++) {
    int mode = run & 1; /* 0: shadow slots, 1: in place */
    ferry_swap_config c = ferry_swap_config_default();
    c.check_threads = run >> 1 ? 2 : 0; /* reads checked beside the completion thread */
    c.paths[0] = dirs[0];
    c.npaths = 1;
    c.slot_size = SLOT;
    c.nslots = NCH;
    c.spare_slots = mode ? 0 : 2;
    c.queue_depth = 8;
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
    memset(good_len, 0, sizeof good_len);
    ferry_fault probe = {FERRY_FAULT_EIO, -1, -1, -1, 1, 0};
    if (ferry_swap_fault_add(s, &probe) == FERRY_ENOTSUP) {
      ferry_swap_close(s);
      nt_cleanup(dir, 0);
      TEST_SKIP("fault injection not compiled in (FERRY_FAULT_INJECTION=OFF)");
    }
    ferry_swap_fault_clear(s);

    for (uint32_t i = 0; i < NCH; i++) {
      size_t n = SLOT - i * 1000;
      nt_fill(a, n, 10 + i + 100 * (unsigned)mode);
      REQUIRE(do_write(s, i, a, n) == FERRY_OK);
      set_good(i, a, n);
    }
    check_all(s, "first writes");

    /* EIO on a rewrite */
    nt_fill(b, SLOT, 99);
    add(s, FERRY_FAULT_EIO, 1, 0, 2, 1, 0);
    EXPECT_EQ_INT(do_write(s, 0, b, SLOT), FERRY_EIO);
    const char *m = ferry_swap_last_error(s);
    EXPECT(strstr(m, "write of chunk 0") && strstr(m, ".swap offset") && strstr(m, "Input/output error"));
    if (mode == 0) {
      check_all(s, "EIO on a shadow write");
    } else { /* in place: that chunk is gone, and says so; the others stand */
      EXPECT_EQ_INT(do_read(s, 0, SLOT), FERRY_ECORRUPT);
      EXPECT(strstr(ferry_swap_last_error(s), "lost") != NULL);
      EXPECT_EQ_INT(ferry_swap_chunk_len(s, 0), 0);
      good_len[0] = 0;
      check_all(s, "EIO on an in-place write");
      REQUIRE(do_write(s, 0, b, SLOT) == FERRY_OK);
      set_good(0, b, SLOT);
    }

    /* ENOSPC on any piece of a rewrite of chunk 1 */
    add(s, FERRY_FAULT_ENOSPC, 1, 1, -1, 1, 0);
    EXPECT_EQ_INT(do_write(s, 1, b, SLOT - 7), FERRY_ENOSPC);
    EXPECT(strstr(ferry_swap_last_error(s), "No space left") != NULL);
    if (mode == 1) good_len[1] = 0;
    check_all(s, "ENOSPC");

    /* EIO on a read: the read fails, the data does not */
    add(s, FERRY_FAULT_EIO, 0, 2, 1, 1, 0);
    EXPECT_EQ_INT(do_read(s, 2, good_len[2]), FERRY_EIO);
    EXPECT(strstr(ferry_swap_last_error(s), "read of chunk 2") != NULL);
    check_all(s, "EIO on a read");

    /* short transfers are resubmitted for the remainder */
    ferry_swap_stats st0, st1;
    ferry_swap_get_stats(s, &st0);
    add(s, FERRY_FAULT_SHORT, -1, 3, -1, 0, 0);
    nt_fill(a, SLOT, 555);
    EXPECT_EQ_INT(do_write(s, 3, a, SLOT), FERRY_OK);
    set_good(3, a, SLOT);
    check_all(s, "short transfers");
    ferry_swap_get_stats(s, &st1);
    EXPECT(st1.retries >= st0.retries + 8); /* 4 full pieces, write and read */
    ferry_swap_fault_clear(s);

    /* a flipped bit in a read is caught */
    add(s, FERRY_FAULT_BITFLIP, 0, 2, 0, 1, 0);
    EXPECT_EQ_INT(do_read(s, 2, good_len[2]), FERRY_ECORRUPT);
    m = ferry_swap_last_error(s);
    EXPECT(strstr(m, "chunk 2 corrupt at offset 0") && strstr(m, "expected 0x") &&
           strstr(m, "found 0x"));
    ferry_swap_get_stats(s, &st1);
    EXPECT(st1.crc_errors >= 1);
    check_all(s, "a flipped bit in transit");

    /* a flipped bit on the disk is caught, in the unaligned tail too */
    if (good_len[3]) {
      EXPECT_EQ_INT(ferry_swap_corrupt_on_disk(s, 3, good_len[3] - 2, 5), FERRY_OK);
      EXPECT_EQ_INT(do_read(s, 3, good_len[3]), FERRY_ECORRUPT);
      char want[64];
      snprintf(want, sizeof want, "offset %u", 4u << 20);
      EXPECT(strstr(ferry_swap_last_error(s), want) != NULL);
      EXPECT_EQ_INT(ferry_swap_corrupt_on_disk(s, 3, 1 << 20, 0), FERRY_OK);
      EXPECT_EQ_INT(ferry_swap_corrupt_on_disk(s, 3, good_len[3] - 2, 5), FERRY_OK);
      EXPECT_EQ_INT(do_read(s, 3, good_len[3]), FERRY_ECORRUPT);
      EXPECT_EQ_INT(ferry_swap_corrupt_on_disk(s, 3, 1 << 20, 0), FERRY_OK);
      check_all(s, "on-disk corruption undone");
    }

    /* a late completion (1 s) holds back only its own request: the read
     * started after it completes first, by its own completion time */
    add(s, FERRY_FAULT_DELAY, 0, 0, 0, 1, 1000);
    ferry_swap_req r0, r2;
    double t0 = ferry_now();
    EXPECT_EQ_INT(ferry_swap_read(s, 0, rbuf, good_len[0], &r0, NULL, NULL), FERRY_OK);
    unsigned char *rb2 = nt_alloc(SLOT);
    EXPECT_EQ_INT(ferry_swap_read(s, 2, rb2, good_len[2], &r2, NULL, NULL), FERRY_OK);
    EXPECT_EQ_INT(ferry_swap_wait(&r2), FERRY_OK);
    EXPECT_EQ_INT(ferry_swap_wait(&r0), FERRY_OK);
    double t00 = ferry_now() - t0, done0 = 0, done2 = 0;
    ferry_swap_req_times(&r0, NULL, NULL, &done0);
    ferry_swap_req_times(&r2, NULL, NULL, &done2);
    EXPECT(t00 >= 0.99);
    EXPECT(done2 < done0);
    EXPECT(memcmp(rbuf, good[0], good_len[0]) == 0);
    EXPECT(memcmp(rb2, good[2], good_len[2]) == 0);
    free(rb2);
    check_all(s, "a late completion");

    /* a write's CRCs taken 2.5 s late: its data lands first and it waits
     * for them, while other requests complete (the completion thread and
     * the check threads never wait for a CRC: the write is handed back); a
     * read that waited for them would take over 2 s, against a bound of
     * 1.5 s that a loaded machine's stalls do not reach */
    add(s, FERRY_FAULT_CRC_DELAY, 1, 1, -1, 1, 2500);
    nt_fill(a, SLOT, 4242 + (unsigned)run);
    late_write lw = {s, a, run & 1, 0, 0, 0};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, late_writer, &lw) == 0);
    usleep(200000); /* the write's pieces land meanwhile */
    t0 = ferry_now();
    EXPECT_EQ_INT(do_read(s, 2, good_len[2]), FERRY_OK);
    double tread = ferry_now() - t0;
    if (tread >= 1.5) fprintf(stderr, "read beside a write waiting for its CRCs took %.3f s\n", tread);
    EXPECT(tread < 1.5);
    pthread_join(th, NULL);
    EXPECT_EQ_INT(lw.status, FERRY_OK);
    EXPECT(lw.seconds >= 2.49);
    set_good(1, a, SLOT);
    check_all(s, "a write whose CRCs came after its data");
    ferry_swap_close(s);
  }
  free(a);
  free(b);
  free(rbuf);
  for (int i = 0; i < NCH; i++) free(good[i]);
  nt_cleanup(dir, 0);
  return test_finish("nvme.faults");
}
