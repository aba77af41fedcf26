/* tests/offload/ckpt_util.h — what the checkpoint and fault tests share: an
 * engine on the synthetic model (bench/synth_model.h) from a placement and
 * a few key=value settings, one training step, the caller's blob, and
 * scratch-folder helpers.
 */
#ifndef FERRY_TESTS_CKPT_UTIL_H
#define FERRY_TESTS_CKPT_UTIL_H

#include "bench/synth_model.h"
#include "tests/test.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_G 8
#define CK_D 32
#define CK_B 8
#define CK_MAGIC 0x6b636b50u

/* The caller's blob: where the data loader is. */
typedef struct {
  uint32_t magic;
  int64_t next_step;
  uint64_t rng;
} ck_blob;

typedef struct {
  ferry_engine *e;
  ferry_device *dev; /* the caller's, or NULL */
  synth_model m;
  ferry_stream *s;
  synth_call *calls;
  int finalized;
} ck_run;

static char ck_scratch[1024];

static inline void ck_set_scratch(const char *dir) {
  snprintf(ck_scratch, sizeof ck_scratch, "%s", dir);
  mkdir(dir, 0777);
}

static inline int ck_rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st;
  (void)flag;
  (void)f;
  remove(p);
  return 0;
}
static inline void ck_rm(const char *path) { nftw(path, ck_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Entries of dir whose name starts with prefix. */
static inline int ck_count_entries(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (!strncmp(de->d_name, prefix, strlen(prefix)) && strcmp(de->d_name, ".") &&
        strcmp(de->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

/* A configuration: gpu budget, the placement text, and "key=value,..." sets
 * applied after it. */
static inline ferry_config *ck_config(const char *gpu, const char *placement, int dt,
                                      const char *sets) {
  char nvme[1200], text[4096];
  snprintf(nvme, sizeof nvme, "%s/nvme-%ld", ck_scratch, (long)getpid());
  mkdir(nvme, 0777);
  const char *prec = dt == FERRY_DT_F32 ? "fp32" : dt == FERRY_DT_F16 ? "fp16" : "bf16";
  snprintf(text, sizeof text,
           "device = \"host\";\nchunk_size = \"4K\";\n"
           "tiers: { gpu: { budget = \"%s\"; }; host: { budget = \"16M\"; pinned = false; };\n"
           "         nvme: { paths = [\"%s\"]; block_size = \"4K\"; queue_depth = 8; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; threads = 2; };\n"
           "precision: { params = \"%s\"; };\n%s\n",
           gpu, nvme, prec, placement);
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  int rc = ferry_config_load_string(c, text, "test.cfg");
  if (rc) fprintf(stderr, "config: %s\n", ferry_config_last_error(c));
  REQUIRE(rc == 0);
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", sets ? sets : "");
  for (char *kv = strtok(buf, ","); kv; kv = strtok(NULL, ",")) {
    char *eq = strchr(kv, '=');
    REQUIRE(eq);
    *eq = 0;
    rc = ferry_config_set(c, kv, eq + 1);
    if (rc) fprintf(stderr, "config set %s: %s\n", kv, ferry_config_last_error(c));
    REQUIRE(rc == 0);
  }
  return c;
}

/* Creates, registers and (when finalize) finalizes; groups x dim layers. */
static inline int ck_open_full(ck_run *r, const char *gpu, const char *placement, int dt,
                               const char *sets, int groups, int dim, ferry_device *dev,
                               int finalize) {
  memset(r, 0, sizeof *r);
  ferry_config *c = ck_config(gpu, placement, dt, sets);
  int rc = ferry_engine_create(c, dev, &r->e);
  ferry_config_destroy(c);
  if (rc) {
    fprintf(stderr, "engine create: %s\n", ferry_last_error());
    return rc;
  }
  r->dev = dev;
  REQUIRE(synth_init(&r->m, groups, dim, CK_B, dt) == 0);
  r->calls = calloc(2 * (size_t)groups, sizeof *r->calls);
  REQUIRE(r->calls);
  ferry_engine *e = r->e;
  rc = synth_register(e, &r->m);
  if (rc || !finalize) return rc;
  rc = ferry_engine_finalize(e);
  if (rc) return rc;
  r->finalized = 1;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &r->s) == 0);
  return 0;
}

static inline void ck_open_dims(ck_run *r, const char *gpu, const char *placement, int dt,
                                const char *sets, int groups, int dim) {
  int rc = ck_open_full(r, gpu, placement, dt, sets, groups, dim, NULL, 1);
  if (rc) fprintf(stderr, "engine: %s\n", r->e ? ferry_engine_last_error(r->e) : ferry_last_error());
  REQUIRE(rc == 0);
}

static inline void ck_open(ck_run *r, const char *gpu, const char *placement, int dt,
                           const char *sets) {
  ck_open_dims(r, gpu, placement, dt, sets, CK_G, CK_D);
}

static inline void ck_close(ck_run *r) {
  if (r->s) ferry_stream_destroy(r->s);
  ferry_engine_destroy(r->e);
  synth_free(&r->m);
  free(r->calls);
  memset(r, 0, sizeof *r);
}

/* One step on the batch of `seed`. */
/* The fp32 master weights of layers 0..groups-1 ("layer<g>.w", dim x dim
 * each) into out, layer after layer. */
static inline void ck_read_params(ck_run *r, int groups, int dim, float *out) {
  for (int g = 0; g < groups; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    REQUIRE(ferry_param_read(r->e, name, out + (size_t)g * dim * dim, (size_t)dim * dim) == 0);
  }
}

static inline int ck_step(ck_run *r, unsigned long long seed, double *loss) {
  synth_batch(&r->m, seed);
  int rc = synth_micro_batch(r->e, &r->m, r->s, r->calls);
  if (rc) return rc;
  *loss = r->m.loss;
  ferry_step_info info;
  return ferry_step(r->e, &info);
}

#endif
