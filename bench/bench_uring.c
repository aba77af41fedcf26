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
#include "bench/json.h"
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

int ferry_bench_uring_main(int argc, char **argv) {
  bench_io_opts o;
  int ex = bench_io_parse(&o, argc, argv, "ferry bench uring", usage, NULL, NULL);
  if (ex >= 0) return ex;
  const char *path = o.path, *mode = o.mode;
  uint64_t size = o.size, bs = o.bs, qd = o.qd;
  int json = o.json, pages = o.pages;
  int op;
  if (!strcmp(mode, "read")) op = 0;
  else if (!strcmp(mode, "write")) op = 1;
  else {
    fprintf(stderr, "ferry bench uring: --mode must be read or write, not '%s'\n", mode);
    return 2;
  }
  if (bs < 4096 || bs % 4096 || bs > (1u << 30) || !qd || qd > 1024 || size < bs) {
    fprintf(stderr, "ferry bench uring: need bs a multiple of 4096 up to 1G (O_DIRECT), "
                    "0 < qd <= 1024, size >= bs\n");
    return 2;
  }
  uring_run r;
  memset(&r, 0, sizeof r);
  r.op = 1;
  r.bs = bs;
  r.qd = (unsigned)qd;
  r.nops = size / bs;
  size = r.nops * bs;

  char file[4096];
  int n = snprintf(file, sizeof file, "%s/ferry-uring-%ld.dat", path, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof file) {
    fprintf(stderr, "ferry bench uring: path too long: %s\n", path);
    return 2;
  }
  int fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    fprintf(stderr, "ferry bench uring: %s: %s\n", file, strerror(errno));
    return 1;
  }
  int status = 1, ring_ok = 0;
  size_t buflen = bench_pages_round(r.qd * bs, pages);
  r.mem = bench_pages_alloc(buflen, pages);
  r.t_sub = calloc(r.qd, sizeof *r.t_sub);
  r.slot_op = calloc(r.qd, sizeof *r.slot_op);
  r.lat = malloc(r.nops * sizeof *r.lat);
  unsigned char *check = bench_pages_alloc(bench_pages_round(bs, BENCH_PAGES_4K), BENCH_PAGES_4K);
  double secs = 0;
  if (fallocate(fd, 0, 0, (off_t)size) != 0) {
    fprintf(stderr, "ferry bench uring: fallocate %s (%llu bytes): %s\n", file,
            (unsigned long long)size, strerror(errno));
    goto out;
  }
  if (!r.mem || !r.t_sub || !r.slot_op || !r.lat || !check) {
    fprintf(stderr, "ferry bench uring: out of memory for %u x %llu-byte %s buffers%s\n", r.qd,
            (unsigned long long)bs, bench_pages_name(pages),
            pages == BENCH_PAGES_HUGETLB ? " (reserve hugetlb pages: echo N > /proc/sys/vm/nr_hugepages)" : "");
    goto out;
  }
  unsigned long long x = 0x243F6A8885A308D3ull; /* incompressible contents */
  for (size_t i = 0; i + 8 <= buflen; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(r.mem + i, &x, 8);
  }
  int rc = io_uring_queue_init(r.qd, &r.ring, 0);
  if (rc < 0) {
    fprintf(stderr, "ferry bench uring: io_uring_queue_init(%u): %s\n", r.qd, strerror(-rc));
    goto out;
  }
  ring_ok = 1;
  struct iovec iov = {r.mem, buflen};
  if ((rc = io_uring_register_buffers(&r.ring, &iov, 1)) < 0 ||
      (rc = io_uring_register_files(&r.ring, &fd, 1)) < 0) {
    fprintf(stderr, "ferry bench uring: io_uring_register: %s (RLIMIT_MEMLOCK?)\n", strerror(-rc));
    goto out;
  }
  if (o.overwrite) {
    if (pass(&r)) goto failed;
    r.gen = 1ull << 63;
  }
  double t0 = ferry_now();
  if (pass(&r)) goto failed;
  secs = ferry_now() - t0;
  if (!op) {
    r.op = 0;
    t0 = ferry_now();
    if (pass(&r)) goto failed;
    secs = ferry_now() - t0;
  } else { /* read the write pass back, block by block */
    for (uint64_t i = 0; i < r.nops; i++) {
      ssize_t got = pread(fd, check, bs, (off_t)(i * bs));
      if (got != (ssize_t)bs || !stamp_ok(check, bs, i | r.gen)) {
        snprintf(r.err, sizeof r.err, "validation: block %llu %s", (unsigned long long)i,
                 got < 0 ? strerror(errno) : got != (ssize_t)bs ? "short read" : "holds wrong bytes");
        goto failed;
      }
    }
  }
  {
    double p50, p99;
    bench_latency_us(r.lat, r.nops, &p50, &p99);
    double gbs = (double)size / secs / 1e9;
    if (json) {
      json_out j;
      json_begin(&j, stdout);
      bench_io_json_head(&j, "uring", mode, bs, qd, size, secs, p50, p99);
      json_str(&j, "pages", bench_pages_name(pages));
      json_bool(&j, "overwrite", o.overwrite);
      json_str(&j, "path", path);
      json_end(&j);
    } else {
      char a[32];
      printf("uring %s bs=%llu qd=%llu: %s in %.3f s = %.3f GB/s, %.0f IOPS, latency p50 %.0f us "
             "p99 %.0f us (floor: one thread, no CRC, %s-page buffers)\n",
             mode, (unsigned long long)bs, (unsigned long long)qd,
             ferry_format_size(size, a, sizeof a), secs, gbs, r.nops / secs, p50, p99,
             bench_pages_name(pages));
    }
  }
  status = 0;
  goto out;
failed:
  fprintf(stderr, "ferry bench uring: %s: %s\n", file, r.err);
out:
  if (ring_ok) io_uring_queue_exit(&r.ring);
  close(fd);
  unlink(file);
  bench_pages_free(r.mem, buflen, pages);
  bench_pages_free(check, bench_pages_round(bs, BENCH_PAGES_4K), BENCH_PAGES_4K);
  free(r.t_sub);
  free(r.slot_op);
  free(r.lat);
  return status;
}
