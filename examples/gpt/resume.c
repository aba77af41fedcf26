/* examples/gpt/resume.c — exact resume of `ferry-gpt train --engine`: the
 * trainer's own state that rides in every engine checkpoint (user.bin): the
 * next step, the batch sampler's RNG state and a fingerprint of the run
 * (seed, model config, batch, seq, data, tokenizer, the engine keys that
 * change the numbers), and the search for the newest checkpoint of a
 * folder. Prints nothing: messages go to the caller's buffer.
 */
#include "gpt.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

_Static_assert(sizeof(gpt_resume_state) ==
                   4 * 8 + 8 * GPT_RESUME_NUM + 128 + GPT_RESUME_KEYS * GPT_RESUME_KEYLEN,
               "gpt_resume_state has a fixed layout without padding");
_Static_assert(offsetof(gpt_resume_state, num) == 32, "fixed layout");

/* The fingerprint's numbers, in the order of gpt_resume_state.num. kind:
 * 'i' integer, 'f' the bits of a float, 'x' a 64-bit hash. */
static const struct {
  const char *what;
  char kind;
} k_num[GPT_RESUME_NUM] = {
    [GPT_RS_SEED] = {"--seed", 'i'},
    [GPT_RS_FAMILY] = {"model family (0 gpt2, 1 llama)", 'i'},
    [GPT_RS_VOCAB] = {"model vocab_size", 'i'},
    [GPT_RS_D_MODEL] = {"model hidden size", 'i'},
    [GPT_RS_N_LAYER] = {"model layers", 'i'},
    [GPT_RS_N_HEAD] = {"model attention heads", 'i'},
    [GPT_RS_N_KV_HEAD] = {"model key/value heads", 'i'},
    [GPT_RS_D_FF] = {"model intermediate size", 'i'},
    [GPT_RS_MAX_SEQ] = {"model positions", 'i'},
    [GPT_RS_NORM_EPS] = {"model norm epsilon", 'f'},
    [GPT_RS_ROPE_THETA] = {"model rope_theta", 'f'},
    [GPT_RS_TIED] = {"model tied embeddings", 'i'},
    [GPT_RS_BATCH] = {"the global batch (--batch x ranks)", 'i'},
    [GPT_RS_SEQ] = {"--seq", 'i'},
    [GPT_RS_DATA_BYTES] = {"--data size in bytes", 'i'},
    [GPT_RS_DATA_TOKENS] = {"--data tokens", 'i'},
    [GPT_RS_DATA_HASH] = {"--data token hash", 'x'},
    [GPT_RS_TOK_VOCAB] = {"tokenizer ids (--tokenizer)", 'i'},
    [GPT_RS_TOK_HASH] = {"tokenizer token hash (--tokenizer)", 'x'},
};

/* The engine keys that change the numbers of a step; placement, tiers,
 * chunk size, eviction, prefetch and threads do not (bit-identical on the
 * host backend) and may differ between the saving and the resuming run. */
static const char *const k_keys[GPT_RESUME_KEYS] = {
    "optimizer.type",         "optimizer.lr",           "optimizer.betas",
    "optimizer.eps",          "optimizer.weight_decay", "optimizer.momentum",
    "optimizer.nesterov",     "precision.params",       "precision.loss_scale",
    "precision.growth_interval", "precision.backoff",   "clip_grad_norm",
    "grad_accumulation"};

static uint64_t fnv_step(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static int64_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (int64_t)u;
}

