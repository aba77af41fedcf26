/* nvme/swap_open.c — the io_uring swap store: files in 1..N directories holding
 * fixed-size chunk slots, blocks of a slot striped over the files, shadow
 * slots so a failed rewrite keeps the old bytes, CRC32C per block, one ring
 * per store with a completion thread that reaps, verifies, retries short
 * I/O and refills the queue. Fault injection lives here too (test builds).
 */
#include "nvme/swap_impl.h"
#include "core/crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sched.h>
#include <unistd.h>

ferry_swap_config ferry_swap_config_default(void) {
  ferry_swap_config c;
  memset(&c, 0, sizeof c);
  c.spare_slots = 4;
  c.block_size = 1u << 20;
  c.queue_depth = 32;
  c.verify = 1;
  c.check_threads = 1;
  return c;
}

const char *ferry_swap_last_error(ferry_swap *s) { return s ? ferry_err_msg(&s->err) : ""; }

static int status_of_errno(int e) {
  switch (e) {
  case ENOSPC:
  case EDQUOT: return FERRY_ENOSPC;
  case ENOENT: return FERRY_ENOENT;
  case EACCES:
  case EPERM:
  case EROFS: return FERRY_EPERM;
  case ENOMEM: return FERRY_ENOMEM;
  default: return FERRY_EIO;
  }
}

static uint32_t npieces_of(const ferry_swap *s, size_t len) {
  size_t nfull = len / s->bs, rem = len % s->bs, a = rem - rem % s->oa;
  return (uint32_t)(nfull + (a > 0) + (rem - a > 0));
}

/* Piece k of a chunk of len bytes: its block position, offset inside the
 * block, data bytes, and whether it is the sub-alignment tail (bounce). */
static void piece_geom(const ferry_swap *s, size_t len, uint32_t k, uint32_t *pos, size_t *intra,
                       size_t *dlen, int *bounce) {
  size_t nfull = len / s->bs, rem = len % s->bs, a = rem - rem % s->oa;
  *bounce = 0;
  *intra = 0;
  if (k < nfull) {
    *pos = k;
    *dlen = s->bs;
  } else if (k == nfull && a) {
    *pos = (uint32_t)nfull;
    *dlen = a;
  } else {
    *pos = (uint32_t)nfull;
    *intra = a;
    *dlen = rem - a;
    *bounce = 1;
  }
}

static void locate(const ferry_swap *s, uint32_t phys, uint32_t pos, uint32_t *file,
                   uint64_t *off) {
  uint32_t n = (uint32_t)s->npaths;
  *file = (phys + pos) % n;
  *off = ((uint64_t)phys * s->ppf + pos / n) * s->bs;
}

/* ------------------------------------------------------------------------ */
/* Fault injection: decided when a piece is first issued, applied when it   */
/* completes. Compiled out of production builds.                            */

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

static void fault_plan(ferry_swap *s, io_unit *u) {
  for (int i = 0; i < s->nfaults; i++) {
    ferry_fault *f = &s->faults[i];
    if (f->kind == FERRY_FAULT_CRC_DELAY) continue; /* per request: crc_delay_ms */
    if (!fault_match(s, i, u->req->op, u->req->chunk, u->piece)) continue;
    s->fault_hits[i]++;
    u->fault = (int)f->kind;
    u->delay_ms = f->delay_ms;
    return;
  }
}

/* Milliseconds a CRC_DELAY rule holds back write r's CRCs (mutex held). */
static unsigned crc_delay_ms(ferry_swap *s, const ferry_swap_req *r) {
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
#endif

/* ------------------------------------------------------------------------ */
/* Submission side (store mutex held)                                        */

static void submit_now(ferry_swap *s) {
  int rc = io_uring_submit(&s->ring);
  s->st.submit_calls++;
  if (rc > 0) s->sq_inflight += rc;
  if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
    ferry_err(&s->err, FERRY_EIO, "swap '%s': io_uring_submit: %s", s->name, strerror(-rc));
}

static struct io_uring_sqe *get_sqe(ferry_swap *s) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
  if (!sqe) {
    submit_now(s);
    sqe = io_uring_get_sqe(&s->ring);
  }
  FERRY_ASSERT(sqe, "swap '%s': submission queue full with %u units", s->name,
               s->cfg.queue_depth);
  return sqe;
}

/* Submits a NOP carrying tag (STOP_TAG, FIN_TAG) to wake the completion
 * thread. */
static void post_tag(ferry_swap *s, uint64_t tag) {
  struct io_uring_sqe *sqe = get_sqe(s);
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, tag);
  submit_now(s);
}

static void prep_unit(ferry_swap *s, io_unit *u) {
  struct io_uring_sqe *sqe = get_sqe(s);
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

/* Issues pieces of the queued requests while units are free. */
static int issue(ferry_swap *s) {
  int n = 0;
  while (s->free_units && s->runq_head) {
    ferry_swap_req *r = s->runq_head;
    uint32_t k = r->next_piece++;
    if (r->next_piece == r->npieces) runq_pop(s);
    io_unit *u = s->free_units;
    s->free_units = u->next;
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
#if FERRY_FAULT_INJECTION
    if (s->nfaults) fault_plan(s, u);
#endif
    r->inflight++;
    prep_unit(s, u);
    n++;
  }
  return n;
}

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
  post_tag(s, FIN_TAG);
  pthread_mutex_unlock(&s->mu);
}

/* Computes write r's CRCs unless another thread took them (crc_state
 * not 0). */
