/* tests/gpt/test_stream.c — the engine provider's stream mode on the host
 * backend, with the provider code the CUDA model runs on a GPU. A stand-in
 * model goes through the CUDA model's exact fetch/release sequence (tied
 * head, embedding grads open from the head to the end, checkpoint-free
 * blocks) and computes in "kernels" enqueued on the provider's stream
 * (ferry_launch_host_func): forward kernels read the params in the view's
 * dtype and record a checksum; backward kernels add fp32 grads computed from
 * those params into the view's grad slots. The same model on the same
 * engine config in sync mode (the CPU model's path, work done on this
 * thread) is the reference. Per step the test checks:
 *   - every forward kernel saw the params the sync run saw (nothing is read
 *     before its fetch completed on the stream);
 *   - after ferry_step the fp32 masters of every tensor equal the sync
 *     run's bit for bit (grads zeroed, converted and handed in in stream
 *     order; the grad slots reused only after their conversion);
 * for resident.cfg, offload-host.cfg and offload-nvme.cfg (bf16), fp16
 * (loss scaling), fp32 and 2 micro-batches, and llama-tiny with params at
 * home on the host and on NVMe. The stream is slowed down
 * (ferry_stream_sleep before each backward kernel) so the loop runs ahead
 * of it. argv[1]: examples/configs, argv[2]: a scratch directory.
 */
#include "gpt.h"

#include "ferry.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

enum { MAX_FETCHES = 256, STEPS = 3 };

/* One enqueued kernel: a group's tensors. */
typedef struct job {
  struct job *next;
  const void *w[GPT_MAX_SLOTS];
  float *g[GPT_MAX_SLOTS];
  size_t n[GPT_MAX_SLOTS];
  int nt, step, grads;
  ferry_dtype wdt;
  double *seen; /* forward: the checksum */
  unsigned char *model_mem; /* the model's part of the reserved block: scribbled on */
  size_t model_bytes;
} job;

typedef struct {
  const gpt_schema *s;
  gpt_provider p;
  ferry_stream *st; /* NULL: sync mode, kernels run on this thread */
  job *jobs;
  double seen[MAX_FETCHES];
  int nseen;
  void *model_mem;
  size_t model_bytes;
} fake_model;

static float wval(const void *w, ferry_dtype dt, size_t i) {
  if (dt == FERRY_DT_BF16) return gpt_bf16_to_f32(((const uint16_t *)w)[i]);
  if (dt == FERRY_DT_F16) return gpt_f16_to_f32(((const uint16_t *)w)[i]);
  return ((const float *)w)[i];
}

/* The kernel: a checksum of the params (forward), or grads from them. */
static int run_job(void *arg) {
  job *j = arg;
  double sum = 0;
  for (int t = 0; t < j->nt; t++)
    for (size_t i = 0; i < j->n[t]; i++) {
      float w = wval(j->w[t], j->wdt, i);
      if (j->grads) {
        float c = (float)((i * 2654435761u + (size_t)j->step * 977u) % 1000u) * 1e-6f - 5e-4f;
        j->g[t][i] += 0.01f * w + c;
      } else {
        sum += (double)w * (double)((i % 7) + 1);
      }
    }
  if (!j->grads) *j->seen = sum;
  if (j->model_mem) memset(j->model_mem, 0xA5, j->model_bytes); /* the model's own bytes */
  return 0;
}

/* A kernel over group `grp` of view v: run now (sync) or enqueue. */
static void kernel(fake_model *fm, int grp, const gpt_group_view *v, int grads, int step) {
  job *j = calloc(1, sizeof *j);
  REQUIRE(j);
  const gpt_schema *s = fm->s;
  for (int i = s->group_first[grp]; i < s->group_first[grp + 1]; i++, j->nt++) {
    int slot = s->params[i].slot;
    j->w[j->nt] = v->w[slot];
    j->g[j->nt] = grads ? v->g[slot] : NULL;
    j->n[j->nt] = s->params[i].numel;
    if (grads) REQUIRE(v->g[slot]);
  }
  j->grads = grads, j->step = step, j->wdt = v->wdt;
  if (!grads) {
    REQUIRE(fm->nseen < MAX_FETCHES);
    j->seen = &fm->seen[fm->nseen++];
  }
  j->model_mem = fm->model_mem, j->model_bytes = fm->model_bytes;
  j->next = fm->jobs, fm->jobs = j;
  if (!fm->st) {
    EXPECT_EQ_INT(v->wdt, FERRY_DT_F32);
    run_job(j);
    return;
  }
  if (grads) REQUIRE(ferry_stream_sleep(fm->st, 0.0005) == 0);
  REQUIRE(ferry_launch_host_func(fm->st, run_job, j) == 0);
}

