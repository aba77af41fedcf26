/* ferry/optim.h — the CPU optimizers, gradient helpers and loss scaling.
 * Part of the public API: include ferry.h, which includes this file. */
#ifndef FERRY_API_OPTIM_H
#define FERRY_API_OPTIM_H

#ifndef FERRY_H
#error "include ferry.h, not ferry/optim.h"
#endif

/* ------------------------------------------------------------------------ */
/* CPU optimizers (optim/)                                                   */

/* The step runs on the CPU over spans of fp32 master weights in host memory,
 * while the GPU computes. One fused pass per element: read the gradient
 * (fp32, fp16 or bf16) times one scale, update the states, write the master
 * and, when asked, a 16-bit copy of the new params (round to nearest even,
 * NaN kept; the AVX512-BF16 instruction flushes bf16 subnormals, |x| < 1.2e-38,
 * to zero) into a separate buffer ready to upload. SIMD kernels (AVX2+FMA+
 * F16C, AVX-512) are chosen by CPUID; FERRY_SIMD=scalar|avx2|avx512 forces
 * one. States must be zeroed (or loaded from a checkpoint) before step 1. */

typedef struct ferry_optimizer ferry_optimizer;

typedef enum {
  FERRY_OPTIM_ADAMW = 0,   /* Adam with decoupled weight decay (torch.optim.AdamW) */
  FERRY_OPTIM_ADAM = 1,    /* Adam, weight decay as L2 on the gradient */
  FERRY_OPTIM_ADAGRAD = 2, /* state1 = sum of squares */
  FERRY_OPTIM_LAMB = 3,    /* Adam update times a per-span (per-tensor) trust ratio */
  FERRY_OPTIM_SGD = 4,     /* with momentum (state1), dampening, Nesterov */
  FERRY_OPTIM_LION = 5     /* sign update; state1 = m; betas default (0.9, 0.99) */
} ferry_optim_type;

/* Element types of optimizer buffers: ferry_dtype's FERRY_DT_NONE (no
 * buffer: param copy off), _F32, _F16, _BF16. The FERRY_OPTIM_DT_ names are
 * deprecated aliases, kept for one release. */
#define FERRY_OPTIM_DT_NONE FERRY_DT_NONE
#define FERRY_OPTIM_DT_F32 FERRY_DT_F32
#define FERRY_OPTIM_DT_F16 FERRY_DT_F16
#define FERRY_OPTIM_DT_BF16 FERRY_DT_BF16

typedef struct {
  ferry_optim_type type;
  float lr;
  float beta1, beta2;  /* Adam, AdamW, LAMB, Lion */
  float eps;           /* Adam, AdamW, LAMB, Adagrad */
  float weight_decay;
  float momentum;      /* SGD */
  float dampening;     /* SGD */
  int nesterov;        /* SGD (needs momentum > 0 and dampening 0) */
  float lr_decay;      /* Adagrad */
  int state_dtype;     /* FERRY_DT_F32 (default), FERRY_DT_BF16 (rounded to
                          nearest even; on AVX512-BF16 CPUs subnormals flush to 0)
                          or FERRY_DT_I8: 8-bit blockwise dynamic quantization
                          (see "Compact state" below; AdamW, Adam and Lion) */
  size_t state_block;  /* int8 states: elements per fp32 absmax block, a power of
                          two in [32, 4096]; 0 = 256 */
  int master_dtype;    /* FERRY_DT_F32 (default; 0 reads as it): span.param is the
                          fp32 master. FERRY_DT_BF16: span.param holds the bf16
                          params themselves, updated in place in fp32 and written
                          back with stochastic rounding; copy_dtype must be NONE */
  uint64_t seed;       /* stochastic rounding: mixed with the step and each
                          element's index (span.index + i), so results are
                          deterministic and resumable */
  int threads;         /* worker threads; 0 = one per core */
  int bind;            /* 1 (default): pin workers to cores with hwloc */
  const char *simd;    /* NULL: FERRY_SIMD or the best the CPU has; else
                          "scalar", "avx2", "avx512" */
  size_t tile;         /* elements per tile handed to a worker; 0 = 65536 */
  ferry_log_fn log;    /* optional; NULL = the process-wide logger */
  void *log_user;
  int log_level;
} ferry_optimizer_config;

