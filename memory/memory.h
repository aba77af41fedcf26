/* memory/memory.h — the internal API of the tiered memory manager: the tensor
 * registry, the chunk layout, the three tiers (device arena, pinned host
 * pool, NVMe store behind a small interface), per-chunk residency, eviction
 * (LRU or furthest-next-use from a recorded trace) and accounting. The
 * engine (offload/) calls it; the NVMe store is wired in through
 * ferry_mem_store so memory/ never includes nvme/.
 */
#ifndef FERRY_MEMORY_H
#define FERRY_MEMORY_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ferry_mem ferry_mem;

/* Tiers and families index ferry_stats (include/ferry.h): FERRY_TIER_DEVICE,
 * FERRY_TIER_HOST, FERRY_TIER_NVME; FERRY_FAMILY_PARAMS, _GRADS, _OPTIM. */

/* Tensors have a ferry_dtype (include/ferry.h): its size is all the manager
 * needs of it. */

typedef enum {
  FERRY_ROLE_PARAM = 0,      /* 16-bit params: family PARAMS */
  FERRY_ROLE_GRAD = 1,       /* family GRADS */
  FERRY_ROLE_MASTER = 2,     /* fp32 master weights: family OPTIM */
  FERRY_ROLE_EXP_AVG = 3,    /* family OPTIM */
  FERRY_ROLE_EXP_AVG_SQ = 4, /* family OPTIM */
  FERRY_ROLE_COUNT
} ferry_role;

/* ferry_evict_policy (placement.eviction) and ferry_fit_policy (fit) are in
 * include/ferry/engine.h. */

/* Residency of one chunk in one tier. */
typedef enum {
  FERRY_RES_ABSENT = 0,
  FERRY_RES_LOADING = 1,  /* space held, bytes on their way in */
  FERRY_RES_RESIDENT = 2, /* a clean copy */
  FERRY_RES_DIRTY = 3,    /* newer than the copy in the next slower tier */
  FERRY_RES_WRITING = 4   /* being written back to the next slower tier */
} ferry_res_state;

#define FERRY_MEM_NAME_MAX 255 /* bytes of a tensor name, without the NUL */
#define FERRY_MEM_MAX_DIMS 8
#define FERRY_MEM_MAX_GROUPS (1u << 24)

/* The NVMe tier as memory/ sees it: numbered slots of slot_size bytes, async
 * reads and writes from host buffers, completion by poll or wait. The engine
 * fills it with the io_uring swap store (a ferry_swap_req fits in `req`);
 * tests fill it with a fake. `req` is req_size bytes of storage the manager
 * owns, one per chunk (at most one request per chunk in flight), reserved at
 * finalize. A slot never written is never read (the manager zero-fills). */
typedef struct {
  void *user;
  size_t req_size;
  int (*write)(void *user, void *req, uint32_t slot, const void *buf, size_t len);
  int (*read)(void *user, void *req, uint32_t slot, void *buf, size_t len);
  /* FERRY_EAGAIN while in flight, then the request's status (once). */
  int (*poll)(void *user, void *req);
  /* Blocks until done; the request's status. */
  int (*wait)(void *user, void *req);
  /* Optional (NULL: none): copies the store's text of its last failure
   * (file, offset, what the check found) into out (cap bytes, NUL-ended),
   * which the manager quotes when a chunk cannot be loaded or written back. */
  void (*why)(void *user, char *out, size_t cap);
} ferry_mem_store;

