/* nvme/swap_impl.h — the swap store's private structures and the calls
 * between its files. From the top down (each file calls only files below
 * it): swap_open.c and swap_reopen.c (a store's life: open, close, reopen
 * from an index, info), swap_complete.c (the completion thread),
 * swap_check.c (finished pieces: read check, commit, callback; the check
 * workers), swap_submit.c (requests started and issued to the ring, write
 * CRCs), swap_fault.c (fault injection); swap_index.c (the index file of
 * kept files) and swap_reclaim.c (files of dead processes) call none of
 * them.
 */
#ifndef FERRY_SWAP_IMPL_H
#define FERRY_SWAP_IMPL_H

#include "nvme/nvme.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <sys/types.h>

#define MAX_RETRIES 8
#define STOP_TAG ((uint64_t)1)
#define FIN_TAG ((uint64_t)2) /* a NOP: writes on finq wait to be finished */
#define BATCH 64
#define MAX_FAULTS 16
#define SWAP_REG_MAX ((size_t)1 << 30) /* io_uring's bytes per registered buffer */

enum { OP_READ = 0, OP_WRITE = 1 };
enum { U_NORMAL = 0, U_DELAYING = 1, U_DROPPED = 2 /* a NOP carrying a dropped request's end */ };

typedef struct io_unit {
  ferry_swap_req *req;
  struct io_unit *next;    /* free list */
  uint32_t piece;
  uint32_t file;
  uint64_t file_off;       /* where the piece starts in its file */
  size_t chunk_off;        /* where it starts in the chunk / buffer */
  size_t io_len;           /* bytes the request moves (aligned when direct) */
  size_t data_len;         /* bytes of chunk data in it */
  size_t done;             /* bytes moved so far */
  unsigned char *mem;      /* user buffer or bounce */
  unsigned char *bounce;   /* this unit's bounce block (oa bytes) */
  int use_bounce;
  int retries;
  int err;                 /* FERRY_E... once the piece failed */
  int state;
  int fault;               /* planned fault kind, 0 none */
  int flip;                /* flip a bit once the read is complete */
  int saved_res;
  unsigned delay_ms;
  struct __kernel_timespec ts;
} io_unit;

/* A finished piece, copied out of its unit so the unit can be reused (and
 * the queue refilled) before the CRC work is done. */
typedef struct {
  ferry_swap_req *req;
  uint32_t piece, file;
  uint64_t file_off;
  size_t chunk_off, data_len;
  int err, flip;
} done_piece;

struct ferry_swap {
  ferry_swap_config cfg;
  char name[64];
  int npaths;
  char dirs[FERRY_SWAP_MAX_PATHS][1024];
  char files[FERRY_SWAP_MAX_PATHS][1100];
  int fds[FERRY_SWAP_MAX_PATHS];
  int owns_files;          /* the files have names this store made (keep_files) or
                            * reopened: close unlinks them unless keep_files */
  int anonymous;           /* the files have no name (O_TMPFILE, or unlinked at once) */
  uint64_t reclaimed_files, reclaimed_bytes; /* removed at open (swap_reclaim.c) */
  char *stale[FERRY_SWAP_MAX_PATHS]; /* per directory: ferry files open could not
                                      * remove (live owners, kept stores), or NULL */
  int direct, fixed_files, sqpoll;
  size_t mem_align, oa, bs;
  uint32_t positions;      /* block positions per slot: ceil(slot/bs) */
  uint32_t cps;            /* CRC entries per slot (positions + 1) */
  uint32_t ppf;            /* positions per file per slot */
  uint32_t nphys;
  uint64_t file_bytes;
  int tight;               /* cfg.slot_sizes: each slot takes its own bytes in the files */
  uint64_t *psize;         /* bytes a physical slot holds (spares: slot_size) */
  uint64_t *pbase;         /* where a physical slot starts in each file */
  uint32_t nshadow;        /* writes in flight into a slot their chunk is not in */
  uint64_t below_max;      /* the largest slot smaller than slot_size (0: none) */

  uint32_t *map;           /* chunk -> physical slot */
  uint32_t *free_phys;
  uint32_t nfree_phys;
  size_t *plen;            /* bytes held by a physical slot, 0 = none */
  uint32_t *crc;           /* nphys * cps */
  unsigned char *busy;     /* per chunk: a request is in flight */
  unsigned char *lost;     /* per chunk: an in-place rewrite failed */

