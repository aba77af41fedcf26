/* examples/gpt/resident_cuda.cu — the device-resident provider of the CUDA
 * model: every weight and gradient in device memory as fp32, schema order
 * (the pre-engine --device cuda path and the tests), their seeded init on
 * the device, and page-locking of the host buffers its copies use.
 */
#include "gpt_cuda.h"
#include "gpt_init.h"

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" int gpt_cuda_resident_init(gpt_cuda_resident *r, const gpt_schema *s, void *stream) {
  memset(r, 0, sizeof *r);
  r->schema = s;
  r->stream = stream;
  size_t n = s->total_numel ? s->total_numel : 1;
  r->offset = (size_t *)calloc((size_t)s->n_params, sizeof *r->offset);
  if (!r->offset || cudaMalloc((void **)&r->weights, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&r->grads, n * sizeof(float)) != cudaSuccess) {
    (void)cudaGetLastError();
    gpt_cuda_resident_free(r);
    return -1;
  }
  size_t at = 0;
  for (int i = 0; i < s->n_params; i++) r->offset[i] = at, at += s->params[i].numel;
  return 0;
}

/* cudaFree waits for the device's work; the stream may already be gone. */
extern "C" void gpt_cuda_resident_free(gpt_cuda_resident *r) {
  cudaFree(r->weights), cudaFree(r->grads), free(r->offset);
  memset(r, 0, sizeof *r);
}

static int cres_fetch(void *ctx, int group, gpt_fetch_mode mode, gpt_group_view *out) {
  gpt_cuda_resident *r = (gpt_cuda_resident *)ctx;
  const gpt_schema *s = r->schema;
  if (group < 0 || group >= s->n_groups) return -1;
  if (mode == GPT_FETCH_WRITE) {
    snprintf(r->err, sizeof r->err, "the device-resident weights are written by upload");
    return -1;
  }
  memset(out, 0, sizeof *out);
  out->wdt = FERRY_DT_F32;
  for (int i = s->group_first[group]; i < s->group_first[group + 1]; i++) {
    out->w[s->params[i].slot] = r->weights + r->offset[i];
    out->g[s->params[i].slot] = mode == GPT_FETCH_BACKWARD ? r->grads + r->offset[i] : NULL;
  }
  return 0;
}

static int cres_release(void *ctx, int group, gpt_release_mode mode) {
  (void)ctx, (void)group, (void)mode;
  return 0;
}

static int cres_zero(void *ctx) {
  gpt_cuda_resident *r = (gpt_cuda_resident *)ctx;
  cudaError_t e = cudaMemsetAsync(r->grads, 0, r->schema->total_numel * sizeof(float),
                                  (cudaStream_t)r->stream);
  if (e == cudaSuccess) return 0;
  snprintf(r->err, sizeof r->err, "zero grads: %s", cudaGetErrorString(e));
  return -1;
}

static const char *cres_err(void *ctx) { return ((gpt_cuda_resident *)ctx)->err; }

extern "C" gpt_provider gpt_cuda_resident_provider(gpt_cuda_resident *r) {
  gpt_provider p = {r, cres_fetch, cres_release, cres_zero, cres_err};
  return p;
}

extern "C" int gpt_cuda_resident_upload(gpt_cuda_resident *r, const float *w) {
  cudaError_t e = cudaMemcpyAsync(r->weights, w, r->schema->total_numel * sizeof(float),
                                  cudaMemcpyHostToDevice, (cudaStream_t)r->stream);
  if (e == cudaSuccess) return 0;
  snprintf(r->err, sizeof r->err, "upload: %s", cudaGetErrorString(e));
  return -1;
}

extern "C" int gpt_cuda_resident_download_grads(gpt_cuda_resident *r, float *g) {
  cudaError_t e = cudaMemcpyAsync(g, r->grads, r->schema->total_numel * sizeof(float),
                                  cudaMemcpyDeviceToHost, (cudaStream_t)r->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)r->stream);
  if (e == cudaSuccess) return 0;
  snprintf(r->err, sizeof r->err, "download grads: %s", cudaGetErrorString(e));
  return -1;
}

extern "C" int gpt_cuda_resident_init_weights(gpt_cuda_resident *r, uint64_t seed,
                                              float *host_weights) {
  const gpt_schema *s = r->schema;
  for (int i = 0; i < s->n_params; i++)
    if (gpt_cuda_init_tensor(r->weights + r->offset[i], FERRY_DT_F32, s->params[i].numel, s, i,
                             seed, r->stream, r->err, sizeof r->err))
      return -1;
  cudaError_t e = cudaMemcpyAsync(host_weights, r->weights, s->total_numel * sizeof(float),
                                  cudaMemcpyDeviceToHost, (cudaStream_t)r->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)r->stream);
  if (e == cudaSuccess) return 0;
  snprintf(r->err, sizeof r->err, "init of the weights: %s", cudaGetErrorString(e));
  return -1;
}

extern "C" int gpt_cuda_host_register(void *p, size_t bytes) {
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return 0;
  (void)cudaGetLastError();
  return -1;
}

extern "C" void gpt_cuda_host_unregister(void *p) {
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}