/* torch.optim's defaults for `type` (AdamW: lr 1e-3, betas 0.9/0.999, eps
 * 1e-8, weight_decay 1e-2; Adam: weight_decay 0; Adagrad: lr 1e-2, eps 1e-10;
 * SGD: lr 1e-2; LAMB: eps 1e-6, weight_decay 1e-2; Lion: lr 1e-4, betas
 * 0.9/0.99), fp32 states, threads 0, bind 1. */
FERRY_API ferry_optimizer_config ferry_optimizer_config_default(ferry_optim_type type);

/* How many state buffers per element the optimizer `cfg` describes keeps:
 * 2 (exp_avg and exp_avg_sq: AdamW, Adam, LAMB), 1 (Adagrad's sum, Lion's
 * m, SGD's momentum buffer) or 0 (SGD without momentum); -1 for an unknown
 * type. span.state1 and state2 must be given for that many. */
FERRY_API int ferry_optimizer_state_count(const ferry_optimizer_config *cfg);

/* One tensor (or a piece of one; LAMB's trust ratio is per span). */
typedef struct {
  void *param;        /* the master weights (cfg.master_dtype: fp32, or bf16),
                         updated in place */
  const void *grad;   /* grad_dtype */
  void *state1;       /* exp_avg / momentum buffer / Adagrad sum; state_dtype,
                         ferry_optimizer_state_bytes(cfg, n) bytes */
  void *state2;       /* exp_avg_sq (Adam, AdamW, LAMB); else unused */
  void *param_copy;   /* copy_dtype; written when copy_dtype != NONE */
  size_t n;           /* elements */
  int grad_dtype;     /* FERRY_DT_F32, _F16, _BF16 */
  int copy_dtype;     /* FERRY_DT_NONE, _F16, _BF16 */
  uint64_t index;     /* bf16 master: the stochastic-rounding counter of element
                         0 (the element's index in the model; spans must not
                         overlap) */
} ferry_optim_span;

/* Compact state. With state_dtype FERRY_DT_I8 a state buffer of n elements
 * is packed as round_up(n, 64) one-byte codes, then ceil(n / state_block)
 * fp32 absmax values, one per block of state_block elements (the last block
 * may be short). Each code is a float with 3 mantissa bits scaled by its
 * block's absmax: exp_avg, momentum and Lion's m (signed) as sign + 4-bit
 * exponent, exp_avg_sq (never negative) as a 5-bit exponent, so small values
 * keep a relative precision of 2^-4 down to 2^-14 (signed) and 2^-30
 * (unsigned) of the block's absmax, as 8-bit Adam's dynamic code does.
 * A zeroed buffer is a zero state. The kernels dequantize, update and
 * requantize each block in one pass over memory; the update itself uses the
 * fp32 states before they are requantized. */

/* Bytes of one state buffer of n elements for cfg's state_dtype: 4n (fp32),
 * 2n (bf16), or the int8 packing above. 0 for an invalid config. */
FERRY_API size_t ferry_optimizer_state_bytes(const ferry_optimizer_config *cfg, size_t n);

/* Bytes a step's fused pass moves per parameter, read plus written: the
 * master (read and written), each state (with its absmax share), the
 * gradient of grad_dtype and the param copy of copy_dtype (FERRY_DT_NONE:
 * none). AdamW with fp32 states, bf16 grads and a bf16 copy: 28; bf16
 * states 20; int8 states 16.0625 (16 of codes, 1/16 of absmax at blocks of
 * 256); bf16 master + int8 states 10.0625. -1 for an invalid config. */
FERRY_API double ferry_optimizer_bytes_per_param(const ferry_optimizer_config *cfg, int grad_dtype,
                                                 int copy_dtype);

typedef struct {
  char simd[16];   /* kernels in use: "scalar", "avx2", "avx512" */
  int native_bf16; /* AVX-512 bf16 conversion instructions used */
  int threads;     /* worker threads */
  int bound;       /* of which pinned to a core */
  int64_t step;    /* steps taken */
} ferry_optimizer_info;

typedef void (*ferry_optim_done_fn)(void *user, int status);

FERRY_API int ferry_optimizer_create(const ferry_optimizer_config *cfg, ferry_optimizer **out);
/* Waits for an async step in flight, then frees. NULL is allowed. */
FERRY_API void ferry_optimizer_destroy(ferry_optimizer *o);
FERRY_API const char *ferry_optimizer_last_error(const ferry_optimizer *o);
FERRY_API int ferry_optimizer_get_info(ferry_optimizer *o, ferry_optimizer_info *out);

