/* ferry/dist.h — communicators: the ranks of a data-parallel run and the
 * collectives between them (dist/). Part of the public API: include
 * ferry.h, which includes this file.
 *
 * A run of N processes (ranks), started by `mpirun -np N`, trains one
 * model: each rank computes the grads of its share of the batch, and the
 * engine (ferry_engine_set_comm) splits the optimizer state, the grads and
 * (ZeRO stage 3) the params between the ranks (dist.zero_stage). ferry
 * does not move the bytes itself: MPI carries host buffers, NCCL device
 * buffers. */
#ifndef FERRY_API_DIST_H
#define FERRY_API_DIST_H

#ifndef FERRY_H
#error "include ferry.h, not ferry/dist.h"
#endif

/* ------------------------------------------------------------------------ */
/* Communicators (dist/)                                                     */

typedef struct ferry_comm ferry_comm;
typedef struct ferry_comm_req ferry_comm_req;

typedef enum {
  FERRY_COMM_AUTO = 0, /* MPI when an MPI launcher (mpirun, srun) started the process, else SELF */
  FERRY_COMM_SELF = 1, /* one rank and no library: every collective is a copy */
  FERRY_COMM_MPI = 2,  /* MPI over host buffers (pinned or pageable; the host backend's device
                          memory is host memory too) */
  FERRY_COMM_NCCL = 3  /* NCCL over device buffers of a cuda device, bootstrapped by an MPI
                          broadcast of its unique id; its calls are ordered on ferry streams */
} ferry_comm_kind;

typedef enum {
  FERRY_REDUCE_SUM = 0,
  FERRY_REDUCE_AVG = 1, /* the sum divided by the number of ranks */
  FERRY_REDUCE_MAX = 2,
  FERRY_REDUCE_MIN = 3
} ferry_reduce_op;

typedef struct {
  ferry_comm_kind kind;
  ferry_device *dev; /* NCCL: the cuda device whose memory and streams it uses; else ignored */
  double timeout;    /* seconds a wait may last before it fails with FERRY_ETIMEDOUT (a rank
                        died or hangs); 0: 300 */
} ferry_comm_options;

FERRY_API ferry_comm_options ferry_comm_options_default(void);
/* 1 when this build has the kind (SELF and AUTO always), else 0. */
FERRY_API int ferry_comm_compiled(ferry_comm_kind kind);
FERRY_API const char *ferry_comm_kind_name(ferry_comm_kind kind); /* "self", "mpi", "nccl" */

/* Creates the communicator of every rank of the job (a collective: every
 * rank calls it). MPI: initializes MPI (MPI_THREAD_MULTIPLE) unless the
 * program has, and finalizes it at the last destroy when it initialized
 * it. A kind this build lacks: FERRY_ENOTSUP. The reason of a failure is
 * in ferry_last_error(). opt NULL: defaults. */
FERRY_API int ferry_comm_create(const ferry_comm_options *opt, ferry_comm **out);
/* A channel: the same ranks with an order of collectives of its own and
 * its own worker, so threads that each use their own channel cannot
 * disagree on the order of their collectives (a collective). */
FERRY_API int ferry_comm_dup(ferry_comm *c, ferry_comm **out);
/* Waits for the collectives still queued, then frees. */
FERRY_API void ferry_comm_destroy(ferry_comm *c);
FERRY_API const char *ferry_comm_last_error(const ferry_comm *c);
FERRY_API int ferry_comm_rank(const ferry_comm *c);
FERRY_API int ferry_comm_size(const ferry_comm *c);
/* The rank among the ranks on this host, and how many there are (which GPU
 * a rank takes). */
FERRY_API int ferry_comm_local_rank(const ferry_comm *c);
FERRY_API int ferry_comm_local_size(const ferry_comm *c);
FERRY_API ferry_comm_kind ferry_comm_get_kind(const ferry_comm *c);

/* Collectives. Every rank calls the same collectives on a communicator in
 * the same order. Each is asynchronous: it is queued and runs in call
 * order (MPI: on the communicator's worker thread; NCCL: on stream s,
 * which MPI and SELF ignore). *req gets a request to wait for; req NULL
 * waits before returning. Buffers stay untouched by the caller until the
 * request completes. dt: F32, F64, I32, I64, U64, U8 (bytes: moves only),
 * and F16/BF16 on NCCL (MPI: reductions of them are FERRY_ENOTSUP).
 * counts arrays have one entry per rank and are read during the call. */