static void claim_write_crcs(ferry_swap *s, ferry_swap_req *r) {
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

/* Completion side: submits the prepared requests now when force, when
 * the disk is short of work, or when a quarter of the queue depth is
 * ready; otherwise they wait for the next check of this kind or the end
 * of the batch, so a burst of completions costs a few io_uring_enter
 * calls, not one per request (mutex held). */
static void flush_sq(ferry_swap *s, int force) {
  unsigned ready = io_uring_sq_ready(&s->ring);
  if (ready && (force || starving(s) || ready * 4 >= s->cfg.queue_depth)) submit_now(s);
}

/* Detaches the list at *head (crcq or finq, linked by crc_next); with
 * flush, first submits what is prepared when the list is not empty. */
static ferry_swap_req *take_list(ferry_swap *s, ferry_swap_req **head, int flush) {
  pthread_mutex_lock(&s->mu);
  if (flush && *head) flush_sq(s, 1);
  ferry_swap_req *q = *head;
  *head = NULL;
  pthread_mutex_unlock(&s->mu);
  return q;
}

/* Completion side, after callbacks may have started writes: submits what
 * is prepared, then takes the CRCs of those writes while they are in
 * flight (none has finished: completions are reaped only between
 * batches, and every batch drains crcq before it ends). */
static void drain_crcq(ferry_swap *s) {
  ferry_swap_req *q = take_list(s, &s->crcq, 1);
  for (ferry_swap_req *r = q, *nx; r; r = nx) {
    nx = r->crc_next;
    claim_write_crcs(s, r);
  }
}

/* A physical slot came free: start writes that waited for one. */
static void start_waiting_writes(ferry_swap *s) {
  while (s->nfree_phys && s->slotq_head) {
    ferry_swap_req *r = s->slotq_head;
    s->slotq_head = r->next;
    if (!s->slotq_head) s->slotq_tail = NULL;
    r->phys = s->free_phys[--s->nfree_phys];
    runq_push(s, r);
    crcq_push(s, r);
  }
}

static int start(ferry_swap *s, ferry_swap_req *r, int op, uint32_t chunk, const void *buf,
                 size_t len, ferry_swap_cb cb, void *user) {
  if (!s || !r || (!buf && len)) return FERRY_EINVAL;
  if (chunk >= s->cfg.nslots)
    return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': chunk %u out of range (%u slots)",
                     s->name, chunk, s->cfg.nslots);
  if (len == 0 || len > s->cfg.slot_size)
    return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': chunk %u: %zu bytes (slot holds 1..%zu)",
                     s->name, chunk, len, s->cfg.slot_size);
  if ((uintptr_t)buf % s->mem_align)
    return ferry_err(&s->err, FERRY_EINVAL,
                     "swap '%s': buffer %p is not aligned to %zu bytes as O_DIRECT needs", s->name,
                     buf, s->mem_align);
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
  int crc_here = 0; /* this thread takes the write's CRCs once it is submitted */
  unsigned crc_delay = 0;
  pthread_mutex_lock(&s->mu);
  for (unsigned i = 0; i < s->nregs; i++) {
    unsigned char *b = s->regs[i].iov_base;
    if (r->buf >= b && r->buf + len <= b + s->regs[i].iov_len) {
      r->buf_index = (int)i;
      break;
    }
  }
  int rc = FERRY_OK;
  if (s->busy[chunk]) {
    rc = ferry_err(&s->err, FERRY_EBUSY, "swap '%s': chunk %u already has a request in flight",
                   s->name, chunk);
  } else if (op == OP_READ) {
    size_t have = s->plen[s->map[chunk]];
    if (s->lost[chunk])
      rc = ferry_err(&s->err, FERRY_ECORRUPT,
                     "swap '%s': chunk %u was lost by a failed in-place write", s->name, chunk);
    else if (!have)
      rc = ferry_err(&s->err, FERRY_ESTATE, "swap '%s': chunk %u was never written", s->name,
                     chunk);
    else if (have != len)
      rc = ferry_err(&s->err, FERRY_EINVAL, "swap '%s': chunk %u holds %zu bytes, read asked %zu",
                     s->name, chunk, have, len);
  }
  if (rc == FERRY_OK && op == OP_WRITE && s->index_saved) {
    unlink(s->index_path); /* it no longer describes the files */
    s->index_saved = 0;
  }
  if (rc == FERRY_OK) {
    s->busy[chunk] = 1;
    s->active++;
    r->t_submit = ferry_now();
    int queued = 1;
    if (op == OP_READ || !s->cfg.spare_slots) {
      r->phys = s->map[chunk];
      runq_push(s, r);
    } else if (s->nfree_phys) {
      r->phys = s->free_phys[--s->nfree_phys];
      runq_push(s, r);
    } else { /* every spare holds a write in flight: wait for one */
      r->next = NULL;
      if (s->slotq_tail) s->slotq_tail->next = r;
      else s->slotq_head = r;
      s->slotq_tail = r;
      queued = 0; /* its CRCs: when it gets a slot (start_waiting_writes) */
    }
    if (op == OP_WRITE && queued && s->cfg.verify) {
      if (tl_reaping == s) {
        crcq_push(s, r); /* after the completion thread submits */
      } else { /* ours: the commit waits until we store 2 */
        atomic_store_explicit(&r->crc_state, 1, memory_order_relaxed);
        crc_here = 1;
#if FERRY_FAULT_INJECTION
        if (s->nfaults) crc_delay = crc_delay_ms(s, r);
#endif
      }
    }
    if (issue(s) && tl_reaping != s) submit_now(s);
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

void ferry_swap_drain(ferry_swap *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  while (s->active) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* Completion side                                                           */

static void piece_error(ferry_swap *s, io_unit *u, int res, const char *what) {
  ferry_swap_req *r = u->req;
  int e = -res;
  u->err = e > 0 ? status_of_errno(e) : FERRY_EIO;
  if (u->err == FERRY_ENOENT || u->err == FERRY_EPERM) u->err = FERRY_EIO;
  s->st.io_errors++;
  ferry_err(&s->err, u->err,
            "swap '%s': %s of chunk %u failed at %s offset %llu (%zu bytes): %s", s->name,
            r->op == OP_READ ? "read" : "write", r->chunk, s->files[u->file],
            (unsigned long long)(u->file_off + u->done), u->io_len - u->done,
            e > 0 ? strerror(e) : what);
}

/* One completion, with the store mutex held. Returns 1 when the piece is
 * finished (done or failed), 0 when it was resubmitted or parked. */
static int on_cqe(ferry_swap *s, io_unit *u, int res) {
  if (u->state == U_DELAYING) {
    res = u->saved_res;
    u->state = U_NORMAL;
  }
#if FERRY_FAULT_INJECTION
  else if (u->fault) {
    int f = u->fault;
    u->fault = 0;
    if (f == FERRY_FAULT_EIO) res = -EIO;
    else if (f == FERRY_FAULT_ENOSPC) res = -ENOSPC;
    else if (f == FERRY_FAULT_SHORT && res > 0 && (size_t)res >= 2 * s->oa)
      res = (int)((size_t)res / 2 / s->oa * s->oa);
    else if (f == FERRY_FAULT_BITFLIP && u->req->op == OP_READ) u->flip = 1;
    else if (f == FERRY_FAULT_DELAY) {
      u->saved_res = res;
      u->state = U_DELAYING;
      u->ts.tv_sec = u->delay_ms / 1000;
      u->ts.tv_nsec = (long long)(u->delay_ms % 1000) * 1000000LL;
      struct io_uring_sqe *sqe = get_sqe(s);
      io_uring_prep_timeout(sqe, &u->ts, 0, 0);
      io_uring_sqe_set_data(sqe, u);
      return 0;
    }
  }
#endif
  if (res < 0) {
    if ((res == -EINTR || res == -EAGAIN) && u->retries < MAX_RETRIES) {
      u->retries++;
      s->st.retries++;
      prep_unit(s, u);
      return 0;
    }
    piece_error(s, u, res, "");
    return 1;
  }
  u->done += (size_t)res;
  s->st.ios++;
  if (u->done < u->io_len) {
    if (res == 0 || u->retries >= MAX_RETRIES) {
      piece_error(s, u, 0, res == 0 ? "no progress (end of file?)" : "too many short transfers");
      return 1;
    }
    u->retries++;
    s->st.retries++;
    prep_unit(s, u);
    return 0;
  }
  return 1;
}

/* The request lost a piece: issue nothing more of it (mutex held). */
static void fail_req(ferry_swap *s, ferry_swap_req *r, int err) {
  if (r->status != FERRY_OK) return;
  r->status = err;
  if (r->next_piece < r->npieces) { /* only the queue head is half issued */
    FERRY_ASSERT(s->runq_head == r, "swap: failing request is not at the queue head");
    runq_pop(s);
    r->next_piece = r->npieces;
  }
}

/* A request has no piece in flight and none left: commit it (mutex held).
 * Returns 1 when its callback must run. */
static int finish_req(ferry_swap *s, ferry_swap_req *r) {
  int ok = r->status == FERRY_OK;
  if (r->op == OP_WRITE) {
    uint32_t old = s->map[r->chunk];
    if (ok) {
      s->map[r->chunk] = r->phys;
      s->plen[r->phys] = r->len;
      s->lost[r->chunk] = 0;
      if (old != r->phys) {
        s->plen[old] = 0;
        s->free_phys[s->nfree_phys++] = old;
      }
      s->st.writes++;
      s->st.bytes_written += r->len;
    } else if (old != r->phys) { /* shadow write failed: the old slot stands */
      s->plen[r->phys] = 0;
      s->free_phys[s->nfree_phys++] = r->phys;
    } else { /* in place: the old bytes are gone */
      s->plen[old] = 0;
      s->lost[r->chunk] = 1;
    }
    start_waiting_writes(s);
  } else if (ok) {
    s->st.reads++;
    s->st.bytes_read += r->len;
  }
  if (r->status == FERRY_ECORRUPT) s->st.crc_errors++;
  s->busy[r->chunk] = 0;
  r->t_done = ferry_now();
  if (r->cb) return 1;
  s->active--;
  atomic_store_explicit(&r->done, 1, memory_order_release);
  return 0;
}

/* A finished piece that gets a read check. */
static int read_check_due(const ferry_swap *s, const done_piece *d) {
  return !d->err && d->req->op == OP_READ && s->cfg.verify;
}

/* Flips the planned bit and checks a finished read piece against its
 * CRC, without the mutex. Returns 0, or 1 with *found on a mismatch. */
static int check_piece(ferry_swap *s, const done_piece *d, uint32_t *found) {
  ferry_swap_req *r = d->req;
  unsigned char *data = r->buf + d->chunk_off;
  if (d->flip) data[d->data_len / 2] ^= 1u;
  if (!s->cfg.verify) return 0;
  *found = ferry_crc32c(0, data, d->data_len);
  return *found != s->crc[(size_t)r->phys * s->cps + d->piece];
}

/* Commits request r, whose every piece is done (and a write's CRCs
 * taken), and runs its callback; then the CRCs of the writes that callback
 * started. */
static void finish_whole(ferry_swap *s, ferry_swap_req *r) {
  pthread_mutex_lock(&s->mu);
  int run_cb = finish_req(s, r);
  if (!run_cb) pthread_cond_broadcast(&s->cv);
  issue(s); /* a finished write may have freed a slot */
  flush_sq(s, 0);
  pthread_mutex_unlock(&s->mu);
  if (run_cb) { /* what the callback starts is submitted with the batch */
    tl_reaping = s;
    r->cb(r, r->status, r->user); /* r belongs to the caller from here */
    tl_reaping = NULL;
    pthread_mutex_lock(&s->mu);
    s->active--;
    flush_sq(s, 0);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
  }
  drain_crcq(s); /* writes just started: CRCs while they fly */
}

/* One finished piece, on the completion thread or a check worker: its
 * read check, then (when it was the request's last) the commit and the
 * callback, so the request that callback starts is ready for the disk
 * before this thread checks another piece. Checking a whole batch first
 * left the disk idle for a batch of CRCs whenever completions came in
 * bursts (32 x 1 MiB = 1.6 ms here). */
static void process_piece(ferry_swap *s, done_piece *d) {
  ferry_swap_req *r = d->req;
  int checked = read_check_due(s, d);
  uint32_t found = 0;
  int bad = 0;
  double tc = checked ? ferry_now() : 0;
  if (!d->err && r->op == OP_READ) bad = check_piece(s, d, &found);
  if (checked) tc = ferry_now() - tc;
  pthread_mutex_lock(&s->mu);
  if (bad) {
    d->err = FERRY_ECORRUPT;
    ferry_err(&s->err, FERRY_ECORRUPT,
              "swap '%s': chunk %u corrupt at offset %zu (%zu bytes; %s offset %llu): "
              "CRC32C expected 0x%08x, found 0x%08x",
              s->name, r->chunk, d->chunk_off, d->data_len, s->files[d->file],
              (unsigned long long)d->file_off, s->crc[(size_t)r->phys * s->cps + d->piece],
              found);
  }
  if (checked) {
    s->st.read_check_bytes += d->data_len;
    s->st.read_check_seconds += tc;
  }
  r->inflight--;
  r->pieces_done++;
  if (d->err) fail_req(s, r, d->err);
  int whole = r->inflight == 0 && r->next_piece == r->npieces;
  if (!whole) flush_sq(s, 0);
  pthread_mutex_unlock(&s->mu);
  if (!whole) return;
  /* A write commits with its CRCs, failed or not (its slot may be reused
   * at once): take them when nobody has (0); when another thread is
   * taking them (1), leave the write to that thread (3: crcs_done hands it
   * to the completion thread through finq), so no thread here waits. */
  if (r->op == OP_WRITE && s->cfg.verify) {
    for (;;) {
      int st = atomic_load_explicit(&r->crc_state, memory_order_acquire);
      if (st == 2) break;
      if (st == 0) {
        claim_write_crcs(s, r);
      } else if (atomic_compare_exchange_strong_explicit(&r->crc_state, &st, 3,
                                                         memory_order_acq_rel,
                                                         memory_order_acquire)) {
        return;
      }
    }
  }
  finish_whole(s, r);
}

/* Processes pieces of batch gen until none is left to take (mutex held on
 * entry and on return). */
static void share_batch(ferry_swap *s, uint64_t gen) {
  while (s->batch_gen == gen && s->batch_taken < s->batch_n) {
    done_piece *d = &s->batch[s->batch_taken++];
    pthread_mutex_unlock(&s->mu);
    process_piece(s, d);
    pthread_mutex_lock(&s->mu);
    if (--s->batch_left == 0) pthread_cond_signal(&s->bcv);
  }
}

/* A check worker (cfg.check_threads): takes pieces of each batch the
 * completion thread publishes, beside it. */
static void *worker_main(void *arg) {
  ferry_swap *s = arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->workers_stop && s->batch_gen == seen) pthread_cond_wait(&s->wcv, &s->mu);
    if (s->workers_stop) break;
    seen = s->batch_gen;
    share_batch(s, seen);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* The completion thread's share of a batch: alone, or with the check
 * workers when at least two pieces need a read check (a batch of writes
 * or one read is not worth waking anyone). Returns when every piece of
 * the batch is processed: fin is reused for the next one. */
static void run_batch(ferry_swap *s, done_piece *fin, unsigned nfin) {
  unsigned nchk = 0;
  for (unsigned i = 0; i < nfin; i++) nchk += read_check_due(s, &fin[i]);
  if (!s->nworkers || nchk < 2) {
    for (unsigned i = 0; i < nfin; i++) process_piece(s, &fin[i]);
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->batch = fin;
  s->batch_n = nfin;
  s->batch_taken = 0;
  s->batch_left = nfin;
  uint64_t gen = ++s->batch_gen;
  if (nchk - 1 >= s->nworkers) pthread_cond_broadcast(&s->wcv);
  else for (unsigned k = 0; k < nchk - 1; k++) pthread_cond_signal(&s->wcv);
  share_batch(s, gen);
  while (s->batch_left) pthread_cond_wait(&s->bcv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

static void *reaper_main(void *arg) {
  ferry_swap *s = arg;
  struct io_uring_cqe *cqes[BATCH];
  struct {
    void *u;
    int res;
  } got[BATCH];
  done_piece fin[BATCH];
  int stop = 0;
  while (!stop) {
    pthread_mutex_lock(&s->mu); /* what the last batch prepared: one call */
    flush_sq(s, 1);
    pthread_mutex_unlock(&s->mu);
    struct io_uring_cqe *cqe = NULL;
    int rc = io_uring_wait_cqe(&s->ring, &cqe);
    if (rc == -EINTR || rc == -EAGAIN) continue;
    if (rc < 0) { /* the ring is unusable: nothing can complete any more */
      ferry_err(&s->err, FERRY_EIO, "swap '%s': io_uring_wait_cqe: %s", s->name, strerror(-rc));
      ferry_logf(&s->log, FERRY_LOG_ERROR, "%s", ferry_err_msg(&s->err));
      break;
    }
    unsigned n = io_uring_peek_batch_cqe(&s->ring, cqes, BATCH);
    for (unsigned i = 0; i < n; i++) {
      got[i].u = io_uring_cqe_get_data(cqes[i]);
      got[i].res = cqes[i]->res;
    }
    io_uring_cq_advance(&s->ring, n);

    unsigned nfin = 0;
    pthread_mutex_lock(&s->mu);
    s->sq_inflight = s->sq_inflight > (int)n ? s->sq_inflight - (int)n : 0;
    for (unsigned i = 0; i < n; i++) {
      if ((uintptr_t)got[i].u == STOP_TAG) {
        stop = 1;
        continue;
      }
      if ((uintptr_t)got[i].u == FIN_TAG) continue; /* finq is taken below */
      io_unit *u = got[i].u;
      if (!on_cqe(s, u, got[i].res)) continue;
      ferry_swap_req *r = u->req;
      if (!u->err && r->op == OP_READ && u->use_bounce) memcpy(r->buf + u->chunk_off, u->bounce, u->data_len);
      if (u->err) fail_req(s, r, u->err);
      fin[nfin++] = (done_piece){r, u->piece, u->file, u->file_off, u->chunk_off, u->data_len,
                                 u->err, u->flip};
      u->req = NULL;
      u->next = s->free_units;
      s->free_units = u;
    }
    issue(s); /* refill first: the disk works while we check */
    flush_sq(s, 0);
    pthread_mutex_unlock(&s->mu);
    /* Prepared requests go to the disk while it is short of work or in
     * groups of qd/4 (flush_sq), the rest before the next wait: one
     * io_uring_enter per request (a virtio notification each on a VM) was
     * 2 requests per call at 128 KiB qd 32, this is 5-7. */
    run_batch(s, fin, nfin);
    /* writes whose CRCs came after their data landed */
    for (ferry_swap_req *r = take_list(s, &s->finq, 0), *nx; r; r = nx) {
      nx = r->crc_next;
      finish_whole(s, r);
    }
    drain_crcq(s);
  }
  return NULL;
}

/* Stops and joins the check workers (no batch may be in progress). */
static void stop_workers(ferry_swap *s) {
  if (!s->nworkers) return;
  pthread_mutex_lock(&s->mu);
  s->workers_stop = 1;
  pthread_cond_broadcast(&s->wcv);
  pthread_mutex_unlock(&s->mu);
  for (unsigned i = 0; i < s->nworkers; i++) pthread_join(s->workers[i], NULL);
  s->nworkers = 0;
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                            */

static atomic_uint g_store_seq;

static void free_store(ferry_swap *s) {
  stop_workers(s);
  free(s->workers);
  if (s->ring_ok) io_uring_queue_exit(&s->ring);
  for (int i = 0; i < s->npaths; i++) {
    if (s->fds[i] >= 0) {
      close(s->fds[i]);
      if (s->owns_files && !s->cfg.keep_files) unlink(s->files[i]);
    }
  }
  free(s->map);
  free(s->free_phys);
  free(s->plen);
  free(s->crc);
  free(s->busy);
  free(s->lost);
  free(s->units);
  free(s->bounce);
  free(s->regs);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->wcv);
  pthread_cond_destroy(&s->bcv);
  ferry_errbuf_destroy(&s->err);
  free(s);
}

static int open_fail(ferry_swap *s, int status) {
  ferry_err_thread(status, "%s", ferry_err_msg(&s->err));
  free_store(s);
  return status;
}

/* Checks the configuration fields every store needs. */
static int check_cfg(const ferry_swap_config *cfg, const char *name, int need_geometry) {
  if (need_geometry && (cfg->npaths < 1 || cfg->npaths > FERRY_SWAP_MAX_PATHS))
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': %d directories (1..%d)", name, cfg->npaths,
                            FERRY_SWAP_MAX_PATHS);
  if ((need_geometry && (!cfg->slot_size || !cfg->nslots || !cfg->block_size)) ||
      !cfg->queue_depth || cfg->queue_depth > 4096)
    return ferry_err_thread(FERRY_EINVAL,
                            "swap '%s': slot_size %zu, nslots %u, block_size %zu, queue_depth %u "
                            "(all > 0, queue_depth <= 4096)",
                            name, cfg->slot_size, cfg->nslots, cfg->block_size, cfg->queue_depth);
  if (cfg->check_threads > 64)
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': check_threads %u (0..64)", name,
                            cfg->check_threads);
  if (cfg->block_size > (1u << 30))
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': block_size %zu above 1 GiB", name,
                            cfg->block_size);
  for (int i = 0; need_geometry && i < cfg->npaths; i++)
    if (!cfg->paths[i] || !cfg->paths[i][0] || strlen(cfg->paths[i]) >= 1024)
      return ferry_err_thread(FERRY_EINVAL, "swap '%s': directory %d is empty or too long", name,
                              i);
  return FERRY_OK;
}

static ferry_swap *new_store(const ferry_swap_config *cfg, const char *name) {
  ferry_swap *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->cfg = *cfg;
  snprintf(s->name, sizeof s->name, "%s", name);
  s->cfg.name = s->name;
  s->log = cfg->log;
  s->npaths = cfg->npaths;
  for (int i = 0; i < FERRY_SWAP_MAX_PATHS; i++) s->fds[i] = -1;
  ferry_errbuf_init(&s->err);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->wcv, NULL);
  pthread_cond_init(&s->bcv, NULL);
  return s;
}

/* What each directory offers: sets s->direct, mem_align and oa, and says
 * once (logger) when a directory refuses O_DIRECT. */
static int probe_dirs(ferry_swap *s, ferry_path_info *pi, dev_t *devs) {
  int direct = !s->cfg.force_buffered;
  size_t mem_align = 1, oa = 1;
  for (int i = 0; i < s->npaths; i++) {
    char why[600];
    int rc = ferry_path_probe(s->dirs[i], &pi[i], why, sizeof why);
    if (rc != FERRY_OK)
      return ferry_err(&s->err, rc, "swap '%s': directory %s unusable: %s", s->name, s->dirs[i],
                       why);
    struct stat st;
    devs[i] = stat(s->dirs[i], &st) == 0 ? st.st_dev : (dev_t)i;
    if (!pi[i].o_direct) direct = 0;
    if (pi[i].dio_mem_align > mem_align) mem_align = pi[i].dio_mem_align;
    if (pi[i].dio_offset_align > oa) oa = pi[i].dio_offset_align;
  }
  if (!direct) {
    mem_align = 1;
    oa = 1;
    if (!s->cfg.force_buffered) { /* said once per store, naming every directory that refused */
      char which[2048];
      size_t w = 0;
      which[0] = 0;
      for (int i = 0; i < s->npaths && w < sizeof which; i++)
        if (!pi[i].o_direct) {
          int k = snprintf(which + w, sizeof which - w, "%s%s (%s)", w ? ", " : "", s->dirs[i],
                           pi[i].fs_type[0] ? pi[i].fs_type : "unknown");
          if (k > 0) w += (size_t)k;
        }
      ferry_logf(&s->log, FERRY_LOG_WARN,
                 "swap '%s': O_DIRECT refused by %s; this store uses buffered I/O (page cache; "
                 "slower, and host RAM is used for caching)",
                 s->name, which);
    }
  }
  s->direct = direct;
  s->mem_align = mem_align;
  s->oa = oa;
  return FERRY_OK;
}

/* The in-memory index and the I/O units, sized once (geometry set). */
static int alloc_index(ferry_swap *s) {
  uint32_t nslots = s->cfg.nslots;
  s->map = calloc(nslots, sizeof *s->map);
  s->free_phys = calloc(s->nphys, sizeof *s->free_phys);
  s->plen = calloc(s->nphys, sizeof *s->plen);
  s->crc = calloc((size_t)s->nphys * s->cps, sizeof *s->crc);
  s->busy = calloc(nslots, 1);
  s->lost = calloc(nslots, 1);
  s->units = calloc(s->cfg.queue_depth, sizeof *s->units);
  size_t bsz = ferry_align_up((size_t)s->cfg.queue_depth * s->oa, 4096);
  void *bounce = NULL;
  if (posix_memalign(&bounce, s->mem_align > 4096 ? s->mem_align : 4096, bsz) == 0)
    s->bounce = bounce;
  if (!s->map || !s->free_phys || !s->plen || !s->crc || !s->busy || !s->lost || !s->units ||
      !s->bounce)
    return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory for the index of %u slots",
                     s->name, s->nphys);
  for (unsigned i = 0; i < s->cfg.queue_depth; i++) {
    s->units[i].bounce = s->bounce + (size_t)i * s->oa;
    s->units[i].next = s->free_units;
    s->free_units = &s->units[i];
  }
  return FERRY_OK;
}

