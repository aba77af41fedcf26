/* examples/gpt/train_setup.c — a `train` run up to its first step: the
 * model's config and tokenizer, the engine config (file, flags, --set),
 * the data, the engine or the resident weights, a checkpoint to resume
 * from, the model (CPU or CUDA); and train_free, which frees all of it
 * wherever the run stopped.
 */
#include "app.h"

#include "core/par.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void load_model_config(const char *model, gpt_config *cfg) {
  char err[512];
  if (gpt_config_preset(model, cfg) == 0) return;
  struct stat st;
  if (stat(model, &st) != 0) {
    errf("--model '%s' is neither a preset (tiny, small, gpt2, llama-tiny, "
         "llama-small, llama-1b, llama-2-7b, llama-2-13b) nor a file\n",
         model);
    exit(2);
  }
  char path[4096];
  if (S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%.4000s/config.json", model);
  else snprintf(path, sizeof path, "%.4000s", model);
  if (gpt_config_load_json(path, cfg, err, sizeof err)) {
    errf("%s\n", err);
    exit(1);
  }
}

/* 1 when path/name exists (a stat only: the readers open it, with their checks). */
static int has_file(const char *path, const char *name) {
  char b[4200];
  struct stat st;
  snprintf(b, sizeof b, "%.4000s/%s", path, name);
  return stat(b, &st) == 0;
}

void model_dir_defaults(const char *model, const char **weights, const char **tokdir) {
  struct stat st;
  if (!model || gpt_config_preset(model, &(gpt_config){0}) == 0 || stat(model, &st) ||
      !S_ISDIR(st.st_mode))
    return;
  if (!*weights && (has_file(model, "model.safetensors") ||
                    has_file(model, "model.safetensors.index.json")))
    *weights = model; /* read as --weights DIR reads a folder */
  if (!*tokdir && (has_file(model, "tokenizer.json") ||
                   (has_file(model, "vocab.json") && has_file(model, "merges.txt"))))
    *tokdir = model; /* read as --tokenizer DIR reads a folder */
}

gpt_tokenizer *load_tokenizer(const char *dir) {
  gpt_tokenizer *t;
  if (!dir) {
    if (gpt_tokenizer_bytes(&t)) exit(1);
    return t;
  }
  char err[512];
  if (gpt_tokenizer_load(dir, &t, err, sizeof err)) {
    errf("tokenizer: %s\n", err);
    exit(1);
  }
  return t;
}