/* recv = op over the ranks' send (count elements each); send == recv is in
 * place. */
FERRY_API int ferry_comm_allreduce(ferry_comm *c, const void *send, void *recv, size_t count,
                                   ferry_dtype dt, ferry_reduce_op op, ferry_stream *s,
                                   ferry_comm_req **req);
/* send holds counts[0] + ... + counts[size-1] elements, rank r's part after
 * those of the ranks before it; rank r gets op over the ranks' parts r in
 * recv (counts[r] elements; 0 is allowed). recv may not overlap send. */
FERRY_API int ferry_comm_reduce_scatter(ferry_comm *c, const void *send, void *recv,
                                        const size_t *counts, ferry_dtype dt,
                                        ferry_reduce_op op, ferry_stream *s,
                                        ferry_comm_req **req);
/* Rank r's counts[r] elements (send) go to every rank's recv, in rank
 * order (recv holds the sum of counts). send may be this rank's own place
 * in recv (in place). */
FERRY_API int ferry_comm_allgather(ferry_comm *c, const void *send, void *recv,
                                   const size_t *counts, ferry_dtype dt, ferry_stream *s,
                                   ferry_comm_req **req);
/* root's count elements of buf go to every rank's buf. */
FERRY_API int ferry_comm_broadcast(ferry_comm *c, void *buf, size_t count, ferry_dtype dt,
                                   int root, ferry_stream *s, ferry_comm_req **req);
FERRY_API int ferry_comm_barrier(ferry_comm *c, ferry_comm_req **req);
/* Waits for req (NULL: nothing) and frees it; its status. After
 * options.timeout seconds: FERRY_ETIMEDOUT naming the collective, and the
 * communicator is broken (every later call fails the same way); a program
 * then ends the job with ferry_comm_abort. */
FERRY_API int ferry_comm_wait(ferry_comm *c, ferry_comm_req *req);
/* *done = 1 once req completed (it still needs ferry_comm_wait to free it). */
FERRY_API int ferry_comm_test(ferry_comm *c, ferry_comm_req *req, int *done);
/* Ends every rank of the job with `code` (MPI_Abort): for a program that
 * cannot go on after an error, so that no other rank waits forever. SELF:
 * exit(code). The one call of the library that does not return. */
FERRY_API void ferry_comm_abort(ferry_comm *c, int code);
/* This rank failed on its own (an I/O error, a failed update) and stops:
 * tells every other rank, whose waits on any communicator of the job then
 * fail within a fraction of a second with FERRY_EIO and "rank R failed:
 * <why>" (instead of waiting options.timeout for this rank), and breaks c.
 * Call it before ferry_comm_abort, so that the others name the rank and the
 * cause even where the launcher is slow to end them. A rank that fails
 * after another rank's news tells every rank but that one (it knows). NCCL tells it over MPI
 * as MPI does (its polling waits look for it too); on SELF, with no other
 * rank, c, the communicator it was made from and their channels break with
 * the message, and another communicator of the process stays whole. */
FERRY_API int ferry_comm_fail(ferry_comm *c, const char *why);

typedef struct {
  uint64_t ops;        /* collectives completed */
  uint64_t bytes;      /* bytes this rank contributed (its send buffers) */
  double seconds;      /* time the collectives ran, from start to completion */
  double wait_seconds; /* time callers spent in ferry_comm_wait (blocked on communication) */
} ferry_comm_stats;

/* This communicator's (channel's) figures since it was created. */
FERRY_API int ferry_comm_get_stats(const ferry_comm *c, ferry_comm_stats *out);

/* Called after each collective completes, from the thread that saw it
 * complete, with its name ("allreduce", ...) and its span on the
 * ferry_now() clock; the engine puts these on its timeline. */
typedef void (*ferry_comm_span_fn)(void *user, const char *name, double t0, double t1);
FERRY_API void ferry_comm_set_span_hook(ferry_comm *c, ferry_comm_span_fn fn, void *user);

#endif /* FERRY_API_DIST_H */
