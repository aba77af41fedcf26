/* examples/gpt/gpt_cuda.h — the model on a CUDA GPU: the same forward,
 * backward and cross-entropy as model_cpu.c, GEMMs in bf16 on cuBLAS with
 * fp32 accumulation, CUDA C kernels for the rest, all on one stream.
 * Parameters come through the same gpt_provider, whose pointers are then
 * device memory in the view's dtype (the engine provider's stream mode, or
 * the fp32 resident device provider below). The device memory layout of
 * activations and workspace (cuda_layout.c) is plain C, built and tested
 * everywhere; the model itself is built when FERRY_HAVE_CUDA, into the
 * shared module libferry-gpt-cuda.so (with cuBLAS) that ferry-gpt opens
 * only for --device cuda (gpt_cuda_load below), so a CPU run never maps
 * cuBLAS; the tests link the same objects statically.
 */
#ifndef FERRY_GPT_CUDA_H
#define FERRY_GPT_CUDA_H

#include "gpt.h"
#include "plan/gpt_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the device memory layout (cuda_layout.c, plain C) ----------------------------
 * Every byte of device memory the model uses besides the params and grads
 * is one block laid out by plan/gpt_layout.h (the arithmetic `ferry plan`
 * prints from): bf16 activations, fp32 statistics, flash attention (no
 * T x T buffer), each block's pass in chunks of sequences, the loss in
 * chunks of tokens. */
typedef ferry_gpt_layout gpt_cuda_layout_t;

/* The layout's dims for schema s, run rc, and weights read in dtype wdt. */
ferry_gpt_dims gpt_cuda_dims(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt);
/* The layout for schema s, run rc, and weights read in dtype wdt (BF16: no
 * weight scratch). Returns out->bytes; 0 when rc is out of range. */
size_t gpt_cuda_layout(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt,
                       gpt_cuda_layout_t *out);

/* ---- the model (model_cuda.cu) ------------------------------------------------------ */

/* 0 when a CUDA device can be used; else -1 and the reason in why. */
int gpt_cuda_available(char *why, size_t len);

typedef struct gpt_cuda_model gpt_cuda_model;

/* Where the model's device memory and stream come from. base/bytes: the
 * block for gpt_cuda_layout (at least its bytes, 256-aligned), or NULL to
 * have the model cudaMalloc one. stream: the cudaStream_t every launch,
 * copy and cuBLAS call goes to (the engine provider's, through
 * ferry_stream_native), or NULL for a stream of the model's own. wdt: the
 * dtype the provider's views will have (F32 for the resident provider,
 * the engine's precision.params in stream mode); it sizes the weight
 * scratch. A NULL gpt_cuda_mem: own block, own stream, F32. */
typedef struct {
  void *base;
  size_t bytes;
  void *stream;
  ferry_dtype wdt;
} gpt_cuda_mem;

/* 0, or -1 with what failed (the CUDA or cuBLAS error, the sizes) in err. */
int gpt_cuda_model_create(const gpt_schema *s, const gpt_run_config *rc, const gpt_cuda_mem *mem,
                          gpt_cuda_model **out, char *err, size_t errlen);
/* Waits for the stream, then frees what the model owns (never a given
 * block or stream). */
void gpt_cuda_model_free(gpt_cuda_model *m);
const char *gpt_cuda_model_last_error(const gpt_cuda_model *m);
/* The stream the model launches on (a cudaStream_t). */
void *gpt_cuda_model_stream(const gpt_cuda_model *m);
/* Bytes of the model's device block (gpt_cuda_layout). */
size_t gpt_cuda_model_bytes(const gpt_cuda_model *m);
/* Enqueues the forward pass on the stream; returns without waiting for the
 * device. tokens, targets: host arrays of batch*seq ids (copied into pinned
 * staging before return; targets NULL: logits only). With targets the mean
 * cross-entropy is added to the model's loss sum on the device and copied
 * back asynchronously. */
int gpt_cuda_model_forward(gpt_cuda_model *m, gpt_provider *p, const int32_t *tokens,
                           const int32_t *targets);