typedef struct {
  ferry_device *dev;             /* required: device tier and pinned host memory */
  size_t budget[FERRY_TIERS];    /* bytes per tier (device, host, nvme) */
  size_t chunk_size;             /* default 64 MiB */
  int home[FERRY_FAMILIES];      /* tier each family lives in (default host, host, host) */
  /* The fastest tier each family is fetched into (default device, device,
   * host): layout checks a chunk fits every tier from here to its home. */
  int reach[FERRY_FAMILIES];
  ferry_evict_policy policy;
  ferry_fit_policy fit;          /* placement in the device and host pools */
  uint64_t fit_seed;             /* FERRY_FIT_RANDOM's generator (0: 1) */
  int host_pinned;               /* 1 (default): pin the host pool through the backend */
  int pinned_fallback;           /* memlock too low or pinning fails: 1 pageable pool, 0 error */
  int numa_local;                /* 1 (default): bind the host pool to this thread's NUMA node */
  size_t nvme_align;             /* buffer/length alignment of the store (default 4096) */
  ferry_mem_store store;         /* may also be set later with ferry_mem_set_store */
  /* Optional timeline hook: called in stream order on the copy streams when
   * a transfer the manager issued starts (begin 1) and ends (begin 0);
   * dir 0 is H2D, 1 is D2H. On cuda it runs on a runtime thread. Each call
   * is a host function on the stream (on cuda one runtime round trip), so
   * they are launched only while the hook is on: from create when on_copy
   * is set, and as ferry_mem_copy_hook switches it. */
  void (*on_copy)(void *user, int dir, int begin);
  void *copy_user;
  /* Optional: asked between pieces of the homes' zeroing at finalize (from
   * several threads at once); non-zero stops finalize with FERRY_ECANCELED. */
  int (*cancel)(void *user);
  void *cancel_user;
  ferry_logger log;
} ferry_mem_config;

ferry_mem_config ferry_mem_config_default(void);

int ferry_mem_create(const ferry_mem_config *cfg, ferry_mem **out);
/* Waits for transfers in flight, frees every pool and event. NULL allowed.
 * Dirty data not flushed is lost (the engine flushes first). */
void ferry_mem_destroy(ferry_mem *m);
/* The last message: a copy taken under its lock (other threads may set it
 * meanwhile), valid in this thread until its next call. */
const char *ferry_mem_last_error(ferry_mem *m);
/* Before the first NVMe transfer (normally between finalize and the first
 * fetch, once the engine has opened the store with ferry_mem_store_layout). */
int ferry_mem_set_store(ferry_mem *m, const ferry_mem_store *store);

/* ---- registry (before finalize) ---------------------------------------- */

/* Names: 1..FERRY_MEM_NAME_MAX printable ASCII bytes, unique. *id (may be
 * NULL) gets the tensor's id: 0, 1, ... in registration order. */
int ferry_mem_register(ferry_mem *m, const char *name, ferry_dtype dtype, int ndim,
                       const int64_t *shape, uint32_t group, ferry_role role, uint32_t *id);
int ferry_mem_lookup(ferry_mem *m, const char *name, uint32_t *id);

typedef struct {
  const char *name;
  ferry_dtype dtype;
  int ndim;
  const int64_t *shape;
  uint32_t group;
  ferry_role role;
  int family;
  size_t bytes;                     /* numel * element size */
  uint32_t chunk;                   /* global chunk index (after finalize) */
  size_t offset;                    /* bytes into the chunk (after finalize) */
} ferry_mem_tensor_info;
int ferry_mem_tensor_get(ferry_mem *m, uint32_t id, ferry_mem_tensor_info *out);
/* The tensors of a group in registration order (after ferry_mem_layout or finalize). */
int ferry_mem_group_tensors(ferry_mem *m, uint32_t group, const uint32_t **ids, size_t *n);

/* Packs the tensors into chunks per family and builds the group tables,
 * checking no budget, so that the caller can weigh the packed sizes
 * (ferry_mem_group_chunks, ferry_mem_chunk_get) against its own needs
 * before finalize checks and reserves the tiers. After it, no registration.
 * Optional: finalize lays out itself when this was not called. */
int ferry_mem_layout(ferry_mem *m);
/* Packs the tensors into chunks per family, checks every chunk against the
 * budgets of the tiers it must pass (a tensor too big is FERRY_ENOMEM naming
 * it), reserves the device arena and host pool, creates events. After it, no
 * registration; the steady state allocates nothing. */
int ferry_mem_finalize(ferry_mem *m);
/* What the NVMe store must hold: slots 0..nslots-1 of at most slot_size
 * bytes (the largest chunk there). */
int ferry_mem_store_layout(ferry_mem *m, uint32_t *nslots, size_t *slot_size);
/* Each NVMe slot's bytes into sizes (cap entries): slot i < nslots its
 * chunk's, then per family homed there a spare of its largest chunk and up
 * to three of min(chunk_size, that) within 1% of the family's bytes (more
 * writes in flight); *n the count (sizes NULL and cap 0: the count alone;
 * cap short: FERRY_EINVAL). The home bytes of the NVMe tier are their
 * sum, held against tiers.nvme.budget. */
