/* bench/bench_io.c — `ferry bench io`: sequential/random chunk I/O through
 * the swap store (nvme/) on its own file: writes it, times one pass, reads
 * every byte back and compares (a figure is printed only when they match);
 * reports GB/s, IOPS, latency p50/p99 and CPU seconds per GB. One request
 * per bs-sized chunk, qd of them in flight; the mixed mode interleaves
 * reads and rewrites in one pass, as the engine's swap traffic does.
 */
#include "bench/bench.h"
#include "format/json_writer.h"
#include "bench/io_common.h"
#include "core/crc32c.h"
#include "nvme/nvme.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct io_run io_run;

typedef struct {
  io_run *run;
  ferry_swap_req req;
  int idx;
} io_slot;

struct io_run {
  ferry_swap *s;
  int op;                  /* 0 read, 1 write */
  const unsigned char *ops; /* per op, when not NULL: 0 read, 1 write (mixed) */
  uint32_t nops;
  const uint32_t *order;   /* chunk of op i */
  unsigned char **wbuf;    /* write source for chunk j: wbuf[j % qd] */
  unsigned char **rbuf;    /* read target per slot */
  unsigned qd;             /* wbuf count */
  unsigned nslots;         /* requests kept submitted (--outstanding) */
  size_t bs;
  double *lat;             /* seconds, per op */
  uint32_t *slot_op;       /* op index running in each slot */
  atomic_uint next;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint32_t completed;
  int status;
  char err[512];
};

static void submit_op(io_run *r, io_slot *sl, uint32_t i);

static void on_done(ferry_swap_req *req, int status, void *user) {
  io_slot *sl = user;
  io_run *r = sl->run;
  uint32_t i = r->slot_op[sl->idx];
  r->lat[i] = ferry_now() - req->t_submit;
  int failed = status != FERRY_OK;
  if (failed) {
    pthread_mutex_lock(&r->mu);
    if (!r->status) {
      r->status = status;
      snprintf(r->err, sizeof r->err, "%s", ferry_swap_last_error(r->s));
    }
    pthread_mutex_unlock(&r->mu);
  }
  uint32_t nx = failed ? r->nops : atomic_fetch_add(&r->next, 1);
  if (nx < r->nops) submit_op(r, sl, nx);
  pthread_mutex_lock(&r->mu);
  r->completed++;
  if (r->completed == r->nops || failed) pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

static void submit_op(io_run *r, io_slot *sl, uint32_t i) {
  uint32_t chunk = r->order[i];
  r->slot_op[sl->idx] = i;
  int wr = r->ops ? r->ops[i] : r->op;
  int rc = wr ? ferry_swap_write(r->s, chunk, r->wbuf[chunk % r->qd], r->bs, &sl->req, on_done, sl)
              : ferry_swap_read(r->s, chunk, r->rbuf[sl->idx], r->bs, &sl->req, on_done, sl);
  if (rc != FERRY_OK) {
    pthread_mutex_lock(&r->mu);
    if (!r->status) {
      r->status = rc;
      snprintf(r->err, sizeof r->err, "%s", ferry_swap_last_error(r->s));
    }
    r->completed++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
  }
}

/* Runs nops requests, nslots of them submitted at a time (the store puts
 * up to qd at the disk and queues the rest); returns a status. */
static int run_pass(io_run *r, io_slot *slots) {
  atomic_store(&r->next, 0);
  r->completed = 0;
  r->status = 0;
  unsigned start = r->nslots < r->nops ? r->nslots : r->nops;
  atomic_store(&r->next, start);
  for (unsigned b = 0; b < start; b++) submit_op(r, &slots[b], b);
  pthread_mutex_lock(&r->mu);
  while (r->completed < r->nops && !r->status) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  ferry_swap_drain(r->s);
  return r->status;
}

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench io --path DIR [--size 4G] [--bs 1M] [--qd 32]\n"
          "                      [--mode read|write|randread|mixed] [--read-share F]\n"
          "                      [--no-verify] [--no-fixed]\n"
          "                      [--sqpoll] [--no-hugepages | --hugetlb] [--overwrite]\n"
          "                      [--outstanding N] [--check-threads N] [--json]\n"
          "Writes its own file in DIR through the swap store, times one pass (one\n"
          "request per bs-sized chunk, qd in flight, CRC32C on unless --no-verify), then\n"
          "reads every byte back and compares. Reports GB/s (1e9 bytes), IOPS, latency\n"
          "p50/p99 and CPU seconds per GB (getrusage, all threads).\n"
          "Buffers are 2 MiB aligned with MADV_HUGEPAGE, as the engine's pinned host\n"
          "pool is (a 1 MiB request is then one physically contiguous segment);\n"
          "--no-hugepages uses plain 4 KiB pages (256 segments per 1 MiB); --hugetlb\n"
          "takes them from the reserved hugetlb pool (vm.nr_hugepages), as fio's\n"
          "--mem=shmhuge does.\n"
          "--overwrite (write only) times a second write pass over the blocks an\n"
          "untimed first pass wrote, as a swap file is rewritten every step; the\n"
          "first pass over a fresh file also pays the file system's conversion of\n"
          "fallocated extents and, where freed blocks are discarded (mount -o\n"
          "discard), the device refilling them.\n"
          "--mode mixed times a pass of reads and rewrites interleaved in one stream\n"
          "(a fraction F of the requests reads, --read-share, default 0.5; the rest\n"
          "rewrite blocks an untimed first pass wrote), as the engine's swap store\n"
          "reads one group while it writes another back; gb_per_s counts both.\n"
          "--outstanding N keeps N requests submitted (default qd + 2): the store\n"
          "puts qd of them at the disk, as fio's iodepth does, and queues the rest,\n"
          "so a completed burst is refilled while the CRCs are checked; each\n"
          "request has its own read buffer (many more than qd were\n"
          "slower on the development disk: docs/PERFORMANCE.md).\n"
          "--check-threads N starts N threads that share each burst of read checks\n"
          "(and the callbacks after them) with the completion thread (default 1, as\n"
          "the store's; 0: the completion thread checks alone).\n"
          "Latency counts from a request's submission to the store to its callback\n"
          "(with N > qd, time queued in the store as well).\n"
          "JSON keys: bench (\"io\"), mode, bs, qd, bytes, seconds, gb_per_s, iops,\n"
          "p50_us, p99_us, cpu_s_per_gb, crc_gb_per_s (CRC32C of a warm buffer),\n"
          "check_gb_per_s and check_s_per_gb (the read checks of all threads\n"
          "in the timed pass: their rate per checking thread, and their seconds\n"
          "per GB read; 0 for writes and --no-verify), requests_per_submit (I/O\n"
          "requests per io_uring submit call in the timed pass), verify, o_direct,\n"
          "fixed_buffers, sqpoll, hugepages, pages, overwrite, outstanding,\n"
          "check_threads, path; with --mode mixed also read_share.\n");
}

