/* examples/gpt/json.h — the little JSON reader the example needs for
 * config.json and the BPE vocab.json: a cursor, strings decoded to UTF-8,
 * numbers, literals and skipping, each bounded by the end of the text.
 */
#ifndef FERRY_GPT_JSON_H
#define FERRY_GPT_JSON_H

#include <stddef.h>

typedef struct {
  const char *p, *end;
  int bad;
} gj;

void gj_ws(gj *j);
int gj_peek(gj *j);              /* next non-space char, or -1 */
int gj_eat(gj *j, char c);       /* 1 when c was next (and consumed) */
/* A string into buf (NUL-terminated, truncated to cap-1); returns its full
 * length or -1. */
long gj_string(gj *j, char *buf, size_t cap);
int gj_number(gj *j, double *out);
int gj_skip(gj *j, int depth);
/* The value kind at the cursor: 's' string, 'n' number, 'o' object,
 * 'a' array, 't'/'f' bool, 'z' null, 0 bad. */
int gj_kind(gj *j);

/* Reads a whole file (NUL-terminated); NULL on failure. */
char *gj_read_file(const char *path, size_t *len);

#endif