int ferry_mem_store_slot_sizes(ferry_mem *m, size_t *sizes, uint32_t cap, uint32_t *n);

typedef struct {
  int family, home;
  uint32_t index;            /* within the family */
  size_t bytes;              /* bytes held in a tier (aligned) */
  uint32_t group_first, group_last;
  uint32_t ntensors;
  ferry_res_state state[FERRY_TIERS];
  uint32_t use[FERRY_TIERS];
} ferry_mem_chunk_info;
uint32_t ferry_mem_chunk_count(ferry_mem *m);
/* Compactions of the host pool that moved a copy (a fetch found bytes
 * enough free, in holes none of which fit, and nothing to evict). */
uint64_t ferry_mem_compactions(ferry_mem *m);
int ferry_mem_chunk_get(ferry_mem *m, uint32_t chunk, ferry_mem_chunk_info *out);
/* The chunks of a group in one family: [*first, *first + *count). */
int ferry_mem_group_chunks(ferry_mem *m, uint32_t group, int family, uint32_t *first,
                           uint32_t *count);

/* ---- residency ----------------------------------------------------------- */

enum {
  /* The caller overwrites every byte: chunks that hold only this group's
   * tensors get space but no load (they become dirty at once), in the
   * device tier or, fetched to the host, with no NVMe read. */
  FERRY_MEM_NOLOAD = 1u << 0,
  /* Not an access of the loop's order: the fetch neither records into the
   * trace nor moves its replay cursor (the engine's drain, stepper and
   * checkpoints; a commit's fetch of group g during backward would move the
   * cursor to g's use in the next forward and mislead eviction). */
  FERRY_MEM_NOTRACE = 1u << 1
};

/* Makes `family`'s chunks of `group` resident in `tier` (through every tier
 * between it and their home) and holds them (a use count) until release.
 * Device tier: returns once `stream` is ordered after the loads (stream NULL:
 * after they are done). Host tier: returns when the bytes are there. Budget
 * full of chunks in use: FERRY_ENOMEM naming the groups that hold the space
 * (nothing stays held). To the device while another thread holds the group
 * in the host tier and marked it dirty there (it may still be writing):
 * FERRY_EBUSY until the host holds are released (nothing stays held).
 * Counts a stall when it had to wait. */
int ferry_mem_fetch(ferry_mem *m, uint32_t group, int family, int tier, ferry_stream *stream,
                    unsigned flags);
/* Starts the same loads without holding or waiting (FERRY_EBUSY as for
 * fetch while the host copy is written). FERRY_ENOMEM when the space is
 * held, still moving, or holds copies the trace needs before this group's:
 * a prefetch never evicts those. Copies already there are marked read
 * ahead too: the last victims until the group's next fetch. */
int ferry_mem_prefetch(ferry_mem *m, uint32_t group, int family, int tier);
/* Drops the hold. Device tier: `stream` (may be NULL) is the stream that
 * used the chunks; the space is reused only after its work so far. */
int ferry_mem_release(ferry_mem *m, uint32_t group, int family, int tier, ferry_stream *stream);
/* The caller writes the group's bytes in `tier` while it holds them (call
 * it before or after the writes, before release; on the device, `stream` is
 * where the writing kernels run). Copies in faster tiers are dropped; one
 * that is held or dirty there: FERRY_EBUSY, nothing changed, do not write.
 * Copies held in a tier are never written back from it (flush, write-back,
 * eviction skip them), so a holder's writes are never torn. Host tier: once
 * a host holder marks the group dirty, no other thread loads from the host
 * copy (its device fetches and prefetches are FERRY_EBUSY) until the host
 * holds are released, so a device copy never gets half-written bytes; the
 * marking thread itself may fetch it to the device after its writes. A
 * caller that writes a host home without holding it must order those writes
 * against other threads' device fetches itself. */
int ferry_mem_mark_dirty(ferry_mem *m, uint32_t group, int family, int tier, ferry_stream *stream);
/* Orders `stream` after every use of the group's device copies recorded so
 * far (the streams handed to release and mark dirty): work enqueued on it
 * afterwards waits for them. For a writer that overwrites a device copy in
 * place while other streams may still read it (the engine's param upload). */
