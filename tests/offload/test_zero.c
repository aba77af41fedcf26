/* tests/offload/test_zero.c — ZeRO data parallelism in the engine, under
 * `mpirun -np 2` (host backend). Each rank feeds synthetic grads of its own
 * (deterministic, rank-dependent, multiples of 2^-10 so that every sum the
 * ranks or the micro-batches make is exact) to an engine with the
 * communicator, and the same configuration without it, fed the average of
 * both ranks' grads, is the reference: the params (ferry_param_read, a
 * collective, and the params as the loop sees them) must match bit for bit
 * after every run. Stages 0, 1, 2 x placements (host; optimizer on NVMe;
 * params, grads and optimizer on NVMe), with grad_accumulation 2 and
 * clipping (the global norm), fp16 dynamic scaling with an inf on one rank
 * only (both ranks skip), int8 states, a bf16 master with bf16 grads; the
 * optimizer family's peak bytes per rank at most 0.55 of one rank's. Then
 * the refusals: ranks that disagree on optimizer.lr both fail naming it;
 * dist.zero_stage = 3, placement.grads = "none", set_comm after finalize,
 * ferry_param_no_grad with optimizer.missing_grad = skip, a checkpoint of a
 * sharded engine.
 * argv[1]: a scratch folder (each rank's NVMe store under it).
 */
#include "ferry.h"
#include "core/core.h"
#include "core/dtype.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define STEPS  4
#define NRANKS 2

static int rank;
static const char *scratch;
static int quick; /* argv[2] "quick" (sanitizer builds): fewer combinations */

/* The model: three groups; group 2 is smaller than a piece's alignment, so
 * one rank has nothing of it. */
static const struct {
  const char *name;
  int64_t shape[2];
  int ndim, group;
} model[] = {
    {"a", {12000, 0}, 1, 0}, {"b", {80, 100}, 2, 0}, {"c", {24000, 0}, 1, 1}, {"d", {40, 0}, 1, 2}};
#define NPARAMS (int)(sizeof model / sizeof model[0])
#define NGROUPS 3
#define MAXN    24000

static size_t param_n(int i) {
  return (size_t)model[i].shape[0] * (model[i].ndim > 1 ? (size_t)model[i].shape[1] : 1);
}

static int init_fn(void *user, const char *name, float *dst, size_t n) {
  (void)user;
  for (size_t i = 0; i < n; i++)
    dst[i] = 0.1f * sinf(0.37f * (float)i + (float)name[0]);
  return 0;
}

/* Rank r's grad of element i of param p at (step, micro): k * 2^-10, k in
 * [-100, 100]. */
static float grad_of(int r, int step, int micro, int p, size_t i) {
  uint64_t x = ((uint64_t)r * 1000003u + (uint64_t)step * 7919u + (uint64_t)micro * 104729u +
                (uint64_t)p * 15485863u) ^
               (i * 2654435761u);
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  x ^= x >> 11;
  return (float)((int)(x % 201) - 100) * (1.0f / 1024.0f);
}

typedef struct {
  const char *name;
  const char *sets; /* key=value,... on top of the base */
  int fp16_inf;     /* rank 1 feeds an inf at step 1 */
  int check_memory; /* the optimizer family's peak bytes per rank */
} variant;

static const variant variants[] = {
    {"host", "", 0, 1},
    {"optimizer on nvme", "placement.optimizer=nvme", 0, 1},
    {"params, grads, optimizer on nvme",
     "placement.params=nvme,placement.grads=nvme,placement.optimizer=nvme", 0, 0},
    {"grad_accumulation 2, clipping", "grad_accumulation=2,clip_grad_norm=0.05", 0, 0},
    {"fp16 dynamic scaling, inf on rank 1", "precision.params=fp16,precision.initial_scale=1024", 1,
     0},
    {"int8 states", "optimizer.state_dtype=int8", 0, 0},
    {"bf16 master, bf16 grads on nvme, grad_accumulation 2",
     "precision.master=bf16,precision.grads=bf16,placement.grads=nvme,placement.optimizer=nvme,"
     "grad_accumulation=2",
     0, 0},
};
#define NVARIANTS (int)(sizeof variants / sizeof variants[0])

