/* bench/bench_memory.c — `ferry bench memory`: the tiered memory manager's
 * own costs on a transformer-shaped layout: bookkeeping bytes against
 * managed bytes (target < 1%), and the cost of fetching (and releasing) a
 * group that is already resident (target < 1 us, no allocation: the heap is
 * checked around the loop; tests/memory/test_mem_noalloc counts mallocs).
 * Validates first: a fetched group reads back what was written.
 */
#include "bench/args.h"
#include "bench/bench.h"
#include "format/json_writer.h"

#include "memory/memory.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench memory [--layers N] [--hidden N] [--chunk SIZE] [--iters N] "
          "[--json]\n"
          "\n"
          "Registers a GPT-style model (per layer: qkv, proj, fc1, fc2, two norms; params\n"
          "bf16 on the host, grads and fp32 optimizer state on NVMe), then reports the\n"
          "manager's metadata bytes against the managed bytes, and the time to fetch and\n"
          "release a group already resident on the device (host backend).\n"
          "\n"
          "  --layers N    transformer blocks (groups), 1..65536, default 24\n"
          "  --hidden N    hidden size, 8..65536, default 512\n"
          "  --chunk SIZE  chunk size, 4K..1G, default 16M\n"
          "  --iters N     timed fetch/release pairs, 1..100000000, default 1000000\n"
          "  --json        one JSON object per result\n"
          "\n"
          "The params live in RAM (about 24 x hidden^2 bytes a layer, 6 MiB at hidden 512):\n"
          "a model that needs more than 90%% of the available memory is refused up front.\n"
          "Exit status: 0 within the targets, 1 a failure or a missed target, 2 a usage\n"
          "error (naming the option and its value).\n");
}

/* On failure: says which call failed and returns 1 (the manager's error
 * when there is one, m being the caller's manager). */
#define TRY(call)                                                                                  \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_) {                                                                                     \
      fprintf(stderr, "ferry bench memory: %s: %s: %s\n", #call, ferry_strerror(rc_),              \
              m ? ferry_mem_last_error(m) : ferry_last_error());                                   \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

typedef struct {
  int layers, hidden, json;
  long iters;
  uint64_t chunk;
} mem_opts;

/* The bytes the run holds in RAM: the host tier (the bf16 params and
 * their slack) and the emulated device, as open_model sizes them. */
static double host_need(const mem_opts *o) {
  double h = o->hidden, group = 2 * (3 * h * h + h * h + 4 * h * h + 4 * h * h + 2 * h);
  double params = group * o->layers, chunk = (double)o->chunk;
  return params * 1.25 + 4 * chunk + (8 << 20) + 4 * (group + chunk) + (1 << 20);
}

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage,
 * every refusal naming the option and its value). */
static int parse_args(mem_opts *o, int argc, char **argv) {
  static const char *const prog = "ferry bench memory";
  *o = (mem_opts){24, 512, 0, 1000000, 16ull << 20};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long x = 0;
    if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--layers") && v) {
      if (bench_arg_int(prog, a, argv[++i], 1, 65536, NULL, &x)) return 2;
      o->layers = (int)x;
    } else if (!strcmp(a, "--hidden") && v) {
      if (bench_arg_int(prog, a, argv[++i], 8, 65536, NULL, &x)) return 2;
      o->hidden = (int)x;
    } else if (!strcmp(a, "--iters") && v) {
      if (bench_arg_int(prog, a, argv[++i], 1, 100000000, NULL, &x)) return 2;
      o->iters = (long)x;
    } else if (!strcmp(a, "--chunk") && v) {
      if (bench_arg_size(prog, a, argv[++i], 4096, 1ull << 30, &o->chunk)) return 2;
    } else {
      int known = !strcmp(a, "--layers") || !strcmp(a, "--hidden") || !strcmp(a, "--iters") ||
                  !strcmp(a, "--chunk");
      fprintf(stderr, "%s: %s '%s' (see --help)\n", prog,
              known ? "a value is missing after" : "unknown option", a);
      return 2;
    }
  }
  /* the model lives in RAM: refuse up front what cannot fit, rather than
   * run out of memory (or swap) in the middle */
  uint64_t avail = bench_mem_available();
  if (avail && host_need(o) > 0.9 * (double)avail) {
    char need[32], have[32], ch[32];
    fprintf(stderr,
            "%s: --layers %d with --hidden %d and --chunk %s needs %s of RAM (the bf16 params "
            "on the host tier and the emulated device); %s is available: lower --layers or "
            "--hidden\n",
            prog, o->layers, o->hidden, ferry_format_size(o->chunk, ch, sizeof ch),
            ferry_format_size((uint64_t)host_need(o), need, sizeof need),
            ferry_format_size(avail, have, sizeof have));
    return 2;
  }
  return -1;
}

