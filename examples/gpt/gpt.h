/* examples/gpt/gpt.h — the ferry-gpt example's contracts: the model config
 * (GPT-2 and Llama families from a Hugging Face config.json), the parameter
 * schema and the parameter provider the model reads its weights and writes
 * its gradients through (the model owns no parameter byte), the resident
 * and engine providers, the CPU model, the tokenizer, the data loader and
 * the pre-engine AdamW.
 */
#ifndef FERRY_GPT_H
#define FERRY_GPT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry.h"

/* ---- config ------------------------------------------------------------------ */

typedef enum { GPT_GPT2 = 0, GPT_LLAMA = 1 } gpt_family;

typedef struct {
  gpt_family family;
  int vocab;     /* vocab_size */
  int d_model;   /* n_embd / hidden_size */
  int n_layer;
  int n_head;
  int n_kv_head; /* Llama grouped-query attention; = n_head for GPT-2 */
  int d_ff;      /* 4*d_model (GPT-2 n_inner) / intermediate_size */
  int max_seq;   /* n_positions / max_position_embeddings */
  float norm_eps;
  float rope_theta;
  int tied;      /* lm head shares the token embedding (GPT-2 always) */
} gpt_config;

/* "tiny" (~1M params), "small" (~10M), "gpt2" (124M), "llama-tiny",
 * "llama-small", "llama-1b" (TinyLlama-1.1B's shape, 1.1B), "llama-2-7b"
 * (6.7B), "llama-2-13b" (13.0B): 0, or -1 when unknown. */
int gpt_config_preset(const char *name, gpt_config *out);
/* A Hugging Face config.json (model_type gpt2 or llama). 0, or -1 with a
 * message in err. */
int gpt_config_load_json(const char *path, gpt_config *out, char *err, size_t errlen);
/* The integer `key` (bos_token_id, eos_token_id) of the config.json that
 * --model names (a file, or DIR/config.json), else -1 (a preset, no such
 * key, a file that cannot be read). */
int gpt_config_token_id(const char *model, const char *key);
int gpt_config_check(const gpt_config *c, char *err, size_t errlen);
void gpt_config_describe(const gpt_config *c, char *buf, size_t len);

/* ---- parameters -------------------------------------------------------------
 * One group per block, plus the embeddings (group 0) and the head (group
 * n_layer + 1): the unit a provider (later the engine) fetches and releases.
 * Tensors keep Hugging Face names and layouts (GPT-2's Conv1D weights are
 * [in, out], Llama's Linear weights [out, in]) so files map byte for byte. */

enum { GPT_MAX_SLOTS = 16 };

typedef struct {
  char name[96];   /* Hugging Face name */
  int ndim;
  int64_t shape[2];
  size_t numel;
  int group, slot; /* slot: index within the group */
  int decay;       /* AdamW weight decay applies (matrices, not biases/norms) */
} gpt_param;

typedef struct {
  gpt_config cfg;
  int n_groups;
  int n_params;
  gpt_param *params;           /* group order, slot order */
  int group_first[2 + 1024];   /* index of a group's first param; [n_groups] = n_params */
  size_t total_numel;
} gpt_schema;

/* Slots of each group. */
enum { G2_WTE = 0, G2_WPE = 1 };
enum {
  G2_LN1_W = 0, G2_LN1_B, G2_QKV_W, G2_QKV_B, G2_ATTO_W, G2_ATTO_B,
  G2_LN2_W, G2_LN2_B, G2_FC_W, G2_FC_B, G2_FCO_W, G2_FCO_B, G2_NSLOT
};
enum { G2_LNF_W = 0, G2_LNF_B = 1 };
enum { LL_EMB = 0 };
enum {
  LL_IN_NORM = 0, LL_Q, LL_K, LL_V, LL_O, LL_POST_NORM, LL_GATE, LL_UP, LL_DOWN, LL_NSLOT
};
enum { LL_NORM = 0, LL_HEAD = 1 };

int gpt_schema_build(const gpt_config *c, gpt_schema *out);
void gpt_schema_free(gpt_schema *s);
static inline int gpt_group_emb(const gpt_schema *s) { (void)s; return 0; }
static inline int gpt_group_block(const gpt_schema *s, int l) { (void)s; return 1 + l; }
static inline int gpt_group_head(const gpt_schema *s) { return s->cfg.n_layer + 1; }
/* The param of that name, or NULL. */
const gpt_param *gpt_schema_find(const gpt_schema *s, const char *name);