static const char *base_cfg =
    "device = \"host\";\n"
    "tiers: { gpu: { budget = \"16M\"; }; host: { budget = \"32M\"; }; };\n"
    "placement: { params = \"host\"; grads = \"host\"; optimizer = "
    "\"host\"; };\n"
    "optimizer: { type = \"adamw\"; lr = 0.01; };\n";

/* An engine of the variant at `stage`, with comm (NULL: the reference);
 * finalize's status in *frc (the engine is returned either way). */
static ferry_engine *make(const variant *v, int stage, ferry_comm *comm, const char *extra,
                          int *frc) {
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  REQUIRE(ferry_config_load_string(c, base_cfg, "zero.cfg") == 0);
  char sets[512], *save = NULL;
  snprintf(sets, sizeof sets, "%s%s%s", v->sets, extra && *v->sets ? "," : "", extra ? extra : "");
  for (char *kv = strtok_r(sets, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    REQUIRE(eq);
    *eq = 0;
    int rc = ferry_config_set(c, kv, eq + 1);
    if (rc) fprintf(stderr, "set %s: %s\n", kv, ferry_config_last_error(c));
    REQUIRE(rc == 0);
  }
  char v_stage[8], dir[1200];
  snprintf(v_stage, sizeof v_stage, "%d", stage);
  REQUIRE(ferry_config_set(c, "dist.zero_stage", v_stage) == 0);
  /* each rank's own swap folder, and the reference's (a per-rank key) */
  snprintf(dir, sizeof dir, "%.1000s/rank%d-%s", scratch, rank, comm ? "dist" : "ref");
  mkdir(dir, 0777);
  REQUIRE(ferry_config_set(c, "tiers.nvme.paths", dir) == 0);
  ferry_engine *e = NULL;
  int rc = ferry_engine_create(c, NULL, &e);
  if (rc) fprintf(stderr, "create: %s\n", ferry_last_error());
  REQUIRE(rc == 0);
  ferry_config_destroy(c);
  for (int i = 0; i < NPARAMS; i++)
    REQUIRE(ferry_param_register(e, model[i].name, model[i].shape, model[i].ndim, model[i].group,
                                 NULL, init_fn, NULL) == 0);
  if (comm) REQUIRE(ferry_engine_set_comm(e, comm) == 0);
  *frc = ferry_engine_finalize(e);
  return e;
}

/* One step of the loop: fetch every group, then "backward" in reverse with
 * the grads of (step, micro) per micro-batch; avg: both ranks' average. */
static int run_step(ferry_engine *e, ferry_stream *s, const variant *v, int step, int avg, int ga,
                    ferry_step_info *info) {
  static uint16_t h16[MAXN];
  static float h32[MAXN];
  ferry_device *dev = ferry_engine_device(e);
  (void)dev;
  int fp16 = strstr(v->sets, "fp16") != NULL;
  for (int micro = 0; micro < ga; micro++) {
    for (int g = 0; g < NGROUPS; g++) /* "forward" */
      if (ferry_fetch(e, g, s) || ferry_release(e, g, s)) return 1;
    for (int g = NGROUPS - 1; g >= 0; g--) {
      if (ferry_fetch(e, g, s)) return 1;
      for (int p = 0; p < NPARAMS; p++) {
        if (model[p].group != g) continue;
        void *grad;
        if (ferry_param_device(e, model[p].name, NULL, &grad)) return 1;
        size_t n = param_n(p);
        for (size_t i = 0; i < n; i++) {
          float x = avg ? (grad_of(0, step, micro, p, i) + grad_of(1, step, micro, p, i)) * 0.5f
                        : grad_of(rank, step, micro, p, i);
          if (v->fp16_inf && step == 1 && p == 2 && i == 5 && (avg || rank == 1)) x = INFINITY;
          h32[i] = x;
        }
        const void *src = h32;
        size_t es = 4;
        if (!strstr(v->sets, "precision.params")) { /* bf16 (the default) */
          for (size_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &h32[i], 4);
            h16[i] = (uint16_t)(b >> 16); /* exact: the values fit bf16 */
          }
          src = h16;
          es = 2;
        } else if (fp16) {
          for (size_t i = 0; i < n; i++)
            h16[i] = ferry_f32_to_f16(h32[i]);
          src = h16;
          es = 2;
        }
        if (ferry_memcpy_async(s, grad, src, n * es, FERRY_COPY_H2D)) return 1;
        if (ferry_stream_synchronize(s)) return 1;
      }
      if (ferry_grads_ready(e, g, s) || ferry_release(e, g, s)) return 1;
    }
  }
  return ferry_step(e, info);
}

