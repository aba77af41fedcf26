/* tests/offload/test_missing_grad.c — params that get no gradient in a
 * step (ferry_param_no_grad). With optimizer.missing_grad = "skip" (the
 * default) such a param is left as it is: params, optimizer state and its
 * own step count, which its later bias corrections use, as torch.optim
 * does; with "zero" it is stepped with zero grads (DeepSpeed). Each run is
 * compared bit for bit with a reference that steps every param alone with
 * the public CPU optimizer and its own count: a whole group missing, part
 * of a group, host and device param homes, updates at ferry_step and
 * during backward. Checkpoints keep the per-param counts: saved after a
 * step that left params out, loaded into a fresh engine and trained on, the
 * weights are the uninterrupted run's bit for bit; a count above the
 * checkpoint's step or FERRY_STEP_MAX, or an index past its params, is
 * refused naming the manifest and the value (one name listed twice by the
 * load and by ferry_checkpoint_verify alike); the counts as version 4 wrote
 * them (in the manifest) resume the same; a manifest without the counts
 * (version 3) loads with every count at the checkpoint's step.
 */
#include "core/crc32c.h"
#include "format/manifest.h"
#include "tests/offload/ckpt_util.h"
#include "tests/offload/run_fixture.h"
#include "tests/test.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STEPS 6
/* 1: run_open registers a.b before a.w (a model whose code changed the
 * order: a checkpoint's counts go by name, as its tensors do) */
static int g_swap_order;

/* a.b (part of group 0) gets no grad in steps 2 and 3; b.w (all of group
 * 1) in steps 3 and 5. */
static int missing(int k, int step) {
  return (k == 1 && (step == 2 || step == 3)) || (k == 2 && (step == 3 || step == 5));
}

/* ---- the reference: each param alone, its own optimizer count ---------- */

typedef struct {
  float *w[NP], *m[NP], *v[NP];
  int64_t t[NP];
  ferry_optimizer *o;
} ref_model;

static ferry_optimizer_config ref_config(void) {
  ferry_optimizer_config oc = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  oc.lr = (float)0.01;
  oc.beta1 = (float)0.9;
  oc.beta2 = (float)0.999;
  oc.eps = (float)1e-8;
  oc.weight_decay = (float)0.1;
  oc.threads = 1;
  oc.bind = 0;
  return oc;
}

static void ref_init(ref_model *r) {
  memset(r, 0, sizeof *r);
  ferry_optimizer_config oc = ref_config();
  REQUIRE(ferry_optimizer_create(&oc, &r->o) == 0);
  for (int k = 0; k < NP; k++) {
    r->w[k] = calloc(sizeof(float), sizes[k]);
    r->m[k] = calloc(sizeof(float), sizes[k]);
    r->v[k] = calloc(sizeof(float), sizes[k]);
    REQUIRE(r->w[k] && r->m[k] && r->v[k]);
    for (size_t i = 0; i < sizes[k]; i++) r->w[k][i] = init_value(k, i);
  }
}

static void ref_copy(ref_model *dst, const ref_model *src) {
  ref_init(dst);
  for (int k = 0; k < NP; k++) {
    memcpy(dst->w[k], src->w[k], sizes[k] * sizeof(float));
    memcpy(dst->m[k], src->m[k], sizes[k] * sizeof(float));
    memcpy(dst->v[k], src->v[k], sizes[k] * sizeof(float));
    dst->t[k] = src->t[k];
  }
}

static void ref_free(ref_model *r) {
  for (int k = 0; k < NP; k++) free(r->w[k]), free(r->m[k]), free(r->v[k]);
  ferry_optimizer_destroy(r->o);
}

