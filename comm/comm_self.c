/* comm/comm_self.c — the `self` backend: one rank and no library. Every
 * collective is a copy of this rank's part into recv (nothing for in-place
 * calls and barriers), done in the calling thread, so requests complete
 * at submit. Buffers are host memory; with a stream of a cuda device the
 * copy is a device-to-device copy on that stream instead. There is no
 * other rank to tell of a failure (ferry_comm_fail): the news is kept for
 * the communicator and its channels, whose later calls all name it.
 */
#include "comm/comm_impl.h"

#include "core/dtype.h"
#include "device/peer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* c->impl: what a communicator and its channels share, a failure's news. */
typedef struct {
  pthread_mutex_t mu;
  int refs;                /* (mu) the communicator and its channels alive */
  int status;              /* (mu) ferry_comm_fail was called: FERRY_EIO */
  char msg[FERRY_ERR_MAX]; /* (mu) "rank 0 failed: why" */
} self_news;

static int self_init(ferry_comm *c, const ferry_comm_options *opt) {
  (void)opt;
  c->rank = c->local_rank = 0;
  c->size = c->local_size = 1;
  c->dev = NULL;
  self_news *n = calloc(1, sizeof *n);
  if (!n) return ferry_err(&c->err, FERRY_ENOMEM, "self: out of memory");
  pthread_mutex_init(&n->mu, NULL);
  n->refs = 1;
  c->impl = n;
  return 0;
}

static int self_dup(ferry_comm *parent, ferry_comm *child) {
  self_news *n = parent->impl;
  child->rank = child->local_rank = 0;
  child->size = child->local_size = 1;
  child->dev = NULL;
  pthread_mutex_lock(&n->mu);
  n->refs++;
  pthread_mutex_unlock(&n->mu);
  child->impl = n;
  return 0;
}

static void self_shutdown(ferry_comm *c, int broken) {
  (void)broken;
  self_news *n = c->impl;
  if (!n) return;
  pthread_mutex_lock(&n->mu);
  int last = --n->refs == 0;
  pthread_mutex_unlock(&n->mu);
  if (last) {
    pthread_mutex_destroy(&n->mu);
    free(n);
  }
  c->impl = NULL;
}

/* This rank's failure, to the communicator's family (the first one kept). */
static int self_alert_send(ferry_comm *c, const char *msg) {
  self_news *n = c->impl;
  pthread_mutex_lock(&n->mu);
  if (!n->status) {
    n->status = FERRY_EIO;
    snprintf(n->msg, sizeof n->msg, "%s", msg);
  }
  pthread_mutex_unlock(&n->mu);
  return 0;
}

static int self_alert_poll(ferry_comm *c, char *msg, size_t cap) {
  self_news *n = c->impl;
  pthread_mutex_lock(&n->mu);
  int st = n->status;
  if (st) snprintf(msg, cap, "%s", n->msg);
  pthread_mutex_unlock(&n->mu);
  return st;
}

static int copy(ferry_comm *c, ferry_stream *s, void *dst, const void *src, size_t bytes) {
  if (dst == src || bytes == 0) return 0;
  if (s && ferry_device_backend(ferry_stream_device(s)) != FERRY_DEVICE_HOST) {
    int st = ferry_memcpy_async(s, dst, src, bytes, FERRY_COPY_D2D);
    if (!st) st = ferry_stream_synchronize(s);
    if (st)
      return ferry_err(&c->err, st, "self: device copy of %zu bytes failed: %s", bytes,
                       ferry_device_last_error(ferry_stream_device(s)));
    return 0;
  }
  memmove(dst, src, bytes);
  return 0;
}

static int self_run(ferry_comm *c, ferry_comm_req *r) {
  size_t es = r->dt ? ferry_dtype_size(r->dt) : 0;
  switch (r->coll) {
  case FERRY_COLL_ALLREDUCE: return copy(c, r->s, r->recv, r->send, r->count * es);
  case FERRY_COLL_REDUCE_SCATTER: return copy(c, r->s, r->recv, r->send, r->counts[0] * es);
  case FERRY_COLL_ALLGATHER: return copy(c, r->s, r->recv, r->send, r->counts[0] * es);
  case FERRY_COLL_BROADCAST:
  case FERRY_COLL_BARRIER:
  case FERRY_COLL_DUP: return 0;
  }
  return ferry_err(&c->err, FERRY_EINVAL, "self: unknown collective %d", (int)r->coll);
}

static _Noreturn void self_abort(ferry_comm *c, int code) {
  (void)c;
  exit(code);
}

const ferry_comm_ops ferry_comm_self_ops = {
    /* .name = */ "self",
    /* .kind = */ FERRY_COMM_SELF,
    /* .threaded = */ 0,
    /* .reduce_dtypes = */
    (1u << FERRY_DT_F32) | (1u << FERRY_DT_F64) | (1u << FERRY_DT_I32) | (1u << FERRY_DT_I64) |
        (1u << FERRY_DT_U64) | (1u << FERRY_DT_F16) | (1u << FERRY_DT_BF16),
    /* .init = */ self_init,
    /* .dup = */ self_dup,
    /* .shutdown = */ self_shutdown,
    /* .run = */ self_run,
    /* .poll = */ NULL,
    /* .release = */ NULL,
    /* .abort = */ self_abort,
    /* .alert_send = */ self_alert_send,
    /* .alert_poll = */ self_alert_poll,
};