/* bench io's own flags, beside the options bench uring shares. */
typedef struct {
  int verify, fixed, sqpoll;
  uint64_t outstanding; /* 0: qd + 2 */
  unsigned check_threads;
  double read_share; /* mixed: the fraction of requests that read */
} io_flags;

static int own_opt(const char *a, const char *v, void *ctx) {
  io_flags *f = ctx;
  if (!strcmp(a, "--no-verify")) f->verify = 0;
  else if (!strcmp(a, "--no-fixed")) f->fixed = 0;
  else if (!strcmp(a, "--sqpoll")) f->sqpoll = 1;
  else if (!strcmp(a, "--check-threads") && v) {
    char *end = NULL;
    unsigned long n = strtoul(v, &end, 10);
    if (!*v || *end || n > 64) {
      fprintf(stderr, "ferry bench io: bad value '%s' for --check-threads (0..64)\n", v);
      return -1;
    }
    f->check_threads = (unsigned)n;
    return 2;
  } else if (!strcmp(a, "--read-share") && v) {
    char *end = NULL;
    double x = strtod(v, &end);
    if (!*v || *end || !(x > 0 && x < 1)) {
      fprintf(stderr, "ferry bench io: bad value '%s' for --read-share (between 0 and 1)\n", v);
      return -1;
    }
    f->read_share = x;
    return 2;
  } else if (!strcmp(a, "--outstanding") && v) {
    if (ferry_parse_size(v, &f->outstanding) || !f->outstanding || f->outstanding > 4096) {
      fprintf(stderr, "ferry bench io: bad value '%s' for --outstanding (1..4096)\n", v);
      return -1;
    }
    return 2;
  } else return 0;
  return 1;
}