static float bits_float(int64_t v) {
  uint32_t u = (uint32_t)v;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

int gpt_resume_fingerprint(gpt_resume_state *r, const gpt_config *c, int batch, int seq,
                           uint64_t seed, const char *data_path, const gpt_data *d,
                           const gpt_tokenizer *tok, const ferry_config *fc, char *err,
                           size_t el) {
  memset(r, 0, sizeof *r);
  r->magic = GPT_RESUME_MAGIC;
  r->version = GPT_RESUME_VERSION;
  r->size = (uint32_t)sizeof *r;
  int64_t *n = r->num;
  n[GPT_RS_SEED] = (int64_t)seed;
  n[GPT_RS_FAMILY] = c->family;
  n[GPT_RS_VOCAB] = c->vocab;
  n[GPT_RS_D_MODEL] = c->d_model;
  n[GPT_RS_N_LAYER] = c->n_layer;
  n[GPT_RS_N_HEAD] = c->n_head;
  n[GPT_RS_N_KV_HEAD] = c->n_kv_head;
  n[GPT_RS_D_FF] = c->d_ff;
  n[GPT_RS_MAX_SEQ] = c->max_seq;
  n[GPT_RS_NORM_EPS] = float_bits(c->norm_eps);
  n[GPT_RS_ROPE_THETA] = float_bits(c->family == GPT_LLAMA ? c->rope_theta : 0.0f);
  n[GPT_RS_TIED] = c->tied;
  n[GPT_RS_BATCH] = batch;
  n[GPT_RS_SEQ] = seq;
  struct stat st;
  if (stat(data_path, &st)) {
    snprintf(err, el, "%s: %s", data_path, strerror(errno));
    return -1;
  }
  n[GPT_RS_DATA_BYTES] = (int64_t)st.st_size;
  n[GPT_RS_DATA_TOKENS] = (int64_t)d->n;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < d->n; i++) {
    uint32_t v = (uint32_t)d->tokens[i];
    h = fnv_step(h, &v, sizeof v);
  }
  n[GPT_RS_DATA_HASH] = (int64_t)h;
  int V = gpt_tokenizer_vocab(tok);
  n[GPT_RS_TOK_VOCAB] = V;
  h = 1469598103934665603ull;
  for (int id = 0; id < V; id++) {
    char b[1024];
    uint32_t len = (uint32_t)gpt_tokenizer_decode(tok, id, b, sizeof b);
    h = fnv_step(fnv_step(h, &len, sizeof len), b, len);
  }
  n[GPT_RS_TOK_HASH] = (int64_t)h;
  const char *base = strrchr(data_path, '/');
  snprintf(r->data_name, sizeof r->data_name, "%s", base ? base + 1 : data_path);
  for (int k = 0; k < GPT_RESUME_KEYS; k++) {
    char v[GPT_RESUME_KEYLEN];
    if (ferry_config_get(fc, k_keys[k], v, sizeof v)) {
      snprintf(err, el, "engine config: %s: %s", k_keys[k], ferry_config_last_error(fc));
      return -1;
    }
    snprintf(r->engine[k], sizeof r->engine[k], "%s", v);
  }
  return 0;
}

__attribute__((format(printf, 3, 4))) static void append(char *err, size_t el, const char *fmt,
                                                         ...) {
  size_t at = strlen(err);
  if (at + 1 >= el) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + at, el - at, fmt, ap);
  va_end(ap);
}

static void show(char *b, size_t cap, char kind, int64_t v) {
  if (kind == 'f') snprintf(b, cap, "%.9g", (double)bits_float(v));
  else if (kind == 'x') snprintf(b, cap, "%016llx", (unsigned long long)v);
  else snprintf(b, cap, "%lld", (long long)v);
}

/* Appends "WHAT: a_name A, b_name B" for each fingerprint field that differs
 * to list; the number of differences. */