int ferry_mem_wait_users(ferry_mem *m, uint32_t group, int family, ferry_stream *stream);
/* Starts writing dirty copies of the group in `tier` back one tier down
 * (copies held there are skipped). */
int ferry_mem_writeback(ferry_mem *m, uint32_t group, int family, int tier);
/* Drops the group's copies in `tier` (< home) after writing dirty ones
 * back; FERRY_EBUSY when held. */
int ferry_mem_evict(ferry_mem *m, uint32_t group, int family, int tier);
/* Host tier of NVMe homes: drops the group's copies there once clean,
 * without waiting: a clean copy now, one being written back when its write
 * lands. A copy held, dirty and not being written, or under a device copy
 * is left as it is; a write that fails keeps the copy dirty, and the
 * eviction or flush that writes it again reports the error. */
int ferry_mem_evict_clean(ferry_mem *m, uint32_t group, int family, int tier);
/* Writes every dirty copy that is not held back to its home and waits. */
int ferry_mem_flush(ferry_mem *m);
/* Room coming free, for a caller that got FERRY_ENOMEM (or FERRY_EBUSY)
 * because other threads hold what it needs: a count that moves whenever
 * room may have come free in a tier (a release, a transfer done, an
 * eviction, ferry_mem_notify), read before the call that failed; and a wait
 * until it differs from *seen or the clock (ferry_now) passes `deadline`,
 * driving the transfers in flight meanwhile. *seen gets the count;
 * FERRY_OK when it moved, FERRY_ETIMEDOUT at the deadline. ferry_mem_notify
 * moves it for a caller whose own state a waiter's condition reads (a
 * thread that stopped holding room up). */
uint64_t ferry_mem_changes(ferry_mem *m);
int ferry_mem_wait_change(ferry_mem *m, uint64_t *seen, double deadline);
int ferry_mem_notify(ferry_mem *m);
/* Completes finished transfers; never blocks. */
int ferry_mem_poll(ferry_mem *m);
/* Switches the on_copy hook on (1) or off (0) for transfers issued from now
 * on (those already queued still call it). FERRY_ESTATE to switch it on
 * without an on_copy in the config. */
int ferry_mem_copy_hook(ferry_mem *m, int on);

/* Address of a tensor's bytes in `tier` (device or host): valid while held
 * there, or always in its home. FERRY_ESTATE when not resident there. */
int ferry_mem_tensor_ptr(ferry_mem *m, uint32_t id, int tier, void **ptr);

/* ---- access trace (furthest-next-use eviction and prefetch) ------------- */

/* on = 1: start recording the order of fetches (the first step); on = 0:
 * stop, and use the trace from now on (replay). */
int ferry_mem_trace_record(ferry_mem *m, int on);
/* Sets a trace (group, family pairs) instead of recording one. */
int ferry_mem_trace_set(ferry_mem *m, const uint32_t *groups, const int *families, size_t n);
size_t ferry_mem_trace_length(ferry_mem *m);
/* The fetch expected `ahead` fetches after the last one (1 = the next),
 * cyclically: what to prefetch. FERRY_ENOENT without a trace. */
int ferry_mem_trace_peek(ferry_mem *m, size_t ahead, uint32_t *group, int *family);

/* Caps the host bytes of `family`'s copies (0: no cap). A fetch of that
 * family over the cap evicts its own copies only (not those read ahead:
 * when only those are left, it takes room as an uncapped fetch); other families' moves
 * evict none of them while they are within it (they wait for their own
 * transfers, and take them only when nothing else can go). The engine caps
 * NVMe params at the room the planner counts for them, so which groups
 * stay cached follows the loop's order, not the threads' timing. */
int ferry_mem_cap(ferry_mem *m, int family, size_t bytes);

/* ---- accounting ---------------------------------------------------------- */

int ferry_mem_get_stats(ferry_mem *m, ferry_stats *out);
/* Bytes of the manager's own bookkeeping (registry, layout, states,
 * events, requests) and of managed tensor bytes. */
int ferry_mem_metadata(ferry_mem *m, size_t *metadata_bytes, size_t *managed_bytes);

const char *ferry_tier_name(int tier);
const char *ferry_family_name(int family);
const char *ferry_res_state_name(int state);

#endif /* FERRY_MEMORY_H */