/* The ring, the files registered with it, and the completion thread. */
static int start_ring(ferry_swap *s) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  if (s->cfg.sqpoll) {
    p.flags |= IORING_SETUP_SQPOLL;
    p.sq_thread_idle = 50;
  }
  unsigned entries = s->cfg.queue_depth * 2 + 2;
  int rc = io_uring_queue_init_params(entries, &s->ring, &p);
  if (rc < 0)
    return ferry_err(&s->err, rc == -ENOSYS || rc == -EPERM ? FERRY_ENOTSUP : FERRY_EIO,
                     "swap '%s': io_uring_queue_init(%u%s): %s", s->name, entries,
                     s->cfg.sqpoll ? ", SQPOLL" : "", strerror(-rc));
  s->ring_ok = 1;
  s->sqpoll = s->cfg.sqpoll;
  rc = io_uring_register_files(&s->ring, s->fds, (unsigned)s->npaths);
  if (rc == 0) s->fixed_files = 1;
  else
    ferry_logf(&s->log, FERRY_LOG_INFO, "swap '%s': files not registered with the ring: %s",
               s->name, strerror(-rc));
  if (s->cfg.check_threads) {
    s->workers = calloc(s->cfg.check_threads, sizeof *s->workers);
    if (!s->workers)
      return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory for %u check threads",
                       s->name, s->cfg.check_threads);
    for (unsigned i = 0; i < s->cfg.check_threads; i++) {
      int e = pthread_create(&s->workers[i], NULL, worker_main, s);
      if (e != 0)
        return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': cannot start check thread %u of %u: %s",
                         s->name, i + 1, s->cfg.check_threads, strerror(e));
      s->nworkers++;
    }
  }
  if (pthread_create(&s->reaper, NULL, reaper_main, s) != 0)
    return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': cannot start the completion thread",
                     s->name);
  s->reaper_started = 1;
  ferry_logf(&s->log, FERRY_LOG_DEBUG,
             "swap '%s': %d file(s) of %llu bytes, %s, block %zu, qd %u, %u+%u slots of %zu",
             s->name, s->npaths, (unsigned long long)s->file_bytes,
             s->direct ? "O_DIRECT" : "buffered", s->bs, s->cfg.queue_depth, s->cfg.nslots,
             s->cfg.spare_slots, s->cfg.slot_size);
  return FERRY_OK;
}