/* ---- the parameter provider ----------------------------------------------------
 * How the model sees parameters it does not own. fetch() makes one group's
 * weights readable (w[slot]) and, for GPT_FETCH_BACKWARD, its gradients
 * writable (g[slot]; the model adds into them, so they are zero after the
 * provider's zero_grad); it returns when the pointers may be used. release()
 * says the model is done with the group: GPT_RELEASE_FORWARD (weights no
 * longer needed), GPT_RELEASE_GRADS (this pass added its last contribution
 * to the group's gradients: they may be drained) or GPT_RELEASE_PARTIAL
 * (grads touched but more contributions follow: the tied embedding after the
 * head). GPT_FETCH_WRITE / GPT_RELEASE_WRITTEN bracket init and loading.
 * Several groups may be fetched at once (the tied head reads group 0).
 * The resident provider below keeps everything in host memory; the engine
 * provider (further down) implements the same four callbacks over ferry's
 * tiers. */

typedef enum {
  GPT_FETCH_FORWARD = 0,  /* weights readable */
  GPT_FETCH_BACKWARD = 1, /* weights readable, grads writable */
  GPT_FETCH_WRITE = 2     /* weights writable (init, load) */
} gpt_fetch_mode;
typedef enum {
  GPT_RELEASE_FORWARD = 0,
  GPT_RELEASE_GRADS = 1,
  GPT_RELEASE_PARTIAL = 2,
  GPT_RELEASE_WRITTEN = 3 /* after GPT_FETCH_WRITE: the weights changed */
} gpt_release_mode;

/* One fetched group. w[slot] points at the weights in dtype `wdt`: the
 * pointers keep type float * but hold wdt data (FERRY_DT_F32 from the
 * resident providers and the engine provider's synchronous mode; the
 * params' own FERRY_DT_BF16 / F16 / F32 from its stream mode); a model
 * reads them as that dtype (the CPU model requires F32 and refuses others).
 * g[slot] are always fp32 accumulators the model adds into. */
typedef struct {
  float *w[GPT_MAX_SLOTS];
  float *g[GPT_MAX_SLOTS];
  ferry_dtype wdt;
} gpt_group_view;

typedef struct gpt_provider {
  void *ctx;
  int (*fetch)(void *ctx, int group, gpt_fetch_mode mode, gpt_group_view *out);
  int (*release)(void *ctx, int group, gpt_release_mode mode);
  int (*zero_grad)(void *ctx);
  const char *(*last_error)(void *ctx);
} gpt_provider;

/* The resident provider: one fp32 allocation for all weights and one for
 * all gradients, tensors pointed into them (schema order). */
typedef struct {
  const gpt_schema *schema;
  float *weights, *grads;
  size_t *offset; /* per param, into weights/grads */
  int *fetched;   /* per group: fetch count, to catch unbalanced use */
  char err[256];
} gpt_resident;

int gpt_resident_init(gpt_resident *r, const gpt_schema *s);
void gpt_resident_free(gpt_resident *r);
gpt_provider gpt_resident_provider(gpt_resident *r);
/* The param's weight / grad pointer (the resident store only). */
float *gpt_resident_w(gpt_resident *r, int param);
float *gpt_resident_g(gpt_resident *r, int param);

/* ---- weights: init, load, save ------------------------------------------------ */

/* GPT-2 style init (normal 0.02, residual projections 0.02/sqrt(2L), norms
 * 1, biases 0), from `seed`, written through the provider. Value k of
 * tensor i depends on (seed, i, k) only (init.c, gpt_init.h). */
int gpt_weights_init(const gpt_schema *s, gpt_provider *p, uint64_t seed);
/* Loads a safetensors file or model folder (sharded too) with Hugging Face
 * names ("transformer." and "model." prefixes and an lm_head tied to the
 * embedding accepted); F32, F16 and BF16 converted to fp32. A missing
 * tensor, a wrong shape or dtype: -1 and a message naming the tensor. */
int gpt_weights_load(const gpt_schema *s, gpt_provider *p, const char *path, char *err,
                     size_t errlen);
