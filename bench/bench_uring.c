/* bench/bench_uring.c — `ferry bench uring`: the io_uring floor. The
 * simplest loop that moves the same bytes as `ferry bench io` (one thread,
 * one ring, registered buffers and file, O_DIRECT, qd requests of bs bytes
 * in flight, a new one submitted for each completion, every submission of
 * a pass of the loop in one io_uring_enter): no swap engine, no CRC, no
 * completion thread. What it gets on a disk is what any io_uring program
 * gets there; the engine's cost is the gap between it and `bench io`, and
 * a gap between it and fio is fio's doing or the disk's, not the engine's.
 * Every block carries its index in its first and last 8 bytes; reads check
 * them, and a write pass is read back and checked before a figure is
 * printed.
 */
#include "bench/bench.h"
#include "format/json_writer.h"
#include "bench/io_common.h"
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  struct io_uring ring;
  int op; /* 0 read, 1 write */
  unsigned char *mem;
  size_t bs;
  unsigned qd;
  uint64_t nops;
  double *t_sub; /* per slot */
  double *lat;   /* per op */
  uint64_t gen;  /* ORed into every stamp: 0, or 1 << 63 on a second write pass */
  uint64_t *slot_op;
  char err[256];
} uring_run;

/* A block's stamp: its index, top bit set on an --overwrite's second pass. */
static void stamp(unsigned char *b, size_t bs, uint64_t i) {
  memcpy(b, &i, 8);
  memcpy(b + bs - 8, &i, 8);
}

static int stamp_ok(const unsigned char *b, size_t bs, uint64_t i) {
  uint64_t x, y;
  memcpy(&x, b, 8);
  memcpy(&y, b + bs - 8, 8);
  return x == i && y == i;
}

static void prep(uring_run *r, unsigned slot, uint64_t i) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring); /* qd entries: never full */
  unsigned char *b = r->mem + (size_t)slot * r->bs;
  if (r->op) {
    stamp(b, r->bs, i | r->gen);
    io_uring_prep_write_fixed(sqe, 0, b, (unsigned)r->bs, i * r->bs, 0);
  } else {
    io_uring_prep_read_fixed(sqe, 0, b, (unsigned)r->bs, i * r->bs, 0);
  }
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, slot);
  r->slot_op[slot] = i;
  r->t_sub[slot] = ferry_now();
}

/* One pass over the file; returns 0 or -1 with r->err set. */
static int pass(uring_run *r) {
  uint64_t next = 0, done = 0;
  for (unsigned s = 0; s < r->qd && next < r->nops; s++) prep(r, s, next++);
  while (done < r->nops) {
    int rc = io_uring_submit_and_wait(&r->ring, 1);
    if (rc < 0 && rc != -EINTR) {
      snprintf(r->err, sizeof r->err, "io_uring_submit_and_wait: %s", strerror(-rc));
      return -1;
    }
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&r->ring, head, cqe) {
      unsigned slot = (unsigned)io_uring_cqe_get_data64(cqe);
      uint64_t i = r->slot_op[slot];
      n++;
      if (cqe->res != (int)r->bs) {
        snprintf(r->err, sizeof r->err, "block %llu: %s", (unsigned long long)i,
                 cqe->res < 0 ? strerror(-cqe->res) : "short transfer (the floor does not resubmit)");
        io_uring_cq_advance(&r->ring, n);
        return -1;
      }
      if (!r->op && !stamp_ok(r->mem + (size_t)slot * r->bs, r->bs, i | r->gen)) {
        snprintf(r->err, sizeof r->err, "block %llu: read back wrong bytes", (unsigned long long)i);
        io_uring_cq_advance(&r->ring, n);
        return -1;
      }
      r->lat[i] = ferry_now() - r->t_sub[slot];
      done++;
      if (next < r->nops) prep(r, slot, next++);
    }
    io_uring_cq_advance(&r->ring, n);
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench uring --path DIR [--size 4G] [--bs 1M] [--qd 32]\n"
          "                         [--mode read|write] [--no-hugepages | --hugetlb]\n"
          "                         [--overwrite] [--json]\n"
          "The io_uring floor: one thread, one ring, registered buffers and file,\n"
          "O_DIRECT, qd requests of bs bytes in flight, a new one per completion,\n"
          "no CRC and no swap engine, on its own file in DIR (created with O_EXCL,\n"
          "fallocated, removed at exit). Times one sequential pass (read: after an\n"
          "untimed write pass) and checks every block's index stamp; a write pass\n"
          "is read back and checked before the figure is printed. --overwrite (write\n"
          "only) times a second write pass over the blocks an untimed first one wrote.\n"
          "Compare with `ferry bench io` (same options) to see the engine's cost,\n"
          "and with fio to see what neither program controls.\n"
          "JSON keys: bench (\"uring\"), mode, bs, qd, bytes, seconds, gb_per_s, iops,\n"
          "p50_us, p99_us, pages, overwrite, path.\n");
}