int ferry_swap_open(const ferry_swap_config *cfg, ferry_swap **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  if (!cfg) return ferry_err_thread(FERRY_EINVAL, "swap: no configuration");
  const char *name = cfg->name ? cfg->name : "swap";
  int rc = check_cfg(cfg, name, 1);
  if (rc != FERRY_OK) return rc;
  ferry_swap *s = new_store(cfg, name);
  if (!s) return ferry_err_thread(FERRY_ENOMEM, "swap '%s': out of memory", name);
  for (int i = 0; i < s->npaths; i++) {
    snprintf(s->dirs[i], sizeof s->dirs[i], "%s", cfg->paths[i]);
    s->cfg.paths[i] = s->dirs[i];
  }
  ferry_path_info pi[FERRY_SWAP_MAX_PATHS];
  dev_t devs[FERRY_SWAP_MAX_PATHS];
  rc = probe_dirs(s, pi, devs);
  if (rc != FERRY_OK) return open_fail(s, rc);
  s->bs = ferry_align_up(cfg->block_size, s->oa);

  /* Geometry, with overflow checks: the sizes come from a config file. */
  uint64_t positions = (cfg->slot_size + s->bs - 1) / s->bs;
  uint64_t nphys = (uint64_t)cfg->nslots + cfg->spare_slots;
  uint64_t ppf = (positions + (uint64_t)s->npaths - 1) / (uint64_t)s->npaths, fb;
  if (positions >= UINT32_MAX || nphys >= UINT32_MAX ||
      __builtin_mul_overflow(nphys, ppf, &fb) || __builtin_mul_overflow(fb, (uint64_t)s->bs, &fb) ||
      fb > (uint64_t)INT64_MAX) {
    ferry_err(&s->err, FERRY_EOVERFLOW, "swap '%s': %u slots of %zu bytes do not fit in a file",
              name, cfg->nslots, cfg->slot_size);
    return open_fail(s, FERRY_EOVERFLOW);
  }
  s->positions = (uint32_t)positions;
  s->cps = s->positions + 1;
  s->ppf = (uint32_t)ppf;
  s->nphys = (uint32_t)nphys;
  s->file_bytes = fb;

  /* Space, per file system: directories on one device share its free bytes. */
  for (int i = 0; i < s->npaths; i++) {
    int first = 1, nfiles = 0;
    for (int j = 0; j < s->npaths; j++) {
      if (devs[j] != devs[i]) continue;
      if (j < i) first = 0;
      nfiles++;
    }
    if (!first) continue;
    uint64_t need = s->file_bytes * (uint64_t)nfiles;
    if (need / (uint64_t)nfiles != s->file_bytes || need > pi[i].free_bytes) {
      char a[32], b[32];
      ferry_err(&s->err, FERRY_ENOSPC,
                "swap '%s': directory %s needs %llu bytes (%s: %d file(s) of %llu) but only %llu "
                "(%s) are free",
                name, s->dirs[i], (unsigned long long)need, ferry_format_size(need, a, sizeof a),
                nfiles, (unsigned long long)s->file_bytes, (unsigned long long)pi[i].free_bytes,
                ferry_format_size(pi[i].free_bytes, b, sizeof b));
      return open_fail(s, FERRY_ENOSPC);
    }
  }

  rc = alloc_index(s);
  if (rc != FERRY_OK) return open_fail(s, rc);
  for (uint32_t i = 0; i < cfg->nslots; i++) s->map[i] = i;
  for (uint32_t p = s->nphys; p > cfg->nslots; p--) s->free_phys[s->nfree_phys++] = p - 1;

  /* The files. */
  s->owns_files = 1; /* a failed open removes the ones it made */
  unsigned seq = atomic_fetch_add(&g_store_seq, 1);
  for (int i = 0; i < s->npaths; i++) {
    int len = snprintf(s->files[i], sizeof s->files[i], "%s/ferry-%s-%ld-%u-%d.swap",
                       s->dirs[i], s->name, (long)getpid(), seq, i);
    if (len < 0 || (size_t)len >= sizeof s->files[i]) {
      ferry_err(&s->err, FERRY_EINVAL, "swap '%s': file path in %s is too long", name, s->dirs[i]);
      return open_fail(s, FERRY_EINVAL);
    }
    int fd = open(s->files[i],
                  O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (s->direct ? O_DIRECT : 0), 0600);
    if (fd < 0) {
      int e = errno;
      ferry_err(&s->err, status_of_errno(e), "swap '%s': cannot create %s: %s", name, s->files[i],
                strerror(e));
      return open_fail(s, status_of_errno(e));
    }
    s->fds[i] = fd;
    if (fallocate(fd, 0, 0, (off_t)s->file_bytes) != 0) {
      int e = errno;
      if (e == EOPNOTSUPP || e == ENOSYS) {
        ferry_logf(&s->log, FERRY_LOG_WARN,
                   "swap '%s': %s cannot reserve space (fallocate unsupported); a full disk will "
                   "show up as write errors",
                   name, s->dirs[i]);
        if (ftruncate(fd, (off_t)s->file_bytes) == 0) continue;
        e = errno;
      }
      ferry_err(&s->err, status_of_errno(e),
                "swap '%s': cannot reserve %llu bytes for %s: %s (free there: %llu)", name,
                (unsigned long long)s->file_bytes, s->files[i], strerror(e),
                (unsigned long long)pi[i].free_bytes);
      return open_fail(s, status_of_errno(e));
    }
  }
  int ilen = snprintf(s->index_path, sizeof s->index_path, "%s/ferry-%s-%ld-%u.index",
                      s->dirs[0], s->name, (long)getpid(), seq);
  if (ilen < 0 || (size_t)ilen >= sizeof s->index_path) { /* shorter than files[0]: cannot */
    ferry_err(&s->err, FERRY_EINVAL, "swap '%s': index path in %s is too long", name, s->dirs[0]);
    return open_fail(s, FERRY_EINVAL);
  }

  rc = start_ring(s);
  if (rc != FERRY_OK) return open_fail(s, rc);
  *out = s;
  return FERRY_OK;
}