/* Saves the weights as fp32 safetensors (Hugging Face names, metadata
 * format=pt); max_shard > 0 writes a folder with shards and an index. */
int gpt_weights_save(const gpt_schema *s, gpt_provider *p, const char *path, uint64_t max_shard,
                     char *err, size_t errlen);

/* A per-tensor source of initial values: random init from `seed` (path
 * NULL, the values gpt_weights_init writes) or a safetensors file or
 * folder, checked whole at open as gpt_weights_load does. fill() writes
 * param i's fp32 values: what the engine's init callback calls, so no
 * second full copy of the model is ever held. */
/* The tensors of the safetensors file or folder at path that the model
 * does not use (a sixth block for five, lm_head.weight with a tied head, a
 * buffer): how many (-1 when it cannot be opened, the reason in err), the
 * first 8 named in list ('a', 'b' and N more). */
int gpt_weights_unused(const gpt_schema *s, const char *path, char *list, size_t cap, char *err,
                       size_t errlen);
typedef struct gpt_weights_src gpt_weights_src;
int gpt_weights_src_open(const gpt_schema *s, const char *path, uint64_t seed,
                         gpt_weights_src **out, char *err, size_t errlen);
/* fill: -1 with "interrupted" in err once gpt_cancelled() says so */
int gpt_weights_src_fill(gpt_weights_src *w, int param, float *dst, char *err, size_t errlen);
/* What the set-up's long loops poll (the seeded init, fill): once
 * cancelled() returns non-zero they stop early and fail. NULL (the
 * default): never. Set before any thread reads it (init.c). */
void gpt_set_cancel(int (*cancelled)(void));
int gpt_cancelled(void);
void gpt_weights_src_close(gpt_weights_src *w);
/* Saves as gpt_weights_save does, each tensor read (fp32, numel values) by
 * read(user, param index, dst) into a buffer of the largest tensor. */
typedef int (*gpt_weights_read_fn)(void *user, int param, float *dst);
int gpt_weights_save_with(const gpt_schema *s, gpt_weights_read_fn read, void *user,
                          const char *path, uint64_t max_shard, char *err, size_t errlen);

/* ---- 16-bit conversions (convert.c): round to nearest even ---------------------- */
float gpt_f16_to_f32(uint16_t h);
float gpt_bf16_to_f32(uint16_t h);
uint16_t gpt_f32_to_f16(float f);
uint16_t gpt_f32_to_bf16(float f);

/* ---- the engine provider (provider_engine.c) ------------------------------------
 * The parameter provider over a ferry engine: every tensor of the schema is
 * registered with its group (0 = embeddings, 1..L = blocks, L+1 = head) and
 * its initial values come from a gpt_weights_src through the init callback
 * at finalize. fetch = ferry_fetch (+ ferry_param_device), release =
 * ferry_release, GPT_RELEASE_GRADS = ferry_grads_ready first (once per group
 * per micro-batch; GPT_RELEASE_PARTIAL hands nothing in). Two modes:
 *
 * GPT_ENGINE_SYNC, for the CPU model (fp32, on the caller's thread, over
 * the emulated device only): the provider synchronizes its stream after
 * every fetch. With precision.params = fp32 the views are the engine's
 * device buffers; with bf16 / fp16 the provider converts a group's params
 * into an fp32 host scratch and, at GPT_RELEASE_GRADS, its fp32 grads back
 * into the engine's grad buffers (times the loss scale). Views: wdt F32.
 *
 * GPT_ENGINE_STREAM, for models that compute in the order of the
 * provider's stream (the CUDA model, which launches on its native stream;
 * tests/gpt/test_stream.c on the host backend): no call waits for the
 * device. fetch enqueues the engine's fetch on the stream and hands out
 * the engine's param buffers in their own dtype (view wdt = the params'
 * dtype); the grads are fp32 accumulators in device memory, zeroed in
 * stream order at a group's first backward fetch; GPT_RELEASE_GRADS
 * enqueues the conversion of each tensor into the engine's grad buffer
 * (ferry_convert_async, times the loss scale), then ferry_grads_ready and
 * ferry_release, all on the stream.
 *
 * In both modes the fp32 grads sit in two slots, one for the embedding
 * group (its grads stay open from the tied head to the end of backward) and
 * one for every other group, each sized for its largest group (stream
 * mode: always; sync mode: 16-bit params only). A slot is handed to the
 * next group only once its owner's grads were released; in stream mode the
 * next group's zeroing is enqueued after the owner's conversion on the same
 * stream, so the device never clears a slot before it was read. In stream
 * mode the slots and the model's activations and workspace are one block
 * reserved out of tiers.gpu.budget (ferry_engine_reserve): [model bytes |
 * embedding slot | other slot], each part 256-aligned. */
