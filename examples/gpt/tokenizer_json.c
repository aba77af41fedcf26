/* examples/gpt/tokenizer_json.c — reads a Hugging Face tokenizer.json into
 * gpt_hf (tokenizer_json.h): the BPE model (vocab, merges by rank, unk, byte
 * fallback), added and special tokens, and the normalizers, pre-tokenizers,
 * post-processor and decoders of the byte-level (GPT-2, Llama-3, Qwen2) and
 * SentencePiece-style (Llama-2, Mistral, TinyLlama) files. The model's vocab
 * and merges are walked with the JSON cursor (they are most of a 10 MB
 * file); the small sections are parsed as trees. Anything else is refused
 * with its name.
 */
#include "tokenizer_json.h"
#include "unicode_data.h"

#include "core/file.h"
#include "core/json.h"
#include "core/untrusted.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one read of the file (a tokenizer.json is at most this large). */

/* As the other tokenizer files: no link, FIFO or device, within the limit
 * (core/untrusted.h); the message names the path. */
static int read_whole(const char *path, char **text, size_t *len, char *err, size_t el) {
  return ferry_read_below(NULL, path, FERRY_MAX_TOKENIZER, text, len, err, el) ? -1 : 0;
}

typedef struct {
  gpt_hf *h;
  char *err;
  size_t el;
} ld;

static int fail(ld *l, const char *fmt, const char *what) {
  snprintf(l->err, l->el, fmt, what ? what : "");
  return -1;
}

static const char *str_of(const ferry_json_value *o, const char *key) {
  const ferry_json_value *v = o ? ferry_json_get(o, key) : NULL;
  return v && v->type == FERRY_JSON_STR ? v->str : NULL;
}

static int bool_of(const ferry_json_value *o, const char *key, int dflt) {
  const ferry_json_value *v = o ? ferry_json_get(o, key) : NULL;
  return v && v->type == FERRY_JSON_BOOL ? v->b : dflt;
}

static int int_of(const ferry_json_value *o, const char *key, int dflt) {
  const ferry_json_value *v = o ? ferry_json_get(o, key) : NULL;
  return v && v->type == FERRY_JSON_NUM && v->is_int ? (int)v->i : dflt;
}

/* pattern: {"String": s} -> s; {"Regex": r} -> r with *regex set */
static const char *pattern_of(const ferry_json_value *o, int *regex) {
  const ferry_json_value *p = o ? ferry_json_get(o, "pattern") : NULL;
  const char *s = str_of(p, "String");
  *regex = 0;
  if (!s && (s = str_of(p, "Regex"))) *regex = 1;
  return s;
}

static gpt_hf_step *new_step(ld *l, gpt_hf_step *steps, int *n, int type, const char *a,
                             const char *b) {
  if (*n == HF_MAX_STEPS) return fail(l, "more than 8 normalizers, pre-tokenizers or decoders%s", NULL), NULL;
  gpt_hf_step *s = &steps[(*n)++];
  s->type = type;
  if ((a && !(s->a = strdup(a))) || (b && !(s->b = strdup(b))))
    return fail(l, "out of memory%s", NULL), NULL;
  return s;
}

static int prepend_scheme(const ferry_json_value *v) {
  const char *s = str_of(v, "prepend_scheme");
  if (s) return !strcmp(s, "first") ? HF_SCHEME_FIRST : !strcmp(s, "never") ? HF_SCHEME_NEVER : HF_SCHEME_ALWAYS;
  return bool_of(v, "add_prefix_space", 1) ? HF_SCHEME_ALWAYS : HF_SCHEME_NEVER;
}

static int normalizer(ld *l, const ferry_json_value *v) {
  if (!v || v->type == FERRY_JSON_NULL) return 0;
  const char *type = str_of(v, "type");
  if (!type) return fail(l, "normalizer without a type%s", NULL);
  gpt_hf *h = l->h;
  int re;
  if (!strcmp(type, "Sequence")) {
    const ferry_json_value *a = ferry_json_get(v, "normalizers");
    for (size_t i = 0; a && a->type == FERRY_JSON_ARR && i < a->n; i++)
      if (normalizer(l, &a->items[i])) return -1;
    return 0;
  }
  if (!strcmp(type, "Prepend") && str_of(v, "prepend"))
    return new_step(l, h->norm, &h->n_norm, HF_NORM_PREPEND, str_of(v, "prepend"), NULL) ? 0 : -1;
  if (!strcmp(type, "Replace") && pattern_of(v, &re) && !re && str_of(v, "content"))
    return new_step(l, h->norm, &h->n_norm, HF_NORM_REPLACE, pattern_of(v, &re), str_of(v, "content"))
               ? 0 : -1;
  if (!strcmp(type, "NFC")) return new_step(l, h->norm, &h->n_norm, HF_NORM_NFC, NULL, NULL) ? 0 : -1;
  return fail(l, "normalizer '%s' is not supported", type);
}

