/* nvme/nvme.h — the internal API of the io_uring swap store: fixed-size
 * chunk slots striped over files in 1..N directories, async chunk read/write
 * with O_DIRECT, registered buffers, CRC32C on every block, and (in test
 * builds) fault injection. The engine (offload/) wires it to memory/.
 */
#ifndef FERRY_NVME_H
#define FERRY_NVME_H

#include "core/core.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define FERRY_SWAP_MAX_PATHS 16
/* Names ferry makes in a swap directory: ferry_path_probe's probe file
 * (".ferry-probe-PID-..."), a store's files ("ferry-NAME-PID-SEQ-I.swap")
 * and the index of kept files ("ferry-NAME-PID-SEQ.index"). */
#define FERRY_PROBE_PREFIX ".ferry-probe-"

typedef struct ferry_swap ferry_swap;
typedef struct ferry_swap_req ferry_swap_req;

/* Called on the store's completion thread, or on one of its check threads
 * (ferry_swap_config.check_threads > 0: then callbacks of different
 * requests can run at the same time), when a request ends. It must not
 * block; it may submit new requests (that never blocks). After it returns
 * the request belongs to the caller again. */
typedef void (*ferry_swap_cb)(ferry_swap_req *req, int status, void *user);

typedef struct {
  const char *paths[FERRY_SWAP_MAX_PATHS]; /* directories, one file in each */
  int npaths;
  size_t slot_size;      /* largest chunk, bytes (> 0) */
  uint32_t nslots;       /* chunks 0..nslots-1 */
  /* The bytes each physical slot holds: chunk i's own slot, then the
   * spares (nslots + spare_slots entries, each 1..slot_size, one of them
   * slot_size; read at open only), or NULL: every slot holds slot_size.
   * With sizes, each slot takes its own bytes in the files (rounded to the
   * block and O_DIRECT alignment); a write goes to the smallest free slot
   * that holds it (nvme/README.md). */
  const size_t *slot_sizes;
  /* Extra physical slots for shadow writes: a chunk is rewritten into a free
   * spare and the index flips only when every byte is on disk, so a failed
   * write leaves the previous contents readable. 0 = write in place (a
   * failed rewrite then loses that chunk: reads give FERRY_ECORRUPT). */
  uint32_t spare_slots;
  size_t block_size;     /* bytes per I/O request (default 1 MiB) */
  unsigned queue_depth;  /* requests in flight on the ring (default 32) */
  int sqpoll;            /* IORING_SETUP_SQPOLL (costs a core; default 0) */
  int keep_files;        /* keep the files (and write an index) at close (default 0: unlink) */
  int verify;            /* CRC32C every block written, check on read (default 1) */
  int force_buffered;    /* never use O_DIRECT (tests, odd file systems) */
  /* Threads that share the read checks (and the commits and callbacks
   * that follow them) with the completion thread: each burst of finished
   * pieces is split among them (default 1; 0: the completion thread
   * alone; at most 64). A worker sleeps unless a burst holds two or more
   * pieces to check. */
  unsigned check_threads;
  const char *name;      /* for messages (default "swap") */
  ferry_logger log;      /* fn NULL = the process-wide logger */
} ferry_swap_config;

/* slot_size 0, nslots 0, spare_slots 4, block 1 MiB, qd 32, verify on,
 * one check thread. */
ferry_swap_config ferry_swap_config_default(void);

/* Creates the files (0600, O_EXCL), reserves their space with fallocate and
 * sets up the ring. The files cannot outlive the process: they have no name
 * (O_TMPFILE, else unlinked at once) unless keep_files names them, and
 * then the store holds flock(LOCK_EX) on each while it lives. First, in
 * each directory, it removes what dead processes left: swap files no store
 * holds and no index keeps, probe files, index temporaries (a WARN log line
 * names them; info.reclaimed_*). Too little space: FERRY_ENOSPC naming the
 * directory, the bytes needed and free, and the ferry swap files there it
 * could not remove (a live process's, a kept store's). Failure text in
 * ferry_last_error(). */
int ferry_swap_open(const ferry_swap_config *cfg, ferry_swap **out);
/* Waits for every request in flight, then closes (and unlinks) the files.
 * With keep_files the files stay, and unless ferry_swap_save_index already
 * saved a current index, close syncs them and writes one (info.index_path;
 * a failure there is logged at ERROR, since close returns nothing). NULL is
 * allowed. */
void ferry_swap_close(ferry_swap *s);