/* ---- the command -------------------------------------------------------------- */

/* The options, checked, and what follows from them. */
typedef struct {
  bench_io_opts o;
  io_flags fl;
  int op, random, mixed; /* op: 0 read, 1 write; random: randread's shuffled
                            order; mixed: reads and rewrites in one pass */
  uint32_t nops;  /* bs-sized chunks */
  uint64_t size;  /* nops * bs */
} io_args;

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage). */
static int parse_args(io_args *a, int argc, char **argv) {
  memset(a, 0, sizeof *a);
  a->fl = (io_flags){1, 1, 0, 0, 1, 0.5};
  int ex = bench_io_parse(&a->o, argc, argv, "ferry bench io", usage, own_opt, &a->fl);
  if (ex >= 0) return ex;
  const char *mode = a->o.mode;
  uint64_t size = a->o.size, bs = a->o.bs;
  if (!strcmp(mode, "read"))
    a->op = 0;
  else if (!strcmp(mode, "write"))
    a->op = 1;
  else if (!strcmp(mode, "randread"))
    a->op = 0, a->random = 1;
  else if (!strcmp(mode, "mixed"))
    a->op = 1, a->mixed = 1;
  else {
    fprintf(stderr, "ferry bench io: --mode must be read, write, randread or mixed, not '%s'\n",
            mode);
    return 2;
  }
  if (bench_io_check_geometry(&a->o, "ferry bench io", 1, UINT32_MAX)) return 2;
  a->nops = (uint32_t)(size / bs);
  a->size = (uint64_t)a->nops * bs;
  return -1;
}

/* The swap store on its own file in --path, one slot per chunk: 0, or 1
 * (said on stderr). */
static int open_store(const io_args *a, ferry_swap **s, ferry_swap_info *info) {
  ferry_swap_config cfg = ferry_swap_config_default();
  cfg.paths[0] = a->o.path;
  cfg.npaths = 1;
  cfg.slot_size = a->o.bs;
  cfg.nslots = a->nops;
  cfg.spare_slots = 0; /* in place, like fio: the pass stays sequential on disk */
  cfg.block_size = a->o.bs;
  cfg.queue_depth = (unsigned)a->o.qd;
  cfg.verify = a->fl.verify;
  cfg.sqpoll = a->fl.sqpoll;
  cfg.check_threads = a->fl.check_threads;
  cfg.name = "bench";
  if (ferry_swap_open(&cfg, s) != FERRY_OK) {
    fprintf(stderr, "ferry bench io: %s\n", ferry_last_error());
    return 1;
  }
  ferry_swap_get_info(*s, info);
  return 0;
}

/* The passes' memory: nq write sources (chunk j is written from
 * wbuf[j % nq]), nsl read targets (one per slot), and per-op arrays. */
typedef struct {
  unsigned nq, nsl;
  int pages;
  unsigned char *wmem, *rmem;
  size_t buflen, rbuflen;
  unsigned char **wbuf, **rbuf;
  uint32_t *order, *slot_op;
  unsigned char *ops; /* mixed: each op's kind */
  double *lat;
  io_slot *slots;
} io_bufs;

/* 0, or 1 (said on stderr); b is for bufs_free either way. */
static int bufs_alloc(io_bufs *b, const io_args *a) {
  size_t bs = a->o.bs;
  memset(b, 0, sizeof *b);
  b->nq = (unsigned)a->o.qd;
  b->nsl = a->fl.outstanding ? (unsigned)a->fl.outstanding : b->nq + 2;
  b->pages = a->o.pages;
  unsigned nq = b->nq, nsl = b->nsl;
  b->buflen = bench_pages_round(nq * bs, b->pages);
  b->rbuflen = bench_pages_round(nsl * bs, b->pages);
  b->wmem = bench_pages_alloc(b->buflen, b->pages);
  b->rmem = bench_pages_alloc(b->rbuflen, b->pages);
  if ((!b->wmem || !b->rmem) && b->pages == BENCH_PAGES_HUGETLB) {
    fprintf(stderr,
            "ferry bench io: --hugetlb: no %llu bytes of hugetlb pages (reserve them: "
            "echo N > /proc/sys/vm/nr_hugepages)\n",
            (unsigned long long)(b->buflen + b->rbuflen));
    return 1;
  }
  b->wbuf = calloc(nq, sizeof *b->wbuf);
  b->rbuf = calloc(nsl, sizeof *b->rbuf);
  b->order = malloc(a->nops * sizeof *b->order);
  b->ops = malloc(a->nops);
  b->slot_op = calloc(nsl, sizeof *b->slot_op);
  b->lat = malloc(a->nops * sizeof *b->lat);
  b->slots = calloc(nsl, sizeof *b->slots);
  if (!b->wmem || !b->rmem || !b->wbuf || !b->rbuf || !b->order || !b->ops || !b->slot_op ||
      !b->lat || !b->slots) {
    fprintf(stderr, "ferry bench io: out of memory for %u buffers of %llu bytes\n", nq,
            (unsigned long long)bs);
    return 1;
  }
  for (unsigned i = 0; i < nq; i++)
    b->wbuf[i] = b->wmem + i * bs;
  for (unsigned i = 0; i < nsl; i++)
    b->rbuf[i] = b->rmem + i * bs;
  return 0;
}