/* Every param's fp32 values (param_read) and param-dtype bytes. */
static void read_all(ferry_engine *e, ferry_stream *s, float *vals, unsigned char *bytes) {
  size_t at = 0, bat = 0;
  for (int p = 0; p < NPARAMS; p++) {
    size_t n = param_n(p);
    int rc = ferry_param_read(e, model[p].name, vals + at, n);
    if (rc) fprintf(stderr, "param read: %s\n", ferry_engine_last_error(e));
    REQUIRE(rc == 0);
    at += n;
  }
  for (int g = 0; g < NGROUPS; g++) {
    REQUIRE(ferry_fetch(e, g, s) == 0);
    for (int p = 0; p < NPARAMS; p++) {
      if (model[p].group != g) continue;
      void *d;
      REQUIRE(ferry_param_device(e, model[p].name, &d, NULL) == 0);
      size_t b = param_n(p) * 4; /* at most fp32 */
      REQUIRE(ferry_memcpy_async(s, bytes + bat, d, b / 2, FERRY_COPY_D2H) == 0);
      bat += b;
    }
    REQUIRE(ferry_stream_synchronize(s) == 0);
    REQUIRE(ferry_release(e, g, s) == 0);
  }
}

#define NTOTAL (12000 + 8000 + 24000 + 40)

static int run_case(const variant *v, int stage, ferry_comm *comm) {
  static float dv[NTOTAL], rv[NTOTAL];
  static unsigned char db[NTOTAL * 4], rb[NTOTAL * 4];
  int ga = strstr(v->sets, "grad_accumulation=2") ? 2 : 1;
  int frc;
  ferry_engine *d = make(v, stage, comm, NULL, &frc);
  if (frc) fprintf(stderr, "finalize (dist) %d: %s\n", frc, ferry_engine_last_error(d));
  REQUIRE(frc == 0);
  ferry_engine *r = make(v, stage, NULL, NULL, &frc);
  if (frc) fprintf(stderr, "finalize (ref): %s\n", ferry_engine_last_error(r));
  REQUIRE(frc == 0);
  ferry_stream *sd = NULL, *sr = NULL;
  REQUIRE(ferry_stream_create(ferry_engine_device(d), &sd) == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(r), &sr) == 0);
  int bad = 0, skipped_d = 0, skipped_r = 0;
  for (int step = 0; step < STEPS; step++) {
    ferry_step_info id, ir;
    int rc = run_step(d, sd, v, step, 0, ga, &id);
    if (rc) fprintf(stderr, "step %d (dist): %s\n", step, ferry_engine_last_error(d));
    REQUIRE(rc == 0);
    rc = run_step(r, sr, v, step, 1, ga, &ir);
    if (rc) fprintf(stderr, "step %d (ref): %s\n", step, ferry_engine_last_error(r));
    REQUIRE(rc == 0);
    skipped_d += id.skipped;
    skipped_r += ir.skipped;
    if (id.skipped != ir.skipped || id.clip_coef != ir.clip_coef || id.grad_norm != ir.grad_norm) {
      fprintf(stderr, "  step %d: skipped %d/%d clip %g/%g norm %.17g/%.17g\n", step, id.skipped,
              ir.skipped, id.clip_coef, ir.clip_coef, id.grad_norm, ir.grad_norm);
      bad++;
    }
  }
  if (v->fp16_inf) EXPECT(skipped_d == 1 && skipped_r == 1);
  read_all(d, sd, dv, db);
  read_all(r, sr, rv, rb);
  if (memcmp(dv, rv, sizeof dv)) {
    size_t i = 0;
    while (i < NTOTAL && !memcmp(&dv[i], &rv[i], 4))
      i++;
    fprintf(stderr, "  master/param_read differ first at %zu: %.9g vs %.9g\n", i, dv[i], rv[i]);
    bad++;
  }
  if (memcmp(db, rb, sizeof db)) {
    fprintf(stderr, "  params differ\n");
    bad++;
  }
  /* the params moved */
  float init[MAXN];
  init_fn(NULL, "c", init, MAXN);
  EXPECT(memcmp(init, dv + 20000, sizeof init) != 0);
  if (v->check_memory && stage >= 1) {
    ferry_stats a, b;
    REQUIRE(ferry_engine_get_stats(d, &a) == 0);
    REQUIRE(ferry_engine_get_stats(r, &b) == 0);
    int tier = strstr(v->sets, "optimizer=nvme") ? FERRY_TIER_NVME : FERRY_TIER_HOST;
    double ratio =
        (double)a.peak[tier][FERRY_FAMILY_OPTIM] / (double)b.peak[tier][FERRY_FAMILY_OPTIM];
    printf("  rank %d: optimizer family peak %.3f of one rank's\n", rank, ratio);
    EXPECT(ratio <= 0.55);
    EXPECT(a.comm_ops > 0 && a.comm_bytes > 0 && b.comm_ops == 0);
    if (stage == 3) { /* the params' home holds this rank's pieces too */
      int pt = strstr(v->sets, "params=nvme") ? FERRY_TIER_NVME : FERRY_TIER_HOST;
      double pr = (double)a.peak[pt][FERRY_FAMILY_PARAMS] / (double)b.peak[pt][FERRY_FAMILY_PARAMS];
      printf("  rank %d: params family peak %.3f of one rank's\n", rank, pr);
      EXPECT(pr <= 0.55);
    }
  }
  ferry_stream_destroy(sd);
  ferry_stream_destroy(sr);
  ferry_engine_destroy(d);
  ferry_engine_destroy(r);
  return bad;
}