static void ref_step(ref_model *r, int step, int zero) {
  for (int k = 0; k < NP; k++) {
    int none = missing(k, step);
    if (none && !zero) continue;
    float *g = calloc(sizeof(float), sizes[k]);
    REQUIRE(g);
    for (size_t i = 0; i < sizes[k] && !none; i++) g[i] = grad_value(k, step, i);
    ferry_optim_span sp;
    memset(&sp, 0, sizeof sp);
    sp.param = r->w[k];
    sp.grad = g;
    sp.state1 = r->m[k];
    sp.state2 = r->v[k];
    sp.n = sizes[k];
    sp.grad_dtype = FERRY_DT_F32;
    sp.copy_dtype = FERRY_DT_NONE;
    REQUIRE(ferry_optimizer_set_step(r->o, r->t[k]) == 0);
    REQUIRE(ferry_optimizer_step(r->o, &sp, 1, 1.0f) == 0);
    r->t[k]++;
    free(g);
  }
}

/* ---- the engine ----------------------------------------------------------- */

static void run_open(run_t *R, const char *mode, int eager, const char *params_home) {
  char text[1024];
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"8K\";\n"
           "step_during_backward = %s;\n"
           "tiers: { gpu: { budget = \"1M\"; }; host: { budget = \"16M\"; pinned = false; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; weight_decay = 0.1; threads = 1; "
           "missing_grad = \"%s\"; };\n"
           "precision: { params = \"fp32\"; };\n"
           "placement: { params = \"%s\"; optimizer = \"host\"; };\n",
           eager ? "true" : "false", mode, params_home);
  run_engine(R, text, g_swap_order);
}

/* One step's backward (groups in reverse) with each param's grads, or
 * ferry_param_no_grad for a missing one (its buffer stays zero); then
 * ferry_step. */
static void run_step(run_t *R, int step) {
  for (int g = 1; g >= 0; g--) {
    REQUIRE(ferry_fetch(R->e, g, R->s) == 0);
    for (int k = 0; k < NP; k++) {
      if (group_of[k] != g) continue;
      void *gw = NULL;
      REQUIRE(ferry_param_device(R->e, names[k], NULL, &gw) == 0);
      REQUIRE(ferry_stream_synchronize(R->s) == 0); /* the buffer's zeroing */
      if (missing(k, step)) {
        EXPECT_EQ_INT(ferry_param_no_grad(R->e, names[k]), 0);
        continue;
      }
      for (size_t i = 0; i < sizes[k]; i++) ((float *)gw)[i] = grad_value(k, step, i);
    }
    REQUIRE(ferry_grads_ready(R->e, g, R->s) == 0);
    REQUIRE(ferry_release(R->e, g, R->s) == 0);
  }
  ferry_step_info info;
  int rc = ferry_step(R->e, &info);
  if (rc) fprintf(stderr, "step: %s\n", ferry_engine_last_error(R->e));
  REQUIRE(rc == 0);
  EXPECT(info.step == step);
}

/* Every param's master equals the reference's, bit for bit. */
static int same_as(run_t *R, const ref_model *r, const char *what, int step) {
  int ok = 1;
  for (int k = 0; k < NP; k++) {
    float *w = malloc(sizes[k] * sizeof(float));
    REQUIRE(w && ferry_param_read(R->e, names[k], w, sizes[k]) == 0);
    if (memcmp(w, r->w[k], sizes[k] * sizeof(float))) {
      fprintf(stderr, "%s, step %d: %s differs from the reference (%.9g vs %.9g)\n", what, step,
                     names[k], (double)w[0], (double)r->w[k][0]);
      ok = 0;
    }
    free(w);
  }
  return ok;
}

static void check_mode(const char *mode, int eager, const char *home) {
  char what[128];
  snprintf(what, sizeof what, "missing_grad %s, eager %d, params %s", mode, eager, home);
  printf("-- %s\n", what);
  int zero = !strcmp(mode, "zero");
  run_t R;
  run_open(&R, mode, eager, home);
  ref_model r;
  ref_init(&r);
  float *before = malloc(sizes[1] * sizeof(float));
  REQUIRE(before);
  for (int step = 1; step <= STEPS; step++) {
    REQUIRE(ferry_param_read(R.e, names[1], before, sizes[1]) == 0);
    run_step(&R, step);
    ref_step(&r, step, zero);
    EXPECT(same_as(&R, &r, what, step));
    float *after = malloc(sizes[1] * sizeof(float));
    REQUIRE(after && ferry_param_read(R.e, names[1], after, sizes[1]) == 0);
    /* skip: a.b stays put where it had no grad; zero: weight decay and
     * momentum move it */
    if (missing(1, step)) EXPECT((memcmp(before, after, sizes[1] * sizeof(float)) == 0) == !zero);
    free(after);
  }
  free(before);
  ref_free(&r);
  run_close(&R);
}