int ferry_swap_reopen(const ferry_swap_config *cfg, const char *index_path, ferry_swap **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  if (!cfg || !index_path || !index_path[0])
    return ferry_err_thread(FERRY_EINVAL, "swap: reopen needs a configuration and an index path");
  const char *name = cfg->name ? cfg->name : "swap";
  ferry_swap_config c = *cfg;
  if (!c.block_size) c.block_size = 1; /* from the index */
  int rc = check_cfg(&c, name, 0);
  if (rc != FERRY_OK) return rc;
  if (strlen(index_path) >= 1024)
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': index path too long", name);
  ferry_errbuf e;
  ferry_errbuf_init(&e);
  swap_saved sv;
  rc = swap_index_load(index_path, &sv, &e);
  if (rc != FERRY_OK) {
    ferry_err_thread(rc, "swap '%s': %s", name, ferry_err_msg(&e));
    ferry_errbuf_destroy(&e);
    return rc;
  }
  ferry_errbuf_destroy(&e);
  /* The caller's geometry, where given, must be the store's. */
  const char *field = NULL;
  unsigned long long want = 0, have = 0;
  if (cfg->slot_size && cfg->slot_size != sv.slot_size)
    field = "slot_size", want = cfg->slot_size, have = sv.slot_size;
  else if (cfg->nslots && cfg->nslots != sv.nslots)
    field = "nslots", want = cfg->nslots, have = sv.nslots;
  else if (cfg->npaths && cfg->npaths != sv.npaths)
    field = "npaths", want = (unsigned)cfg->npaths, have = (unsigned)sv.npaths;
  if (field) {
    swap_saved_free(&sv);
    return ferry_err_thread(FERRY_EINVAL,
                            "swap '%s': the configuration asks %s %llu but the store of %s has "
                            "%llu (0 takes the store's)",
                            name, field, want, index_path, have);
  }
  if (cfg->verify && !sv.verify) {
    swap_saved_free(&sv);
    return ferry_err_thread(FERRY_EINVAL,
                            "swap '%s': %s was written without CRCs (verify off); reopen it with "
                            "verify off",
                            name, index_path);
  }
  c.npaths = sv.npaths;
  c.slot_size = sv.slot_size;
  c.nslots = sv.nslots;
  c.spare_slots = sv.spare_slots;
  c.block_size = sv.bs;
  ferry_swap *s = new_store(&c, name);
  if (!s) {
    swap_saved_free(&sv);
    return ferry_err_thread(FERRY_ENOMEM, "swap '%s': out of memory", name);
  }
  for (int i = 0; i < s->npaths; i++) {
    size_t flen = strlen(sv.files[i]); /* < sizeof sv.files[i] == sizeof s->files[i] */
    if (flen >= sizeof s->dirs[i]) {
      ferry_err(&s->err, FERRY_EINVAL, "swap '%s': %s names a file path of %zu bytes (at most %zu)",
                name, index_path, flen, sizeof s->dirs[i] - 1);
      swap_saved_free(&sv);
      return open_fail(s, FERRY_EINVAL);
    }
    memcpy(s->files[i], sv.files[i], flen + 1);
    memcpy(s->dirs[i], sv.files[i], flen + 1);
    char *slash = strrchr(s->dirs[i], '/');
    if (slash == s->dirs[i]) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(s->dirs[i], sizeof s->dirs[i], ".");
    s->cfg.paths[i] = s->dirs[i];
  }
  snprintf(s->index_path, sizeof s->index_path, "%s", index_path);
  ferry_path_info pi[FERRY_SWAP_MAX_PATHS];
  dev_t devs[FERRY_SWAP_MAX_PATHS];
  rc = probe_dirs(s, pi, devs);
  /* Block and tail boundaries (and so the CRC of each piece) follow the
   * alignment the store was written with; O_DIRECT here must accept it. */
  if (rc == FERRY_OK && s->direct && (sv.oa % s->oa || sv.bs % s->oa)) {
    rc = ferry_err(&s->err, FERRY_EINVAL,
                   "swap '%s': %s was written with %llu-byte alignment (blocks of %llu), which "
                   "O_DIRECT here (alignment %zu) cannot read; reopen it with force_buffered",
                   name, index_path, (unsigned long long)sv.oa, (unsigned long long)sv.bs, s->oa);
  }
  if (rc != FERRY_OK) {
    swap_saved_free(&sv);
    return open_fail(s, rc);
  }
  s->oa = sv.oa;
  s->bs = sv.bs;
  s->positions = sv.positions;
  s->cps = sv.cps;
  s->ppf = sv.ppf;
  s->nphys = sv.nphys;
  s->file_bytes = sv.file_bytes;
  rc = alloc_index(s);
  if (rc != FERRY_OK) {
    swap_saved_free(&sv);
    return open_fail(s, rc);
  }
  unsigned char *used = calloc(s->nphys, 1);
  if (!used) {
    swap_saved_free(&sv);
    ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory", name);
    return open_fail(s, FERRY_ENOMEM);
  }
  for (uint32_t i = 0; i < s->cfg.nslots; i++) {
    s->map[i] = sv.map[i];
    used[sv.map[i]] = 1;
    s->lost[i] = sv.lost[i];
  }
  for (uint32_t p = 0; p < s->nphys; p++) s->plen[p] = used[p] ? (size_t)sv.plen[p] : 0;
  for (uint32_t p = s->nphys; p > 0; p--)
    if (!used[p - 1]) s->free_phys[s->nfree_phys++] = p - 1;
  memcpy(s->crc, sv.crc, (size_t)s->nphys * s->cps * sizeof *s->crc);
  free(used);
  swap_saved_free(&sv);

  for (int i = 0; i < s->npaths; i++) {
    int fd = open(s->files[i], O_RDWR | O_CLOEXEC | (s->direct ? O_DIRECT : 0));
    if (fd < 0) {
      int er = errno;
      ferry_err(&s->err, status_of_errno(er), "swap '%s': cannot open %s (named by %s): %s", name,
                s->files[i], index_path, strerror(er));
      return open_fail(s, status_of_errno(er)); /* owns_files 0: nothing is unlinked */
    }
    s->fds[i] = fd;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != s->file_bytes) {
      ferry_err(&s->err, FERRY_ECORRUPT,
                "swap '%s': %s is %lld bytes, the index %s says %llu", name, s->files[i],
                (long long)st.st_size, index_path, (unsigned long long)s->file_bytes);
      return open_fail(s, FERRY_ECORRUPT);
    }
  }
  rc = start_ring(s);
  if (rc != FERRY_OK) return open_fail(s, rc);
  /* From the first write on the index no longer describes the files: it
   * goes now, and a close that keeps the files writes a new one. The store
   * is live: a close without keep_files removes them. */
  unlink(index_path);
  s->owns_files = 1;
  *out = s;
  return FERRY_OK;
}

