/* comm/comm_impl.h — the private contract between the communicator layer
 * (comm/comm.c: validation, requests, the worker thread and its queue,
 * waits with a timeout, stats, the span hook) and a backend
 * (comm/comm_self.c, comm/comm_mpi.c, comm/comm_nccl.c). A backend is one
 * table of function pointers; comm.c has validated every argument when a
 * slot is called, so backends only move the bytes.
 */
#ifndef FERRY_DIST_IMPL_H
#define FERRY_DIST_IMPL_H

#include "core/core.h"

#include <pthread.h>

typedef struct ferry_comm_ops ferry_comm_ops;

/* What a request does. FERRY_COLL_DUP is internal: ferry_comm_dup runs it on
 * the parent's worker, so it is ordered with the parent's collectives. */
typedef enum {
  FERRY_COLL_ALLREDUCE = 0,
  FERRY_COLL_REDUCE_SCATTER,
  FERRY_COLL_ALLGATHER,
  FERRY_COLL_BROADCAST,
  FERRY_COLL_BARRIER,
  FERRY_COLL_DUP
} ferry_coll;

/* One queued collective. Owned by the caller from submit to ferry_comm_wait,
 * except an abandoned one (its wait timed out), which the worker frees. */
struct ferry_comm_req {
  ferry_comm *c;               /* (fixed) */
  ferry_coll coll;             /* (fixed) */
  const char *name;            /* (fixed) "allreduce", ... */
  const void *send;            /* (fixed) */
  void *recv;                  /* (fixed) the buffer of broadcast */
  size_t count;                /* (fixed) allreduce, broadcast */
  size_t *counts;              /* (fixed) reduce-scatter, all-gather: size entries (a copy) */
  size_t *displs;              /* (fixed) element offset of each rank's part (prefix sums) */
  size_t total;                /* (fixed) sum of counts */
  ferry_dtype dt;              /* (fixed) */
  ferry_reduce_op op;          /* (fixed) */
  int root;                    /* (fixed) */
  ferry_stream *s;             /* (fixed) NCCL's stream; NULL for the others */
  size_t bytes;                /* (fixed) size of the collective, for messages */
  size_t sent;                 /* (fixed) this rank's send bytes, for the stats */
  ferry_comm *dup_out;         /* (fixed) DUP: the child, set up by the backend */
  double t0, t1;               /* (worker, then mu) start and completion on ferry_now() */
  int status;                  /* (mu) the result once done */
  int done;                    /* (mu) */
  int completing;              /* (mu) a polling thread is completing it (NCCL) */
  int abandoned;               /* (mu) its wait timed out: whoever completes it frees it */
  int skipped;                 /* (mu) not run: the communicator was broken before it started */
  void *impl;                  /* (backend) NCCL: the event recorded after the call */
  struct ferry_comm_req *next; /* (mu) the queue */
};

struct ferry_comm {
  const ferry_comm_ops *ops;  /* (fixed) */
  void *impl;                 /* (backend) set by init or dup, freed by shutdown */
  ferry_comm_kind kind;       /* (fixed) */
  int rank, size;             /* (fixed) set by the backend's init */
  int local_rank, local_size; /* (fixed) */
  double timeout;             /* (fixed) seconds */
  ferry_device *dev;          /* (fixed) NCCL's device; NULL for the others */
  ferry_errbuf err;           /* any thread */

  pthread_mutex_t mu;
  pthread_cond_t work_cv;         /* the worker: a request queued or stopping */
  pthread_cond_t done_cv;         /* waiters: a request completed (CLOCK_MONOTONIC) */
  ferry_comm_req *head, *tail;    /* (mu) queued, not yet started by the worker */
  int running;                    /* (mu) the worker is inside ops->run */
  int stopping;                   /* (mu) destroy asked the worker to end */
  int broken;                     /* (mu) a wait timed out or the backend failed: status */
  char broken_msg[FERRY_ERR_MAX]; /* (mu) the message every later call repeats */
  int has_worker;                 /* (fixed) */
  pthread_t worker;               /* (fixed) */
  ferry_comm_stats stats;         /* (mu) */
  ferry_comm_span_fn span_fn;     /* (mu) */
  void *span_user;                /* (mu) */
};