static int diff_list(const gpt_resume_state *r, const char *rn, const gpt_resume_state *now,
                     const char *nn, char *list, size_t cap) {
  int diffs = 0;
  for (int k = 0; k < GPT_RESUME_NUM; k++) {
    if (r->num[k] == now->num[k]) continue;
    char a[32], b[32];
    show(a, sizeof a, k_num[k].kind, r->num[k]);
    show(b, sizeof b, k_num[k].kind, now->num[k]);
    append(list, cap, "%s%s: %s %s, %s %s", diffs++ ? "; " : "", k_num[k].what, rn, a, nn, b);
    if (k == GPT_RS_DATA_BYTES || (k == GPT_RS_DATA_HASH && r->num[GPT_RS_DATA_BYTES] ==
                                                                now->num[GPT_RS_DATA_BYTES]))
      append(list, cap, " (the %s trained on '%s', %s reads '%s')", rn, r->data_name, nn,
             now->data_name);
  }
  for (int k = 0; k < GPT_RESUME_KEYS; k++) {
    if (!strncmp(r->engine[k], now->engine[k], GPT_RESUME_KEYLEN)) continue;
    append(list, cap, "%s%s: %s %.*s, %s %.*s", diffs++ ? "; " : "", k_keys[k], rn,
           GPT_RESUME_KEYLEN, r->engine[k], nn, GPT_RESUME_KEYLEN, now->engine[k]);
  }
  return diffs;
}

int gpt_resume_compare(const gpt_resume_state *a, const char *an, const gpt_resume_state *b,
                       const char *bn, char *err, size_t el) {
  if (el) err[0] = '\0';
  return diff_list(a, an, b, bn, err, el);
}