/* The tensors of one layer (a group), as rows x cols of bf16 params. */
typedef struct {
  const char *name;
  int64_t rows, cols;
} layer_shape;

enum { NSHAPES = 6, NROLES = 5 };

/* A host device and a manager over it with every layer's tensors (params,
 * grads, master, two states) registered and finalized: 0, or 1 (said on
 * stderr). *devp and *mp are set as soon as they exist, for the caller to
 * destroy either way. */
static int open_model(const mem_opts *o, ferry_device **devp, ferry_mem **mp) {
  int layers = o->layers;
  uint64_t chunk = o->chunk;
  int64_t h = o->hidden;
  const layer_shape shapes[NSHAPES] = {{"qkv", h, 3 * h}, {"proj", h, h}, {"fc1", h, 4 * h},
                                       {"fc2", 4 * h, h}, {"ln1", 1, h},  {"ln2", 1, h}};
  const int ns = NSHAPES;
  size_t group_bytes = 0;
  for (int s = 0; s < ns; s++)
    group_bytes += (size_t)(shapes[s].rows * shapes[s].cols * 2);
  size_t params_bytes = group_bytes * (size_t)layers;

  ferry_device *dev = NULL;
  ferry_mem *m = NULL;
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 4 * (group_bytes + chunk) + (1u << 20);
  ferry_mem_config mc = ferry_mem_config_default();
  mc.budget[FERRY_TIER_DEVICE] = dc.capacity;
  mc.budget[FERRY_TIER_HOST] = params_bytes + params_bytes / 4 + 4 * chunk + (8u << 20);
  mc.budget[FERRY_TIER_NVME] = (size_t)1 << 50;
  mc.chunk_size = chunk;
  mc.home[FERRY_FAMILY_GRADS] = FERRY_TIER_NVME;
  mc.home[FERRY_FAMILY_OPTIM] = FERRY_TIER_NVME;
  mc.host_pinned = 0; /* a bench of bookkeeping, not of copies */
  TRY(ferry_device_create(&dc, &dev));
  *devp = dev;
  mc.dev = dev;
  TRY(ferry_mem_create(&mc, &m));
  *mp = m;
  static const int roles[NROLES] = {FERRY_ROLE_PARAM, FERRY_ROLE_GRAD, FERRY_ROLE_MASTER,
                                    FERRY_ROLE_EXP_AVG, FERRY_ROLE_EXP_AVG_SQ};
  static const char *suffix[NROLES] = {"", ".grad", ".master", ".exp_avg", ".exp_avg_sq"};
  for (int l = 0; l < layers; l++)
    for (int s = 0; s < ns; s++)
      for (int r = 0; r < NROLES; r++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.%s.weight%s", l, shapes[s].name, suffix[r]);
        int64_t shp[2] = {shapes[s].rows, shapes[s].cols};
        ferry_dtype dt = r == 0 ? FERRY_DT_BF16 : r == 1 ? FERRY_DT_BF16 : FERRY_DT_F32;
        TRY(ferry_mem_register(m, name, dt, 2, shp, (uint32_t)l, (ferry_role)roles[r], NULL));
      }
  TRY(ferry_mem_finalize(m));
  return 0;
}

/* Writes group 0's params on the host, fetches them to the device and
 * compares: 0, or 1 (said on stderr). */
static int validate(ferry_mem *m) {
  const uint32_t *ids;
  size_t nids;
  TRY(ferry_mem_group_tensors(m, 0, &ids, &nids));
  TRY(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0));
  for (size_t k = 0; k < nids; k++) {
    ferry_mem_tensor_info ti;
    void *p;
    TRY(ferry_mem_tensor_get(m, ids[k], &ti));
    if (ti.family != FERRY_FAMILY_PARAMS) continue;
    TRY(ferry_mem_tensor_ptr(m, ids[k], FERRY_TIER_HOST, &p));
    memset(p, (int)(k + 1), ti.bytes);
  }
  TRY(ferry_mem_mark_dirty(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL));
  TRY(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL));
  TRY(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0));
  for (size_t k = 0; k < nids; k++) {
    ferry_mem_tensor_info ti;
    void *p;
    TRY(ferry_mem_tensor_get(m, ids[k], &ti));
    if (ti.family != FERRY_FAMILY_PARAMS) continue;
    TRY(ferry_mem_tensor_ptr(m, ids[k], FERRY_TIER_DEVICE, &p));
    const unsigned char *b = p;
    for (size_t i = 0; i < ti.bytes; i += 4093)
      if (b[i] != (unsigned char)(k + 1)) {
        fprintf(stderr, "ferry bench memory: validation failed: tensor %s byte %zu\n", ti.name, i);
        return 1;
      }
  }
  return 0;
}

