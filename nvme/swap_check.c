/* nvme/swap_check.c — what happens to a finished piece: its read check
 * (CRC32C, without the mutex), and when it was its request's last, the
 * commit (the index flips for a write) and the callback. The completion
 * thread does it alone, or shares a batch with the check workers
 * (cfg.check_threads), whose life is here too.
 */
#include "nvme/swap_impl.h"
#include "core/crc32c.h"

#include <stdlib.h>
#include <string.h>

/* A request has no piece in flight and none left: commit it (mutex held).
 * Returns 1 when its callback must run. */
static int finish_req(ferry_swap *s, ferry_swap_req *r) {
  int ok = r->status == FERRY_OK;
  if (r->op == OP_WRITE && r->unplaced) { /* dropped before it had a slot: nothing changed */
    swap_start_waiting_writes(s);
  } else if (r->op == OP_WRITE) {
    uint32_t old = s->map[r->chunk];
    if (old != r->phys) s->nshadow--;
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
    swap_start_waiting_writes(s);
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
void swap_finish_whole(ferry_swap *s, ferry_swap_req *r) {
  pthread_mutex_lock(&s->mu);
  int run_cb = finish_req(s, r);
  if (!run_cb) pthread_cond_broadcast(&s->cv);
  swap_issue(s); /* a finished write may have freed a slot */
  swap_flush_sq(s, 0);
  pthread_mutex_unlock(&s->mu);
  if (run_cb) { /* what the callback starts is submitted with the batch */
    swap_run_callback(s, r); /* r belongs to the caller from here */
    pthread_mutex_lock(&s->mu);
    s->active--;
    swap_flush_sq(s, 0);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
  }
  swap_drain_crcq(s); /* writes just started: CRCs while they fly */
}

/* A write commits with its CRCs, failed or not (its slot may be reused
 * at once): take them when nobody has (0); when another thread is taking
 * them (1), leave the write to that thread (3: crcs_done hands it to the
 * completion thread through finq), so no thread here waits; a write
 * dropped by ferry_swap_discard whose CRCs nobody took skips them.
 * Returns 1 when the CRCs are done and the write commits here. */
static int write_crcs_ready(ferry_swap *s, ferry_swap_req *r, int dropped) {
  for (;;) {
    int st = atomic_load_explicit(&r->crc_state, memory_order_acquire);
    if (st == 2) return 1;
    if (st == 0 && dropped) { /* a dropped write commits as failed: no CRCs needed */
      if (atomic_compare_exchange_strong_explicit(&r->crc_state, &st, 2, memory_order_acq_rel,
                                                  memory_order_acquire))
        return 1;
    } else if (st == 0) {
      swap_claim_write_crcs(s, r);
    } else if (atomic_compare_exchange_strong_explicit(&r->crc_state, &st, 3,
                                                       memory_order_acq_rel,
                                                       memory_order_acquire)) {
      return 0;
    }
  }
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
  if (d->err) swap_fail_req(s, r, d->err);
  int whole = r->inflight == 0 && r->next_piece == r->npieces;
  /* a write dropped, or failed on a dead ring, needs no CRCs */
  int dropped = r->status == FERRY_ECANCELED || (s->ring_err && r->status != FERRY_OK);
  if (!whole) swap_flush_sq(s, 0);
  pthread_mutex_unlock(&s->mu);
  if (!whole) return;
  if (r->op == OP_WRITE && s->cfg.verify && !write_crcs_ready(s, r, dropped)) return;
  swap_finish_whole(s, r);
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
void swap_run_batch(ferry_swap *s, done_piece *fin, unsigned nfin) {
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

int swap_workers_start(ferry_swap *s) {
  if (!s->cfg.check_threads) return FERRY_OK;
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
  return FERRY_OK;
}

void swap_workers_stop(ferry_swap *s) {
  if (!s->nworkers) return;
  pthread_mutex_lock(&s->mu);
  s->workers_stop = 1;
  pthread_cond_broadcast(&s->wcv);
  pthread_mutex_unlock(&s->mu);
  for (unsigned i = 0; i < s->nworkers; i++) pthread_join(s->workers[i], NULL);
  s->nworkers = 0;
}
