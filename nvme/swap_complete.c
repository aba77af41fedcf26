/* nvme/swap_complete.c — the swap store's completion thread: it reaps a
 * batch of completions, retries short and interrupted transfers, turns
 * errors into status codes naming the file and offset, refills the ring,
 * then hands the finished pieces to swap_check.c and finishes the writes
 * whose CRCs came late. When the ring fails, it ends every request with an
 * error instead. Also its start and stop.
 */
#include "nvme/swap_impl.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <string.h>

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
  if (u->state == U_DROPPED) return 1; /* u->err is set */
  if (u->state == U_DELAYING) {
    res = u->saved_res;
    u->state = U_NORMAL;
  }
#if FERRY_FAULT_INJECTION
  else if (u->fault && swap_fault_apply(s, u, &res)) { /* parked: u->ts late */
    struct io_uring_sqe *sqe = swap_get_sqe(s);
    io_uring_prep_timeout(sqe, &u->ts, 0, 0);
    io_uring_sqe_set_data(sqe, u);
    return 0;
  }
#endif
  if (res < 0) {
    if ((res == -EINTR || res == -EAGAIN) && u->retries < MAX_RETRIES) {
      u->retries++;
      s->st.retries++;
      swap_prep_unit(s, u);
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
    swap_prep_unit(s, u);
    return 0;
  }
  return 1;
}

/* A reaped completion: the unit (or a tag) and its result. */
typedef struct {
  void *u;
  int res;
} reaped;

/* Settles n reaped completions under the mutex: finished pieces go to fin
 * (their units are free again), then the ring is refilled. Returns how
 * many pieces finished; *stop when STOP_TAG came. */
static unsigned settle(ferry_swap *s, const reaped *got, unsigned n, done_piece *fin, int *stop) {
  unsigned nfin = 0;
  pthread_mutex_lock(&s->mu);
  s->sq_inflight = s->sq_inflight > (int)n ? s->sq_inflight - (int)n : 0;
  for (unsigned i = 0; i < n; i++) {
    if ((uintptr_t)got[i].u == STOP_TAG) {
      *stop = 1;
      continue;
    }
    if ((uintptr_t)got[i].u == FIN_TAG) continue; /* finq is taken after the batch */
    io_unit *u = got[i].u;
    if (!on_cqe(s, u, got[i].res)) continue;
    ferry_swap_req *r = u->req;
    if (!u->err && r->op == OP_READ && u->use_bounce) memcpy(r->buf + u->chunk_off, u->bounce, u->data_len);
    if (u->err) swap_fail_req(s, r, u->err);
    fin[nfin++] = (done_piece){r, u->piece, u->file, u->file_off, u->chunk_off, u->data_len,
                               u->err, u->flip};
    u->req = NULL;
    u->next = s->free_units;
    s->free_units = u;
  }
  swap_issue(s); /* refill first: the disk works while we check */
  swap_flush_sq(s, 0);
  pthread_mutex_unlock(&s->mu);
  return nfin;
}

/* The ring failed (mutex held): up to BATCH pieces that can no longer
 * complete, failed with FERRY_EIO into fin: every unit in use (its
 * completion will never be reaped), then each queued request with no piece
 * in flight (a piece of its own, as drop_head in swap_submit.c makes one).
 * Returns how many. */
static unsigned fail_stranded(ferry_swap *s, done_piece *fin) {
  unsigned n = 0;
  for (unsigned i = 0; i < s->cfg.queue_depth && n < BATCH; i++) {
    io_unit *u = &s->units[i];
    ferry_swap_req *r = u->req;
    if (!r) continue;
    swap_fail_req(s, r, FERRY_EIO);
    fin[n++] = (done_piece){r, u->piece, u->file, u->file_off, u->chunk_off, u->data_len,
                            FERRY_EIO, 0};
    u->req = NULL;
    u->state = U_NORMAL;
    u->next = s->free_units;
    s->free_units = u;
  }
  while (s->runq_head && n < BATCH) {
    ferry_swap_req *r = s->runq_head;
    uint32_t k = r->next_piece;
    int idle = r->inflight == 0;
    swap_fail_req(s, r, FERRY_EIO); /* takes it off the queue */
    if (!idle) continue;            /* its unit's piece above finishes it */
    r->inflight++;
    fin[n++] = (done_piece){r, k, 0, 0, 0, 0, FERRY_EIO, 0};
  }
  return n;
}