int ferry_swap_save_index(ferry_swap *s) {
  if (!s) return FERRY_EINVAL;
  ferry_swap_drain(s);
  pthread_mutex_lock(&s->mu);
  int rc = s->active ? ferry_err(&s->err, FERRY_EBUSY, "swap '%s': requests started while saving",
                                 s->name)
                     : swap_index_save(s);
  if (rc == FERRY_OK) s->index_saved = 1;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void ferry_swap_close(ferry_swap *s) {
  if (!s) return;
  ferry_swap_drain(s);
  if (s->cfg.keep_files && !s->index_saved) {
    pthread_mutex_lock(&s->mu);
    int rc = swap_index_save(s);
    pthread_mutex_unlock(&s->mu);
    if (rc != FERRY_OK) /* close cannot fail: the logger is how this is told */
      ferry_logf(&s->log, FERRY_LOG_ERROR, "%s", ferry_err_msg(&s->err));
  }
  if (s->reaper_started) {
    pthread_mutex_lock(&s->mu);
    post_tag(s, STOP_TAG);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->reaper, NULL);
  }
  free_store(s);
}

int ferry_swap_get_info(ferry_swap *s, ferry_swap_info *out) {
  if (!s || !out) return FERRY_EINVAL;
  memset(out, 0, sizeof *out);
  out->o_direct = s->direct;
  out->mem_align = s->mem_align;
  out->offset_align = s->oa;
  out->block_size = s->bs;
  out->slot_size = s->cfg.slot_size;
  out->nslots = s->cfg.nslots;
  out->spare_slots = s->cfg.spare_slots;
  out->queue_depth = s->cfg.queue_depth;
  out->sqpoll = s->sqpoll;
  out->fixed_files = s->fixed_files;
  out->verify = s->cfg.verify;
  out->check_threads = s->nworkers;
  out->file_bytes = s->file_bytes;
  out->index_path = s->index_path;
  return FERRY_OK;
}