/* ---- checkpoints ------------------------------------------------------- */

/* The saved manifest (good, glen bytes) and its file of counts (gsteps,
 * gslen bytes). */
static char good[8192], gsteps[1024];
static size_t glen, gslen;

static void put_file(const char *folder, const char *name, const char *text, size_t len) {
  char p[1400];
  snprintf(p, sizeof p, "%s/%s", folder, name);
  FILE *f = fopen(p, "wb");
  REQUIRE(f && fwrite(text, 1, len, f) == len && fclose(f) == 0);
}

static size_t get_file(const char *folder, const char *name, char *buf, size_t cap) {
  char p[1400];
  snprintf(p, sizeof p, "%s/%s", folder, name);
  FILE *f = fopen(p, "rb");
  REQUIRE(f);
  size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = 0;
  return n;
}

/* The saved manifest and counts with one change, written over them (the
 * manifest's line for the counts' file follows; no counts: no file). */
static void rewrite_manifest(const char *folder, void (*change)(ckpt_manifest *, int64_t),
                             int64_t arg) {
  ckpt_manifest m;
  char why[256], *text;
  size_t len;
  REQUIRE(ckpt_manifest_parse(good, glen, 1, &m, why, sizeof why) == 0);
  REQUIRE(ckpt_param_steps_parse(gsteps, gslen, &m, why, sizeof why) == 0);
  change(&m, arg);
  REQUIRE(ckpt_param_steps_format(&m, &text, &len) == 0);
  put_file(folder, CKPT_STEPS_NAME, text, len);
  size_t k = 0;
  while (k < m.nfiles && strcmp(m.files[k].path, CKPT_STEPS_NAME)) k++;
  REQUIRE(k < m.nfiles);
  m.files[k].bytes = len;
  m.files[k].crc = ferry_crc32c(0, text, len);
  free(text);
  if (!m.steps_listed) /* the counts dropped */
    memmove(&m.files[k], &m.files[k + 1], (--m.nfiles - k) * sizeof *m.files);
  REQUIRE(ckpt_manifest_format(&m, &text, &len) == 0);
  ckpt_manifest_free(&m);
  put_file(folder, "manifest", text, len);
  free(text);
}

/* The saved checkpoint as version 4 writes it: the count lines in the
 * manifest after "param_steps", no file of them. */
static void write_v4(const char *folder) {
  static char v4[8192];
  const char *at = strstr(good, "\nparam_steps ");
  const char *fl = strstr(good, "\nfile " CKPT_STEPS_NAME " ");
  const char *files = strstr(good, "\nfiles ");
  REQUIRE(at && fl && files);
  at = strchr(at + 1, '\n') + 1; /* after the param_steps line */
  const char *fl_end = strchr(fl + 1, '\n');
  int nfiles = atoi(files + 7);
  size_t n = (size_t)snprintf(v4, sizeof v4, "ferry-checkpoint 4\n%.*s%d%.*s%.*s%.*s",
                              (int)(files + 7 - (good + 19)), good + 19, nfiles - 1,
                              (int)(fl + 1 - strchr(files + 1, '\n')), strchr(files + 1, '\n'),
                              (int)(at - fl_end - 1), fl_end + 1, (int)gslen, gsteps);
  n += (size_t)snprintf(v4 + n, sizeof v4 - n, "crc32c %08x\n", ferry_crc32c(0, v4, n));
  put_file(folder, "manifest", v4, n);
}

