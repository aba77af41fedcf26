/* tests/nvme/test_discard.c — ferry_swap_discard: with many writes queued
 * behind a slow disk (every written piece completes 40 ms late), a discard
 * ends the queue in a fraction of its time: the pieces on the disk are
 * awaited, every other request ends with FERRY_ECANCELED (its callback
 * runs exactly once, wait returns it), and new requests are refused. The
 * index then kept never shows a dropped write as written: reopened, each
 * chunk reads as its last completed write or is refused as lost (in place
 * only). With spare slots (most writes wait for one) and in place.
 */
#include "nvme_test.h"

#include <stdatomic.h>

#define NCH 24
#define SLOT (1u << 20)
#define BS (256u << 10) /* 4 pieces a chunk */
#define QD 2
#define DELAY_MS 40

static unsigned char *old_data[NCH], *new_data[NCH], *rbuf;
static ferry_swap_req req[NCH];
static atomic_int calls[NCH];
static int cb_status[NCH];

static void on_done(ferry_swap_req *r, int status, void *user) {
  (void)r;
  int i = (int)(intptr_t)user;
  cb_status[i] = status;
  atomic_fetch_add(&calls[i], 1);
}

static void run(const char *dir, uint32_t spares) {
  ferry_swap_config c = ferry_swap_config_default();
  c.paths[0] = dir;
  c.npaths = 1;
  c.slot_size = SLOT;
  c.nslots = NCH;
  c.spare_slots = spares;
  c.block_size = BS;
  c.queue_depth = QD;
  c.keep_files = 1;
  ferry_swap *s = NULL;
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  for (int i = 0; i < NCH; i++) { /* the previous contents */
    REQUIRE(ferry_swap_write(s, (uint32_t)i, old_data[i], SLOT, &req[i], NULL, NULL) == 0);
    REQUIRE(ferry_swap_wait(&req[i]) == FERRY_OK);
  }
  ferry_fault f = {FERRY_FAULT_DELAY, 1, -1, -1, 0, DELAY_MS};
  REQUIRE(ferry_swap_fault_add(s, &f) == FERRY_OK);
  for (int i = 0; i < NCH; i++) {
    atomic_store(&calls[i], 0);
    cb_status[i] = 1;
    ferry_swap_cb cb = i % 2 ? on_done : NULL; /* half by callback, half by wait */
    REQUIRE(ferry_swap_write(s, (uint32_t)i, new_data[i], SLOT, &req[i], cb,
                             (void *)(intptr_t)i) == FERRY_OK);
  }
  double queued = (double)NCH * (SLOT / BS) * DELAY_MS / 1000.0 / QD;
  usleep(5 * DELAY_MS * 1000 / 2); /* a few pieces land, others are on the disk */
  double t0 = ferry_now();
  ferry_swap_discard(s);
  ferry_swap_drain(s);
  double took = ferry_now() - t0;
  int wst[NCH], ok = 0, dropped = 0;
  for (int i = 0; i < NCH; i++) {
    if (i % 2) {
      EXPECT_EQ_INT(atomic_load(&calls[i]), 1);
      wst[i] = cb_status[i];
    } else {
      wst[i] = ferry_swap_wait(&req[i]);
    }
    EXPECT(wst[i] == FERRY_OK || wst[i] == FERRY_ECANCELED);
    ok += wst[i] == FERRY_OK;
    dropped += wst[i] == FERRY_ECANCELED;
  }
  printf("spares %u: %d written, %d dropped; the queue (%.2f s of writes) ended %.3f s after "
         "the discard\n",
         spares, ok, dropped, queued, took);
  EXPECT(dropped >= NCH / 2);
  EXPECT(took < queued / 4);
  /* refused from now on */
  ferry_swap_req r;
  EXPECT_EQ_INT(ferry_swap_write(s, 0, new_data[0], SLOT, &r, NULL, NULL), FERRY_ECANCELED);
  EXPECT_EQ_INT(ferry_swap_read(s, 0, rbuf, SLOT, &r, NULL, NULL), FERRY_ECANCELED);
  EXPECT(strstr(ferry_swap_last_error(s), "discarded"));
  ferry_swap_info in;
  REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
  char index[1200];
  snprintf(index, sizeof index, "%s", in.index_path);
  ferry_swap_close(s);

  /* a later reader: the last completed write, or refused, never a dropped one */
  ferry_swap_config rc = ferry_swap_config_default();
  REQUIRE(ferry_swap_reopen(&rc, index, &s) == FERRY_OK);
  int lost = 0;
  for (int i = 0; i < NCH; i++) {
    int st = ferry_swap_read(s, (uint32_t)i, rbuf, SLOT, &r, NULL, NULL);
    if (st == FERRY_OK) st = ferry_swap_wait(&r);
    if (st == FERRY_OK) {
      EXPECT(memcmp(rbuf, wst[i] == FERRY_OK ? new_data[i] : old_data[i], SLOT) == 0);
    } else {
      EXPECT_EQ_INT(st, FERRY_ECORRUPT); /* lost: an in-place write that was dropped */
      EXPECT_EQ_INT(wst[i], FERRY_ECANCELED);
      lost++;
    }
  }
  printf("spares %u: reopened, %d chunks lost\n", spares, lost);
  /* in place, a dropped write's CRCs may be taken: lost; a write that
   * waited for a spare touched nothing */
  if (spares == 0) EXPECT(lost > 0);
  else EXPECT(lost <= 1);
  ferry_swap_close(s); /* keep_files off: the files go */
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "discard", dir, sizeof dir);
  for (int i = 0; i < NCH; i++) {
    old_data[i] = nt_alloc(SLOT);
    new_data[i] = nt_alloc(SLOT);
    nt_fill(old_data[i], SLOT, 100 + (unsigned)i);
    nt_fill(new_data[i], SLOT, 200 + (unsigned)i);
  }
  rbuf = nt_alloc(SLOT);
  {
    ferry_swap_config c = ferry_swap_config_default();
    c.paths[0] = dir;
    c.npaths = 1;
    c.slot_size = SLOT;
    c.nslots = 1;
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
    ferry_fault f = {FERRY_FAULT_DELAY, 1, -1, -1, 0, 1};
    int frc = ferry_swap_fault_add(s, &f);
    ferry_swap_close(s);
    if (frc == FERRY_ENOTSUP) TEST_SKIP("fault injection not compiled in");
  }
  run(dir, 4);
  run(dir, 0);
  EXPECT_EQ_INT(nt_count_files(dir), 0);
  for (int i = 0; i < NCH; i++) {
    free(old_data[i]);
    free(new_data[i]);
  }
  free(rbuf);
  nt_cleanup(dir, 0);
  return test_finish("nvme.discard");
}
