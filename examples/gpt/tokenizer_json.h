/* examples/gpt/tokenizer_json.h — Hugging Face tokenizer.json inside
 * ferry-gpt (internal to the tokenizer files): the parsed tokenizer
 * (tokenizer_json.c reads the file, tokenizer_hf.c encodes and decodes) and
 * GPT-2's byte <-> code point map, which tokenizer.c shares.
 */
#ifndef FERRY_GPT_TOKENIZER_JSON_H
#define FERRY_GPT_TOKENIZER_JSON_H

#include "tok_map.h"

#include <stddef.h>
#include <stdint.h>

/* GPT-2's bytes_to_unicode: byte_str[b] is byte b's code point in UTF-8,
 * unbyte[cp] the byte of a code point below 512. */
void gpt_byte_map(char byte_str[256][4], int unbyte[512]);

enum { HF_NORM_PREPEND, HF_NORM_REPLACE, HF_NORM_NFC };
enum { HF_PRE_BYTELEVEL, HF_PRE_SPLIT, HF_PRE_METASPACE };
enum { HF_RE_GPT2, HF_RE_LLAMA3, HF_RE_QWEN2 };
enum { HF_DEC_BYTELEVEL, HF_DEC_REPLACE, HF_DEC_BYTEFALLBACK, HF_DEC_FUSE, HF_DEC_STRIP,
       HF_DEC_METASPACE };
enum { HF_SCHEME_ALWAYS, HF_SCHEME_FIRST, HF_SCHEME_NEVER };
enum { HF_MAX_STEPS = 8, HF_MAX_SPECIAL = 4, HF_MAX_IDS = 1 << 24 };

/* One normalizer, pre-tokenizer or decoder:
 *   norm Prepend a; Replace a -> b; NFC
 *   pre  ByteLevel x add_prefix_space, y use_regex; Split x HF_RE_*;
 *        Metaspace a replacement, x HF_SCHEME_*, y split
 *   dec  Replace a -> b; Strip a content, x start, y stop; Metaspace a, x */
typedef struct {
  int type;
  char *a, *b;
  int x, y;
} gpt_hf_step;

typedef struct {
  char *s, *ns; /* the content; normalized: the content through the normalizers */
  size_t len, nlen;
  int id, special, lstrip, rstrip, single_word, normalized;
} gpt_hf_added;

typedef struct {
  gpt_smap vocab;  /* the model's token -> id */
  char **id_str;   /* id -> token (the model's or an added token's); n_ids */
  int n_ids;
  gpt_umap merges; /* ids a << 32 | b -> rank << 32 | merged id */
  int unk, byte_fallback, fuse_unk, ignore_merges;
  int meta_cut; /* no token holds a character then U+2581: words are cut before it */
  int byte_id[256]; /* <0xNN> ids, -1 when absent */
  gpt_hf_added *added;
  int n_added;
  unsigned char added_first[256]; /* bit 0: an added token matched in the text starts with
                                     this byte; bit 1: a normalized one's content does */
  char *is_special;               /* per id: a special added token */
  gpt_hf_step norm[HF_MAX_STEPS], pre[HF_MAX_STEPS], dec[HF_MAX_STEPS];
  int n_norm, n_pre, n_dec, has_decoder;
  int32_t bos[HF_MAX_SPECIAL], eos[HF_MAX_SPECIAL]; /* the post-processor's, around a text */
  int n_bos, n_eos;
  char byte_str[256][4];
  int unbyte[512]; /* -1: not a byte's code point */
  gpt_umap nfc;    /* NFC's compositions: a << 32 | b -> composite */
} gpt_hf;

/* Reads a tokenizer.json; 0, or -1 with err. */
int gpt_hf_load(const char *path, gpt_hf **out, char *err, size_t el);
void gpt_hf_free(gpt_hf *h);
/* At the end of gpt_hf_load: the added tokens' normalized contents (what
 * id_str holds for them); -1 when out of memory. */
int gpt_hf_prepare(gpt_hf *h);
/* Appends the ids of text[0..len) (with the post-processor's bos/eos when
 * special); -1 with err on a character no token covers or out of memory. */
int gpt_hf_encode(const gpt_hf *h, const char *text, size_t len, int special, int32_t **ids,
                  size_t *n, size_t *cap, char *err, size_t el);
/* The text of ids through the decoders, in a fresh NUL-terminated *out.
 * stream: one piece of a stream (no Strip, no first-token Metaspace cut,
 * bytes kept as they are). */
int gpt_hf_decode(const gpt_hf *h, const int32_t *ids, size_t n, int skip_special, int stream,
                  char **out, size_t *len);

#endif /* FERRY_GPT_TOKENIZER_JSON_H */
