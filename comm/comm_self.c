/* comm/comm_self.c — the `self` backend: one rank and no library. Every
 * collective is a copy of this rank's part into recv (nothing for in-place
 * calls and barriers), done in the calling thread, so requests complete
 * at submit. Buffers are host memory; with a stream of a cuda device the
 * copy is a device-to-device copy on that stream instead.
 */
#include "comm/comm_impl.h"

#include "core/dtype.h"
#include "device/peer.h"

#include <stdlib.h>
#include <string.h>

static int self_init(ferry_comm *c, const ferry_comm_options *opt) {
  (void)opt;
  c->rank = c->local_rank = 0;
  c->size = c->local_size = 1;
  c->dev = NULL;
  return 0;
}

static int self_dup(ferry_comm *parent, ferry_comm *child) {
  (void)parent;
  return self_init(child, NULL);
}

static void self_shutdown(ferry_comm *c, int broken) { (void)c, (void)broken; }

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
    /* .alert_send = */ NULL,
    /* .alert_poll = */ NULL,
};