#define OK(call)                                                                   \
  do {                                                                             \
    if ((call) != 0) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                \
              fm->p.last_error(fm->p.ctx));                                        \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

/* The CUDA model's fetch/release order for one forward and backward. */
static void pass(fake_model *fm, int step) {
  gpt_provider *p = &fm->p;
  int L = fm->s->cfg.n_layer, hg = L + 1;
  gpt_group_view e, h, g;
  OK(p->zero_grad(p->ctx));
  OK(p->fetch(p->ctx, 0, GPT_FETCH_FORWARD, &e));
  kernel(fm, 0, &e, 0, step);
  OK(p->release(p->ctx, 0, GPT_RELEASE_FORWARD));
  for (int l = 0; l < L; l++) {
    OK(p->fetch(p->ctx, 1 + l, GPT_FETCH_FORWARD, &g));
    kernel(fm, 1 + l, &g, 0, step);
    OK(p->release(p->ctx, 1 + l, GPT_RELEASE_FORWARD));
  }
  OK(p->fetch(p->ctx, hg, GPT_FETCH_FORWARD, &h));
  OK(p->fetch(p->ctx, 0, GPT_FETCH_FORWARD, &e));
  kernel(fm, hg, &h, 0, step);
  OK(p->release(p->ctx, 0, GPT_RELEASE_FORWARD));
  OK(p->release(p->ctx, hg, GPT_RELEASE_FORWARD));
  OK(p->fetch(p->ctx, hg, GPT_FETCH_BACKWARD, &h));
  OK(p->fetch(p->ctx, 0, GPT_FETCH_BACKWARD, &e));
  kernel(fm, hg, &h, 1, step);
  kernel(fm, 0, &e, 1, step); /* the tied head's contribution */
  OK(p->release(p->ctx, 0, GPT_RELEASE_PARTIAL));
  OK(p->release(p->ctx, hg, GPT_RELEASE_GRADS));
  for (int l = L - 1; l >= 0; l--) {
    OK(p->fetch(p->ctx, 1 + l, GPT_FETCH_BACKWARD, &g));
    kernel(fm, 1 + l, &g, 1, step + 1000 * l);
    OK(p->release(p->ctx, 1 + l, GPT_RELEASE_GRADS));
  }
  OK(p->fetch(p->ctx, 0, GPT_FETCH_BACKWARD, &e));
  kernel(fm, 0, &e, 1, step + 7); /* the embedding's own */
  OK(p->release(p->ctx, 0, GPT_RELEASE_GRADS));
}

static void free_jobs(fake_model *fm) {
  while (fm->jobs) {
    job *n = fm->jobs->next;
    free(fm->jobs);
    fm->jobs = n;
  }
}

static gpt_engine *make_engine(const gpt_schema *s, const ferry_config *cfg, gpt_engine_mode mode) {
  gpt_weights_src *src;
  char err[1024];
  REQUIRE(gpt_weights_src_open(s, NULL, 11, &src, err, sizeof err) == 0);
  gpt_engine_options o = {mode, mode == GPT_ENGINE_STREAM ? 4096 + 3 : 0, NULL};
  gpt_engine *ge = NULL;
  if (gpt_engine_create(s, cfg, NULL, src, &o, &ge, err, sizeof err)) {
    fprintf(stderr, "engine: %s\n", err);
    exit(1);
  }
  gpt_weights_src_close(src);
  return ge;
}