/* The regex splits of the files this reader knows, as they are written there. */
static const char *const k_regex[] = {
    [HF_RE_GPT2] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    [HF_RE_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [HF_RE_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

static int pre_tokenizer(ld *l, const ferry_json_value *v) {
  if (!v || v->type == FERRY_JSON_NULL) return 0;
  const char *type = str_of(v, "type");
  if (!type) return fail(l, "pre_tokenizer without a type%s", NULL);
  gpt_hf *h = l->h;
  gpt_hf_step *s;
  if (!strcmp(type, "Sequence")) {
    const ferry_json_value *a = ferry_json_get(v, "pretokenizers");
    for (size_t i = 0; a && a->type == FERRY_JSON_ARR && i < a->n; i++)
      if (pre_tokenizer(l, &a->items[i])) return -1;
    return 0;
  }
  if (!strcmp(type, "ByteLevel")) {
    if (!(s = new_step(l, h->pre, &h->n_pre, HF_PRE_BYTELEVEL, NULL, NULL))) return -1;
    s->x = bool_of(v, "add_prefix_space", 1), s->y = bool_of(v, "use_regex", 1);
    return 0;
  }
  if (!strcmp(type, "Metaspace")) {
    const char *r = str_of(v, "replacement");
    if (!(s = new_step(l, h->pre, &h->n_pre, HF_PRE_METASPACE, r ? r : "\xe2\x96\x81", NULL))) return -1;
    s->x = prepend_scheme(v), s->y = bool_of(v, "split", 1);
    return 0;
  }
  if (!strcmp(type, "Split")) {
    int re;
    const char *p = pattern_of(v, &re), *beh = str_of(v, "behavior");
    if (!p || !re || !beh || strcmp(beh, "Isolated") || bool_of(v, "invert", 0))
      return fail(l, "a Split pre-tokenizer other than an isolated regex%s", NULL);
    for (int k = 0; k < 3; k++)
      if (!strcmp(p, k_regex[k])) {
        if (!(s = new_step(l, h->pre, &h->n_pre, HF_PRE_SPLIT, NULL, NULL))) return -1;
        s->x = k;
        return 0;
      }
    return fail(l, "the Split regex '%.200s' is not one this reader knows (GPT-2, Llama-3, Qwen2)", p);
  }
  return fail(l, "pre_tokenizer '%s' is not supported", type);
}

static int decoder(ld *l, const ferry_json_value *v) {
  if (!v || v->type == FERRY_JSON_NULL) return 0;
  const char *type = str_of(v, "type");
  if (!type) return fail(l, "decoder without a type%s", NULL);
  gpt_hf *h = l->h;
  gpt_hf_step *s;
  int re;
  h->has_decoder = 1;
  if (!strcmp(type, "Sequence")) {
    const ferry_json_value *a = ferry_json_get(v, "decoders");
    for (size_t i = 0; a && a->type == FERRY_JSON_ARR && i < a->n; i++)
      if (decoder(l, &a->items[i])) return -1;
    return 0;
  }
  if (!strcmp(type, "ByteLevel")) return new_step(l, h->dec, &h->n_dec, HF_DEC_BYTELEVEL, 0, 0) ? 0 : -1;
  if (!strcmp(type, "ByteFallback"))
    return new_step(l, h->dec, &h->n_dec, HF_DEC_BYTEFALLBACK, 0, 0) ? 0 : -1;
  if (!strcmp(type, "Fuse")) return new_step(l, h->dec, &h->n_dec, HF_DEC_FUSE, 0, 0) ? 0 : -1;
  if (!strcmp(type, "Replace") && pattern_of(v, &re) && !re && str_of(v, "content"))
    return new_step(l, h->dec, &h->n_dec, HF_DEC_REPLACE, pattern_of(v, &re), str_of(v, "content"))
               ? 0 : -1;
  if (!strcmp(type, "Strip") && str_of(v, "content")) {
    if (!(s = new_step(l, h->dec, &h->n_dec, HF_DEC_STRIP, str_of(v, "content"), NULL))) return -1;
    s->x = int_of(v, "start", 0), s->y = int_of(v, "stop", 0);
    return 0;
  }
  if (!strcmp(type, "Metaspace")) {
    const char *r = str_of(v, "replacement");
    if (!(s = new_step(l, h->dec, &h->n_dec, HF_DEC_METASPACE, r ? r : "\xe2\x96\x81", NULL))) return -1;
    s->x = prepend_scheme(v);
    return 0;
  }
  return fail(l, "decoder '%s' is not supported", type);
}

/* The id of a token named by the post-processor: an added token or the model's. */
static int token_id(const gpt_hf *h, const char *s) {
  for (int i = 0; i < h->n_added; i++)
    if (!strcmp(h->added[i].s, s)) return h->added[i].id;
  return gpt_smap_get(&h->vocab, s, strlen(s));
}

/* An id the post-processor names, as a JSON value. */
static int id_of(const ferry_json_value *v) {
  return v->type == FERRY_JSON_NUM && v->is_int && v->i >= 0 && v->i < HF_MAX_IDS ? (int)v->i : -1;
}

static int push_special(ld *l, int32_t *list, int *n, int id) {
  if (id < 0) return fail(l, "the post_processor names a token the vocabulary lacks%s", NULL);
  if (*n == HF_MAX_SPECIAL) return fail(l, "more than 4 special tokens around a text%s", NULL);
  list[(*n)++] = id;
  return 0;
}

static int post_processor(ld *l, const ferry_json_value *v) {
  if (!v || v->type == FERRY_JSON_NULL) return 0;
  const char *type = str_of(v, "type");
  gpt_hf *h = l->h;
  if (!type) return fail(l, "post_processor without a type%s", NULL);
  if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
  if (!strcmp(type, "Sequence")) {
    const ferry_json_value *a = ferry_json_get(v, "processors");
    for (size_t i = 0; a && a->type == FERRY_JSON_ARR && i < a->n; i++)
      if (post_processor(l, &a->items[i])) return -1;
    return 0;
  }
  if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
    const ferry_json_value *c = ferry_json_get(v, "cls"), *s = ferry_json_get(v, "sep");
    if (!c || c->type != FERRY_JSON_ARR || c->n != 2 || !s || s->type != FERRY_JSON_ARR || s->n != 2)
      return fail(l, "%s without cls and sep", type);
    return push_special(l, h->bos, &h->n_bos, id_of(&c->items[1])) ||
           push_special(l, h->eos, &h->n_eos, id_of(&s->items[1]));
  }
  if (strcmp(type, "TemplateProcessing")) return fail(l, "post_processor '%s' is not supported", type);
  const ferry_json_value *single = ferry_json_get(v, "single"), *sp = ferry_json_get(v, "special_tokens");
  int seen_a = 0;
  for (size_t i = 0; single && single->type == FERRY_JSON_ARR && i < single->n; i++) {
    const ferry_json_value *it = &single->items[i], *st = ferry_json_get(it, "SpecialToken");
    if (ferry_json_get(it, "Sequence")) {
      seen_a = 1;
      continue;
    }
    const char *name = str_of(st, "id");
    if (!name) return fail(l, "a TemplateProcessing item that is neither a SpecialToken nor a Sequence%s", NULL);
    const ferry_json_value *ids = ferry_json_get(ferry_json_get(sp, name), "ids");
    if (!ids || ids->type != FERRY_JSON_ARR) {
      if (push_special(l, seen_a ? h->eos : h->bos, seen_a ? &h->n_eos : &h->n_bos, token_id(h, name)))
        return -1;
      continue;
    }
    for (size_t k = 0; k < ids->n; k++)
      if (push_special(l, seen_a ? h->eos : h->bos, seen_a ? &h->n_eos : &h->n_bos, id_of(&ids->items[k])))
        return -1;
  }
  return 0;
}

static int added_tokens(ld *l, const ferry_json_value *v) {
  gpt_hf *h = l->h;
  if (!v || v->type == FERRY_JSON_NULL) return 0;
  if (v->type != FERRY_JSON_ARR) return fail(l, "added_tokens is not a list%s", NULL);
  if (!(h->added = calloc(v->n + 1, sizeof *h->added))) return fail(l, "out of memory%s", NULL);
  for (size_t i = 0; i < v->n; i++) {
    const ferry_json_value *a = &v->items[i];
    const char *c = str_of(a, "content");
    int id = int_of(a, "id", -1);
    if (!c || !*c || id < 0 || id >= HF_MAX_IDS) return fail(l, "an added token without content or id%s", NULL);
    gpt_hf_added *t = &h->added[h->n_added++];
    if (!(t->s = strdup(c))) return fail(l, "out of memory%s", NULL);
    t->len = strlen(c), t->id = id, t->special = bool_of(a, "special", 0);
    t->lstrip = bool_of(a, "lstrip", 0), t->rstrip = bool_of(a, "rstrip", 0);
    t->single_word = bool_of(a, "single_word", 0);
    t->normalized = bool_of(a, "normalized", 0);
  }
  return 0;
}

/* The model's vocab: {token: id, ...}. */
static int read_vocab(ld *l, const char *p, size_t n) {
  ferry_json_cur c;
  ferry_json_iter it;
  ferry_json_init(&c, p, n);
  char *key = NULL;
  int more;
  if (ferry_json_enter(&c, '{', &it)) return fail(l, "model.vocab is not an object%s", NULL);
  while ((more = ferry_json_more(&c, &it)) == 1) {
    uint64_t id;
    if (ferry_json_strdup(&c, &key, NULL) || ferry_json_expect(&c, ':') || ferry_json_u64(&c, &id))
      break;
    if (id >= HF_MAX_IDS) return free(key), fail(l, "model.vocab: an id past 2^24 (%s)", "16777216");
    if (gpt_smap_put(&l->h->vocab, key, (int)id)) return free(key), fail(l, "out of memory%s", NULL);
    if ((int)id >= l->h->n_ids) l->h->n_ids = (int)id + 1;
    free(key), key = NULL;
  }
  free(key);
  return more ? fail(l, "model.vocab: %s", c.why) : 0;
}

/* One merge, "a b" or ["a", "b"], of rank r. */
static int add_merge(ld *l, const char *a, size_t al, const char *b, size_t bl, uint64_t r) {
  gpt_hf *h = l->h;
  char buf[4096];
  int ia = gpt_smap_get(&h->vocab, a, al), ib = gpt_smap_get(&h->vocab, b, bl);
  if (al + bl >= sizeof buf) return fail(l, "a merge longer than 4 KB%s", NULL);
  memcpy(buf, a, al), memcpy(buf + al, b, bl), buf[al + bl] = 0;
  int m = gpt_smap_get(&h->vocab, buf, al + bl);
  if (ia < 0 || ib < 0 || m < 0) return fail(l, "merge '%.200s' has a token the vocabulary lacks", buf);
  if (gpt_umap_add(&h->merges, (uint64_t)ia << 32 | (uint64_t)ib, r << 32 | (uint64_t)m))
    return fail(l, "out of memory%s", NULL);
  return 0;
}

static int read_merges(ld *l, const char *p, size_t n) {
  ferry_json_cur c;
  ferry_json_iter it, pair;
  ferry_json_init(&c, p, n);
  char a[4096], b[4096];
  size_t al, bl;
  int more;
  uint64_t r = 0;
  if (ferry_json_enter(&c, '[', &it)) return fail(l, "model.merges is not a list%s", NULL);
  while ((more = ferry_json_more(&c, &it)) == 1) {
    if (ferry_json_peek(&c) == '[') {
      if (ferry_json_enter(&c, '[', &pair) || ferry_json_more(&c, &pair) != 1 ||
          ferry_json_string(&c, a, sizeof a, &al) || ferry_json_more(&c, &pair) != 1 ||
          ferry_json_string(&c, b, sizeof b, &bl) || ferry_json_more(&c, &pair) != 0 || al >= sizeof a ||
          bl >= sizeof b)
        return fail(l, "model.merges: an item is not two tokens%s", NULL);
    } else {
      if (ferry_json_string(&c, a, sizeof a, &al) || al >= sizeof a)
        return fail(l, "model.merges: an item is not a string%s", NULL);
      char *sp = memchr(a, ' ', al);
      if (!sp || memchr(sp + 1, ' ', al - (size_t)(sp + 1 - a)))
        return fail(l, "model.merges: '%.200s' is not two tokens", a);
      bl = al - (size_t)(sp + 1 - a), memcpy(b, sp + 1, bl), al = (size_t)(sp - a);
    }
    if (add_merge(l, a, al, b, bl, r++)) return -1;
  }
  return more ? fail(l, "model.merges: %s", c.why) : 0;
}

/* A value that must be null, absent or "" (model options this reader has not). */
static int must_be_unset(ld *l, ferry_json_cur *c, const char *key) {
  int k = ferry_json_kind(c);
  size_t n = 1;
  if (k == FERRY_JSON_NULL) return ferry_json_skip(c);
  if (k == FERRY_JSON_STR && !ferry_json_string(c, NULL, 0, &n) && n == 0) return 0;
  if (k == FERRY_JSON_NUM) { /* dropout 0 is none */
    double d;
    if (!ferry_json_number(c, &d, NULL, NULL) && d == 0) return 0;
  }
  return fail(l, "model.%s is set: not supported", key);
}

/* model: its spans of vocab and merges, read after the walk (any key order). */
static int model(ld *l, ferry_json_cur *c, const char **vp, size_t *vn, const char **mp, size_t *mn,
                 char **unk) {
  ferry_json_iter it;
  char key[64], s[256];
  int more;
  gpt_hf *h = l->h;
  if (ferry_json_enter(c, '{', &it)) return fail(l, "model is not an object%s", NULL);
  while ((more = ferry_json_more(c, &it)) == 1) {
    if (ferry_json_string(c, key, sizeof key, NULL) || ferry_json_expect(c, ':')) return -1;
    int k = ferry_json_kind(c);
    if (!strcmp(key, "vocab") || !strcmp(key, "merges")) {
      if (ferry_json_peek(c) < 0) return -1;
      const char *at = c->p;
      if (ferry_json_skip(c)) return -1;
      *(key[0] == 'v' ? vp : mp) = at, *(key[0] == 'v' ? vn : mn) = (size_t)(c->p - at);
    } else if (!strcmp(key, "type")) {
      if (ferry_json_string(c, s, sizeof s, NULL)) return -1;
      if (strcmp(s, "BPE")) return fail(l, "model type '%s' is not supported (BPE is)", s);
    } else if (!strcmp(key, "unk_token") && k == FERRY_JSON_STR) {
      if (ferry_json_string(c, s, sizeof s, NULL)) return -1;
      free(*unk);
      if (!(*unk = strdup(s))) return fail(l, "out of memory%s", NULL);
    } else if (k == FERRY_JSON_BOOL && (!strcmp(key, "byte_fallback") || !strcmp(key, "fuse_unk") ||
                                        !strcmp(key, "ignore_merges"))) {
      int b;
      if (ferry_json_bool(c, &b)) return -1;
      *(key[0] == 'b' ? &h->byte_fallback : key[0] == 'f' ? &h->fuse_unk : &h->ignore_merges) = b;
    } else if (!strcmp(key, "dropout") || !strcmp(key, "continuing_subword_prefix") ||
               !strcmp(key, "end_of_word_suffix")) {
      if (must_be_unset(l, c, key)) return -1;
    } else if (ferry_json_skip(c))
      return -1;
  }
  return more;
}

/* The sections other than model are small: parsed as trees. */
static int section(ld *l, ferry_json_cur *c, const char *key) {
  static const char *const names[] = {"added_tokens", "normalizer", "pre_tokenizer", "post_processor",
                                      "decoder"};
  int which = -1;
  for (int i = 0; i < 5; i++)
    if (!strcmp(key, names[i])) which = i;
  if (ferry_json_peek(c) < 0) return -1;
  const char *at = c->p;
  if (ferry_json_skip(c)) return -1;
  if (which < 0) return 0;
  ferry_json_value *v;
  char why[256];
  if (ferry_json_parse(at, (size_t)(c->p - at), &v, why, sizeof why))
    return fail(l, "%s", why);
  int rc = which == 0 ? added_tokens(l, v) : which == 1 ? normalizer(l, v) : which == 2 ? pre_tokenizer(l, v)
           : which == 3 ? (l->h->n_bos = l->h->n_eos = 0, post_processor(l, v)) : decoder(l, v);
  ferry_json_free(v);
  return rc;
}

/* Fills id_str and the derived tables once the vocab and added tokens are in. */
static int finish(ld *l, const char *unk) {
  gpt_hf *h = l->h;
  for (int i = 0; i < h->n_added; i++)
    if (h->added[i].id >= h->n_ids) h->n_ids = h->added[i].id + 1;
  if (!(h->id_str = calloc((size_t)h->n_ids + 1, sizeof *h->id_str)) ||
      !(h->is_special = calloc((size_t)h->n_ids + 1, 1)))
    return fail(l, "out of memory%s", NULL);
  for (size_t i = 0; i < h->vocab.cap; i++)
    if (h->vocab.keys[i]) h->id_str[h->vocab.vals[i]] = h->vocab.keys[i];
  for (int i = 0; i < h->n_added; i++) {
    h->id_str[h->added[i].id] = h->added[i].s;
    h->is_special[h->added[i].id] = (char)h->added[i].special;
  }
  h->unk = unk ? token_id(h, unk) : -1;
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    h->byte_id[b] = gpt_smap_get(&h->vocab, name, 6);
  }
  for (int i = 0; i < h->n_bos + h->n_eos; i++)
    if ((i < h->n_bos ? h->bos[i] : h->eos[i - h->n_bos]) >= h->n_ids)
      return fail(l, "the post_processor names an id past the vocabulary%s", NULL);
  for (int i = 0; i < 512; i++) h->unbyte[i] = -1;
  gpt_byte_map(h->byte_str, h->unbyte);
  for (int i = 0; i < h->n_norm; i++)
    for (size_t r = 0; h->norm[i].type == HF_NORM_NFC && r < gpt_uni_decomp_n; r++)
      if (gpt_uni_decomp[r][2] >> 31 &&
          gpt_umap_add(&h->nfc, (uint64_t)gpt_uni_decomp[r][1] << 32 | (gpt_uni_decomp[r][2] & 0x7FFFFFFFu),
                       gpt_uni_decomp[r][0]))
        return fail(l, "out of memory%s", NULL);
  if (gpt_hf_prepare(h)) return fail(l, "out of memory%s", NULL);
  return 0;
}

/* Walks the top-level object; see the file's comment. */
int gpt_hf_load(const char *path, gpt_hf **out, char *err, size_t el) {
  gpt_hf *h = calloc(1, sizeof *h);
  char *text = NULL, *unk = NULL, key[64];
  size_t len, vn = 0, mn = 0;
  const char *vp = NULL, *mp = NULL;
  ld l = {h, err, el};
  ferry_json_cur c;
  ferry_json_iter it;
  int more = -1;
  if (!h) return snprintf(err, el, "out of memory"), -1;
  h->unk = -1;
  if (read_whole(path, &text, &len, err, el)) goto fail;
  size_t bom = len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3) ? 3 : 0;
  ferry_json_init(&c, text + bom, len - bom);
  err[0] = 0;
  if (ferry_json_enter(&c, '{', &it)) goto fail;
  while ((more = ferry_json_more(&c, &it)) == 1) {
    if (ferry_json_string(&c, key, sizeof key, NULL) || ferry_json_expect(&c, ':')) break;
    if (!strcmp(key, "model")) {
      if (model(&l, &c, &vp, &vn, &mp, &mn, &unk)) break;
    } else if (section(&l, &c, key))
      break;
  }
  if (more || !ferry_json_at_end(&c)) goto fail;
  if (!vp || !mp) {
    snprintf(err, el, "no model.vocab and model.merges");
    goto fail;
  }
  if (read_vocab(&l, vp, vn) || read_merges(&l, mp, mn) || finish(&l, unk)) goto fail;
  free(text), free(unk);
  *out = h;
  return 0;
fail:
  if (text && !err[0]) {
    int line, col;
    ferry_json_line_col(&c, c.err_at ? c.err_at : c.p, &line, &col);
    snprintf(err, el, "%s: line %d, column %d: %s", path, line, col, c.err_at ? c.why : "bad shape");
  } else if (text) {
    char why[400];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, el, "%s: %s", path, why);
  }
  free(text), free(unk);
  gpt_hf_free(h);
  return -1;
}

void gpt_hf_free(gpt_hf *h) {
  if (!h) return;
  gpt_smap_free(&h->vocab);
  gpt_umap_free(&h->merges);
  gpt_umap_free(&h->nfc);
  for (int i = 0; i < h->n_added; i++) free(h->added[i].s), free(h->added[i].ns);
  free(h->added), free(h->id_str), free(h->is_special);
  gpt_hf_step *lists[] = {h->norm, h->pre, h->dec};
  int ns[] = {h->n_norm, h->n_pre, h->n_dec};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < ns[k]; i++) free(lists[k][i].a), free(lists[k][i].b);
  free(h);
}
