/* memory/mem_impl.h — the private structures of the tiered memory manager,
 * shared by its sources (registry, layout, pool, tier, residency, evict,
 * stats, names). Everything here is guarded by ferry_mem.mu unless said
 * otherwise.
 *
 * Layers: a source calls only sources below it, never one above, so the
 * calls go one way (tools/call_cycles.py finds no circle):
 *   manager.c    life cycle: create, finalize, set store, destroy
 *   drop_clean.c host copies dropped once their NVMe write lands
 *   residency.c  fetch, release, mark dirty, write-back, flush, eviction moves
 *   query.c      tensor pointers and chunk states (read only)
 *   tier.c, layout.c, evict.c   reserving the tiers, the chunk layout, victim
 *                choice and the access trace (none calls another)
 *   stats.c      accounting
 *   compact.c    sliding movable host copies together (pool.c)
 *   pool.c, registry.c          the pool allocator, the tensor registry
 *   names.c      names of tiers, families and states (calls nothing)
 * Below memory/: device/ (the device API of ferry.h) and core/.
 */
#ifndef FERRY_MEM_IMPL_H
#define FERRY_MEM_IMPL_H

#include "memory/memory.h"

#include <pthread.h>

/* A sub-allocator over [0, capacity) whose block array is sized once
 * (2 * max_allocs + 1 blocks), so alloc/free never call malloc; `fit`
 * chooses among the free blocks that fit (ferry_fit_policy). */
typedef struct {
  size_t off, size;
  int used;
} mem_block;

typedef struct {
  size_t capacity, align, used;
  mem_block *b;
  size_t n, cap;
  int fit;      /* ferry_fit_policy */
  uint64_t rng; /* FERRY_FIT_RANDOM's state */
} mem_pool;

int mem_pool_init(mem_pool *p, size_t capacity, size_t align, size_t max_allocs);
void mem_pool_set_fit(mem_pool *p, int fit, uint64_t seed);
/* Moves the live block at `off` down to the start of the free block just
 * below it (its bytes are the caller's to move); its new offset, or off
 * when the block below is live. */
size_t mem_pool_slide_down(mem_pool *p, size_t off);
void mem_pool_destroy(mem_pool *p);
int mem_pool_alloc(mem_pool *p, size_t bytes, size_t *off);
void mem_pool_free(mem_pool *p, size_t off);

/* Streams whose uses of one device copy are tracked apart (mem_chunk.use_ev);
 * a further stream first waits for one of them and takes its event over. */
#define MEM_USE_STREAMS 4

typedef struct {
  char *name;
  uint8_t dtype, role, family, ndim;
  uint32_t group;
  int64_t shape[FERRY_MEM_MAX_DIMS];
  size_t bytes;
  uint32_t chunk;
  size_t offset;
} mem_tensor;

typedef struct {
  uint8_t state[FERRY_TIERS];
  uint8_t family, home;
  uint8_t never_written;  /* NVMe home: the slot holds nothing yet (zeros) */
  uint8_t queued;         /* device copy LOADING, H2D not issued yet (host source loading) */
  uint8_t io_active;      /* a store request is in flight */
  uint8_t io_write;       /* ... and it is a write */
  uint8_t io_waiter;      /* a thread is blocked in store.wait on it */
  uint8_t pending;        /* on the pending list */
  uint8_t d2h_active;     /* a D2H writeback is in flight (ev_wb) */
  uint8_t load_issued;    /* device LOADING, ev_load recorded */
  uint8_t resv;           /* bit per tier: a thread is finding space for this copy */
  uint8_t ahead;          /* read ahead by a prefetch and not fetched since: the last
                             victim (evicted before its use, it is read twice) */
  uint8_t drop_clean;     /* ferry_mem_evict_clean: the host copy goes when its write lands */
  /* Host writers: a holder in the host tier that marked it dirty may still
   * be writing the host bytes (outside the lock) until it releases, so no
   * copy may be loaded from them (an H2D would copy torn bytes into a clean
   * device copy). hold_host counts the holds taken by fetches to the host
   * tier, of any home (use[] skips the home tier); host_writer is set by
   * mark dirty in the host tier while hold_host > 0 (1: by one thread,
   * writer; 2: by several) and cleared when the last of those holds is
   * released. The writer thread itself may still load from it: its writes
   * so far come before its own fetch. */
  uint8_t host_writer;
  uint32_t hold_host;
  pthread_t writer;
  uint32_t use[FERRY_TIERS];
  size_t off[FERRY_TIERS]; /* pool offsets (device, host); nvme: slot */
  size_t bytes;
  uint32_t index;          /* within the family */
  uint32_t first_tensor, ntensors; /* in m->order */
  uint32_t gfirst, glast;
  uint64_t last_use;       /* LRU clock */
  int io_status;
  ferry_event *ev_load;  /* H2D into the device copy done */
  ferry_event *ev_wb;    /* D2H writeback done */
  /* The holders' last use / writes of the device copy: one event per stream
   * that released or marked it (s NULL: free). Every wait for its users
   * (the next load into its space, the write-back D2H) waits for all. */
  struct mem_use_mark {
    ferry_stream *s;
    ferry_event *ev;
  } use_ev[MEM_USE_STREAMS];
  uint8_t use_next;      /* the slot a fifth stream takes over next */
  void *io;              /* store request storage */
} mem_chunk;

