/* examples/minimal_loop.c — the engine's training-loop API on one page.
 *
 * A 4-layer linear model (y = x W0 W1 W2 W3, squared-error loss) trained
 * with AdamW, its parameters offloaded: fp32 master weights and optimizer
 * state on the host, the device holding only a few layers at a time. The
 * "GPU" is ferry's emulated host backend, so the kernels are plain C
 * functions run in stream order (ferry_launch_host_func). The settings are
 * made from C; the same keys work in a .cfg file (docs/CONFIG.md).
 */
#include "ferry.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { LAYERS = 4, DIM = 32, BATCH = 16, STEPS = 30 };

#define CHECK(call)                                                                    \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_) {                                                                         \
      fprintf(stderr, "minimal_loop: %s: %s: %s\n", #call, ferry_strerror(rc_),        \
              e ? ferry_engine_last_error(e) : ferry_last_error());                    \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

static float act[LAYERS + 1][BATCH * DIM], dact[BATCH * DIM], tmp[BATCH * DIM];
static float target[BATCH * DIM];
static double loss;

typedef struct {
  int layer;
  float *w, *gw; /* device pointers (fp32 params: precision.params = "fp32") */
} call;

static int forward(void *arg) { /* act[l+1] = act[l] W */
  call *c = arg;
  for (int b = 0; b < BATCH; b++)
    for (int j = 0; j < DIM; j++) {
      float s = 0;
      for (int k = 0; k < DIM; k++) s += act[c->layer][b * DIM + k] * c->w[k * DIM + j];
      act[c->layer + 1][b * DIM + j] = s;
    }
  return 0;
}

static int loss_grad(void *arg) { /* loss = mean((y - t)^2) / 2 */
  (void)arg;
  loss = 0;
  for (int i = 0; i < BATCH * DIM; i++) {
    float d = act[LAYERS][i] - target[i];
    loss += 0.5 * d * d / (BATCH * DIM);
    dact[i] = d / (BATCH * DIM);
  }
  return 0;
}

static int backward(void *arg) { /* gW = x^T dY; dX = dY W^T */
  call *c = arg;
  for (int k = 0; k < DIM; k++)
    for (int j = 0; j < DIM; j++) {
      float s = 0;
      for (int b = 0; b < BATCH; b++) s += act[c->layer][b * DIM + k] * dact[b * DIM + j];
      c->gw[k * DIM + j] = s;
    }
  for (int b = 0; b < BATCH; b++)
    for (int k = 0; k < DIM; k++) {
      float s = 0;
      for (int j = 0; j < DIM; j++) s += dact[b * DIM + j] * c->w[k * DIM + j];
      tmp[b * DIM + k] = s;
    }
  memcpy(dact, tmp, sizeof dact);
  return 0;
}

static int init_weights(void *user, const char *name, float *v, size_t n) {
  unsigned s = 1234u + (unsigned)(size_t)user;
  (void)name;
  for (size_t i = 0; i < n; i++) { /* uniform, variance 1/DIM: activations keep scale */
    s = s * 1664525u + 1013904223u;
    v[i] = ((float)(s >> 8) / 16777216.0f * 2 - 1) * sqrtf(3.0f / DIM);
  }
  return 0;
}

int main(int argc, char **argv) {
  (void)argv;
  if (argc > 1) {
    printf("usage: minimal_loop\n\nTrains a 4-layer linear model through the ferry engine on "
           "the emulated GPU\n(params streamed per layer, optimizer on the host) and checks "
           "that the loss falls.\n");
    return 0;
  }
  ferry_engine *e = NULL;
  ferry_config *cfg = NULL;
  CHECK(ferry_config_create(&cfg));
  CHECK(ferry_config_set(cfg, "device", "host"));
  CHECK(ferry_config_set(cfg, "tiers.gpu.budget", "16K")); /* 2 layers + 2 grad buffers */
  CHECK(ferry_config_set(cfg, "tiers.host.budget", "16M"));
  CHECK(ferry_config_set(cfg, "tiers.host.pinned", "false"));
  CHECK(ferry_config_set(cfg, "chunk_size", "4K"));
  CHECK(ferry_config_set(cfg, "placement.params", "host")); /* streamed per group */
  CHECK(ferry_config_set(cfg, "placement.optimizer", "host"));
  CHECK(ferry_config_set(cfg, "precision.params", "fp32"));
  CHECK(ferry_config_set(cfg, "optimizer.lr", "0.01"));
  CHECK(ferry_engine_create(cfg, NULL, &e));
  ferry_config_destroy(cfg);

  char name[LAYERS][16];
  for (int l = 0; l < LAYERS; l++) { /* one group per layer */
    snprintf(name[l], sizeof name[l], "w%d", l);
    int64_t shape[2] = {DIM, DIM};
    CHECK(ferry_param_register(e, name[l], shape, 2, l, NULL, init_weights, (void *)(size_t)l));
  }
  CHECK(ferry_engine_finalize(e));

  ferry_stream *s;
  CHECK(ferry_stream_create(ferry_engine_device(e), &s));
  unsigned r = 7;
  for (int i = 0; i < BATCH * DIM; i++) { /* a fixed batch to fit */
    r = r * 1664525u + 1013904223u;
    act[0][i] = (float)(r >> 8) / 16777216.0f * 2 - 1;
  }
  for (int i = 0; i < BATCH * DIM; i++) target[i] = 0.5f * sinf(3 * act[0][(i * 5) % (BATCH * DIM)]);

  call fwd[LAYERS], bwd[LAYERS];
  double first = 0;
  for (int step = 0; step < STEPS; step++) {
    for (int l = 0; l < LAYERS; l++) { /* forward: fetch, compute, release */
      CHECK(ferry_fetch(e, l, s));
      fwd[l].layer = l;
      CHECK(ferry_param_device(e, name[l], (void **)&fwd[l].w, NULL));
      CHECK(ferry_launch_host_func(s, forward, &fwd[l]));
      CHECK(ferry_release(e, l, s));
    }
    CHECK(ferry_launch_host_func(s, loss_grad, NULL));
    for (int l = LAYERS - 1; l >= 0; l--) { /* backward: grads handed back per layer */
      CHECK(ferry_fetch(e, l, s));
      bwd[l].layer = l;
      CHECK(ferry_param_device(e, name[l], (void **)&bwd[l].w, (void **)&bwd[l].gw));
      CHECK(ferry_launch_host_func(s, backward, &bwd[l]));
      CHECK(ferry_grads_ready(e, l, s));
      CHECK(ferry_release(e, l, s));
    }
    CHECK(ferry_stream_synchronize(s)); /* the loss is ready */
    ferry_step_info info;
    CHECK(ferry_step(e, &info));
    if (step == 0) first = loss;
    if (step % 10 == 0 || step == STEPS - 1)
      printf("step %2d  loss %.6f  grad norm %.4f\n", step, loss, info.grad_norm);
  }
  ferry_stats st;
  CHECK(ferry_engine_get_stats(e, &st));
  printf("minimal_loop: %d steps through the engine, loss %.6f -> %.6f; params streamed to the "
         "device: peak %llu of %d bytes there at once, %llu bytes uploaded, %llu fetches "
         "stalled\n",
         STEPS, first, loss, (unsigned long long)st.tier_peak[FERRY_TIER_DEVICE],
         LAYERS * DIM * DIM * 4, (unsigned long long)st.bytes_h2d, (unsigned long long)st.stalls);
  ferry_engine_destroy(e); /* the device and the stream go with it */
  return loss < 0.5 * first ? 0 : 1;
}
