/* examples/gpt/tokenizer_cli.c — `ferry-gpt tokenize`: text on stdin to one
 * JSON list of ids on stdout, or (--decode) a JSON list of ids to the text,
 * with the tokenizer a --tokenizer path names (a Hugging Face tokenizer.json,
 * or a folder with it or GPT-2's vocab.json + merges.txt).
 */
#include "app.h"

#include "core/json.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const k_tokenize_help =
    "NAME\n"
    "    ferry-gpt tokenize - text to token ids and back\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt tokenize [--tokenizer PATH] [--raw] < TEXT\n"
    "    ferry-gpt tokenize [--tokenizer PATH] --decode [--skip-special] < IDS.json\n"
    "\n"
    "DESCRIPTION\n"
    "    Reads stdin whole. Encoding prints one JSON list of ids (and a newline), with the\n"
    "    tokens a tokenizer.json's post_processor puts around a text (bos, eos), as\n"
    "    Hugging Face's encode() does (a tokenizer_config.json beside it naming a\n"
    "    Llama, CodeLlama or Gemma class: bos by add_bos_token, eos by add_eos_token, as\n"
    "    transformers does); --decode reads such a list and prints its text\n"
    "    (nothing added), special tokens included unless --skip-special.\n"
    "\n"
    "OPTIONS\n"
    "    --tokenizer PATH      a tokenizer.json (byte-level BPE: GPT-2, Llama-3, Qwen2;\n"
    "                          SentencePiece-style BPE with byte fallback: Llama-2,\n"
    "                          Mistral, TinyLlama), or a folder with tokenizer.json or\n"
    "                          vocab.json + merges.txt (default: one id per byte).\n"
    "    --raw                 encode without the tokens put around a text.\n"
    "    --decode              ids to text.\n"
    "    --skip-special        decode without the special tokens.\n"
    "    -h, --help            this text.\n"
    "\n"
    "EXIT STATUS\n"
    "    0 on success, 1 on a runtime failure, 2 on bad usage.\n";

/* stdin, whole, NUL-terminated. */
static char *read_stdin(size_t *len) {
  size_t cap = 1 << 16, n = 0, r;
  char *b = malloc(cap);
  while (b && (r = fread(b + n, 1, cap - n - 1, stdin)) > 0) {
    n += r;
    if (cap - n - 1 == 0) {
      char *p = realloc(b, cap *= 2);
      if (!p) free(b);
      b = p;
    }
  }
  if (b) b[n] = 0, *len = n;
  return b;
}

static int encode(const gpt_tokenizer *t, const char *text, size_t len, int raw) {
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  char err[512];
  if (gpt_tokenizer_encode_text(t, text, len, !raw, &ids, &n, &cap, err, sizeof err)) {
    errf("tokenize: %s\n", err);
    free(ids);
    return 1;
  }
  putchar('[');
  for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
  printf("]\n");
  free(ids);
  return 0;
}

static int decode(const gpt_tokenizer *t, const char *text, size_t len, int skip) {
  ferry_json_cur c;
  ferry_json_iter it;
  int32_t *ids = malloc((len / 2 + 1) * sizeof *ids); /* an id takes 2 bytes at least */
  size_t n = 0;
  int more = -1;
  ferry_json_init(&c, text, len);
  if (ids && !ferry_json_enter(&c, '[', &it))
    while ((more = ferry_json_more(&c, &it)) == 1) {
      uint64_t v;
      if (ferry_json_u64(&c, &v) || v > INT32_MAX) {
        more = -1;
        break;
      }
      ids[n++] = (int32_t)v;
    }
  if (more || !ferry_json_at_end(&c)) {
    errf("tokenize --decode: stdin is not one JSON list of ids%s%s\n", c.err_at ? ": " : "", c.err_at ? c.why : "");
    free(ids);
    return 1;
  }
  char *out;
  size_t ol;
  int rc = gpt_tokenizer_decode_text(t, ids, n, skip, &out, &ol);
  free(ids);
  if (rc) {
    errf("tokenize --decode: out of memory\n");
    return 1;
  }
  fwrite(out, 1, ol, stdout);
  free(out);
  return 0;
}

int cmd_tokenize(int argc, char **argv) {
  enum { O_TOK = 256, O_RAW, O_DECODE, O_SKIP };
  static const struct option opts[] = {{"tokenizer", 1, 0, O_TOK}, {"raw", 0, 0, O_RAW},
                                       {"decode", 0, 0, O_DECODE}, {"skip-special", 0, 0, O_SKIP},
                                       {"help", 0, 0, 'h'},        {0, 0, 0, 0}};
  const char *path = NULL;
  int raw = 0, dec = 0, skip = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case O_TOK: path = optarg; break;
    case O_RAW: raw = 1; break;
    case O_DECODE: dec = 1; break;
    case O_SKIP: skip = 1; break;
    case 'h': fputs(k_tokenize_help, stdout); return 0;
    default: errf("bad option for tokenize (try --help)\n"); return 2;
    }
  }
  if (optind < argc || (raw && dec) || (skip && !dec)) {
    errf("%s (try --help)\n", optind < argc ? "unexpected argument"
                              : raw ? "--raw is for encoding, not --decode"
                                    : "--skip-special needs --decode");
    return 2;
  }
  gpt_tokenizer *t = load_tokenizer(path);
  size_t len;
  char *text = read_stdin(&len);
  int rc = 1;
  if (!text) errf("tokenize: out of memory reading stdin\n");
  else rc = dec ? decode(t, text, len, skip) : encode(t, text, len, raw);
  free(text);
  gpt_tokenizer_free(t);
  return rc;
}