typedef struct {
  uint32_t first, count; /* chunks of one family */
} mem_range;

typedef struct {
  uint32_t group;
  uint8_t family;
} mem_trace_ent;

struct ferry_mem {
  ferry_mem_config cfg;
  ferry_errbuf err;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a transfer completed, or room may have come free (changes) */
  /* Moves whenever room may have come free in a tier: a release, a
   * transfer done, an eviction, a caller's ferry_mem_notify (waited for by
   * ferry_mem_wait_change). */
  uint64_t changes;
  int finalized;
  int laid_out; /* the chunks are packed (ferry_mem_layout or finalize): no registration */
  /* The store's reason for the last failed NVMe transfer and its chunk
   * (under mu): quoted by the error of a fetch or write-back of that chunk. */
  char io_why[768];
  uint32_t io_why_chunk;

  /* registry */
  mem_tensor *t;
  size_t nt, capt;
  uint32_t *hash; /* open addressing: id + 1, 0 empty */
  size_t hcap;
  uint32_t max_group;

  /* layout */
  uint32_t ngroups;
  uint32_t *order;       /* tensor ids sorted by (family, registration) == chunk order */
  uint32_t *by_group;    /* tensor ids sorted by (group, registration) */
  uint32_t *group_start; /* ngroups + 1 offsets into by_group */
  mem_range *ranges;     /* ngroups * FERRY_FAMILIES */
  mem_chunk *c;
  uint32_t nc;
  uint32_t nslots;
  size_t slot_size;
  size_t nvme_spare[FERRY_FAMILIES]; /* a spare NVMe slot per family there: its largest chunk */
  /* and up to MEM_NVME_EXTRA more of min(chunk_size, its largest chunk),
   * as many as fit in 1% of its chunks' bytes (more writes in flight) */
  uint32_t nvme_extra[FERRY_FAMILIES];
  size_t nvme_extra_bytes[FERRY_FAMILIES];
  size_t home_bytes[FERRY_TIERS];    /* nvme: the chunks' bytes and the spares */

  /* tiers */
  char *dev_base;
  char *host_base;
  int host_is_pinned;  /* from ferry_host_alloc (else pageable, ours) */
  size_t host_map_len; /* pageable: mmap length */
  mem_pool pool[2];    /* device, host */
  ferry_stream *h2d, *d2h;
  unsigned char *io_mem;

  /* residency */
  uint32_t *pend;       /* chunk ids with async work in flight */
  uint32_t *compact_ids; /* compact.c's scratch: nc chunk ids */
  uint64_t compactions;  /* compactions that moved a copy */
  uint32_t npend;
  uint64_t clock;

  /* trace */
  mem_trace_ent *trace;
  size_t ntrace, captrace;
  int recording;
  size_t cursor;        /* index of the next expected fetch */
  uint32_t *tpos;       /* positions of each (group, family) in the trace, grouped */
  uint32_t *tpos_start; /* ngroups * FERRY_FAMILIES + 1 */

  /* ferry_mem_cap: the host bytes cap_family's copies may hold (cap_bytes,
   * 0: no cap); within it, other families' moves do not evict them */
  int cap_family;
  size_t cap_bytes;

  ferry_stats st;
  struct mem_copy_mark {
    ferry_mem *m;
    int dir, begin;
  } marks[2][2]; /* [dir][begin]: host-function arguments of the on_copy hook */
  int copy_hook_on; /* launch them (ferry_mem_copy_hook) */
};

/* The most extra spare NVMe slots per family (mem_impl.h, nvme_extra; the
 * same rule as ferry_footprint_nvme_swap in plan/footprint.c). */
#define MEM_NVME_EXTRA 3

/* Chunk offsets in a tier are 256-byte aligned (the device pool's alignment). */
#define MEM_DEVICE_ALIGN 256