/* Waits for the requests in flight, fdatasyncs the files and writes the
 * index (chunk map, lengths, CRCs; a CRC32C over it) to info.index_path
 * through a temp file, fsync and rename. It stays valid until the next
 * write, which deletes it. Returns the status (close cannot); a store
 * whose files have no name (keep_files off): FERRY_ESTATE. */
int ferry_swap_save_index(ferry_swap *s);

/* Opens a store closed with keep_files from its index: the geometry and
 * the files come from the index (cfg's slot_size, nslots, npaths must be 0
 * or equal; its queue_depth, sqpoll, verify, keep_files, force_buffered,
 * name and log apply). A damaged or truncated index, or a file of the
 * wrong size: FERRY_ECORRUPT naming it; a missing file: FERRY_ENOENT. On
 * success the index file is removed (the store is live again); on failure
 * nothing is changed or removed. */
int ferry_swap_reopen(const ferry_swap_config *cfg, const char *index_path, ferry_swap **out);
const char *ferry_swap_last_error(ferry_swap *s);
/* The store's last error copied into out (cap bytes, NUL-ended), safe
 * while the store's threads may be setting it. */
void ferry_swap_error_copy(ferry_swap *s, char *out, size_t cap);

typedef struct {
  int o_direct;          /* 1 when the files are open with O_DIRECT */
  size_t mem_align;      /* buffer address alignment required (1 if buffered) */
  size_t offset_align;   /* file offset / length alignment */
  size_t block_size;     /* after alignment */
  size_t slot_size;
  uint32_t nslots, spare_slots;
  unsigned queue_depth;
  int sqpoll, fixed_files, verify;
  unsigned check_threads; /* started beside the completion thread */
  uint64_t file_bytes;   /* size of each file */
  const char *index_path;/* where the index of kept files goes (valid until close) */
  uint64_t reclaimed_files, reclaimed_bytes; /* left by dead processes, removed at open */
} ferry_swap_info;
int ferry_swap_get_info(ferry_swap *s, ferry_swap_info *out);

/* Registers host buffers with the ring (IORING_REGISTER_BUFFERS); requests
 * whose buffer lies inside one then use READ_FIXED/WRITE_FIXED. Replaces an
 * earlier set; n = 0 unregisters. Only while no request is in flight. A
 * buffer above 1 GiB (io_uring's limit): FERRY_EINVAL naming it, the earlier
 * set kept. */
int ferry_swap_register_buffers(ferry_swap *s, const struct iovec *iov, unsigned n);

/* A request: caller-owned storage (embed it, no allocation per request).
 * Every field is private to nvme/ except what the accessors return. */
struct ferry_swap_req {
  ferry_swap *store;
  ferry_swap_req *next;  /* store queues */
  unsigned char *buf;
  size_t len;
  uint32_t chunk;
  int op;                /* 0 read, 1 write */
  uint32_t phys;         /* physical slot of this request */
  uint32_t npieces, next_piece, inflight, pieces_done;
  int status;            /* first error of the request */
  int buf_index;         /* registered buffer, -1 when none */
  ferry_swap_cb cb;
  void *user;
  double t_submit, t_done;
  atomic_int done;
  atomic_int crc_state;  /* writes: 0 CRCs not started, 1 being computed, 2 done,
                          * 3 being computed while the write waits, whole, for them */
  ferry_swap_req *crc_next; /* store's list of writes whose CRCs are still to do */
  int unplaced;          /* a write dropped while it waited for a slot: commits nothing */
};

/* Starts a read of chunk `chunk` (len bytes, as written) into buf, or a
 * write of len (1..slot_size) bytes from buf. With O_DIRECT, buf must be
 * aligned to info.mem_align; the tail that is not a multiple of the offset
 * alignment goes through a bounce buffer, so buf needs only len bytes. A
 * request on a chunk that already has one in flight: FERRY_EBUSY. cb NULL:
 * complete with ferry_swap_poll / ferry_swap_wait. buf must stay untouched
 * until the request is done. Integrity: a CRC32C per block_size piece of a
 * write is computed from buf while the write is in flight (by the caller's
 * thread right after it is submitted, or by the completion side for
 * writes started from callbacks or that waited for a slot) and kept in the
 * index; a write whose data lands first is done when its CRCs are (the
 * completion side never waits for them);
 * each piece of a read is checked as it arrives (FERRY_ECORRUPT names the
 * chunk, its offset, the file offset, expected and found CRC). A write with
 * spare slots goes to a free slot and the index flips only on success; with
 * every spare busy it waits in order for one (never blocks the caller). */
int ferry_swap_read(ferry_swap *s, uint32_t chunk, void *buf, size_t len, ferry_swap_req *req,
                    ferry_swap_cb cb, void *user);
