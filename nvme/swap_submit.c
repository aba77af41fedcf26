/* nvme/swap_submit.c — the submission side of the swap store: a request
 * is checked, queued (or waits for a spare slot), cut into pieces and
 * issued to the ring as units come free; what the completion side prepares
 * is submitted in batches (swap_flush_sq); a write's CRCs are taken while
 * it flies; a discarded store drops what is queued. Also poll, wait,
 * drain and what a finished request tells.
 */
#include "nvme/swap_impl.h"
#include "core/crc32c.h"

#include <errno.h>
#include <liburing.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* The ring (store mutex held)                                               */

void swap_submit_now(ferry_swap *s) {
  if (s->ring_err) return; /* nothing would complete */
  int rc = io_uring_submit(&s->ring);
  s->st.submit_calls++;
  if (rc > 0) s->sq_inflight += rc;
  if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
    ferry_err(&s->err, FERRY_EIO, "swap '%s': io_uring_submit: %s", s->name, strerror(-rc));
}

struct io_uring_sqe *swap_get_sqe(ferry_swap *s) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
  if (!sqe) {
    swap_submit_now(s);
    sqe = io_uring_get_sqe(&s->ring);
  }
  FERRY_ASSERT(sqe, "swap '%s': submission queue full with %u units", s->name,
               s->cfg.queue_depth);
  return sqe;
}

void swap_post_tag(ferry_swap *s, uint64_t tag) {
  if (s->ring_err) { /* the completion thread waits on cv now (swap_complete.c) */
    pthread_cond_broadcast(&s->cv);
    return;
  }
  struct io_uring_sqe *sqe = swap_get_sqe(s);
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, tag);
  swap_submit_now(s);
}

void swap_prep_unit(ferry_swap *s, io_unit *u) {
  struct io_uring_sqe *sqe = swap_get_sqe(s);
  ferry_swap_req *r = u->req;
  unsigned char *addr = u->mem + u->done;
  unsigned len = (unsigned)(u->io_len - u->done);
  uint64_t off = u->file_off + u->done;
  int fd = s->fixed_files ? (int)u->file : s->fds[u->file];
  int fixed = r->buf_index >= 0 && !u->use_bounce;
  if (r->op == OP_READ) {
    if (fixed) io_uring_prep_read_fixed(sqe, fd, addr, len, off, r->buf_index);
    else io_uring_prep_read(sqe, fd, addr, len, off);
  } else {
    if (fixed) io_uring_prep_write_fixed(sqe, fd, addr, len, off, r->buf_index);
    else io_uring_prep_write(sqe, fd, addr, len, off);
  }
  if (s->fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, u);
}

/* Set on the completion thread while it runs callbacks: requests they
 * start are submitted in one batch after the last callback. */
static _Thread_local ferry_swap *tl_reaping;

void swap_run_callback(ferry_swap *s, ferry_swap_req *r) {
  tl_reaping = s;
  r->cb(r, r->status, r->user); /* r belongs to the caller from here */
  tl_reaping = NULL;
}

/* ------------------------------------------------------------------------ */
/* The run queue and the pieces (store mutex held)                           */

static void runq_push(ferry_swap *s, ferry_swap_req *r) {
  r->next = NULL;
  if (s->runq_tail) s->runq_tail->next = r;
  else s->runq_head = r;
  s->runq_tail = r;
}

static void runq_pop(ferry_swap *s) {
  ferry_swap_req *r = s->runq_head;
  s->runq_head = r->next;
  if (!s->runq_head) s->runq_tail = NULL;
  r->next = NULL;
}

/* Unit u takes piece k of request r: where it lands, and its memory (the
 * caller's buffer, or the unit's bounce block for the sub-alignment tail). */
static void assign_piece(ferry_swap *s, io_unit *u, ferry_swap_req *r, uint32_t k) {
  uint32_t pos;
  size_t intra;
  piece_geom(s, r->len, k, &pos, &intra, &u->data_len, &u->use_bounce);
  u->req = r;
  u->next = NULL;
  u->piece = k;
  u->chunk_off = (size_t)pos * s->bs + intra;
  locate(s, r->phys, pos, &u->file, &u->file_off);
  u->file_off += intra;
  u->done = 0;
  u->retries = 0;
  u->err = 0;
  u->state = U_NORMAL;
  u->fault = 0;
  u->flip = 0;
  if (u->use_bounce) {
    u->mem = u->bounce;
    u->io_len = s->oa;
    if (r->op == OP_WRITE) {
      memcpy(u->bounce, r->buf + u->chunk_off, u->data_len);
      memset(u->bounce + u->data_len, 0, s->oa - u->data_len);
    }
  } else {
    u->mem = r->buf + u->chunk_off;
    u->io_len = u->data_len;
  }
}