typedef struct gpt_engine gpt_engine;

typedef enum { GPT_ENGINE_SYNC = 0, GPT_ENGINE_STREAM = 1 } gpt_engine_mode;

typedef struct {
  gpt_engine_mode mode;
  size_t model_bytes; /* stream mode: device bytes the model wants from the reserved block */
  ferry_comm *comm;   /* data parallel: the ranks (ferry_engine_set_comm before finalize;
                         it must outlive the engine); NULL: alone */
} gpt_engine_options;

/* Creates the engine from cfg (the caller keeps cfg), registers the schema,
 * fills it from src and finalizes. dev: NULL = the engine makes one (the
 * config's device). opt: NULL = GPT_ENGINE_SYNC. Sync mode refuses a
 * device that is not the emulated one. On failure err names the step and
 * the ferry status (e.g. "FERRY_ENODEV"). */
int gpt_engine_create(const gpt_schema *s, const ferry_config *cfg, ferry_device *dev,
                      gpt_weights_src *src, const gpt_engine_options *opt, gpt_engine **out,
                      char *err, size_t errlen);
void gpt_engine_free(gpt_engine *ge);
gpt_provider gpt_engine_provider(gpt_engine *ge);
ferry_engine *gpt_engine_handle(gpt_engine *ge);
/* The dtype of the config's precision.params (F32, F16 or BF16), or
 * FERRY_DT_NONE when the key cannot be read. */
ferry_dtype gpt_engine_config_dtype(const ferry_config *cfg);
/* The dtype of the engine's params (F32, F16 or BF16). */
ferry_dtype gpt_engine_dtype(const gpt_engine *ge);
/* The provider's stream: the model launches its work on it (stream mode). */
ferry_stream *gpt_engine_stream(gpt_engine *ge);
/* Stream mode: the model's part of the reserved block (device memory,
 * 256-aligned, model_bytes long); NULL and 0 in sync mode or when
 * model_bytes was 0. */
void gpt_engine_model_memory(gpt_engine *ge, void **base, size_t *bytes);
/* Micro-batches per ferry_step (the config's grad_accumulation). */
int gpt_engine_micro_batches(const gpt_engine *ge);
/* ferry_step, and the fp32 scratch no longer mirrors the params. */
int gpt_engine_step(gpt_engine *ge, ferry_step_info *info);
/* Param i's fp32 master values (ferry_param_read); a gpt_weights_read_fn. */
int gpt_engine_read(void *ge, int param, float *dst);
/* Bytes of fp32 scratch the provider holds: host memory in sync mode,
 * device memory (the grad slots, inside the reserved block) in stream mode. */
size_t gpt_engine_scratch_bytes(const gpt_engine *ge);
/* ferry_checkpoint_save into dir (made when missing, parents too) keeping
 * the newest `keep` (0 = all); ferry_checkpoint_load of path, after which
 * the fp32 scratch no longer mirrors the params. 0, or the ferry status
 * with the engine's message in err. */
int gpt_engine_save(gpt_engine *ge, const char *dir, const void *blob, size_t len, int keep,
                    char *err, size_t errlen);
int gpt_engine_load(gpt_engine *ge, const char *path, void *blob, size_t cap, size_t *len,
                    char *err, size_t errlen);

/* ---- the CPU model --------------------------------------------------------------- */

typedef struct gpt_model gpt_model;

/* Threads: the GEMMs (over 90% of a step) run on OpenBLAS's threads
 * (OPENBLAS_NUM_THREADS or ferry-gpt --threads); the other kernels are
 * single-threaded loops. */
typedef struct {
  int batch, seq;
  int checkpoint; /* 1: keep only block inputs, recompute each block in backward */
  /* The CUDA model's chunks (0: its defaults, plan/gpt_layout.h): tokens a
   * block's pass aims for per chunk of whole sequences, tokens per chunk of
   * the loss. Tests set them small to run the chunked paths. */
  int chunk_tokens, loss_chunk_tokens;
} gpt_run_config;