  struct io_uring ring;
  int ring_ok;
  struct iovec *regs;
  unsigned nregs;
  io_unit *units;
  io_unit *free_units;
  unsigned char *bounce;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t reaper;
  int reaper_started;
  ferry_swap_req *runq_head, *runq_tail;
  ferry_swap_req *slotq_head, *slotq_tail;
  ferry_swap_req *crcq;    /* writes submitted whose CRCs the completion thread computes */
  ferry_swap_req *finq;    /* whole writes whose CRCs came late: the completion thread
                            * finishes them (woken by a FIN_TAG NOP) */
  /* read-check workers (cfg.check_threads): the completion thread
   * publishes a batch of finished pieces and takes pieces of it beside
   * them, then waits until every piece is processed */
  pthread_t *workers;
  unsigned nworkers;       /* started */
  int workers_stop;
  pthread_cond_t wcv;      /* workers: a batch was published, or stop */
  pthread_cond_t bcv;      /* completion thread: the batch is processed */
  done_piece *batch;       /* the published batch (the completion thread's array) */
  unsigned batch_n, batch_taken, batch_left;
  uint64_t batch_gen;      /* counts published batches */
  unsigned active;
  int sq_inflight;         /* SQEs submitted whose completions are not reaped yet */
  int discard;             /* ferry_swap_discard: queued requests fail, new ones are refused */
  int ring_err;            /* the errno that made the ring unusable (io_uring_wait_cqe), 0
                            * while it works: every request then fails, new ones are refused */
  int stop_req;            /* swap_completion_stop was called */
  ferry_swap_stats st;

#if FERRY_FAULT_INJECTION
  ferry_fault faults[MAX_FAULTS];
  uint32_t fault_hits[MAX_FAULTS];
  int nfaults;
  int wait_fault;          /* errno the next io_uring_wait_cqe returns, 0 none */
#endif
  char index_path[1100];    /* where close writes the index when files are kept */
  int index_saved;          /* the index on disk is current (no write since) */
  ferry_errbuf err;
  ferry_logger log;
};

/* An index read back from disk: the geometry and arrays of a store closed
 * with its files kept. */
typedef struct {
  int npaths;
  char files[FERRY_SWAP_MAX_PATHS][1100];
  uint64_t slot_size, bs, oa, file_bytes;
  uint32_t nslots, spare_slots, positions, cps, ppf, nphys;
  int direct, verify, tight;
  uint32_t *map;
  uint64_t *psize;
  uint64_t *plen;
  uint32_t *crc;
  unsigned char *lost;
} swap_saved;

/* ---- geometry and errors (every file) ---------------------------------- */

/* How many pieces a chunk of len bytes is cut into: full blocks, an
 * aligned part of the tail, a sub-alignment tail. */
static inline uint32_t npieces_of(const ferry_swap *s, size_t len) {
  size_t nfull = len / s->bs, rem = len % s->bs, a = rem - rem % s->oa;
  return (uint32_t)(nfull + (a > 0) + (rem - a > 0));
}

/* Piece k of a chunk of len bytes: its block position, offset inside the
 * block, data bytes, and whether it is the sub-alignment tail (bounce). */