struct ferry_comm_ops {
  const char *name;
  ferry_comm_kind kind;
  /* 1: comm.c gives each communicator a worker thread that calls run for
   * each request in FIFO order (blocking backends: MPI). 0: run is called
   * in the submitting thread (SELF copies, NCCL enqueues on the stream). */
  int threaded;
  /* Bit (1 << dtype) for each dtype the backend can reduce. */
  unsigned reduce_dtypes;
  /* Sets c->impl, rank, size, local_rank, local_size (a collective). */
  int (*init)(ferry_comm *c, const ferry_comm_options *opt);
  /* Sets up child (impl, rank, ...) as a channel of parent (a collective;
   * run on the parent's worker when threaded). */
  int (*dup)(ferry_comm *parent, ferry_comm *child);
  /* Frees c->impl; the queue is empty. broken: a collective may still hang
   * in the backend, so free only what is safe to free. */
  void (*shutdown)(ferry_comm *c, int broken);
  /* Runs (threaded, SELF) or enqueues (NCCL) one collective; errors go to
   * c->err with the status returned. */
  int (*run)(ferry_comm *c, ferry_comm_req *r);
  /* Optional (NCCL): 0 once an enqueued request is complete, FERRY_EAGAIN
   * before, another status when it failed. NULL: run completes it. */
  int (*poll)(ferry_comm *c, ferry_comm_req *r);
  /* Optional: frees r->impl. */
  void (*release)(ferry_comm *c, ferry_comm_req *r);
  void (*abort)(ferry_comm *c, int code); /* does not return */
  /* Optional: a rank's failure, told to every other rank of the job
   * (msg: "rank R failed: ..."; sends that no rank takes within about a
   * second are left); and the news of one c has: 0 none, else its status
   * with the message in msg. MPI and NCCL: process-wide, so every channel's
   * wait sees it; SELF: c and its channels. NULL: no such news. */
  int (*alert_send)(ferry_comm *c, const char *msg);
  int (*alert_poll)(ferry_comm *c, char *msg, size_t cap);
};

extern const ferry_comm_ops ferry_comm_self_ops;
#ifdef FERRY_HAVE_MPI
extern const ferry_comm_ops ferry_comm_mpi_ops;
/* For the NCCL bootstrap (comm/comm_mpi.c): takes a reference on MPI
 * (initializes it when nobody has), and drops it (finalizes at the last one
 * when ferry initialized it). */
int ferry_mpi_acquire(ferry_errbuf *e);
void ferry_mpi_release(void);
/* The same after a communicator broke: MPI is never finalized (MPI_Finalize
 * would wait for ranks that hang or died; the program aborts). */
void ferry_mpi_release_broken(void);
/* Rank, size, local rank and local size of COMM_WORLD. */
int ferry_mpi_world_info(ferry_errbuf *e, int *rank, int *size, int *local_rank, int *local_size);
/* root's `bytes` of buf to every rank (a private duplicate of COMM_WORLD). */
int ferry_mpi_world_bcast(ferry_errbuf *e, void *buf, size_t bytes, int root);
_Noreturn void ferry_mpi_abort(int code);
/* MPI_Abort when MPI is initialized and not finalized; else returns. */
void ferry_mpi_abort_if_running(int code);
/* The MPI backend's news of a rank's failure (alert_send, alert_poll), for
 * NCCL, whose ranks are COMM_WORLD's. */
int ferry_mpi_alert_send(ferry_comm *c, const char *msg);
int ferry_mpi_alert_poll(ferry_comm *c, char *msg, size_t cap);
#endif
#ifdef FERRY_HAVE_NCCL
extern const ferry_comm_ops ferry_comm_nccl_ops;
#endif

#endif /* FERRY_DIST_IMPL_H */