/* One step over `count` spans: the step count goes up by one and bias
 * corrections use it. grad_scale multiplies every gradient (1/loss_scale
 * times the clip coefficient). */
FERRY_API int ferry_optimizer_step(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                                   float grad_scale);
/* The same, returning at once: the spans array is copied, the buffers must
 * stay untouched until completion. `done` (may be NULL) is called on a pool
 * thread when the step is over, before ferry_optimizer_wait returns; it must
 * not call this optimizer. One async step at a time (FERRY_EBUSY). */
FERRY_API int ferry_optimizer_step_async(ferry_optimizer *o, const ferry_optim_span *spans,
                                         size_t count, float grad_scale, ferry_optim_done_fn done,
                                         void *user);
/* 0 when no step is in flight, FERRY_EAGAIN when one is. */
FERRY_API int ferry_optimizer_query(ferry_optimizer *o);
/* Waits for the step in flight (if any); returns its status. */
FERRY_API int ferry_optimizer_wait(ferry_optimizer *o);
/* AdamW/Adam over spans whose buffers are CUDA device memory, on a
 * cudaStream_t (NULL = default stream); same math as the CPU kernels, bit for
 * bit, for fp32, bf16 and int8 states and an fp32 or bf16 master.
 * FERRY_ENOTSUP without CUDA or for other optimizer types. */
FERRY_API int ferry_optimizer_step_cuda(ferry_optimizer *o, const ferry_optim_span *spans,
                                        size_t count, float grad_scale, void *cuda_stream);

/* The most steps a count holds (2^53: exact in a double, as JSON and Python
 * read it). A step that would pass it fails with FERRY_EOVERFLOW and changes
 * nothing (ferry_optimizer_step, ferry_step); a checkpoint claiming more is
 * refused. */
#define FERRY_STEP_MAX ((int64_t)1 << 53)

FERRY_API int64_t ferry_optimizer_get_step(const ferry_optimizer *o);
/* Sets the step count (resuming from a checkpoint), 0..FERRY_STEP_MAX. Not
 * while a step runs. */
FERRY_API int ferry_optimizer_set_step(ferry_optimizer *o, int64_t step);
FERRY_API int ferry_optimizer_set_lr(ferry_optimizer *o, float lr);

/* Gradient helpers, one pass, on the optimizer's threads. */
typedef struct {
  const void *data;
  size_t n;
  int dtype; /* FERRY_DT_F32, _F16, _BF16 */
} ferry_grad_span;

/* Sum of squares over all spans (double accumulation; raw values, before any
 * scale) and whether any element is inf or NaN. */
FERRY_API int ferry_optimizer_grad_stats(ferry_optimizer *o, const ferry_grad_span *spans,
                                         size_t count, double *sumsq, int *nonfinite);
/* acc[i] += scale * grad[i] (accumulating 16-bit micro-batch grads in fp32). */
FERRY_API int ferry_optimizer_grad_accumulate(ferry_optimizer *o, float *acc,
                                              const ferry_grad_span *grad, float scale);
/* torch.nn.utils.clip_grad_norm_'s coefficient: min(1, max_norm / (norm +
 * 1e-6)) with norm = sqrt(sumsq) / loss_scale. */
FERRY_API float ferry_clip_coef(double sumsq, float loss_scale, float max_norm);

/* Dynamic loss scaling (as torch.cuda.amp.GradScaler): after `interval`
 * steps without overflow the scale grows by `growth`; an overflow multiplies
 * it by `backoff` and the step is skipped. */
typedef struct {
  float scale, growth, backoff;
  int interval;
  int good_steps;     /* steps since the last overflow or growth */
  int64_t skipped;    /* steps skipped so far */
} ferry_loss_scaler;

/* Defaults as torch: init 65536, growth 2, backoff 0.5, interval 2000; pass
 * 0 for any to get its default. */
FERRY_API void ferry_loss_scaler_init(ferry_loss_scaler *s, float init_scale, float growth,
                                      float backoff, int interval);
/* Call once per step with whether the grads had an inf/NaN. Returns 1 when
 * the step must be skipped, 0 when it may run with the (old) scale. */
FERRY_API int ferry_loss_scaler_update(ferry_loss_scaler *s, int found_nonfinite);


#endif /* FERRY_API_OPTIM_H */