/* Steps [from, to) of the variant; avg: the reference's grads. */
static void steps(ferry_engine *e, ferry_stream *s, const variant *v, int from, int to, int avg) {
  int ga = strstr(v->sets, "grad_accumulation=2") ? 2 : 1;
  for (int step = from; step < to; step++) {
    ferry_step_info info;
    int rc = run_step(e, s, v, step, avg, ga, &info);
    if (rc) fprintf(stderr, "step %d: %s\n", step, ferry_engine_last_error(e));
    REQUIRE(rc == 0);
  }
}

static ferry_engine *made(const variant *v, int stage, ferry_comm *comm, ferry_stream **s) {
  int frc;
  ferry_engine *e = make(v, stage, comm, NULL, &frc);
  if (frc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  REQUIRE(frc == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(e), s) == 0);
  return e;
}

static void done(ferry_engine *e, ferry_stream *s) {
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

static void load(ferry_engine *e, const char *dir) {
  int rc = ferry_checkpoint_load(e, dir, NULL, 0, NULL);
  if (rc) fprintf(stderr, "load %s: %s\n", dir, ferry_engine_last_error(e));
  REQUIRE(rc == 0);
}

/* A fresh engine (comm NULL: the reference, fed the averaged grads) loads
 * dir and runs steps 2.. : 1 when its params differ from want/wb. */
static int resumed(const variant *v, int stage, ferry_comm *comm, const char *dir,
                   const float *want, const unsigned char *wb, const char *what) {
  static float got[NTOTAL];
  static unsigned char gb[NTOTAL * 4];
  ferry_stream *s;
  ferry_engine *e = made(v, stage, comm, &s);
  load(e, dir);
  steps(e, s, v, 2, STEPS, comm == NULL);
  read_all(e, s, got, gb);
  done(e, s);
  int differ = memcmp(got, want, sizeof got) || memcmp(gb, wb, sizeof gb);
  if (differ) fprintf(stderr, "  rank %d: %s differs\n", rank, what);
  return differ;
}

/* Checkpoints of a sharded engine hold every tensor whole (one rank's
 * checkpoint): a save at step 2 and a load into a fresh engine go on
 * exactly on 2 ranks, on 1 rank (the reference, fed the averaged grads),
 * and a 1-rank checkpoint loads on 2 ranks. */
static int test_checkpoints(const variant *v, int stage, ferry_comm *comm) {
  static float want[NTOTAL];
  static unsigned char wb[NTOTAL * 4];
  char dd[1200], dr[1200];
  snprintf(dd, sizeof dd, "%.1000s/ckpt-dist-%d-%d", scratch, stage, (int)(v - variants));
  snprintf(dr, sizeof dr, "%.1000s/ckpt-ref-%d-%d", scratch, stage, (int)(v - variants));
  ferry_stream *sd, *sr;
  ferry_engine *d = made(v, stage, comm, &sd), *r = made(v, stage, NULL, &sr);
  steps(d, sd, v, 0, 2, 0);
  steps(r, sr, v, 0, 2, 1);
  int rc = ferry_checkpoint_save(d, dd, NULL, 0, NULL); /* a collective */
  if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(d));
  REQUIRE(rc == 0);
  if (rank == 0) REQUIRE(ferry_checkpoint_save(r, dr, NULL, 0, NULL) == 0);
  REQUIRE(ferry_comm_barrier(comm, NULL) == 0); /* rank 0's reference checkpoint is there */
  steps(d, sd, v, 2, STEPS, 0);
  read_all(d, sd, want, wb);
  done(d, sd);
  done(r, sr);
  /* 2 ranks -> 2 ranks, 2 ranks -> 1 rank, 1 rank -> 2 ranks */
  return resumed(v, stage, comm, dd, want, wb, "resumed on 2 ranks") +
         resumed(v, stage, NULL, dd, want, wb, "the 2-rank checkpoint on 1 rank") +
         resumed(v, stage, comm, dr, want, wb, "the 1-rank checkpoint on 2 ranks");
}