int gpt_model_create(const gpt_schema *s, const gpt_run_config *rc, gpt_model **out);
void gpt_model_free(gpt_model *m);
const char *gpt_model_last_error(const gpt_model *m);
/* tokens, targets: batch*seq ids. targets may be NULL (no loss). Returns 0
 * and *loss (mean cross-entropy) when targets are given. */
int gpt_model_forward(gpt_model *m, gpt_provider *p, const int32_t *tokens,
                      const int32_t *targets, float *loss);
/* After a forward with targets: adds d(loss)/d(param) into the provider's
 * gradients. */
int gpt_model_backward(gpt_model *m, gpt_provider *p);
/* The logits of the last forward: [batch*seq, vocab]. */
const float *gpt_model_logits(const gpt_model *m);
/* Bytes of activations and scratch the model holds. */
size_t gpt_model_activation_bytes(const gpt_model *m);

/* The incremental forward for sampling (model_cpu.c): each layer's keys and
 * values stay cached for the positions seen, so a new token costs one row
 * of work (plus its attention over the cache), not the whole window again.
 * The logits equal gpt_model_forward's at every position up to summation
 * order. A call takes 1 to gpt_kv_max_rows() new tokens (a longer prompt
 * goes in several calls); positions run from 0 to max_pos - 1 (max_pos <=
 * cfg.max_seq); gpt_kv_reset starts over. */
enum { GPT_KV_ROWS = 64 }; /* rows of scratch: the most tokens one call takes */
typedef struct gpt_kv gpt_kv;
int gpt_kv_create(const gpt_schema *s, int max_pos, gpt_kv **out);
void gpt_kv_free(gpt_kv *kv);
void gpt_kv_reset(gpt_kv *kv);
int gpt_kv_forward(gpt_kv *kv, gpt_provider *p, const int32_t *tokens, int n);
const float *gpt_kv_logits(const gpt_kv *kv); /* [rows, vocab] of the last call */
int gpt_kv_rows(const gpt_kv *kv);           /* n of the last call */
int gpt_kv_pos(const gpt_kv *kv);             /* positions seen */
int gpt_kv_max_pos(const gpt_kv *kv);
int gpt_kv_max_rows(const gpt_kv *kv);
const char *gpt_kv_last_error(const gpt_kv *kv);
size_t gpt_kv_bytes(const gpt_kv *kv); /* the cache and the scratch */

/* The sampler (sampler.c): the next id from a row of logits. */
typedef struct {
  float temperature; /* 0: the most likely id (greedy) */
  int top_k;         /* keep the k most likely ids (0: all) */
  float top_p;       /* then the fewest whose probability reaches p (1: all) */
} gpt_sampling;
typedef struct gpt_sampler gpt_sampler;
/* -1 on a bad option (temperature < 0, top_k < 0, top_p outside (0, 1]) or
 * no memory. Without a cut (top_k 0, top_p 1) the draw is the plain softmax
 * walk in id order. */
int gpt_sampler_create(int vocab, const gpt_sampling *o, uint64_t seed, gpt_sampler **out);
int gpt_sampler_pick(gpt_sampler *s, const float *logits);
void gpt_sampler_free(gpt_sampler *s);

/* ---- the pre-engine optimizer ------------------------------------------------------ */
/* A plain AdamW over the resident provider (torch.optim.AdamW's math):
 * used by `ferry-gpt train` without --engine (the engine owns the step there). */
typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  float *m, *v;
  int64_t step;
} gpt_adamw;

int gpt_adamw_init(gpt_adamw *a, size_t n, float lr, float weight_decay);
void gpt_adamw_free(gpt_adamw *a);
void gpt_adamw_step(gpt_adamw *a, gpt_resident *r);

/* ---- tokenizer ------------------------------------------------------------------------ */

typedef struct gpt_tokenizer gpt_tokenizer;

/* Byte-level (256 ids, one per byte). */
int gpt_tokenizer_bytes(gpt_tokenizer **out);
/* GPT-2 BPE from vocab.json and merges.txt. */
int gpt_tokenizer_bpe(const char *vocab_json, const char *merges_txt, gpt_tokenizer **out,
                      char *err, size_t errlen);