static void bufs_free(io_bufs *b) {
  bench_pages_free(b->wmem, b->buflen, b->pages);
  bench_pages_free(b->rmem, b->rbuflen, b->pages);
  free(b->wbuf);
  free(b->rbuf);
  free(b->order);
  free(b->ops);
  free(b->slot_op);
  free(b->lat);
  free(b->slots);
}

/* Incompressible contents for the nq write sources of bs bytes. */
static void fill_sources(unsigned char *wmem, size_t nq, size_t bs) {
  unsigned long long seed = 0x243F6A8885A308D3ull;
  for (size_t i = 0; i < nq * bs; i += 8) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    memcpy(wmem + i, &seed, bs - (i % bs) >= 8 ? 8 : bs - (i % bs));
  }
}

/* What the CRC alone costs on one core (GB/s over a warm buffer), for the
 * CRC-overhead estimate. */
static double crc_rate(const unsigned char *mem, size_t len) {
  volatile uint32_t sink = 0;
  double tc = ferry_now();
  size_t done = 0;
  while (ferry_now() - tc < 0.1 || done < (64u << 20)) {
    sink ^= ferry_crc32c(0, mem, len);
    done += len;
  }
  (void)sink;
  return (double)done / (ferry_now() - tc) / 1e9;
}

static void run_init(io_run *r, ferry_swap *s, io_bufs *b, const io_args *a) {
  r->s = s;
  r->nops = a->nops;
  r->order = b->order;
  r->wbuf = b->wbuf;
  r->rbuf = b->rbuf;
  r->qd = b->nq;
  r->nslots = b->nsl;
  r->bs = a->o.bs;
  r->lat = b->lat;
  r->slot_op = b->slot_op;
  for (unsigned i = 0; i < b->nsl; i++) {
    b->slots[i].run = r;
    b->slots[i].idx = (int)i;
  }
  for (uint32_t i = 0; i < a->nops; i++)
    b->order[i] = i;
}

/* The mixed pass: op i reads when the running share of reads falls behind
 * F, so the kinds interleave evenly; reads go through the file's first
 * part in order, writes through the rest, two sequential streams as the
 * engine reads one group's slots while it writes another's back. */
static void mixed_order(io_bufs *b, uint32_t nops, double share) {
  uint32_t nr = 0, nw = 0, reads = (uint32_t)(share * nops + 0.5);
  if (reads < 1) reads = 1;
  if (reads >= nops) reads = nops - 1;
  for (uint32_t i = 0; i < nops; i++) {
    int rd = nr < reads && ((double)nr < share * (i + 1) || nw == nops - reads);
    b->ops[i] = (unsigned char)!rd;
    b->order[i] = rd ? nr++ : reads + nw++;
  }
}

/* The timed pass's seconds, CPU seconds and the store's counters around it. */
typedef struct {
  double secs, cpu;
  ferry_swap_stats st0, st1;
} io_timing;