static void set_count(ckpt_manifest *m, int64_t v) { m->steps[0].steps = v; }
static void set_index(ckpt_manifest *m, int64_t v) { m->steps[m->nsteps - 1].index = (uint64_t)v; }
static void set_name(ckpt_manifest *m, int64_t v) {
  (void)v;
  m->steps[0].name = "no.such";
}
static void dup_name(ckpt_manifest *m, int64_t v) {
  (void)v;
  m->steps[1].name = m->steps[0].name; /* a.b twice, b.w's line gone */
}
static void drop_counts(ckpt_manifest *m, int64_t v) {
  (void)v;
  m->nsteps = 0;
  m->steps_listed = 0;
}

/* A fresh engine refuses the checkpoint at folder, its message naming the
 * manifest and `value`. */
static void expect_refused(const char *folder, const char *value) {
  run_t C;
  run_open(&C, "skip", 0, "host");
  int rc = ferry_checkpoint_load(C.e, folder, NULL, 0, NULL);
  const char *msg = ferry_engine_last_error(C.e);
  printf("refused: %s\n", msg);
  EXPECT_EQ_INT(rc, FERRY_ECORRUPT);
  EXPECT(strstr(msg, "manifest") != NULL && strstr(msg, value) != NULL);
  run_close(&C);
}

/* A fresh engine (registering a.b before a.w with swap) loads folder and
 * trains steps 4 to STEPS: the weights equal r's bit for bit. */
static void expect_resumes(const char *folder, int swap, const ref_model *r, const char *what) {
  g_swap_order = swap;
  run_t B;
  run_open(&B, "skip", 0, "host");
  int rc = ferry_checkpoint_load(B.e, folder, NULL, 0, NULL);
  if (rc) fprintf(stderr, "load (%s): %s\n", what, ferry_engine_last_error(B.e));
  REQUIRE(rc == 0);
  for (int step = 4; step <= STEPS; step++) run_step(&B, step);
  EXPECT(same_as(&B, r, what, STEPS));
  run_close(&B);
  g_swap_order = 0;
}