void gpt_tokenizer_free(gpt_tokenizer *t);
int gpt_tokenizer_vocab(const gpt_tokenizer *t);
/* Appends the ids of text[0..len) to *ids (realloc'd, *n updated). */
int gpt_tokenizer_encode(const gpt_tokenizer *t, const char *text, size_t len, int32_t **ids,
                         size_t *n, size_t *cap);
/* Appends the bytes of one id to buf; returns the number of bytes (0 for an
 * unknown id). */
size_t gpt_tokenizer_decode(const gpt_tokenizer *t, int32_t id, char *buf, size_t cap);
/* A Hugging Face tokenizer.json (byte-level or SentencePiece-style BPE). */
int gpt_tokenizer_json(const char *path, gpt_tokenizer **out, char *err, size_t errlen);
/* What a --tokenizer path names: a tokenizer.json file, or a folder with
 * tokenizer.json (read first) or vocab.json + merges.txt. */
int gpt_tokenizer_load(const char *path, gpt_tokenizer **out, char *err, size_t errlen);
/* gpt_tokenizer_encode with a reason on failure; special: the tokens the
 * tokenizer puts around a text (a tokenizer.json's post_processor: bos, eos). */
int gpt_tokenizer_encode_text(const gpt_tokenizer *t, const char *text, size_t len, int special,
                              int32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen);
/* The text of ids in a fresh NUL-terminated *out (a tokenizer.json's
 * decoders run over the whole list); skip_special leaves out special tokens. */
int gpt_tokenizer_decode_text(const gpt_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              char **out, size_t *len);
/* The id of a token (its text as the vocabulary or added tokens spell it), or -1. */
int gpt_tokenizer_id(const gpt_tokenizer *t, const char *token);

/* ---- data --------------------------------------------------------------------------------- */

typedef struct {
  int32_t *tokens;
  size_t n;
  uint64_t rng;
} gpt_data;

/* A text file (encoded with tok), or a raw token file when the name ends in
 * .u16/.bin (uint16) or .u32 (uint32). Every id must be below `vocab`. */
int gpt_data_load(gpt_data *d, const char *path, const gpt_tokenizer *tok, int vocab,
                  uint64_t seed, char *err, size_t errlen);
/* flags GPT_DATA_STREAM: a path that is not a regular file (a pipe, a
 * character device) is read to its end, at most half the machine's memory
 * (beyond: refused as out of memory, naming how much was read); without it
 * such a path is refused (--data /dev/zero would never end). A regular file
 * is mapped, never copied. */
enum { GPT_DATA_STREAM = 1 };
int gpt_data_load_ex(gpt_data *d, const char *path, const gpt_tokenizer *tok, int vocab,
                     uint64_t seed, int flags, char *err, size_t errlen);
void gpt_data_free(gpt_data *d);
/* batch windows of seq+1 tokens at seeded random offsets: inputs and the
 * next-token targets. */
int gpt_data_batch(gpt_data *d, int batch, int seq, int32_t *tokens, int32_t *targets);
/* Data parallel: rank's share of a global batch of nranks * batch windows.
 * The generator draws all nranks * batch offsets (every rank's generator
 * moves the same), and this rank keeps windows [rank * batch, (rank + 1) *
 * batch): nranks ranks at `batch` see exactly the windows one rank sees at
 * nranks * batch, and every rank's d->rng stays equal. */
int gpt_data_batch_rank(gpt_data *d, int batch, int seq, int rank, int nranks, int32_t *tokens,
                        int32_t *targets);

/* splitmix64: the one RNG of the example (init, data). */
static inline uint64_t gpt_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ---- exact resume (resume.c) ----------------------------------------------------------
 * `ferry-gpt train --engine --save-every N` puts this fixed-layout struct
 * (native byte order, no padding) into each engine checkpoint as its blob
 * (user.bin): with the engine's own state (params, masters, optimizer
 * states, step count, loss scaler) it is everything the next step needs, so
 * a resumed run is bit-identical to an uninterrupted one. The fingerprint
 * (num[], engine[]) must equal the resuming run's, or the resume is refused
 * naming every difference. A change of layout or meaning bumps the version. */
