/* nvme/swap_impl.h — the swap store's private structures, shared by
 * swap_open.c (requests, completion thread, open/close) and swap_index.c (the
 * index saved next to kept files and read back by ferry_swap_reopen).
 */
#ifndef FERRY_SWAP_IMPL_H
#define FERRY_SWAP_IMPL_H

#include "nvme/nvme.h"

#include <liburing.h>
#include <pthread.h>
#include <sys/types.h>

#define MAX_RETRIES 8
#define STOP_TAG ((uint64_t)1)
#define FIN_TAG ((uint64_t)2) /* a NOP: writes on finq wait to be finished */
#define BATCH 64
#define MAX_FAULTS 16

enum { OP_READ = 0, OP_WRITE = 1 };
enum { U_NORMAL = 0, U_DELAYING = 1 };

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
  int owns_files;          /* this store created the files (or reopened them): close may unlink */
  int direct, fixed_files, sqpoll;
  size_t mem_align, oa, bs;
  uint32_t positions;      /* block positions per slot: ceil(slot/bs) */
  uint32_t cps;            /* CRC entries per slot (positions + 1) */
  uint32_t ppf;            /* positions per file per slot */
  uint32_t nphys;
  uint64_t file_bytes;

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
  ferry_swap_stats st;

#if FERRY_FAULT_INJECTION
  ferry_fault faults[MAX_FAULTS];
  uint32_t fault_hits[MAX_FAULTS];
  int nfaults;
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
  int direct, verify;
  uint32_t *map;
  uint64_t *plen;
  uint32_t *crc;
  unsigned char *lost;
} swap_saved;

/* Writes s's index to s->index_path (temp file, fsync, rename) after the
 * data files are synced. No request may be in flight. */
int swap_index_save(ferry_swap *s);
/* Reads and checks an index file; errors (with the path) go to e. */
int swap_index_load(const char *path, swap_saved *out, ferry_errbuf *e);
void swap_saved_free(swap_saved *sv);

#endif /* FERRY_SWAP_IMPL_H */