/* Enqueues the backward pass of the last forward with targets: the grads
 * are added into the provider's fp32 accumulators in stream order. */
int gpt_cuda_model_backward(gpt_cuda_model *m, gpt_provider *p);
/* The mean of the losses of the forwards with targets since the last call:
 * waits for the last one's copy (one event), then resets the sum. Call it
 * once per optimizer step (after the backward and the engine's step, it
 * does not wait at all). */
int gpt_cuda_model_loss(gpt_cuda_model *m, float *loss);
/* The last forward's logits [batch*seq, vocab] into host memory, computed
 * again chunk by chunk from the final norm's output with the head's
 * weights fetched from p (the model never holds them all); waits for them
 * (tests; not for the step loop). */
int gpt_cuda_model_logits(gpt_cuda_model *m, gpt_provider *p, float *host);

/* Every weight and gradient in device memory (fp32), schema order: the
 * provider of the pre-engine --device cuda path and of the tests. Its
 * copies and zeroing go to `stream` (the model's, gpt_cuda_model_stream). */
typedef struct {
  const gpt_schema *schema;
  float *weights, *grads; /* device */
  size_t *offset;
  void *stream;
  char err[256];
} gpt_cuda_resident;

int gpt_cuda_resident_init(gpt_cuda_resident *r, const gpt_schema *s, void *stream);
void gpt_cuda_resident_free(gpt_cuda_resident *r);
gpt_provider gpt_cuda_resident_provider(gpt_cuda_resident *r);
/* Host -> device copy of all weights (total_numel floats), enqueued on the
 * stream: host_weights must stay unchanged until the stream passes it (the
 * next download_grads waits for it). */
int gpt_cuda_resident_upload(gpt_cuda_resident *r, const float *host_weights);
/* Device -> host copy of all grads; waits for it (and all work before it). */
int gpt_cuda_resident_download_grads(gpt_cuda_resident *r, float *host_grads);
/* The seeded init (gpt_init.h) written on the device, each tensor by
 * gpt_cuda_init_tensor (the values the CPU writes, bit for bit), then
 * copied to host_weights (total_numel floats; the host AdamW's copy), and
 * waited for: cheaper than the CPU's init and an upload for a large model.
 * 0, or -1 with r->err set. */
int gpt_cuda_resident_init_weights(gpt_cuda_resident *r, uint64_t seed, float *host_weights);
/* Page-locks host memory the resident copies use (cudaHostRegister), so
 * they run asynchronously; unregister before freeing it. */
int gpt_cuda_host_register(void *p, size_t bytes);
void gpt_cuda_host_unregister(void *p);

/* ---- the KV-cache forward for sampling (kvcache_cuda.cu) ---------------------------
 * gpt_kv's contract (gpt.h) on the device: each layer's keys and values
 * kept in fp32 for max_pos positions, a call of 1 to GPT_KV_ROWS new
 * tokens, the weights read through the provider in its dtype. stream: the
 * cudaStream_t to launch on, or NULL for the cache's own. Each forward
 * waits for its logits, which it leaves in host memory ([rows, vocab]). */
typedef struct gpt_cuda_kv gpt_cuda_kv;
int gpt_cuda_kv_create(const gpt_schema *s, int max_pos, void *stream, gpt_cuda_kv **out,
                       char *err, size_t errlen);
void gpt_cuda_kv_free(gpt_cuda_kv *kv);
void gpt_cuda_kv_reset(gpt_cuda_kv *kv);
int gpt_cuda_kv_forward(gpt_cuda_kv *kv, gpt_provider *p, const int32_t *tokens, int n);
const float *gpt_cuda_kv_logits(const gpt_cuda_kv *kv);
int gpt_cuda_kv_pos(const gpt_cuda_kv *kv);
int gpt_cuda_kv_rows(const gpt_cuda_kv *kv);
const char *gpt_cuda_kv_last_error(const gpt_cuda_kv *kv);
void *gpt_cuda_kv_stream(const gpt_cuda_kv *kv); /* the cudaStream_t it launches on */