/* registry.c */
int mem_registry_metadata(const ferry_mem *m, size_t *bytes);
void mem_registry_free(ferry_mem *m);
/* layout.c */
/* Packs the chunks and builds the group tables (no budget checked). */
int mem_layout_build(ferry_mem *m);
/* Every chunk fits the tiers it passes, every home holds its families. */
int mem_layout_check(ferry_mem *m);
void mem_layout_free(ferry_mem *m);
/* tier.c */
int mem_tiers_reserve(ferry_mem *m);
void mem_tiers_release(ferry_mem *m);
int mem_alloc_io(ferry_mem *m);
/* evict.c */
/* Which victims a move of chunk ci into `tier` may pick under the cap
 * (ferry_mem_cap): MEM_PICK_ANY, MEM_PICK_CAPPED (ci's family would go over
 * the cap: only that family's copies not read ahead: one read ahead is
 * about to be used), MEM_PICK_OTHERS (the capped family
 * is within its cap: any other family's) or MEM_PICK_OTHERS_SPENT (ci is of
 * the capped family, within it: other families' copies not read ahead). */
enum { MEM_PICK_ANY, MEM_PICK_CAPPED, MEM_PICK_OTHERS, MEM_PICK_OTHERS_SPENT };
int mem_evict_scope(const ferry_mem *m, int tier, uint32_t ci);
uint32_t mem_evict_pick(ferry_mem *m, int tier, int (*eligible)(ferry_mem *, uint32_t, int),
                        int scope);
/* Fetches until chunk ci is used again by the trace (UINT64_MAX: never);
 * 0 without a trace (LRU, or while it is recorded). */
uint64_t mem_evict_next_use(ferry_mem *m, uint32_t ci);
/* A host copy being written back that nothing will fetch again (an
 * untraced chunk: the optimizer state just stepped), unheld: once written
 * it frees room. UINT32_MAX when there is none (or tier is not the host). */
uint32_t mem_evict_spent_write(ferry_mem *m, int tier);
/* A prefetch of chunk ci may evict chunk v: the trace needs v after ci. */
int mem_prefetch_may_evict(const ferry_mem *m, uint32_t v, uint32_t ci);
void mem_trace_on_fetch(ferry_mem *m, uint32_t group, int family);
void mem_trace_free(ferry_mem *m);
/* stats.c */
void mem_stats_add(ferry_mem *m, int tier, int family, size_t bytes);
void mem_stats_sub(ferry_mem *m, int tier, int family, size_t bytes);
/* The groups whose held copies fill `tier`, and the bytes cached but not
 * evictable, for a full tier's message. */
void mem_describe_holders(ferry_mem *m, int tier, char *buf, size_t len);
/* compact.c: slides the movable host copies down; the bytes moved (0:
 * none could move). */
size_t mem_compact_host(ferry_mem *m);
/* residency.c */
void mem_set_state(ferry_mem *m, uint32_t ci, int tier, int to);
void mem_drain(ferry_mem *m);
/* The arguments of a group call, checked (a status with m->err set); *r
 * the group's chunks of the family. */
int mem_check_call(ferry_mem *m, uint32_t group, int family, int tier, const char *op,
                   const mem_range **r);
/* Chunk ci's copy in `tier` could go now (nothing holds or moves it); drops
 * it (its space back to the pool). */
int mem_evictable(ferry_mem *m, uint32_t ci, int tier);
void mem_drop_copy(ferry_mem *m, uint32_t ci, int tier);
/* The same for a host copy with no device copy resting on it; its drop
 * counts as an eviction. A write-back to NVMe that lands drops the copy
 * when it is marked so (mem_chunk.drop_clean) and still could go. */
int mem_host_droppable(ferry_mem *m, uint32_t ci);
void mem_drop_host(ferry_mem *m, uint32_t ci);

/* The host pool's alignment: the store's when any family lives on NVMe.
 * Read by layout.c (chunk sizes) and tier.c (the host pool). */
static inline size_t mem_host_align(const ferry_mem *m) {
  size_t a = MEM_DEVICE_ALIGN;
  for (int f = 0; f < FERRY_FAMILIES; f++)
    if (m->cfg.home[f] == FERRY_TIER_NVME && m->cfg.nvme_align > a) a = m->cfg.nvme_align;
  return a;
}

static inline void *mem_tier_addr(ferry_mem *m, const mem_chunk *c, int tier) {
  return (tier == FERRY_TIER_DEVICE ? m->dev_base : m->host_base) + c->off[tier];
}

#endif /* FERRY_MEM_IMPL_H */