/* Discarding: queue head r issues nothing more and fails. When none of
 * its pieces is in flight, unit u carries a NOP for it, so its end takes
 * the completion side's path of a failed request (commit, callback).
 * Returns 1 when it took u. */
static int drop_head(ferry_swap *s, ferry_swap_req *r, io_unit *u) {
  uint32_t k = r->next_piece;
  int idle = r->inflight == 0;
  swap_fail_req(s, r, FERRY_ECANCELED);
  if (!idle) return 0; /* its last piece in flight finishes it */
  s->free_units = u->next;
  assign_piece(s, u, r, k);
  u->state = U_DROPPED;
  u->err = FERRY_ECANCELED;
  r->inflight++;
  struct io_uring_sqe *sqe = swap_get_sqe(s);
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data(sqe, u);
  return 1;
}

int swap_issue(ferry_swap *s) {
  int n = 0;
  if (s->ring_err) return 0; /* the completion thread fails what is queued */
  while (s->free_units && s->runq_head) {
    ferry_swap_req *r = s->runq_head;
    if (s->discard) {
      n += drop_head(s, r, s->free_units);
      continue;
    }
    uint32_t k = r->next_piece++;
    if (r->next_piece == r->npieces) runq_pop(s);
    io_unit *u = s->free_units;
    s->free_units = u->next;
    assign_piece(s, u, r, k);
#if FERRY_FAULT_INJECTION
    if (s->nfaults) swap_fault_plan(s, u);
#endif
    r->inflight++;
    swap_prep_unit(s, u);
    n++;
  }
  return n;
}

void swap_fail_req(ferry_swap *s, ferry_swap_req *r, int err) {
  if (r->status != FERRY_OK) return;
  r->status = err;
  if (r->next_piece < r->npieces) { /* only the queue head is half issued */
    FERRY_ASSERT(s->runq_head == r, "swap: failing request is not at the queue head");
    runq_pop(s);
    r->next_piece = r->npieces;
  }
}

/* ------------------------------------------------------------------------ */
/* Write CRCs, taken while the write flies                                   */

/* The CRC of every piece of write r, into its physical slot's entries
 * (not visible to readers until the write commits: a shadow slot is not
 * mapped yet, and a chunk with a write in flight refuses reads). */
static void write_crcs(ferry_swap *s, ferry_swap_req *r) {
  uint32_t *crc = &s->crc[(size_t)r->phys * s->cps];
  for (uint32_t k = 0; k < r->npieces; k++) {
    uint32_t pos;
    size_t intra, dlen;
    int bounce;
    piece_geom(s, r->len, k, &pos, &intra, &dlen, &bounce);
    crc[k] = ferry_crc32c(0, r->buf + (size_t)pos * s->bs + intra, dlen);
  }
}

/* After computing write r's CRCs (crc_state 1): marks them done. When the
 * write became whole meanwhile (crc_state 3: its last piece found them
 * missing and left it), hands it to the completion thread to finish: a
 * NOP with FIN_TAG wakes it. */
static void crcs_done(ferry_swap *s, ferry_swap_req *r) {
  int st = 1;
  if (atomic_compare_exchange_strong_explicit(&r->crc_state, &st, 2, memory_order_acq_rel,
                                              memory_order_acquire))
    return;
  FERRY_ASSERT(st == 3, "swap: write CRC state %d", st);
  atomic_store_explicit(&r->crc_state, 2, memory_order_release);
  pthread_mutex_lock(&s->mu);
  r->crc_next = s->finq;
  s->finq = r;
  swap_post_tag(s, FIN_TAG);
  pthread_mutex_unlock(&s->mu);
}