/* A fixed shuffle of order[0..n), for randread. */
static void shuffle(uint32_t *order, uint32_t n) {
  unsigned long long x = 0x9E3779B97F4A7C15ull;
  for (uint32_t i = n - 1; i > 0; i--) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint32_t j = (uint32_t)(x % (i + 1));
    uint32_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

/* 1. writes the file (timed when mode is write; with --overwrite, the
 * second of two passes, from buffers changed in between so that the
 * validation tells the passes apart); 2. the timed read pass. Returns a
 * status. */
static int timed_passes(io_run *r, io_bufs *b, const io_args *a, io_timing *t) {
  ferry_swap *s = r->s;
  io_slot *slots = b->slots;
  int op = a->op, rc;
  memset(t, 0, sizeof *t);
  r->op = 1;
  if (a->mixed) { /* an untimed write of every block, then the mixed pass */
    if ((rc = run_pass(r, slots))) return rc;
    mixed_order(b, a->nops, a->fl.read_share);
    r->ops = b->ops;
  } else if (a->o.overwrite) {
    if ((rc = run_pass(r, slots))) return rc;
    for (unsigned i = 0; i < b->nq; i++)
      b->wbuf[i][0] ^= 0x5A, b->wbuf[i][r->bs - 1] ^= 0xA5;
  }
  if (op == 1) ferry_swap_get_stats(s, &t->st0);
  double t0 = ferry_now(), c0 = cpu_seconds();
  rc = run_pass(r, slots);
  double t1 = ferry_now(), c1 = cpu_seconds();
  if (rc) return rc;
  r->ops = NULL;
  if (op == 1) t->secs = t1 - t0, t->cpu = c1 - c0, ferry_swap_get_stats(s, &t->st1);
  if (op == 0) {
    if (a->random) shuffle(b->order, a->nops);
    r->op = 0;
    ferry_swap_get_stats(s, &t->st0);
    t0 = ferry_now(), c0 = cpu_seconds();
    rc = run_pass(r, slots);
    t->secs = ferry_now() - t0, t->cpu = cpu_seconds() - c0;
    ferry_swap_get_stats(s, &t->st1);
  }
  return rc;
}

/* 3. validate: reads everything back and compares (after the timed pass,
 * so the timed read follows a write pass as fio's does after its layout).
 * Returns a status (r->err set), or FERRY_OK with *differs set when a
 * chunk read back differs (said on stderr). */
static int read_back(io_run *r, io_slot *slots, int *differs) {
  ferry_swap *s = r->s;
  uint32_t nops = r->nops;
  unsigned nq = r->qd;
  size_t bs = r->bs;
  int rc = FERRY_OK;
  r->op = 0;
  for (uint32_t i = 0; i < nops && !rc; i += nq) {
    unsigned n = nops - i < nq ? nops - i : nq;
    unsigned sub = 0;
    for (; sub < n && !rc; sub++)
      rc = ferry_swap_read(s, i + sub, r->rbuf[sub], bs, &slots[sub].req, NULL, NULL);
    if (rc) sub--;
    for (unsigned b = 0; b < sub; b++) {
      int st = ferry_swap_wait(&slots[b].req);
      if (!rc) rc = st;
      if (!rc && memcmp(r->rbuf[b], r->wbuf[(i + b) % nq], bs)) {
        fprintf(stderr, "ferry bench io: validation failed: chunk %u differs\n", i + b);
        *differs = 1;
        return FERRY_OK;
      }
    }
  }
  if (rc) snprintf(r->err, sizeof r->err, "%s", ferry_swap_last_error(s));
  return rc;
}

static void report(const io_args *a, const ferry_swap_info *info, const io_timing *t, double *lat,
                   double crc_gbs, int fixed, unsigned nsl) {
  const char *mode = a->o.mode;
  uint64_t size = a->size, bs = a->o.bs, qd = a->o.qd;
  int verify = a->fl.verify, pages = a->o.pages;
  double secs = t->secs, cpu = t->cpu;
  double p50, p99;
  bench_latency_us(lat, a->nops, &p50, &p99);
  double gbs = (double)size / secs / 1e9, iops = a->nops / secs,
         cpu_gb = cpu / ((double)size / 1e9);
  double ck_s = t->st1.read_check_seconds - t->st0.read_check_seconds;
  double ck_b = (double)(t->st1.read_check_bytes - t->st0.read_check_bytes);
  double check_gbs = ck_s > 0 ? ck_b / ck_s / 1e9 : 0, check_sgb = ck_s / ((double)size / 1e9);
  uint64_t calls = t->st1.submit_calls - t->st0.submit_calls;
  double per_submit = calls ? (double)(t->st1.ios - t->st0.ios) / (double)calls : 0;
  if (a->o.json) {
    json_out j;
    json_begin(&j, stdout);
    bench_io_json_head(&j, "io", mode, bs, qd, size, secs, p50, p99);
    json_num(&j, "cpu_s_per_gb", cpu_gb);
    json_num(&j, "crc_gb_per_s", crc_gbs);
    json_num(&j, "check_gb_per_s", check_gbs);
    json_num(&j, "check_s_per_gb", check_sgb);
    json_num(&j, "requests_per_submit", per_submit);
    json_bool(&j, "verify", verify);
    json_bool(&j, "o_direct", info->o_direct);
    json_bool(&j, "fixed_buffers", fixed);
    json_bool(&j, "sqpoll", a->fl.sqpoll);
    json_bool(&j, "hugepages", pages != BENCH_PAGES_4K);
    json_str(&j, "pages", bench_pages_name(pages));
    json_bool(&j, "overwrite", a->o.overwrite);
    json_uint(&j, "outstanding", nsl);
    json_uint(&j, "check_threads", a->fl.check_threads);
    if (a->mixed) json_num(&j, "read_share", a->fl.read_share);
    json_str(&j, "path", a->o.path);
    json_end(&j);
    return;
  }
  char sz[32];
  printf("io %s bs=%llu qd=%llu: %s in %.3f s = %.3f GB/s, %.0f IOPS, latency p50 %.0f us "
         "p99 %.0f us, CPU %.3f s/GB (%s, crc %s, %s %s-page buffers; CRC32C alone %.1f GB/s)\n",
         mode, (unsigned long long)bs, (unsigned long long)qd,
         ferry_format_size(size, sz, sizeof sz), secs, gbs, iops, p50, p99, cpu_gb,
         info->o_direct ? "O_DIRECT" : "buffered", verify ? "on" : "off",
         fixed ? "registered" : "plain", bench_pages_name(pages), crc_gbs);
  printf("  %.2f requests per io_uring submit call\n", per_submit);
  if (ck_s > 0)
    printf("  read checks: %.1f GB/s on the just-read data, %.3f s per GB read\n", check_gbs,
           check_sgb);
}

/* Fills the buffers, registers them, runs the passes, validates and
 * reports: 0, or 1 (said on stderr). r: mutex and condition initialized. */
static int measure(ferry_swap *s, const ferry_swap_info *info, io_bufs *b, io_run *r,
                   const io_args *a) {
  size_t bs = a->o.bs;
  unsigned nq = b->nq, nsl = b->nsl;
  fill_sources(b->wmem, nq, bs);
  double crc_gbs = crc_rate(b->wmem, nq * bs);
  int fixed = a->fl.fixed;
  if (fixed) {
    struct iovec iov[2] = {{b->wmem, nq * bs}, {b->rmem, nsl * bs}};
    if (ferry_swap_register_buffers(s, iov, 2) != FERRY_OK) {
      fprintf(stderr, "ferry bench io: note: %s; continuing unregistered\n",
              ferry_swap_last_error(s));
      fixed = 0;
    }
  }
  run_init(r, s, b, a);
  io_timing t;
  int differs = 0;
  int rc = timed_passes(r, b, a, &t);
  if (!rc) rc = read_back(r, b->slots, &differs);
  if (rc) {
    fprintf(stderr, "ferry bench io: %s: %s\n", ferry_strerror(rc),
            r->err[0] ? r->err : ferry_swap_last_error(s));
    return 1;
  }
  if (differs) return 1;
  report(a, info, &t, b->lat, crc_gbs, fixed, nsl);
  return 0;
}

int ferry_bench_io_main(int argc, char **argv) {
  io_args a;
  int ex = parse_args(&a, argc, argv);
  if (ex >= 0) return ex;
  ferry_swap *s = NULL;
  ferry_swap_info info;
  if (open_store(&a, &s, &info)) return 1;
  io_bufs b;
  io_run r;
  memset(&r, 0, sizeof r);
  pthread_mutex_init(&r.mu, NULL);
  pthread_cond_init(&r.cv, NULL);
  int status = bufs_alloc(&b, &a) || measure(s, &info, &b, &r, &a);
  ferry_swap_close(s);
  pthread_mutex_destroy(&r.mu);
  pthread_cond_destroy(&r.cv);
  bufs_free(&b);
  return status;
}