int ferry_swap_register_buffers(ferry_swap *s, const struct iovec *iov, unsigned n) {
  if (!s || (n && !iov)) return FERRY_EINVAL;
  pthread_mutex_lock(&s->mu);
  int rc = FERRY_OK;
  if (s->active) {
    rc = ferry_err(&s->err, FERRY_EBUSY, "swap '%s': buffers registered while %u requests run",
                   s->name, s->active);
    goto out;
  }
  if (s->nregs) {
    io_uring_unregister_buffers(&s->ring);
    free(s->regs);
    s->regs = NULL;
    s->nregs = 0;
  }
  if (!n) goto out;
  s->regs = malloc(n * sizeof *iov);
  if (!s->regs) {
    rc = ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory", s->name);
    goto out;
  }
  int r = io_uring_register_buffers(&s->ring, iov, n);
  if (r < 0) {
    free(s->regs);
    s->regs = NULL;
    rc = ferry_err(&s->err, r == -ENOMEM ? FERRY_ENOMEM : FERRY_EIO,
                   "swap '%s': IORING_REGISTER_BUFFERS of %u buffers: %s%s", s->name, n,
                   strerror(-r), r == -ENOMEM ? " (raise ulimit -l)" : "");
    goto out;
  }
  memcpy(s->regs, iov, n * sizeof *iov);
  s->nregs = n;
out:
  pthread_mutex_unlock(&s->mu);
  return rc;
}

size_t ferry_swap_chunk_len(ferry_swap *s, uint32_t chunk) {
  if (!s || chunk >= s->cfg.nslots) return 0;
  pthread_mutex_lock(&s->mu);
  size_t n = s->lost[chunk] ? 0 : s->plen[s->map[chunk]];
  pthread_mutex_unlock(&s->mu);
  return n;
}

void ferry_swap_get_stats(ferry_swap *s, ferry_swap_stats *out) {
  if (!s || !out) return;
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  pthread_mutex_unlock(&s->mu);
}

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
  if (pread(s->fds[file], tmp, blk, (off_t)base) != (ssize_t)blk) rc = FERRY_EIO;
  if (rc == FERRY_OK) {
    ((unsigned char *)tmp)[off - base] ^= (unsigned char)(1u << (bit & 7));
    if (pwrite(s->fds[file], tmp, blk, (off_t)base) != (ssize_t)blk) rc = FERRY_EIO;
  }
  free(tmp);
  return rc;
}