void swap_claim_write_crcs(ferry_swap *s, ferry_swap_req *r) {
  int st = 0;
  if (!atomic_compare_exchange_strong_explicit(&r->crc_state, &st, 1, memory_order_acq_rel,
                                               memory_order_acquire))
    return;
  write_crcs(s, r);
  crcs_done(s, r);
}

/* Writes queued for the completion thread's CRC work (mutex held). */
static void crcq_push(ferry_swap *s, ferry_swap_req *r) {
  if (!s->cfg.verify) return;
  r->crc_next = s->crcq;
  s->crcq = r;
}

/* The disk is short of work: fewer than a quarter of the queue depth
 * submitted and not yet completed (mutex held). Read on the completion
 * thread or on a check worker while the completion thread waits for its
 * batch: both after its last io_uring_cq_advance. */
static int starving(ferry_swap *s) {
  int flying = s->sq_inflight - (int)io_uring_cq_ready(&s->ring);
  return flying * 4 < (int)s->cfg.queue_depth;
}

/* Otherwise the prepared requests wait for the next check of this kind or
 * the end of the batch, so a burst of completions costs a few
 * io_uring_enter calls, not one per request. */
void swap_flush_sq(ferry_swap *s, int force) {
  unsigned ready = io_uring_sq_ready(&s->ring);
  if (ready && (force || starving(s) || ready * 4 >= s->cfg.queue_depth)) swap_submit_now(s);
}

ferry_swap_req *swap_take_list(ferry_swap *s, ferry_swap_req **head, int flush) {
  pthread_mutex_lock(&s->mu);
  if (flush && *head) swap_flush_sq(s, 1);
  ferry_swap_req *q = *head;
  *head = NULL;
  pthread_mutex_unlock(&s->mu);
  return q;
}

/* Completion side, after callbacks may have started writes: those writes
 * are in flight and none has finished (completions are reaped only
 * between batches, and every batch drains crcq before it ends). */
void swap_drain_crcq(ferry_swap *s) {
  ferry_swap_req *q = swap_take_list(s, &s->crcq, 1);
  for (ferry_swap_req *r = q, *nx; r; r = nx) {
    nx = r->crc_next;
    swap_claim_write_crcs(s, r);
  }
}

/* The free physical slot a write of len bytes takes: the smallest that
 * holds it, the last freed among equals; UINT32_MAX when none does. The
 * last free slot of slot_size bytes is kept for a chunk that fits no
 * smaller slot, so such a chunk always finds one once the writes in
 * flight are done. The slot leaves the free list (mutex held). */
static uint32_t take_free_slot(ferry_swap *s, size_t len) {
  uint32_t best = UINT32_MAX, nmax = 0;
  for (uint32_t i = s->nfree_phys; i-- > 0;) {
    uint64_t z = s->psize[s->free_phys[i]];
    nmax += z == s->cfg.slot_size;
    if (z >= len && (best == UINT32_MAX || z < s->psize[s->free_phys[best]])) best = i;
  }
  if (best == UINT32_MAX ||
      (len <= s->below_max && s->psize[s->free_phys[best]] == s->cfg.slot_size && nmax < 2))
    return UINT32_MAX;
  uint32_t p = s->free_phys[best];
  memmove(s->free_phys + best, s->free_phys + best + 1,
          (s->nfree_phys - best - 1) * sizeof *s->free_phys);
  s->nfree_phys--;
  return p;
}

/* Where write r goes: a free slot that holds it (a shadow write), in place
 * when no shadow write in flight can free one, else nowhere yet
 * (UINT32_MAX: it waits) (mutex held). */
static uint32_t write_slot(ferry_swap *s, const ferry_swap_req *r) {
  uint32_t p = take_free_slot(s, r->len);
  if (p != UINT32_MAX) {
    s->nshadow++;
    return p;
  }
  return s->nshadow ? UINT32_MAX : s->map[r->chunk];
}

void swap_start_waiting_writes(ferry_swap *s) {
  while (s->slotq_head) {
    ferry_swap_req *r = s->slotq_head;
    /* discarding (or the ring failed): each goes to the run queue at once,
     * to be dropped there without a slot of its own (its pieces' places:
     * the chunk's slot) */
    int drop = s->discard || s->ring_err;
    uint32_t p = drop ? s->map[r->chunk] : write_slot(s, r);
    if (p == UINT32_MAX) break;
    r->unplaced = drop;
    s->slotq_head = r->next;
    if (!s->slotq_head) s->slotq_tail = NULL;
    r->phys = p;
    runq_push(s, r);
    if (!drop) crcq_push(s, r);
  }
}