/* ---- the command -------------------------------------------------------------- */

/* Parses and checks the options: -1 to go on, or the exit code (0 after
 * --help, 2 bad usage). op: 0 read, 1 write. */
static int parse_args(bench_io_opts *o, int *op, int argc, char **argv) {
  int ex = bench_io_parse(o, argc, argv, "ferry bench uring", usage, NULL, NULL);
  if (ex >= 0) return ex;
  if (!strcmp(o->mode, "read"))
    *op = 0;
  else if (!strcmp(o->mode, "write"))
    *op = 1;
  else {
    fprintf(stderr, "ferry bench uring: --mode must be read or write, not '%s'\n", o->mode);
    return 2;
  }
  if (bench_io_check_geometry(o, "ferry bench uring", 4096, UINT64_MAX)) return 2; /* O_DIRECT */
  return -1;
}

/* The run's buffers, its file (created O_EXCL | O_DIRECT, removed at exit)
 * and its ring; torn down by rig_close. */
typedef struct {
  uring_run r;
  char file[4096];
  int fd, ring_ok, pages;
  size_t buflen;
  unsigned char *check; /* one block, for reading a write pass back */
} uring_rig;

/* Creates the file: -1 to go on, or the exit code (said on stderr). */
static int rig_file(uring_rig *g, const char *path) {
  int n = snprintf(g->file, sizeof g->file, "%s/ferry-uring-%ld.dat", path, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof g->file) {
    fprintf(stderr, "ferry bench uring: path too long: %s\n", path);
    return 2;
  }
  g->fd = open(g->file, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (g->fd < 0) {
    fprintf(stderr, "ferry bench uring: %s: %s\n", g->file, strerror(errno));
    return 1;
  }
  return -1;
}

/* Buffers, the file's blocks, incompressible contents and the ring with
 * the buffers and the file registered: 0, or 1 (said on stderr). */
static int rig_open(uring_rig *g, uint64_t size) {
  uring_run *r = &g->r;
  size_t bs = r->bs;
  int pages = g->pages;
  g->buflen = bench_pages_round(r->qd * bs, pages);
  r->mem = bench_pages_alloc(g->buflen, pages);
  r->t_sub = calloc(r->qd, sizeof *r->t_sub);
  r->slot_op = calloc(r->qd, sizeof *r->slot_op);
  r->lat = malloc(r->nops * sizeof *r->lat);
  g->check = bench_pages_alloc(bench_pages_round(bs, BENCH_PAGES_4K), BENCH_PAGES_4K);
  if (fallocate(g->fd, 0, 0, (off_t)size) != 0) {
    fprintf(stderr, "ferry bench uring: fallocate %s (%llu bytes): %s\n", g->file,
            (unsigned long long)size, strerror(errno));
    return 1;
  }
  if (!r->mem || !r->t_sub || !r->slot_op || !r->lat || !g->check) {
    fprintf(stderr, "ferry bench uring: out of memory for %u x %llu-byte %s buffers%s\n", r->qd,
            (unsigned long long)bs, bench_pages_name(pages),
            pages == BENCH_PAGES_HUGETLB
                ? " (reserve hugetlb pages: echo N > /proc/sys/vm/nr_hugepages)"
                : "");
    return 1;
  }
  unsigned long long x = 0x243F6A8885A308D3ull; /* incompressible contents */
  for (size_t i = 0; i + 8 <= g->buflen; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(r->mem + i, &x, 8);
  }
  int rc = io_uring_queue_init(r->qd, &r->ring, 0);
  if (rc < 0) {
    fprintf(stderr, "ferry bench uring: io_uring_queue_init(%u): %s\n", r->qd, strerror(-rc));
    return 1;
  }
  g->ring_ok = 1;
  struct iovec iov = {r->mem, g->buflen};
  if ((rc = io_uring_register_buffers(&r->ring, &iov, 1)) < 0 ||
      (rc = io_uring_register_files(&r->ring, &g->fd, 1)) < 0) {
    fprintf(stderr, "ferry bench uring: io_uring_register: %s (RLIMIT_MEMLOCK?)\n", strerror(-rc));
    return 1;
  }
  return 0;
}

static void rig_close(uring_rig *g) {
  uring_run *r = &g->r;
  if (g->ring_ok) io_uring_queue_exit(&r->ring);
  close(g->fd);
  unlink(g->file);
  bench_pages_free(r->mem, g->buflen, g->pages);
  bench_pages_free(g->check, bench_pages_round(r->bs, BENCH_PAGES_4K), BENCH_PAGES_4K);
  free(r->t_sub);
  free(r->slot_op);
  free(r->lat);
}

/* The timed pass (read: after an untimed write pass; --overwrite: after
 * an untimed first write), then a write pass read back and checked block
 * by block. 0 with *secs set, or -1 with g->r.err set. */
static int timed_pass(uring_rig *g, int op, int overwrite, double *secs) {
  uring_run *r = &g->r;
  size_t bs = r->bs;
  if (overwrite) {
    if (pass(r)) return -1;
    r->gen = 1ull << 63;
  }
  double t0 = ferry_now();
  if (pass(r)) return -1;
  *secs = ferry_now() - t0;
  if (!op) {
    r->op = 0;
    t0 = ferry_now();
    if (pass(r)) return -1;
    *secs = ferry_now() - t0;
    return 0;
  }
  for (uint64_t i = 0; i < r->nops; i++) { /* read the write pass back, block by block */
    ssize_t got = pread(g->fd, g->check, bs, (off_t)(i * bs));
    if (got != (ssize_t)bs || !stamp_ok(g->check, bs, i | r->gen)) {
      snprintf(r->err, sizeof r->err, "validation: block %llu %s", (unsigned long long)i,
               got < 0              ? strerror(errno)
               : got != (ssize_t)bs ? "short read"
                                    : "holds wrong bytes");
      return -1;
    }
  }
  return 0;
}

static void report(const bench_io_opts *o, uring_run *r, uint64_t size, double secs) {
  double p50, p99;
  bench_latency_us(r->lat, r->nops, &p50, &p99);
  double gbs = (double)size / secs / 1e9;
  if (o->json) {
    json_out j;
    json_begin(&j, stdout);
    bench_io_json_head(&j, "uring", o->mode, o->bs, o->qd, size, secs, p50, p99);
    json_str(&j, "pages", bench_pages_name(o->pages));
    json_bool(&j, "overwrite", o->overwrite);
    json_str(&j, "path", o->path);
    json_end(&j);
  } else {
    char a[32];
    printf("uring %s bs=%llu qd=%llu: %s in %.3f s = %.3f GB/s, %.0f IOPS, latency p50 %.0f us "
           "p99 %.0f us (floor: one thread, no CRC, %s-page buffers)\n",
           o->mode, (unsigned long long)o->bs, (unsigned long long)o->qd,
           ferry_format_size(size, a, sizeof a), secs, gbs, r->nops / secs, p50, p99,
           bench_pages_name(o->pages));
  }
}

int ferry_bench_uring_main(int argc, char **argv) {
  bench_io_opts o;
  int op;
  int ex = parse_args(&o, &op, argc, argv);
  if (ex >= 0) return ex;
  uring_rig g;
  memset(&g, 0, sizeof g);
  g.pages = o.pages;
  g.r.op = 1;
  g.r.bs = o.bs;
  g.r.qd = (unsigned)o.qd;
  g.r.nops = o.size / o.bs;
  uint64_t size = g.r.nops * o.bs;
  ex = rig_file(&g, o.path);
  if (ex >= 0) return ex;
  int status = 1;
  double secs = 0;
  if (rig_open(&g, size)) goto out;
  if (timed_pass(&g, op, o.overwrite, &secs)) {
    fprintf(stderr, "ferry bench uring: %s: %s\n", g.file, g.r.err);
    goto out;
  }
  report(&o, &g.r, size, secs);
  status = 0;
out:
  rig_close(&g);
  return status;
}