static long file_bytes(const char *path, unsigned char *buf, long cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  long n = (long)fread(buf, 1, (size_t)cap, f);
  fclose(f);
  return n;
}

/* Stage 3's export is a collective (rank 0 writes the params gathered
 * whole): the same file as the reference's export. */
static void test_export(ferry_comm *comm) {
  static unsigned char a[1 << 18], b[1 << 18];
  char xd[1200], xr[1200];
  snprintf(xd, sizeof xd, "%.1000s/export-dist.safetensors", scratch);
  snprintf(xr, sizeof xr, "%.1000s/export-ref.safetensors", scratch);
  ferry_stream *sd, *sr;
  ferry_engine *d = made(&variants[0], 3, comm, &sd), *r = made(&variants[0], 3, NULL, &sr);
  steps(d, sd, &variants[0], 0, 2, 0);
  steps(r, sr, &variants[0], 0, 2, 1);
  int rc = ferry_export_weights(d, xd, 0);
  if (rc) fprintf(stderr, "export: %s\n", ferry_engine_last_error(d));
  EXPECT(rc == 0);
  if (rank == 0) {
    EXPECT(ferry_export_weights(r, xr, 0) == 0);
    long na = file_bytes(xd, a, sizeof a), nb = file_bytes(xr, b, sizeof b);
    EXPECT(na > 2 * NTOTAL && na == nb && !memcmp(a, b, (size_t)na));
  }
  done(d, sd);
  done(r, sr);
}

/* Ranks that disagree on a key both fail at finalize, naming it. */
static void test_fingerprint(ferry_comm *comm) {
  int frc;
  ferry_engine *e = make(&variants[0], 2, comm, rank == 1 ? "optimizer.lr=0.002" : NULL, &frc);
  EXPECT(frc == FERRY_ECONFIG);
  const char *msg = ferry_engine_last_error(e);
  if (rank == 0) printf("  mismatch: %s\n", msg);
  EXPECT(strstr(msg, "ranks disagree on optimizer.lr") != NULL);
  EXPECT(strstr(msg, "rank 0 has 0.01") != NULL && strstr(msg, "rank 1 has 0.002") != NULL);
  ferry_engine_destroy(e);
}