/* ------------------------------------------------------------------------ */
/* Starting a request                                                        */

/* The arguments of a request, before anything is touched. */
static int check_request(ferry_swap *s, ferry_swap_req *r, uint32_t chunk, const void *buf,
                         size_t len) {
  if (!s || !r || (!buf && len)) return FERRY_EINVAL;
  if (chunk >= s->cfg.nslots)
    return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': chunk %u out of range (%u slots)",
                     s->name, chunk, s->cfg.nslots);
  if (len == 0 || len > s->psize[chunk])
    return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': chunk %u: %zu bytes (slot holds 1..%zu)",
                     s->name, chunk, len, (size_t)s->psize[chunk]);
  if ((uintptr_t)buf % s->mem_align)
    return ferry_err(&s->err, FERRY_EINVAL,
                     "swap '%s': buffer %p is not aligned to %zu bytes as O_DIRECT needs", s->name,
                     buf, s->mem_align);
  return FERRY_OK;
}

static void init_request(ferry_swap *s, ferry_swap_req *r, int op, uint32_t chunk,
                         const void *buf, size_t len, ferry_swap_cb cb, void *user) {
  memset(r, 0, sizeof *r);
  r->store = s;
  r->buf = (unsigned char *)buf;
  r->len = len;
  r->chunk = chunk;
  r->op = op;
  r->cb = cb;
  r->user = user;
  r->buf_index = -1;
  r->npieces = npieces_of(s, len);
  atomic_init(&r->done, 0);
  atomic_init(&r->crc_state, 0);
}

/* The registered buffer holding [buf, buf+len), -1 when none (mutex held). */
static int registered_buffer(const ferry_swap *s, const unsigned char *buf, size_t len) {
  for (unsigned i = 0; i < s->nregs; i++) {
    const unsigned char *b = s->regs[i].iov_base;
    if (buf >= b && buf + len <= b + s->regs[i].iov_len) return (int)i;
  }
  return -1;
}

/* Whether chunk r->chunk takes request r now (mutex held). */
static int admit(ferry_swap *s, const ferry_swap_req *r) {
  uint32_t chunk = r->chunk;
  if (s->busy[chunk])
    return ferry_err(&s->err, FERRY_EBUSY, "swap '%s': chunk %u already has a request in flight",
                     s->name, chunk);
  if (r->op != OP_READ) {
    if (r->len <= s->psize[s->map[chunk]]) return FERRY_OK;
    return ferry_err(&s->err, FERRY_EINVAL,
                     "swap '%s': chunk %u: a write of %zu bytes where its slot now holds %zu "
                     "(a chunk of sized slots never grows)",
                     s->name, chunk, r->len, (size_t)s->psize[s->map[chunk]]);
  }
  size_t have = s->plen[s->map[chunk]];
  if (s->lost[chunk])
    return ferry_err(&s->err, FERRY_ECORRUPT,
                     "swap '%s': chunk %u was lost by a failed in-place write", s->name, chunk);
  if (!have)
    return ferry_err(&s->err, FERRY_ESTATE, "swap '%s': chunk %u was never written", s->name,
                     chunk);
  if (have != r->len)
    return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': chunk %u holds %zu bytes, read asked %zu",
                     s->name, chunk, have, r->len);
  return FERRY_OK;
}

/* Queues admitted request r on its physical slot, or behind the other
 * writes waiting for a spare. Returns 1 when it is on the run queue
 * (mutex held). */
static int enqueue(ferry_swap *s, ferry_swap_req *r) {
  if (r->op == OP_WRITE && s->index_saved) {
    unlink(s->index_path); /* it no longer describes the files */
    s->index_saved = 0;
  }
  s->busy[r->chunk] = 1;
  s->active++;
  r->t_submit = ferry_now();
  uint32_t p = r->op == OP_READ || !s->cfg.spare_slots ? s->map[r->chunk]
               : s->slotq_head                         ? UINT32_MAX /* behind those waiting */
                                                       : write_slot(s, r);
  if (p != UINT32_MAX) {
    r->phys = p;
  } else { /* no free slot holds it, and a shadow write in flight will free one: wait */
    r->next = NULL;
    if (s->slotq_tail) s->slotq_tail->next = r;
    else s->slotq_head = r;
    s->slotq_tail = r;
    return 0; /* its CRCs: when it gets a slot (swap_start_waiting_writes) */
  }
  runq_push(s, r);
  return 1;
}