static void check_checkpoint(const char *scratch) {
  printf("-- checkpoint after a step that left params out\n");
  char dir[1024], folder[1300];
  snprintf(dir, sizeof dir, "%s/missing-grad", scratch);
  mkdir(scratch, 0755);
  ck_rm(dir); /* a run before this one */
  mkdir(dir, 0755);
  snprintf(folder, sizeof folder, "%s/step-%012d", dir, 3);
  run_t A;
  run_open(&A, "skip", 0, "host");
  ref_model r, r3;
  ref_init(&r);
  for (int step = 1; step <= 3; step++) run_step(&A, step), ref_step(&r, step, 0);
  ferry_checkpoint_options opt = ferry_checkpoint_options_default();
  opt.keep = 0;
  int rc = ferry_checkpoint_save(A.e, dir, NULL, 0, &opt);
  if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(A.e));
  REQUIRE(rc == 0);
  ref_copy(&r3, &r);
  for (int step = 4; step <= STEPS; step++) run_step(&A, step), ref_step(&r, step, 0);
  EXPECT(same_as(&A, &r, "uninterrupted", STEPS));

  /* a.b has made 1 step, b.w 2, of the checkpoint's 3 */
  char mp[1400];
  snprintf(mp, sizeof mp, "%s/manifest", folder);
  glen = get_file(folder, "manifest", good, sizeof good);
  gslen = get_file(folder, CKPT_STEPS_NAME, gsteps, sizeof gsteps);
  EXPECT(strncmp(good, "ferry-checkpoint 5\n", 19) == 0);
  EXPECT(strstr(good, "\nparam_steps 2\ncrc32c ") != NULL);
  EXPECT(strcmp(gsteps, "param_step 1 1 a.b\nparam_step 2 2 b.w\n") == 0);

  /* resumed, and resumed by an engine that registers a.b before a.w (the
   * counts follow the names; by index a.w would get a.b's count) */
  for (int swap = 0; swap <= 1; swap++)
    expect_resumes(folder, swap, &r, swap ? "resumed, registered in another order" : "resumed");
  run_close(&A);

  /* counts a file may not claim */
  rewrite_manifest(folder, set_count, 4); /* above the checkpoint's step 3 */
  expect_refused(folder, "step count 4");
  rewrite_manifest(folder, set_count, FERRY_STEP_MAX + 1);
  expect_refused(folder, "9007199254740993");
  rewrite_manifest(folder, set_index, NP); /* past the params */
  expect_refused(folder, "param_step index 3");
  rewrite_manifest(folder, set_name, 0); /* a param the engine does not have */
  expect_refused(folder, "names 'no.such'");
  rewrite_manifest(folder, dup_name, 0); /* one param's count twice */
  expect_refused(folder, "names 'a.b' a second time");
  /* and `ferry checkpoint verify`, which has no engine: the same rule */
  rc = ferry_checkpoint_verify(folder, NULL);
  printf("verify refused: %s\n", ferry_last_error());
  EXPECT_EQ_INT(rc, FERRY_ECORRUPT);
  EXPECT(strstr(ferry_last_error(), "/param_steps line 2: ") != NULL &&
         strstr(ferry_last_error(), "names 'a.b' a second time (line 1 names it first)") != NULL);

  /* version 4: the counts in the manifest itself */
  write_v4(folder);
  char head[20] = "";
  FILE *f = fopen(mp, "rb");
  REQUIRE(f && fread(head, 1, 19, f) == 19);
  fclose(f);
  EXPECT(strncmp(head, "ferry-checkpoint 4\n", 19) == 0);
  expect_resumes(folder, 0, &r, "version 4");

  /* version 3 (no counts): every param's count is the checkpoint's step */
  rewrite_manifest(folder, drop_counts, 0);
  f = fopen(mp, "rb");
  REQUIRE(f && fread(head, 1, 19, f) == 19);
  fclose(f);
  EXPECT(strncmp(head, "ferry-checkpoint 3\n", 19) == 0);
  for (int k = 0; k < NP; k++) r3.t[k] = 3;
  run_t C;
  run_open(&C, "skip", 0, "host");
  rc = ferry_checkpoint_load(C.e, folder, NULL, 0, NULL);
  if (rc) fprintf(stderr, "load v3: %s\n", ferry_engine_last_error(C.e));
  REQUIRE(rc == 0);
  run_step(&C, 4);
  ref_step(&r3, 4, 0);
  EXPECT(same_as(&C, &r3, "version 3", 4));
  run_close(&C);
  ref_free(&r);
  ref_free(&r3);
}

/* A mark of a micro-batch that ferry_zero_grads discarded (backward threw
 * after ferry_param_no_grad, the user zeroed the grads and ran it again)
 * does not carry over: the redone micro-batch's gradient is taken. */
static void check_discarded_mark(void) {
  printf("-- a no-grad mark discarded by ferry_zero_grads\n");
  run_t A;
  run_open(&A, "skip", 0, "host");
  ref_model r;
  ref_init(&r);
  EXPECT_EQ_INT(ferry_param_no_grad(A.e, "a.b"), 0);
  EXPECT_EQ_INT(ferry_zero_grads(A.e), 0);
  for (int step = 1; step <= STEPS; step++) run_step(&A, step), ref_step(&r, step, 0);
  EXPECT(same_as(&A, &r, "after a discarded mark", STEPS));
  run_close(&A);
  ref_free(&r);
}

int main(int argc, char **argv) {
  static const char *modes[] = {"skip", "zero"};
  for (int m = 0; m < 2; m++)
    for (int eager = 0; eager < 2; eager++) {
      check_mode(modes[m], eager, "host");
      check_mode(modes[m], eager, "gpu");
    }
  check_checkpoint(argc > 1 ? argv[1] : "missing-grad-scratch");
  check_discarded_mark();
  return test_finish("offload.missing_grad");
}