#define GPT_RESUME_MAGIC 0x3153455254504746ull /* "FGPTRES1" in little-endian bytes */
#define GPT_RESUME_VERSION 1u
#define GPT_RESUME_SUBDIR "checkpoints"        /* under --save DIR */
enum {
  GPT_RS_SEED = 0, GPT_RS_FAMILY, GPT_RS_VOCAB, GPT_RS_D_MODEL, GPT_RS_N_LAYER, GPT_RS_N_HEAD,
  GPT_RS_N_KV_HEAD, GPT_RS_D_FF, GPT_RS_MAX_SEQ, GPT_RS_NORM_EPS, GPT_RS_ROPE_THETA,
  GPT_RS_TIED, GPT_RS_BATCH, GPT_RS_SEQ, GPT_RS_DATA_BYTES, GPT_RS_DATA_TOKENS,
  GPT_RS_DATA_HASH, GPT_RS_TOK_VOCAB, GPT_RS_TOK_HASH,
  GPT_RESUME_NUM = 20 /* one spare, zero */
};
enum { GPT_RESUME_KEYS = 13, GPT_RESUME_KEYLEN = 64 };
typedef struct {
  uint64_t magic;    /* GPT_RESUME_MAGIC */
  uint32_t version;  /* GPT_RESUME_VERSION */
  uint32_t size;     /* sizeof(gpt_resume_state) */
  int64_t next_step; /* the first step a resumed run takes (steps done + 1) */
  uint64_t data_rng; /* the batch sampler's state (gpt_data.rng) after steps done */
  int64_t num[GPT_RESUME_NUM]; /* seed, model config (floats as bits), the global batch
                                  (--batch x ranks), seq, data size,
                                  tokens and FNV-1a hash, tokenizer ids and hash (GPT_RS_*) */
  char data_name[128];         /* the data file's name, for messages only */
  char engine[GPT_RESUME_KEYS][GPT_RESUME_KEYLEN]; /* values of the engine keys that change
                                                      the numbers (resume.c lists them) */
} gpt_resume_state;

/* This run's state at step 0 (next_step 0 and data_rng 0: the caller sets
 * them before a save). fc: the final engine config. 0, or -1 and err. */
int gpt_resume_fingerprint(gpt_resume_state *r, const gpt_config *c, int batch, int seq,
                           uint64_t seed, const char *data_path, const gpt_data *d,
                           const gpt_tokenizer *tok, const ferry_config *fc, char *err,
                           size_t errlen);
/* Checks a checkpoint's blob (len bytes) against `now`: size, magic,
 * version, then every fingerprint field. 0 and *out (may be NULL); -1 for
 * a blob that is not a resume state of this version; -2 when settings
 * differ, every difference named in err. */
int gpt_resume_check(const void *blob, size_t len, const gpt_resume_state *now,
                     gpt_resume_state *out, char *err, size_t errlen);
/* Compares two runs' fingerprints (num[], engine[]; not next_step nor
 * data_rng), naming each field that differs as "WHAT: A_NAME a, B_NAME b"
 * in err ("" when none). Returns the number of differences. */
int gpt_resume_compare(const gpt_resume_state *a, const char *a_name, const gpt_resume_state *b,
                       const char *b_name, char *err, size_t errlen);
/* The checkpoint `dir` names: a step-<digits> folder itself, else the
 * newest complete step-* (one with a manifest) of dir/checkpoints (a --save
 * folder) or of dir; newer step-* folders without a manifest (empty, or
 * left by an interrupted copy) are skipped and named in note ("" when
 * none). 0 with the folder and its step, or -1 and err (missing, not a
 * folder, none there, none complete). */
int gpt_resume_find(const char *dir, char *folder, size_t cap, int64_t *step, char *note,
                    size_t notelen, char *err, size_t errlen);
/* Reads folder/user.bin (the blob) before the engine load, so settings that
 * differ are named before the engine compares tensors; its size and CRC32C
 * are checked against the manifest first (ferry_checkpoint_read_blob), so a
 * damaged file is FERRY_ECORRUPT (the reason in ferry_last_error()), never
 * read as a version or a setting. 0, or the FERRY_E* status; *len > cap
 * when it is larger than cap (nothing copied). */
int gpt_resume_peek(const char *folder, void *blob, size_t cap, size_t *len);

#endif