static int start(ferry_swap *s, ferry_swap_req *r, int op, uint32_t chunk, const void *buf,
                 size_t len, ferry_swap_cb cb, void *user) {
  int rc = check_request(s, r, chunk, buf, len);
  if (rc != FERRY_OK) return rc;
  init_request(s, r, op, chunk, buf, len, cb, user);
  int crc_here = 0; /* this thread takes the write's CRCs once it is submitted */
  unsigned crc_delay = 0;
  pthread_mutex_lock(&s->mu);
  r->buf_index = registered_buffer(s, r->buf, len);
  if (s->discard)
    rc = ferry_err(&s->err, FERRY_ECANCELED, "swap '%s': chunk %u: the store is discarded (closing)",
                   s->name, chunk);
  else if (s->ring_err)
    rc = ferry_err(&s->err, FERRY_EIO,
                   "swap '%s': chunk %u refused: the store's io_uring failed (io_uring_wait_cqe: "
                   "%s); close the store",
                   s->name, chunk, strerror(s->ring_err));
  else
    rc = admit(s, r);
  if (rc == FERRY_OK) {
    int queued = enqueue(s, r);
    if (op == OP_WRITE && queued && s->cfg.verify) {
      if (tl_reaping == s) {
        crcq_push(s, r); /* after the completion thread submits */
      } else { /* ours: the commit waits until we store 2 */
        atomic_store_explicit(&r->crc_state, 1, memory_order_relaxed);
        crc_here = 1;
#if FERRY_FAULT_INJECTION
        if (s->nfaults) crc_delay = swap_crc_delay_ms(s, r);
#endif
      }
    }
    if (swap_issue(s) && tl_reaping != s) swap_submit_now(s);
  }
  pthread_mutex_unlock(&s->mu);
  /* r cannot finish before crcs_done: its commit needs crc_state 2 (a
   * last piece that finds 1 leaves it to crcs_done, which hands it to the
   * completion thread), and r is not touched here after that */
  if (crc_here) {
    if (crc_delay) usleep(crc_delay * 1000u); /* fault injection: CRCs late */
    write_crcs(s, r);
    crcs_done(s, r);
  }
  return rc;
}

int ferry_swap_read(ferry_swap *s, uint32_t chunk, void *buf, size_t len, ferry_swap_req *req,
                    ferry_swap_cb cb, void *user) {
  return start(s, req, OP_READ, chunk, buf, len, cb, user);
}

int ferry_swap_write(ferry_swap *s, uint32_t chunk, const void *buf, size_t len,
                     ferry_swap_req *req, ferry_swap_cb cb, void *user) {
  return start(s, req, OP_WRITE, chunk, buf, len, cb, user);
}

int ferry_swap_poll(ferry_swap_req *req) {
  if (!req) return FERRY_EINVAL;
  if (!atomic_load_explicit(&req->done, memory_order_acquire)) return FERRY_EAGAIN;
  return req->status;
}

int ferry_swap_wait(ferry_swap_req *req) {
  if (!req || !req->store) return FERRY_EINVAL;
  ferry_swap *s = req->store;
  pthread_mutex_lock(&s->mu);
  while (!atomic_load_explicit(&req->done, memory_order_acquire)) pthread_cond_wait(&s->cv, &s->mu);
  int st = req->status;
  pthread_mutex_unlock(&s->mu);
  return st;
}

void ferry_swap_req_times(const ferry_swap_req *r, int *op, double *t_submit, double *t_done) {
  if (op) *op = r->op;
  if (t_submit) *t_submit = r->t_submit;
  if (t_done) *t_done = r->t_done;
}

void ferry_swap_discard(ferry_swap *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  if (!s->discard) {
    s->discard = 1;
    swap_start_waiting_writes(s);
    if (swap_issue(s)) swap_submit_now(s);
  }
  pthread_mutex_unlock(&s->mu);
}

void ferry_swap_drain(ferry_swap *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  while (s->active) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}