/* Sync and stream engines from one config, STEPS steps each, compared. */
static void compare(const gpt_schema *s, const char *configs, const char *file, const char *nvme,
                    const char *key, const char *value) {
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", configs, file);
  ferry_config *cfg;
  REQUIRE(ferry_config_create(&cfg) == 0);
  REQUIRE(ferry_config_load_file(cfg, path) == 0);
  REQUIRE(ferry_config_set(cfg, "tiers.nvme.paths", nvme) == 0);
  if (key) REQUIRE(ferry_config_set(cfg, key, value) == 0);
  gpt_engine *sy = make_engine(s, cfg, GPT_ENGINE_SYNC), *sm = make_engine(s, cfg, GPT_ENGINE_STREAM);
  fake_model a = {s, gpt_engine_provider(sy), NULL, NULL, {0}, 0, NULL, 0};
  fake_model b = {s, gpt_engine_provider(sm), gpt_engine_stream(sm), NULL, {0}, 0, NULL, 0};
  gpt_engine_model_memory(sm, &b.model_mem, &b.model_bytes);
  EXPECT(b.model_mem != NULL && b.model_bytes == 4096 + 3);
  EXPECT(gpt_engine_scratch_bytes(sm) > 0);
  int micro = gpt_engine_micro_batches(sm), bad_seen = 0, bad_master = 0;
  size_t most = 0;
  for (int i = 0; i < s->n_params; i++) most = s->params[i].numel > most ? s->params[i].numel : most;
  float *x = malloc(most * sizeof *x), *y = malloc(most * sizeof *y);
  for (int step = 0; step < STEPS; step++) {
    a.nseen = b.nseen = 0;
    for (int k = 0; k < micro; k++) pass(&a, step * 10 + k), pass(&b, step * 10 + k);
    ferry_step_info ia, ib;
    REQUIRE(gpt_engine_step(sy, &ia) == 0);
    REQUIRE(gpt_engine_step(sm, &ib) == 0);
    REQUIRE(ferry_stream_synchronize(b.st) == 0); /* the test reads what its kernels wrote */
    EXPECT_EQ_INT(a.nseen, b.nseen);
    for (int i = 0; i < a.nseen; i++) bad_seen += a.seen[i] != b.seen[i];
    EXPECT(ia.grad_norm == ib.grad_norm && ia.loss_scale == ib.loss_scale);
    for (int i = 0; i < s->n_params; i++) {
      REQUIRE(gpt_engine_read(sy, i, x) == 0 && gpt_engine_read(sm, i, y) == 0);
      bad_master += memcmp(x, y, s->params[i].numel * sizeof *x) != 0;
    }
    free_jobs(&a), free_jobs(&b);
  }
  EXPECT_EQ_INT(bad_seen, 0);
  EXPECT_EQ_INT(bad_master, 0);
  printf("%s %s%s%s: %d steps x %d micro-batches, stream = sync (%d params seen wrong, %d "
         "tensors differ)\n", file, key ? key : "", key ? "=" : "", key ? value : "", STEPS, micro,
         bad_seen, bad_master);
  free(x), free(y);
  gpt_engine_free(sy), gpt_engine_free(sm);
  ferry_config_destroy(cfg);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 3);
  char nvme[2048];
  snprintf(nvme, sizeof nvme, "%s/nvme-swap", argv[2]);
  mkdir(argv[2], 0777);
  mkdir(nvme, 0777);
  gpt_config c;
  REQUIRE(gpt_config_preset("tiny", &c) == 0);
  gpt_schema s;
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  compare(&s, argv[1], "resident.cfg", nvme, NULL, NULL);
  compare(&s, argv[1], "offload-host.cfg", nvme, NULL, NULL);
  compare(&s, argv[1], "offload-nvme.cfg", nvme, NULL, NULL);
  compare(&s, argv[1], "offload-host.cfg", nvme, "precision.params", "fp16");
  compare(&s, argv[1], "resident.cfg", nvme, "precision.params", "fp32");
  compare(&s, argv[1], "offload-nvme.cfg", nvme, "grad_accumulation", "2");
  gpt_schema_free(&s);
  /* llama-shaped (an untied head, SwiGLU, grouped KV heads): params at home
   * on the host (zero3-offload) and on NVMe */
  REQUIRE(gpt_config_preset("llama-tiny", &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  compare(&s, argv[1], "offload-host.cfg", nvme, "placement.params", "host");
  compare(&s, argv[1], "offload-nvme.cfg", nvme, NULL, NULL);
  gpt_schema_free(&s);
  return test_finish("gpt.stream");
}