static inline void piece_geom(const ferry_swap *s, size_t len, uint32_t k, uint32_t *pos,
                              size_t *intra, size_t *dlen, int *bounce) {
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

/* Bytes a physical slot of size bytes takes in each of n files: its rows
 * of blocks (position k in file (p + k) mod n, row k / n); tight, a last
 * row that holds only the tail takes the tail rounded to the alignment oa,
 * else every slot takes ceil(positions / n) whole blocks. */
static inline uint64_t swap_slot_height(uint64_t size, uint64_t bs, uint64_t oa, uint32_t n,
                                        int tight) {
  uint64_t pos = size ? (size + bs - 1) / bs : 1;
  if (!tight) return (pos + n - 1) / n * bs;
  uint64_t rows = (pos - 1) / n, last = pos - rows * n, tail = size - (pos - 1) * bs;
  return rows * bs + (last == 1 ? (tail + oa - 1) / oa * oa : bs);
}

/* Where block position pos of physical slot phys lives: file and offset. */
static inline void locate(const ferry_swap *s, uint32_t phys, uint32_t pos, uint32_t *file,
                          uint64_t *off) {
  uint32_t n = (uint32_t)s->npaths;
  *file = (phys + pos) % n;
  *off = s->pbase[phys] + (uint64_t)(pos / n) * s->bs;
}

/* A file operation's errno as a status code. */
static inline int status_of_errno(int e) {
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

/* ---- swap_open.c: what open and reopen share ----------------------------- */

/* Checks the configuration fields every store needs. */
int swap_check_cfg(const ferry_swap_config *cfg, const char *name, int need_geometry);
/* A store with cfg and name copied in and nothing opened; NULL when out
 * of memory. */
ferry_swap *swap_new_store(const ferry_swap_config *cfg, const char *name);
/* What each directory offers: sets s->direct, mem_align and oa. */
int swap_probe_dirs(ferry_swap *s, ferry_path_info *pi, dev_t *devs);
/* The in-memory index and the I/O units, sized once (geometry set). */
int swap_alloc_index(ferry_swap *s);
/* Each physical slot's start from s->psize (set) and s->file_bytes:
 * FERRY_EOVERFLOW when the files would not fit an off_t. */
int swap_place_slots(ferry_swap *s);
/* The ring, the files registered with it, the check workers and the
 * completion thread. */
int swap_start_ring(ferry_swap *s);
/* Hands s's error to ferry_last_error, frees s; returns status. */
int swap_open_fail(ferry_swap *s, int status);

/* ---- swap_complete.c: the completion thread ----------------------------- */

int swap_completion_start(ferry_swap *s);
/* Stops and joins the completion thread (when started). */
void swap_completion_stop(ferry_swap *s);

/* ---- swap_check.c: finished pieces and the check workers ---------------- */

/* Processes the finished pieces fin[0..nfin) (with the check workers when
 * worth it); returns when every one is processed. */
void swap_run_batch(ferry_swap *s, done_piece *fin, unsigned nfin);
/* Commits request r, whose every piece is done (and a write's CRCs
 * taken), and runs its callback. */
void swap_finish_whole(ferry_swap *s, ferry_swap_req *r);
int swap_workers_start(ferry_swap *s);
/* Stops and joins the check workers (no batch may be in progress). */
void swap_workers_stop(ferry_swap *s);

/* ---- swap_submit.c: the submission side (mutex held unless said) -------- */

void swap_submit_now(ferry_swap *s);
struct io_uring_sqe *swap_get_sqe(ferry_swap *s);
/* Submits a NOP carrying tag (STOP_TAG, FIN_TAG) to wake the completion
 * thread. */
void swap_post_tag(ferry_swap *s, uint64_t tag);
/* Prepares the SQE of what is left of unit u's piece. */
void swap_prep_unit(ferry_swap *s, io_unit *u);
/* Issues pieces of the queued requests while units are free; returns how
 * many. */
int swap_issue(ferry_swap *s);
/* Submits what the completion side prepared: now when force, when the
 * disk is short of work, or when a quarter of the queue depth is ready. */
void swap_flush_sq(ferry_swap *s, int force);
/* The request lost a piece: issue nothing more of it. */
void swap_fail_req(ferry_swap *s, ferry_swap_req *r, int err);
/* A physical slot came free: start writes that waited for one. */
void swap_start_waiting_writes(ferry_swap *s);
/* Runs r's callback (no mutex) with this thread marked as reaping for s:
 * the requests it starts wait to be submitted with the batch. */
void swap_run_callback(ferry_swap *s, ferry_swap_req *r);
/* Computes write r's CRCs unless another thread took them (no mutex). */
void swap_claim_write_crcs(ferry_swap *s, ferry_swap_req *r);
/* Detaches the list at *head (crcq or finq, linked by crc_next); with
 * flush, first submits what is prepared when the list is not empty (takes
 * the mutex). */
ferry_swap_req *swap_take_list(ferry_swap *s, ferry_swap_req **head, int flush);
/* Submits what is prepared, then takes the CRCs of the writes callbacks
 * started (takes the mutex). */
void swap_drain_crcq(ferry_swap *s);

/* ---- swap_fault.c: fault injection (FERRY_FAULT_INJECTION builds) -------- */

#if FERRY_FAULT_INJECTION
/* Plans the fault of a piece as it is first issued (mutex held). */
void swap_fault_plan(ferry_swap *s, io_unit *u);
/* Milliseconds a CRC_DELAY rule holds back write r's CRCs (mutex held). */
unsigned swap_crc_delay_ms(ferry_swap *s, const ferry_swap_req *r);
/* Applies u's planned fault to its completion result *res (mutex held).
 * Returns 1 when the completion must come u->delay_ms late: the result
 * is saved in u and u->ts set, for a timeout the caller submits. */
int swap_fault_apply(ferry_swap *s, io_unit *u, int *res);
/* The errno the completion thread's wait is to fail with (taken: the
 * fault hits once), 0 none (mutex held). */
int swap_fault_take_wait(ferry_swap *s);
#endif

/* ---- swap_reclaim.c: files of dead processes ----------------------------- */

/* flock on directory dir, shared (a store making its files) or exclusive
 * (a store looking for dead ones); the fd, or -1 (no lock: go on). */
int swap_dir_lock(const char *dir, int shared);
void swap_dir_unlock(int fd);
/* Removes from each of s's directories the swap files no live store holds
 * (flock) and no index keeps, and the probe files and index temporaries
 * of dead processes; logs (WARN) what it removed, counts it
 * (reclaimed_files, reclaimed_bytes) and keeps in stale[] what it left. */
void swap_reclaim_dirs(ferry_swap *s);
/* What reclaim left in directory i ("" when nothing). */
const char *swap_stale_of(const ferry_swap *s, int i);

/* ---- swap_index.c: the index of kept files ------------------------------ */

/* Writes s's index to s->index_path (temp file, fsync, rename) after the
 * data files are synced. No request may be in flight. */
int swap_index_save(ferry_swap *s);
/* Reads and checks an index file; errors (with the path) go to e. */
int swap_index_load(const char *path, swap_saved *out, ferry_errbuf *e);
void swap_saved_free(swap_saved *sv);

#endif /* FERRY_SWAP_IMPL_H */