typedef struct {
  double pair_ns, fetch_ns; /* per fetch + release, per fetch alone */
  long heap_delta;          /* heap bytes the fetches allocated */
  uint32_t count;           /* chunks per group */
  size_t meta, managed;
  double pct;
} mem_result;

/* Times fetch + release of the resident group 0, then fetches alone with
 * the heap checked around them, then reads the accounting: 0, or 1 (said
 * on stderr). */
static int measure(ferry_mem *m, long iters, mem_result *res) {
  struct mallinfo2 mi0 = mallinfo2();
  double t0 = ferry_now();
  for (long i = 0; i < iters; i++) {
    ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0);
    ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL);
  }
  double t1 = ferry_now();
  for (long i = 0; i < iters; i++)
    ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0);
  double t2 = ferry_now();
  struct mallinfo2 mi1 = mallinfo2();
  for (long i = 0; i < iters; i++)
    ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL);
  uint32_t first, count;
  TRY(ferry_mem_group_chunks(m, 0, FERRY_FAMILY_PARAMS, &first, &count));
  res->count = count;
  res->heap_delta = (long)mi1.uordblks - (long)mi0.uordblks;

  size_t meta, managed;
  TRY(ferry_mem_metadata(m, &meta, &managed));
  res->meta = meta;
  res->managed = managed;
  res->pct = 100.0 * (double)meta / (double)managed;
  res->pair_ns = (t1 - t0) / (double)iters * 1e9;
  res->fetch_ns = (t2 - t1) / (double)iters * 1e9;
  return 0;
}

static void report(const mem_opts *o, ferry_mem *m, const mem_result *r) {
  if (o->json) {
    json_out j;
    json_begin(&j, stdout);
    json_str(&j, "bench", "memory");
    json_str(&j, "result", "metadata");
    json_uint(&j, "metadata_bytes", r->meta);
    json_uint(&j, "managed_bytes", r->managed);
    json_num(&j, "percent", r->pct);
    json_int(&j, "tensors", (long long)o->layers * NSHAPES * NROLES);
    json_uint(&j, "chunks", ferry_mem_chunk_count(m));
    json_uint(&j, "chunk_size", o->chunk);
    json_end(&j);
    json_begin(&j, stdout);
    json_str(&j, "bench", "memory");
    json_str(&j, "result", "resident_fetch");
    json_num(&j, "fetch_ns", r->fetch_ns);
    json_num(&j, "fetch_release_ns", r->pair_ns);
    json_uint(&j, "chunks_per_group", r->count);
    json_int(&j, "iters", o->iters);
    json_int(&j, "heap_bytes_delta", r->heap_delta);
    json_end(&j);
  } else {
    char a[32], b[32]; /* sizes in binary units, as every text the ferry command prints */
    printf("layout: %d layers, hidden %d, %d tensors, %u chunks of %s\n", o->layers,
           o->hidden, o->layers * NSHAPES * NROLES, ferry_mem_chunk_count(m),
           ferry_format_size(o->chunk, a, sizeof a));
    printf("metadata: %s for %s managed = %.5f%% (target < 1%%)\n",
           ferry_format_size(r->meta, a, sizeof a), ferry_format_size(r->managed, b, sizeof b),
           r->pct);
    printf("resident fetch: %.1f ns (fetch + release %.1f ns), %u chunk(s) per group, heap "
           "delta over %ld fetches: %ld bytes (target < 1000 ns, no allocation)\n",
           r->fetch_ns, r->pair_ns, r->count, o->iters, r->heap_delta);
  }
}

int ferry_bench_memory_main(int argc, char **argv) {
  mem_opts o;
  int ex = parse_args(&o, argc, argv);
  if (ex >= 0) return ex;
  ferry_device *dev = NULL;
  ferry_mem *m = NULL;
  mem_result r;
  int ret = open_model(&o, &dev, &m) || validate(m) || measure(m, o.iters, &r);
  if (!ret) {
    report(&o, m, &r);
    ret = (r.pct < 1.0 && r.fetch_ns < 1000.0 && r.heap_delta == 0) ? 0 : 1;
  }
  ferry_mem_destroy(m);
  ferry_device_destroy(dev);
  return ret;
}