int gpt_resume_check(const void *blob, size_t len, const gpt_resume_state *now,
                     gpt_resume_state *out, char *err, size_t el) {
  err[0] = '\0';
  char list[3072] = "";
  gpt_resume_state r;
  if (len != sizeof r) {
    snprintf(err, el, "its trainer state (user.bin) is %zu bytes, not the %zu of a ferry-gpt "
             "resume state: not a checkpoint of ferry-gpt train (or of another version)", len,
             sizeof r);
    return -1;
  }
  memcpy(&r, blob, sizeof r);
  if (r.magic != GPT_RESUME_MAGIC || r.size != sizeof r) {
    snprintf(err, el, "its trainer state (user.bin) has no ferry-gpt resume magic: not a "
             "checkpoint of ferry-gpt train");
    return -1;
  }
  if (r.version != GPT_RESUME_VERSION) {
    snprintf(err, el, "its trainer state is version %u; this ferry-gpt reads version %u",
             r.version, GPT_RESUME_VERSION);
    return -1;
  }
  if (r.next_step < 1) {
    snprintf(err, el, "its trainer state says the next step is %lld", (long long)r.next_step);
    return -1;
  }
  r.data_name[sizeof r.data_name - 1] = '\0';
  for (int k = 0; k < GPT_RESUME_KEYS; k++) r.engine[k][GPT_RESUME_KEYLEN - 1] = '\0';
  int diffs = diff_list(&r, "checkpoint", now, "this run", list, sizeof list);
  if (diffs) {
    snprintf(err, el, "the checkpoint was made with other settings (%d difference%s): %s", diffs,
             diffs > 1 ? "s" : "", list);
    return -2;
  }
  if (out) *out = r;
  return 0;
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The N of a "step-<digits>" name, or -1. */
static int64_t step_of(const char *name) {
  if (strncmp(name, "step-", 5) || !name[5] || strlen(name + 5) > 18) return -1;
  int64_t v = 0;
  for (const char *p = name + 5; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

/* In root (no manifest of its own): the newest step-* folder that holds a
 * manifest, as root/NAME into best; the newer ones without one are named
 * in note. 1 when found, 0 when root has no step-* folder, -1 when none of
 * them is complete (err says so). */
static int newest_complete(const char *root, char *best, size_t cap, char *note, size_t nl,
                           char *err, size_t el) {
  DIR *d = opendir(root);
  if (!d) return 0; /* the library's find names the reason */
  int64_t best_step = -1, seen = 0;
  char newest[256] = "";
  int64_t newest_step = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t s = step_of(e->d_name);
    if (s < 0) continue;
    char path[4096], man[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", root, e->d_name) >= sizeof path) continue;
    if (!is_dir(path)) continue;
    seen++;
    if (s > newest_step) newest_step = s, snprintf(newest, sizeof newest, "%s", e->d_name);
    snprintf(man, sizeof man, "%s/manifest", path);
    struct stat st;
    if (stat(man, &st) || !S_ISREG(st.st_mode) || s <= best_step) continue;
    best_step = s;
    snprintf(best, cap, "%s", path);
  }
  closedir(d);
  if (!seen) return 0;
  if (best_step < 0) {
    snprintf(err, el, "%s: no complete checkpoint: no step-* folder there holds a manifest "
             "(the newest, %s, is empty or incomplete)", root, newest);
    return -1;
  }
  if (newest_step > best_step) {
    /* every newer step-* folder is incomplete: name them (the first few) */
    size_t at = (size_t)snprintf(note, nl, "skipped");
    int listed = 0, more = 0;
    d = opendir(root);
    while (d && (e = readdir(d))) {
      int64_t s = step_of(e->d_name);
      if (s <= best_step) continue;
      char path[4096];
      if ((size_t)snprintf(path, sizeof path, "%s/%s", root, e->d_name) >= sizeof path ||
          !is_dir(path))
        continue;
      if (listed == 4) {
        more++;
        continue;
      }
      if (at < nl) at += (size_t)snprintf(note + at, nl - at, "%s %s", listed ? "," : "", path);
      listed++;
    }
    if (d) closedir(d);
    if (more && at < nl) at += (size_t)snprintf(note + at, nl - at, " and %d more", more);
    if (at < nl)
      snprintf(note + at, nl - at, ": %s no manifest (empty, or an interrupted copy); resuming "
               "from the newest complete checkpoint, %s",
               listed + more > 1 ? "they hold" : "it holds", best);
  }
  return 1;
}

int gpt_resume_find(const char *dir, char *folder, size_t cap, int64_t *step, char *note,
                    size_t nl, char *err, size_t el) {
  if (note && nl) note[0] = '\0';
  struct stat st;
  if (stat(dir, &st)) {
    snprintf(err, el, "%s: %s", dir, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, el, "%s: not a folder", dir);
    return -1;
  }
  /* a --save folder (its checkpoints/), a folder of step-* folders, or a
   * step folder itself: the library finds the newest, reading no tensor */
  char root[4096];
  if ((size_t)snprintf(root, sizeof root, "%s/" GPT_RESUME_SUBDIR, dir) >= sizeof root) {
    snprintf(err, el, "%s: path too long", dir);
    return -1;
  }
  if (!is_dir(root)) snprintf(root, sizeof root, "%s", dir);
  char man[4200], best[4096];
  snprintf(man, sizeof man, "%s/manifest", root);
  struct stat mst;
  if (stat(man, &mst) != 0) { /* a folder of step-* folders: the newest complete one */
    char scratch[1];
    int got = newest_complete(root, best, sizeof best, note && nl ? note : scratch,
                              note && nl ? nl : sizeof scratch, err, el);
    if (got < 0) return -1;
    if (got > 0) snprintf(root, sizeof root, "%s", best);
  }
  int rc = ferry_checkpoint_find(root, folder, cap, step);
  if (rc == FERRY_ENOENT) {
    snprintf(err, el, "%s: no checkpoint there (no step-* folder; --save-every writes them "
             "into --save DIR/" GPT_RESUME_SUBDIR ")", root);
    return -1;
  }
  if (rc) {
    snprintf(err, el, "%s", ferry_last_error());
    return -1;
  }
  if (*step < 0) {
    snprintf(err, el, "%s: a checkpoint, but not a step-* folder of ferry-gpt train", folder);
    return -1;
  }
  return 0;
}

int gpt_resume_peek(const char *folder, void *blob, size_t cap, size_t *len) {
  /* checked against the manifest's size and CRC32C before it is read */
  int rc = ferry_checkpoint_read_blob(folder, blob, cap, len);
  if (rc == FERRY_EOVERFLOW) { /* too big: the caller's size check refuses it */
    *len = cap + 1;
    return 0;
  }
  return rc;
}