/* mkdir -p; 0 when the directory exists at the end. */
static int make_dirs(const char *path) {
  char b[4096];
  if (snprintf(b, sizeof b, "%s", path) >= (int)sizeof b) return -1;
  for (char *q = b + 1; *q; q++) {
    if (*q != '/') continue;
    *q = '\0';
    if (mkdir(b, 0777) && errno != EEXIST) return -1;
    *q = '/';
  }
  if (mkdir(b, 0777) && errno != EEXIST) return -1;
  struct stat st;
  return stat(b, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* --device cuda --engine: the engine's device is cuda whatever the config
 * says ("host", "auto"), and its host pool is pinned (the cuda backend
 * refuses a pageable one: its copies would be synchronous), each with a
 * note when that changes the config. */
static int engine_device_cuda(ferry_config *fc, const char *file, FILE *info) {
  char dev[32] = "", pin[16] = "";
  ferry_config_get(fc, "device", dev, sizeof dev);
  ferry_config_get(fc, "tiers.host.pinned", pin, sizeof pin);
  if (strcmp(pin, "true")) {
    fprintf(info, "ferry-gpt: note: --device cuda: tiers.host.pinned = true (%s says %s)\n",
            file, pin);
    if (ferry_config_set(fc, "tiers.host.pinned", "true")) return -1;
  }
  if (!strcmp(dev, "cuda")) return 0;
  fprintf(info, "ferry-gpt: note: --device cuda: the engine's device is cuda (%s says "
          "device = \"%s\")\n", file, dev);
  return ferry_config_set(fc, "device", "cuda");
}

/* The engine configuration: the file, then --lr / --weight-decay when
 * given, then each --set; --device cuda makes the device cuda; the NVMe
 * directories made when missing. *usage: 1 when the refusal is of a flag's
 * value (bad usage, exit 2). */
static ferry_config *engine_config(const train_opts *o, FILE *info, int *usage) {
  ferry_config *fc;
  if (ferry_config_create(&fc)) {
    errf("%s\n", ferry_last_error());
    return NULL;
  }
  if (ferry_config_load_file(fc, o->engine)) {
    errf("%s\n", ferry_config_last_error(fc));
    goto fail;
  }
  char v[4096];
  if (o->lr_given) {
    snprintf(v, sizeof v, "%.17g", o->lr); /* every bit of the double */
    if (ferry_config_set(fc, "optimizer.lr", v)) goto bad_flag;
  }
  if (o->wd_given) {
    snprintf(v, sizeof v, "%.17g", o->wd);
    if (ferry_config_set(fc, "optimizer.weight_decay", v)) goto bad_flag;
  }
  for (int i = 0; i < o->nset; i++) {
    char key[256];
    const char *eq = strchr(o->set[i], '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - o->set[i]), o->set[i]);
    if (ferry_config_set(fc, key, eq + 1)) goto bad_set;
  }
  if (o->cuda && engine_device_cuda(fc, o->engine, info)) goto bad_set;
  if (ferry_config_get(fc, "tiers.nvme.paths", v, sizeof v) == 0 && v[0]) {
    for (char *p = v, *next; p && *p; p = next) {
      next = strchr(p, ',');
      if (next) *next++ = '\0';
      while (*p == ' ') p++;
      struct stat st;
      if (stat(p, &st) == 0) continue;
      if (make_dirs(p)) {
        errf("cannot create the NVMe swap directory '%s' "
             "(tiers.nvme.paths in %s): %s\n",
             p, o->engine, strerror(errno));
        goto fail;
      }
      fprintf(info, "ferry-gpt: created the NVMe swap directory %s (tiers.nvme.paths)\n", p);
    }
  }
  return fc;
bad_flag: /* --lr / --weight-decay out of the config's range: bad usage */
  errf("%s (from the command line: --lr %s, --weight-decay %s)\n", ferry_config_last_error(fc),
       o->lr_given ? o->lr_text : "not given", o->wd_given ? o->wd_text : "not given");
  *usage = 1;
  goto fail;
bad_set:
  errf("%s\n", ferry_config_last_error(fc));
fail:
  ferry_config_destroy(fc);
  return NULL;
}

void train_free(train_run *t) {
  gpt_model_free(t->m);
  /* the resident weights (cudaFree waits for the device), then the model
   * (it waits for its stream, the engine's with --engine), then the engine */
  if (t->cu) {
    if (t->cr.schema) t->cu->resident_free(&t->cr);
    t->cu->model_free(t->cm);
    if (t->pinned) t->cu->host_unregister(t->r.weights), t->cu->host_unregister(t->r.grads);
  }
  gpt_engine_free(t->ge);
  if (t->fc) ferry_config_destroy(t->fc);
  gpt_adamw_free(&t->opt);
  gpt_resident_free(&t->r);
  gpt_data_free(&t->d);
  gpt_tokenizer_free(t->tok);
  gpt_schema_free(&t->s);
  free(t->rank_figs);
}

/* --threads, where notes go, and for --device cuda the CUDA model's module
 * (only then: a CPU run maps no cuBLAS) and whether it can run (with
 * --engine the engine's device creation says so, with the runtime's own
 * message). */
int train_check_device(train_run *t) {
  if (t->o.threads) openblas_set_num_threads(t->o.threads);
  t->info = t->o.json ? stderr : stdout;
  if (train_address_space(t)) return 1;
  if (!t->o.cuda) return 0;
  char why[2048];
  if (gpt_cuda_load(&t->cu, why, sizeof why)) {
    errf("--device cuda: cannot load the CUDA model: %s\n", why);
    return 1;
  }
  if (!t->o.engine && t->cu->available(why, sizeof why)) {
    errf("--device cuda: %s\n", why);
    return 1;
  }
  return 0;
}

/* The logger at --log-level, else the engine config's log_level when it
 * says more than "silent" (its default), else warnings. */
void train_logger(const train_run *t) {
  int level = t->o.log_level;
  char v[32];
  if (level < 0 && t->fc && ferry_config_get(t->fc, "log_level", v, sizeof v) == 0)
    level = log_level_of(v);
  if (level <= FERRY_LOG_SILENT && t->o.log_level < 0) level = FERRY_LOG_WARN;
  ferry_log_set(gpt_log, (void *)(g_rank_prefix[0] ? g_rank_prefix : ""), level);
}

/* --weights: the tensors the model does not use are named (a warning), or
 * with --strict-weights refused; they are never loaded either way. */
static int train_check_unused(train_run *t) {
  char list[1024];
  int n = gpt_weights_unused(&t->s, t->o.weights, list, sizeof list, t->err, sizeof t->err);
  if (n < 0) {
    errf("%s\n", t->err);
    return 1;
  }
  if (n == 0) return 0;
  errf("%s: --weights %s holds %d tensor%s the model does not use: %s%s\n",
       t->o.strict_weights ? "refused (--strict-weights)" : "warning", t->o.weights, n,
       n > 1 ? "s" : "", list,
       t->o.strict_weights ? "" : " (ignored; --strict-weights refuses them)");
  return t->o.strict_weights;
}

/* The engine config, the model's shape, the tokenizer and the data. */
int train_load(train_run *t) {
  if (t->o.engine) {
    int usage = 0;
    if (!(t->fc = engine_config(&t->o, t->info, &usage))) return usage ? 2 : 1;
    train_logger(t);
  } else {
    fprintf(t->info, "ferry-gpt: note: no --engine: pre-engine path (all parameters resident in "
            "host memory, plain AdamW)\n");
  }
  load_model_config(t->o.model, &t->cfg);
  t->seq = t->o.seq;
  if (!t->seq) t->seq = t->cfg.max_seq < 128 ? t->cfg.max_seq : 128;
  if (t->seq > t->cfg.max_seq) {
    errf("--seq %d is more than the model's %d positions\n", t->seq, t->cfg.max_seq);
    return 2;
  }
  t->tok = load_tokenizer(t->o.tokdir);
  if (gpt_tokenizer_vocab(t->tok) > t->cfg.vocab) {
    errf("the tokenizer has %d ids but the model only %d\n", gpt_tokenizer_vocab(t->tok),
         t->cfg.vocab);
    return 1;
  }
  if (gpt_schema_build(&t->cfg, &t->s)) {
    errf("cannot build the model\n");
    return 1;
  }
  if (t->o.weights && !t->o.resume && train_check_unused(t)) return 1;
  if (gpt_data_load_ex(&t->d, t->o.data, t->tok, t->cfg.vocab, t->o.seed,
                       t->o.data_stream ? GPT_DATA_STREAM : 0, t->err, sizeof t->err)) {
    errf("%s\n", t->err);
    return 1;
  }
  if (t->d.n < (size_t)t->seq + 1) {
    errf("%s holds %zu tokens, fewer than --seq + 1 = %d\n", t->o.data, t->d.n, t->seq + 1);
    return 1;
  }
  return 0;
}

/* --resume, before the engine is built: find the checkpoint and check its
 * trainer state, so settings that differ are named before any tensor is
 * read. */
static int train_resume_find(train_run *t) {
  char note[1024];
  if (gpt_resume_find(t->o.resume, t->ck_folder, sizeof t->ck_folder, &t->ck_step, note,
                      sizeof note, t->err, sizeof t->err)) {
    errf("--resume: %s\n", t->err);
    return 1;
  }
  if (note[0]) errf("warning: --resume: %s\n", note);
  if (t->o.steps < t->ck_step) { /* every rank sees the same folder: refused alike */
    t->agreed = 1;
    errf("--resume %s: the checkpoint is at step %lld, past --steps %d: nothing to resume "
         "(--steps is the total, checkpointed steps included; pass --steps %lld or more)\n",
         t->ck_folder, (long long)t->ck_step, t->o.steps, (long long)t->ck_step + 1);
    return 2;
  }
  static unsigned char peek[sizeof(gpt_resume_state)];
  size_t plen;
  int crc = gpt_resume_peek(t->ck_folder, peek, sizeof peek, &plen);
  if (crc) { /* checked before it is read: damage is named as damage */
    errf("--resume %s: %s%s\n", t->ck_folder, ferry_last_error(),
         crc == FERRY_ECORRUPT ? " (the checkpoint is corrupt: resume from an older one, "
                                 "or check the disk)" : "");
    return 1;
  }
  if ((crc = gpt_resume_check(peek, plen, &t->rs, NULL, t->err, sizeof t->err))) {
    /* other settings on the command line: bad usage; a foreign blob: runtime */
    errf("--resume %s: %s\n", t->ck_folder, t->err);
    return crc == -2 ? 2 : 1;
  }
  if (t->o.weights)
    fprintf(t->info, "ferry-gpt: note: --resume: the weights come from the checkpoint, not "
            "--weights %s\n", t->o.weights);
  return 0;
}

/* --resume, once the engine is built: load the checkpoint into it and take
 * the next step and the sampler's state from its trainer state. */
static int train_resume_load(train_run *t) {
  static unsigned char blob[sizeof(gpt_resume_state)];
  size_t blen = 0;
  gpt_resume_state got;
  int lrc = gpt_engine_load(t->ge, t->ck_folder, blob, sizeof blob, &blen, t->err, sizeof t->err);
  if (lrc == FERRY_EOVERFLOW) {
    errf("--resume %s: its trainer state (user.bin) is %zu bytes, not "
         "the %zu of a ferry-gpt resume state: not a checkpoint of ferry-gpt train\n",
         t->ck_folder, blen, sizeof blob);
    return 1;
  }
  if (lrc) {
    errf("--resume %s: %s\n", t->ck_folder, t->err);
    return 1;
  }
  int crc = gpt_resume_check(blob, blen, &t->rs, &got, t->err, sizeof t->err);
  if (crc) {
    errf("--resume %s: %s\n", t->ck_folder, t->err);
    return crc == -2 ? 2 : 1;
  }
  if (got.next_step != t->ck_step + 1) {
    errf("--resume %s: the folder is step %lld but its trainer state "
         "continues at step %lld: not a checkpoint of ferry-gpt train\n",
         t->ck_folder, (long long)t->ck_step, (long long)got.next_step);
    return 1;
  }
  if (got.next_step > 100000001) {
    errf("--resume %s: step %lld is past the largest --steps\n", t->ck_folder,
         (long long)t->ck_step);
    return 1;
  }
  t->start = (int)got.next_step;
  t->d.rng = got.data_rng;
  if (t->start <= t->o.steps)
    fprintf(t->info, "ferry-gpt: resumed %s: %lld steps done, continuing at step %d of %d\n",
            t->ck_folder, (long long)t->ck_step, t->start, t->o.steps);
  else
    fprintf(t->info, "ferry-gpt: nothing to do: the checkpoint is at step %lld = --steps %d; "
            "no step runs (--save still writes its weights)\n", (long long)t->ck_step,
            t->o.steps);
  return 0;
}

static gpt_run_config run_config(const train_run *t) {
  gpt_run_config rc = {.batch = t->o.batch, .seq = t->seq, .checkpoint = t->o.ckpt};
  return rc;
}

/* --engine: the run's fingerprint, the engine (weights from --weights, the
 * seed or the checkpoint; --device cuda: in stream mode, with the CUDA
 * model's device block reserved) and its provider. */
int train_setup_engine(train_run *t) {
  describe_engine(t->fc, t->info);
  /* the global batch: a checkpoint resumes on another number of ranks that
   * keeps it (2 ranks at --batch 2, 1 rank at --batch 4) */
  if (gpt_resume_fingerprint(&t->rs, &t->cfg, t->o.batch * t->nranks, t->seq, t->o.seed,
                             t->o.data, &t->d,
                             t->tok, t->fc, t->err, sizeof t->err)) {
    errf("%s\n", t->err);
    return 1;
  }
  int rc = train_same_settings(t);
  if (rc) return rc;
  if (t->o.save_every)
    snprintf(t->ck_dir, sizeof t->ck_dir, "%.4000s/" GPT_RESUME_SUBDIR, t->o.save);
  if (t->o.resume && (rc = train_resume_find(t))) return rc;
  gpt_weights_src *src;
  if (gpt_weights_src_open(&t->s, t->o.resume ? NULL : t->o.weights, t->o.seed, &src, t->err,
                           sizeof t->err)) {
    errf("%s\n", t->err);
    return 1;
  }
  gpt_engine_options eo = {GPT_ENGINE_SYNC, 0, t->nranks > 1 ? t->comm : NULL};
  if (t->o.cuda) { /* the CUDA model's block is reserved with the engine's grad slots */
    gpt_cuda_layout_t lay;
    gpt_run_config run = run_config(t);
    eo.mode = GPT_ENGINE_STREAM;
    eo.model_bytes = gpt_cuda_layout(&t->s, &run, gpt_engine_config_dtype(t->fc), &lay);
  }
  rc = gpt_engine_create(&t->s, t->fc, NULL, src, &eo, &t->ge, t->err, sizeof t->err);
  gpt_weights_src_close(src);
  ferry_config_destroy(t->fc);
  t->fc = NULL;
  if (rc) {
    int sig = train_setup_interrupted(t); /* the engine is gone: its swap files with it */
    if (sig) return sig;
    errf("engine (%s): %s\n", t->o.engine, t->err);
    return 1;
  }
  describe_model_states(gpt_engine_handle(t->ge), t->s.total_numel, t->info);
  t->p = gpt_engine_provider(t->ge);
  t->micro = gpt_engine_micro_batches(t->ge);
  return t->o.resume ? train_resume_load(t) : 0;
}

/* Parameters from which the pre-engine --device cuda run initialises the
 * weights on the device and copies them to the host (train_make_cuda):
 * below, the CPU's init and an upload cost milliseconds anyway. */
#define GPT_DEVICE_INIT_MIN ((size_t)1 << 22)

/* Without --engine: weights, grads and AdamW state in host memory. */
int train_setup_resident(train_run *t) {
  if (gpt_resident_init(&t->r, &t->s) ||
      gpt_adamw_init(&t->opt, t->s.total_numel, (float)t->o.lr, (float)t->o.wd)) {
    errf("out of memory for %zu parameters\n", t->s.total_numel);
    return 1;
  }
  t->p = gpt_resident_provider(&t->r);
  t->init_on_device = t->o.cuda && !t->o.weights && t->s.total_numel >= GPT_DEVICE_INIT_MIN;
  int bad = t->o.weights          ? gpt_weights_load(&t->s, &t->p, t->o.weights, t->err, sizeof t->err)
            : t->init_on_device ? 0 /* train_make_cuda */
                                : gpt_weights_init(&t->s, &t->p, t->o.seed);
  int sig = bad ? train_setup_interrupted(t) : 0;
  if (sig) return sig;
  if (bad) errf("%s\n", t->o.weights ? t->err : "the weights' init failed");
  return bad;
}

/* --device cuda: the CUDA model. With --engine in the engine's reserved
 * block, on the provider's stream; without, on its own block and stream,
 * over fp32 weights resident on the device (uploaded from r). */
static int train_make_cuda(train_run *t) {
  gpt_run_config rc = run_config(t);
  if (t->ge) {
    gpt_cuda_mem mem = {NULL, 0, NULL, FERRY_DT_NONE};
    gpt_engine_model_memory(t->ge, &mem.base, &mem.bytes);
    if (ferry_stream_native(gpt_engine_stream(t->ge), &mem.stream) || !mem.stream) {
      errf("--device cuda: the engine's stream has no CUDA stream (is "
           "its device cuda?)\n");
      return 1;
    }
    mem.wdt = gpt_engine_dtype(t->ge);
    t->cp = t->p;
    if (t->cu->model_create(&t->s, &rc, &mem, &t->cm, t->err, sizeof t->err)) {
      errf("--device cuda: %s\n", t->err);
      return 1;
    }
    return 0;
  }
  if (t->cu->model_create(&t->s, &rc, NULL, &t->cm, t->err, sizeof t->err)) {
    errf("--device cuda: %s\n", t->err);
    return 1;
  }
  size_t hb = t->s.total_numel * sizeof(float);
  /* gigabytes: first touched by all threads (calloc's pages are not there
   * yet), so that registering pins pages already there; the weights only
   * when the device writes them (else the CPU's init touched them) */
  if (hb >= FERRY_PAR_MIN_BYTES) {
    if (t->init_on_device) ferry_par_zero(t->r.weights, hb, 0);
    ferry_par_zero(t->r.grads, hb, 0);
  }
  t->pinned = !t->cu->host_register(t->r.weights, hb);
  if (t->pinned && t->cu->host_register(t->r.grads, hb)) {
    t->cu->host_unregister(t->r.weights);
    t->pinned = 0;
  }
  if (!t->pinned)
    fprintf(t->info, "ferry-gpt: note: --device cuda: cannot page-lock the host weights and "
            "grads; their copies each step are synchronous\n");
  if (t->cu->resident_init(&t->cr, &t->s, t->cu->model_stream(t->cm))) {
    errf("--device cuda: out of device memory for the weights (%s)\n", t->cr.err);
    return 1;
  }
  /* the seeded init of a large model on the device, then to the host's
   * copy; else the host's values up */
  if (t->init_on_device ? t->cu->resident_init_weights(&t->cr, t->o.seed, t->r.weights)
                        : t->cu->resident_upload(&t->cr, t->r.weights)) {
    errf("--device cuda: the weights: %s\n", t->cr.err);
    return 1;
  }
  t->cp = t->cu->resident_provider(&t->cr);
  return 0;
}

/* The model (CPU, or the CUDA one), then the line that sizes the run. */
int train_make_model(train_run *t) {
  gpt_run_config rc = run_config(t);
  if (t->o.cuda && train_make_cuda(t)) return 1;
  if (!t->o.cuda && gpt_model_create(&t->s, &rc, &t->m)) {
    errf("out of memory for activations (batch %d, seq %d)\n", t->o.batch, t->seq);
    return 1;
  }
  double act = 0;
  const char *where = "host";
  if (t->cm) act = t->cu->model_bytes(t->cm) / MiB, where = "device";
  if (t->m) act = gpt_model_activation_bytes(t->m) / MiB;
  if (t->ge)
    fprintf(t->info, "ferry-gpt: %zu tokens of data, batch %d x seq %d x %d micro-batches, %d "
            "steps; %s: %.1f MiB of activations and workspace, %.1f MiB of fp32 grad scratch\n",
            t->d.n, t->o.batch, t->seq, t->micro, t->o.steps, where, act,
            gpt_engine_scratch_bytes(t->ge) / MiB);
  else
    fprintf(t->info, "ferry-gpt: %zu tokens of data, batch %d x seq %d, %d steps, lr %g; host: "
            "%.1f MiB of weights+grads+AdamW; %s: %.1f MiB of activations\n",
            t->d.n, t->o.batch, t->seq, t->o.steps, (double)t->o.lr, 16.0 * t->s.total_numel / MiB,
            where, act);
  return 0;
}