/* ---- the module (cuda_entry.c, cuda_load.c) ---------------------------------------
 * libferry-gpt-cuda.so exports one symbol, GPT_CUDA_ENTRY, a function that
 * returns the table below. The loader checks abi and the sizes of the
 * structs both sides share (the module is built from the same tree; a
 * stale or foreign one is refused, naming the numbers). */
#define GPT_CUDA_ABI 4
#define GPT_CUDA_MODULE_FILE "libferry-gpt-cuda.so"
#define GPT_CUDA_ENTRY "gpt_cuda_module_api"
/* The loader's override: the module's path (tests; a relocated build). */
#define GPT_CUDA_MODULE_ENV "FERRY_GPT_CUDA_MODULE"

typedef struct {
  uint32_t abi;                                 /* GPT_CUDA_ABI */
  uint32_t api_bytes;                           /* sizeof(gpt_cuda_api) */
  uint32_t schema_bytes, run_bytes, provider_bytes, mem_bytes, resident_bytes;
  int (*available)(char *why, size_t len);
  int (*model_create)(const gpt_schema *s, const gpt_run_config *rc, const gpt_cuda_mem *mem,
                      gpt_cuda_model **out, char *err, size_t errlen);
  void (*model_free)(gpt_cuda_model *m);
  const char *(*model_last_error)(const gpt_cuda_model *m);
  void *(*model_stream)(const gpt_cuda_model *m);
  size_t (*model_bytes)(const gpt_cuda_model *m);
  int (*model_forward)(gpt_cuda_model *m, gpt_provider *p, const int32_t *tokens,
                       const int32_t *targets);
  int (*model_backward)(gpt_cuda_model *m, gpt_provider *p);
  int (*model_loss)(gpt_cuda_model *m, float *loss);
  int (*model_logits)(gpt_cuda_model *m, gpt_provider *p, float *host);
  int (*resident_init)(gpt_cuda_resident *r, const gpt_schema *s, void *stream);
  void (*resident_free)(gpt_cuda_resident *r);
  gpt_provider (*resident_provider)(gpt_cuda_resident *r);
  int (*resident_upload)(gpt_cuda_resident *r, const float *host_weights);
  int (*resident_download_grads)(gpt_cuda_resident *r, float *host_grads);
  int (*host_register)(void *p, size_t bytes);
  void (*host_unregister)(void *p);
  int (*resident_init_weights)(gpt_cuda_resident *r, uint64_t seed, float *host_weights);
  int (*kv_create)(const gpt_schema *s, int max_pos, void *stream, gpt_cuda_kv **out, char *err,
                   size_t errlen);
  void (*kv_free)(gpt_cuda_kv *kv);
  void (*kv_reset)(gpt_cuda_kv *kv);
  int (*kv_forward)(gpt_cuda_kv *kv, gpt_provider *p, const int32_t *tokens, int n);
  const float *(*kv_logits)(const gpt_cuda_kv *kv);
  int (*kv_pos)(const gpt_cuda_kv *kv);
  int (*kv_rows)(const gpt_cuda_kv *kv);
  const char *(*kv_last_error)(const gpt_cuda_kv *kv);
  void *(*kv_stream)(const gpt_cuda_kv *kv);
} gpt_cuda_api;

/* The module's entry (GPT_CUDA_ENTRY): the table of the functions above. */
typedef const gpt_cuda_api *(*gpt_cuda_entry_fn)(void);

/* Opens the module once per process (it stays mapped) and returns its
 * table: from $GPT_CUDA_MODULE_ENV when set, else <the executable's
 * folder>/../lib/, then the install lib folder. 0, or -1 with every path
 * tried and why (dlerror, a missing entry, another ABI) in err; without
 * CUDA in the build, -1 saying so. */
int gpt_cuda_load(const gpt_cuda_api **out, char *err, size_t len);

#ifdef __cplusplus
}
#endif

#endif