static void test_refusals(ferry_comm *comm) {
  int frc, rc;
  ferry_engine *e = make(&variants[0], 3, comm, "placement.params=gpu", &frc);
  EXPECT(frc == FERRY_ECONFIG && strstr(ferry_engine_last_error(e), "dist.zero_stage = 3") &&
         strstr(ferry_engine_last_error(e), "placement.params"));
  ferry_engine_destroy(e);
  e = make(&variants[6], 3, comm, NULL, &frc);
  EXPECT(frc == FERRY_ECONFIG && strstr(ferry_engine_last_error(e), "precision.master"));
  ferry_engine_destroy(e);
  e = make(&variants[0], 2, comm, "placement.grads=none", &frc);
  EXPECT(frc == FERRY_ECONFIG && strstr(ferry_engine_last_error(e), "placement.grads"));
  ferry_engine_destroy(e);
  /* auto grads with updates during backward: accumulators with ranks */
  e = make(&variants[0], 2, comm, "placement.grads=auto", &frc);
  EXPECT(frc == 0);
  int none = 1;
  EXPECT(ferry_engine_grad_home(e, &none) == FERRY_TIER_HOST && none == 0);
  EXPECT(ferry_engine_set_comm(e, comm) == FERRY_ESTATE);
  /* a param left out of a step (optimizer.missing_grad = skip): not with ranks */
  EXPECT(ferry_param_no_grad(e, model[0].name) == FERRY_ENOTSUP &&
         strstr(ferry_engine_last_error(e), "optimizer.missing_grad") != NULL);
  /* a load that fails on one rank fails on both */
  char dir[1200];
  snprintf(dir, sizeof dir, "%.1000s/no-ckpt-%d", scratch, rank);
  if (rank == 0)
    snprintf(dir, sizeof dir, "%.1000s/ckpt-dist-1-0", scratch); /* made in quick too */
  rc = ferry_checkpoint_load(e, dir, NULL, 0, NULL);
  EXPECT(rc != 0);
  if (rank == 0) EXPECT(strstr(ferry_engine_last_error(e), "rank 1 failed") != NULL);
  ferry_engine_destroy(e);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--help")) {
    printf("usage: mpirun -np 2 test_zero SCRATCH [quick]\n"
           "ZeRO stages 0-2 of the engine against a reference engine fed the averaged grads\n");
    return 0;
  }
  if (argc < 2) {
    fprintf(stderr, "usage: test_zero SCRATCH (under mpirun -np 2)\n");
    return 2;
  }
  scratch = argv[1];
  quick = argc > 2 && !strcmp(argv[2], "quick");
  mkdir(scratch, 0777);
  ferry_comm *comm = eu_mpi_comm(NRANKS);
  rank = ferry_comm_rank(comm);
  int bad = 0;
  for (int stage = 0; stage <= 3; stage++)
    for (int v = 0; v < NVARIANTS; v++) {
      if (stage == 3 && strstr(variants[v].sets, "precision.master=bf16")) continue; /* refused */
      if (quick && stage < 2 && v != 0 && v != 2) continue;
      double t0 = ferry_now();
      int b = run_case(&variants[v], stage, comm);
      if (rank == 0 || b)
        printf("rank %d stage %d, %s: %s (%.2f s)\n", rank, stage, variants[v].name,
               b ? "DIFFERS" : "same", ferry_now() - t0);
      bad += b;
    }
  EXPECT(bad == 0);
  /* checkpoints: host and int8 states at stages 1 and 2, the optimizer on
   * NVMe at stage 2 */
  static const int ck[][2] = {{1, 0}, {2, 0}, {2, 5}, {1, 5}, {2, 1},
                              {2, 6}, {0, 0}, {3, 0}, {3, 5}, {3, 2}};
  for (size_t i = 0; i < sizeof ck / sizeof ck[0]; i++) {
    if (quick && i % 3) continue;
    int b = test_checkpoints(&variants[ck[i][1]], ck[i][0], comm);
    if (rank == 0 || b)
      printf("rank %d checkpoints, stage %d, %s: %s\n", rank, ck[i][0], variants[ck[i][1]].name,
             b ? "DIFFER" : "exact");
    EXPECT(b == 0);
  }
  test_export(comm);
  test_fingerprint(comm);
  test_refusals(comm);
  ferry_comm_destroy(comm);
  return test_finish("offload.zero");
}
