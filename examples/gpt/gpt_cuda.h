/* examples/gpt/gpt_cuda.h — the model on a CUDA GPU: the same forward,
 * backward and cross-entropy as model_cpu.c, GEMMs in bf16 on cuBLAS with
 * fp32 accumulation, CUDA C kernels for the rest. Parameters come through
 * the same gpt_provider, whose pointers are then device memory; a resident
 * device provider is here for tests. Built when FERRY_HAVE_CUDA.
 */
#ifndef FERRY_GPT_CUDA_H
#define FERRY_GPT_CUDA_H

#include "gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 0 when a CUDA device can be used; else -1 and the reason in why. */
int gpt_cuda_available(char *why, size_t len);

typedef struct gpt_cuda_model gpt_cuda_model;

int gpt_cuda_model_create(const gpt_schema *s, const gpt_run_config *rc, gpt_cuda_model **out);
void gpt_cuda_model_free(gpt_cuda_model *m);
const char *gpt_cuda_model_last_error(const gpt_cuda_model *m);
/* tokens, targets: host arrays of batch*seq ids. */
int gpt_cuda_model_forward(gpt_cuda_model *m, gpt_provider *p, const int32_t *tokens,
                           const int32_t *targets, float *loss);
int gpt_cuda_model_backward(gpt_cuda_model *m, gpt_provider *p);
/* Copies the last forward's logits [batch*seq, vocab] to host memory. */
int gpt_cuda_model_logits(gpt_cuda_model *m, float *host);

/* Every weight and gradient in device memory (fp32), schema order. */
typedef struct {
  const gpt_schema *schema;
  float *weights, *grads; /* device */
  size_t *offset;
  char err[256];
} gpt_cuda_resident;

int gpt_cuda_resident_init(gpt_cuda_resident *r, const gpt_schema *s);
void gpt_cuda_resident_free(gpt_cuda_resident *r);
gpt_provider gpt_cuda_resident_provider(gpt_cuda_resident *r);
/* Host <-> device copies of all weights / grads (total_numel floats). */
int gpt_cuda_resident_upload(gpt_cuda_resident *r, const float *host_weights);
int gpt_cuda_resident_download_grads(gpt_cuda_resident *r, float *host_grads);

#ifdef __cplusplus
}
#endif

#endif
