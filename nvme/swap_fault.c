/* nvme/swap_fault.c — fault injection into the swap store (test builds,
 * FERRY_FAULT_INJECTION): the rules (ferry_swap_fault_add), the fault a
 * piece gets when it is first issued, its effect when the piece completes,
 * late write CRCs, a failed wait of the completion thread, and the test
 * hook that flips a bit on disk. Compiled
 * out, ferry_swap_fault_add says FERRY_ENOTSUP.
 */
#include "nvme/swap_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#if FERRY_FAULT_INJECTION
/* Rule i applies to an I/O of op on chunk (piece < 0: any piece) and
 * has hits left. */
static int fault_match(const ferry_swap *s, int i, int op, uint32_t chunk, int64_t piece) {
  const ferry_fault *f = &s->faults[i];
  if (f->count && s->fault_hits[i] >= f->count) return 0;
  if (f->op >= 0 && f->op != op) return 0;
  if (f->chunk >= 0 && (uint32_t)f->chunk != chunk) return 0;
  return piece < 0 || f->piece < 0 || f->piece == piece;
}

void swap_fault_plan(ferry_swap *s, io_unit *u) {
  for (int i = 0; i < s->nfaults; i++) {
    ferry_fault *f = &s->faults[i];
    if (f->kind == FERRY_FAULT_CRC_DELAY) continue; /* per request: swap_crc_delay_ms */
    if (!fault_match(s, i, u->req->op, u->req->chunk, u->piece)) continue;
    s->fault_hits[i]++;
    u->fault = (int)f->kind;
    u->delay_ms = f->delay_ms;
    return;
  }
}

unsigned swap_crc_delay_ms(ferry_swap *s, const ferry_swap_req *r) {
  for (int i = 0; i < s->nfaults; i++) {
    const ferry_fault *f = &s->faults[i];
    if (f->kind != FERRY_FAULT_CRC_DELAY || r->op != OP_WRITE ||
        !fault_match(s, i, r->op, r->chunk, -1))
      continue;
    s->fault_hits[i]++;
    return f->delay_ms;
  }
  return 0;
}

int swap_fault_apply(ferry_swap *s, io_unit *u, int *res) {
  int f = u->fault;
  u->fault = 0;
  if (f == FERRY_FAULT_EIO) *res = -EIO;
  else if (f == FERRY_FAULT_ENOSPC) *res = -ENOSPC;
  else if (f == FERRY_FAULT_SHORT && *res > 0 && (size_t)*res >= 2 * s->oa)
    *res = (int)((size_t)*res / 2 / s->oa * s->oa);
  else if (f == FERRY_FAULT_BITFLIP && u->req->op == OP_READ) u->flip = 1;
  else if (f == FERRY_FAULT_DELAY) {
    u->saved_res = *res;
    u->state = U_DELAYING;
    u->ts.tv_sec = u->delay_ms / 1000;
    u->ts.tv_nsec = (long long)(u->delay_ms % 1000) * 1000000LL;
    return 1;
  }
  return 0;
}

int ferry_swap_fault_add(ferry_swap *s, const ferry_fault *f) {
  if (!s || !f || f->kind < FERRY_FAULT_EIO || f->kind > FERRY_FAULT_CRC_DELAY) return FERRY_EINVAL;
  pthread_mutex_lock(&s->mu);
  int rc = FERRY_OK;
  if (s->nfaults >= MAX_FAULTS) {
    rc = ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': more than %d fault rules", s->name,
                   MAX_FAULTS);
  } else {
    s->faults[s->nfaults] = *f;
    s->fault_hits[s->nfaults++] = 0;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int ferry_swap_fault_ring_wait(ferry_swap *s, int err) {
  if (!s || err <= 0) return FERRY_EINVAL;
  pthread_mutex_lock(&s->mu);
  s->wait_fault = err;
  pthread_mutex_unlock(&s->mu);
  return FERRY_OK;
}

int swap_fault_take_wait(ferry_swap *s) {
  int e = s->wait_fault;
  s->wait_fault = 0;
  return e;
}

void ferry_swap_fault_clear(ferry_swap *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->nfaults = 0;
  pthread_mutex_unlock(&s->mu);
}
#else
int ferry_swap_fault_add(ferry_swap *s, const ferry_fault *f) {
  (void)f;
  if (s) ferry_err(&s->err, FERRY_ENOTSUP, "fault injection is not compiled in "
                                           "(configure with -DFERRY_FAULT_INJECTION=ON)");
  return FERRY_ENOTSUP;
}
void ferry_swap_fault_clear(ferry_swap *s) { (void)s; }
int ferry_swap_fault_ring_wait(ferry_swap *s, int err) {
  (void)err;
  return ferry_swap_fault_add(s, &(ferry_fault){.kind = FERRY_FAULT_EIO}); /* FERRY_ENOTSUP */
}
#endif

int ferry_swap_corrupt_on_disk(ferry_swap *s, uint32_t chunk, size_t offset, int bit) {
  if (!s || chunk >= s->cfg.nslots) return FERRY_EINVAL;
  pthread_mutex_lock(&s->mu);
  uint32_t phys = s->map[chunk];
  size_t have = s->plen[phys];
  int busy = s->busy[chunk];
  pthread_mutex_unlock(&s->mu);
  if (busy || offset >= have) return FERRY_EINVAL;
  uint32_t file;
  uint64_t off;
  locate(s, phys, (uint32_t)(offset / s->bs), &file, &off);
  off += offset % s->bs;
  size_t blk = s->oa > 4096 ? s->oa : 4096;
  uint64_t base = off / blk * blk;
  void *tmp = NULL;
  if (posix_memalign(&tmp, blk, blk) != 0) return FERRY_ENOMEM;
  int rc = FERRY_OK;
  /* a sized slot's tail may end the file short of a whole block */
  ssize_t got = pread(s->fds[file], tmp, blk, (off_t)base);
  if (got <= (ssize_t)(off - base)) rc = FERRY_EIO;
  if (rc == FERRY_OK) {
    ((unsigned char *)tmp)[off - base] ^= (unsigned char)(1u << (bit & 7));
    if (pwrite(s->fds[file], tmp, (size_t)got, (off_t)base) != got) rc = FERRY_EIO;
  }
  free(tmp);
  return rc;
}