/* The completion thread once the ring failed: fails what was in flight
 * and queued (each callback once, through swap_check.c's path of a failed
 * request: nothing committed), finishes writes whose CRCs come late, then
 * waits on cv for more of those or for stop. New requests are refused
 * (swap_submit.c), so ferry_swap_wait, drain and close return. */
static void run_dead(ferry_swap *s, done_piece *fin) {
  pthread_mutex_lock(&s->mu);
  for (;;) {
    unsigned n = fail_stranded(s, fin);
    ferry_swap_req *late = s->finq;
    s->finq = NULL;
    if (!n && !late) {
      if (s->stop_req) break;
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    swap_run_batch(s, fin, n);
    for (ferry_swap_req *nx; late; late = nx) {
      nx = late->crc_next;
      swap_finish_whole(s, late);
    }
    swap_drain_crcq(s);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
}

static void *reaper_main(void *arg) {
  ferry_swap *s = arg;
  struct io_uring_cqe *cqes[BATCH];
  reaped got[BATCH];
  done_piece fin[BATCH];
  int stop = 0;
  while (!stop) {
    int fault = 0;
    pthread_mutex_lock(&s->mu); /* what the last batch prepared: one call */
    swap_flush_sq(s, 1);
#if FERRY_FAULT_INJECTION
    fault = swap_fault_take_wait(s);
#endif
    pthread_mutex_unlock(&s->mu);
    struct io_uring_cqe *cqe = NULL;
    int rc = fault ? -fault : io_uring_wait_cqe(&s->ring, &cqe);
    if (rc == -EINTR || rc == -EAGAIN) continue;
    if (rc < 0) { /* the ring is unusable: nothing can complete any more */
      pthread_mutex_lock(&s->mu);
      s->ring_err = -rc;
      ferry_err(&s->err, FERRY_EIO,
                "swap '%s': io_uring_wait_cqe: %s; every request in flight or queued fails, "
                "new ones are refused",
                s->name, strerror(-rc));
      char msg[FERRY_ERR_MAX];
      snprintf(msg, sizeof msg, "%s", ferry_err_msg(&s->err));
      swap_start_waiting_writes(s); /* writes waiting for a slot fail too */
      pthread_mutex_unlock(&s->mu);
      ferry_logf(&s->log, FERRY_LOG_ERROR, "%s", msg);
      run_dead(s, fin);
      break;
    }
    unsigned n = io_uring_peek_batch_cqe(&s->ring, cqes, BATCH);
    for (unsigned i = 0; i < n; i++) {
      got[i].u = io_uring_cqe_get_data(cqes[i]);
      got[i].res = cqes[i]->res;
    }
    io_uring_cq_advance(&s->ring, n);
    unsigned nfin = settle(s, got, n, fin, &stop);
    /* Prepared requests go to the disk while it is short of work or in
     * groups of qd/4 (swap_flush_sq), the rest before the next wait: one
     * io_uring_enter per request (a virtio notification each on a VM) was
     * 2 requests per call at 128 KiB qd 32, this is 5-7. */
    swap_run_batch(s, fin, nfin);
    /* writes whose CRCs came after their data landed */
    for (ferry_swap_req *r = swap_take_list(s, &s->finq, 0), *nx; r; r = nx) {
      nx = r->crc_next;
      swap_finish_whole(s, r);
    }
    swap_drain_crcq(s);
  }
  return NULL;
}

int swap_completion_start(ferry_swap *s) {
  if (pthread_create(&s->reaper, NULL, reaper_main, s) != 0)
    return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': cannot start the completion thread",
                     s->name);
  s->reaper_started = 1;
  return FERRY_OK;
}

void swap_completion_stop(ferry_swap *s) {
  if (!s->reaper_started) return;
  pthread_mutex_lock(&s->mu);
  s->stop_req = 1; /* what stops it should the ring fail before STOP_TAG is reaped */
  swap_post_tag(s, STOP_TAG);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->reaper, NULL);
}