int ferry_swap_write(ferry_swap *s, uint32_t chunk, const void *buf, size_t len,
                     ferry_swap_req *req, ferry_swap_cb cb, void *user);
/* For requests submitted without a callback (a callback request is done
 * when its callback runs): FERRY_EAGAIN while in flight, then its status. */
int ferry_swap_poll(ferry_swap_req *req);
/* Blocks until done; returns the request's status. */
int ferry_swap_wait(ferry_swap_req *req);
/* Blocks until nothing is in flight on the store. */
void ferry_swap_drain(ferry_swap *s);
/* The store's contents are scratch from now on (it is closed next and
 * its files deleted, as after a cancelled set-up): requests not yet
 * issued to the disk, queued or waiting for a slot, end with
 * FERRY_ECANCELED (their callbacks run, wait returns it), the pieces on
 * the disk are awaited as usual, and requests started afterwards are
 * refused with FERRY_ECANCELED. A dropped write commits nothing: its
 * chunk keeps its previous contents when the write went to a spare slot
 * or still waited for one, else (in place) it reads as lost. Close then
 * waits for the pieces in flight only. */
void ferry_swap_discard(ferry_swap *s);
/* What a finished request was and when (its callback has run, or poll or
 * wait returned its status): *op 0 read, 1 write; *t_submit when it was
 * started and *t_done when it completed (ferry_now seconds). Any out
 * pointer may be NULL. */
void ferry_swap_req_times(const ferry_swap_req *r, int *op, double *t_submit, double *t_done);

/* Bytes of chunk as last written successfully (0 when never written). */
size_t ferry_swap_chunk_len(ferry_swap *s, uint32_t chunk);

typedef struct {
  uint64_t bytes_read, bytes_written;
  uint64_t reads, writes;       /* chunk requests completed */
  uint64_t ios;                 /* io_uring requests completed */
  uint64_t retries;             /* short or interrupted I/O resubmitted */
  uint64_t crc_errors, io_errors;
  /* the read checks (completion thread and check threads): bytes checked
   * and seconds spent, summed over the threads (the CRC of data the disk
   * has just written into memory, which is colder and slower than
   * ferry_crc32c on a warm buffer) */
  uint64_t read_check_bytes;
  double read_check_seconds;
  uint64_t submit_calls;        /* io_uring_submit calls (each an io_uring_enter
                                 * unless SQPOLL): requests / submit_calls is
                                 * the submission batch */
} ferry_swap_stats;
void ferry_swap_get_stats(ferry_swap *s, ferry_swap_stats *out);

/* ---- fault injection (FERRY_FAULT_INJECTION builds; else FERRY_ENOTSUP) */

typedef enum {
  FERRY_FAULT_EIO = 1,    /* the request fails with EIO */
  FERRY_FAULT_ENOSPC = 2, /* the request fails with ENOSPC */
  FERRY_FAULT_SHORT = 3,  /* completes with half its bytes (rest resubmitted) */
  FERRY_FAULT_BITFLIP = 4,/* a read delivers one flipped bit */
  FERRY_FAULT_DELAY = 5,  /* completes delay_ms late */
  /* a write's CRCs are taken delay_ms late (matched per request, piece
   * ignored): the write lands first and waits for them without holding
   * up other completions */
  FERRY_FAULT_CRC_DELAY = 6
} ferry_fault_kind;

typedef struct {
  ferry_fault_kind kind;
  int op;           /* -1 any, 0 read, 1 write */
  int64_t chunk;    /* -1 any */
  int64_t piece;    /* which I/O of the chunk (block index), -1 any */
  uint32_t count;   /* how many matching I/Os to hit (0 = every one) */
  uint32_t delay_ms;
} ferry_fault;

/* Adds a rule (up to 16); FERRY_ENOTSUP when not compiled in. */
int ferry_swap_fault_add(ferry_swap *s, const ferry_fault *f);
void ferry_swap_fault_clear(ferry_swap *s);
/* Test hook: the completion thread's next io_uring_wait_cqe (the one after
 * the wait it is in now ends) fails with -err, which leaves the ring
 * unusable: every request in flight or queued then ends with FERRY_EIO.
 * FERRY_ENOTSUP when fault injection is not compiled in. */
int ferry_swap_fault_ring_wait(ferry_swap *s, int err);
/* Test hook: flips bit `bit` of byte `offset` of chunk on disk. */
int ferry_swap_corrupt_on_disk(ferry_swap *s, uint32_t chunk, size_t offset, int bit);

#endif /* FERRY_NVME_H */
