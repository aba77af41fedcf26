/* format/json_writer.h — a minimal streaming JSON writer for every --json output of
 * the ferry command and the benchmarks: one object per line, keys in call
 * order.
 */
#ifndef FERRY_FORMAT_JSON_WRITER_H
#define FERRY_FORMAT_JSON_WRITER_H

#include <stdio.h>

typedef struct {
  FILE *f;
  int first[16]; /* per nesting level: no member written yet */
  int depth;
} json_out;

void json_begin(json_out *j, FILE *f);  /* { */
void json_end(json_out *j);             /* }\n */
void json_key(json_out *j, const char *key);
void json_str(json_out *j, const char *key, const char *v);
void json_int(json_out *j, const char *key, long long v);
void json_uint(json_out *j, const char *key, unsigned long long v);
void json_num(json_out *j, const char *key, double v);
void json_bool(json_out *j, const char *key, int v);
void json_null(json_out *j, const char *key);
void json_open(json_out *j, const char *key, char bracket); /* key may be NULL in arrays */
void json_close(json_out *j, char bracket);
void json_string_raw(FILE *f, const char *s); /* a quoted, escaped string */

#endif
