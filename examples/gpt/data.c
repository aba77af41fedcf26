/* examples/gpt/data.c — training data: a text file encoded by the
 * tokenizer, or a raw file of little-endian uint16 (.u16, .bin) or uint32
 * (.u32) token ids (a regular file mapped; a stream, pipe or device only
 * when asked: GPT_DATA_STREAM, read to its end within half the memory);
 * batches of windows at seeded random offsets, and each
 * rank's share of a global batch (data parallel).
 */
#include "gpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int ends(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

/* A stream (--data-stream): read in pieces of 1 MiB up to its end, at
 * most `cap` bytes (a stream that goes on past that is refused as too big
 * for memory, naming how much was read). */
static int read_stream(int fd, const char *path, size_t cap, char **out, size_t *len, char *err,
                       size_t el) {
  size_t have = 0, room = 0;
  char *b = NULL;
  for (;;) {
    if (have == room) {
      if (room >= cap) {
        snprintf(err, el, "%s: out of memory: read %.1f MiB of the stream without reaching its "
                 "end (--data-stream reads at most half the machine's memory, %.1f MiB)", path,
                 have / 1048576.0, cap / 1048576.0);
        free(b);
        return -1;
      }
      size_t nr = room ? room * 2 : 1 << 20;
      if (nr > cap) nr = cap;
      char *nb = realloc(b, nr);
      if (!nb) {
        snprintf(err, el, "%s: out of memory after reading %.1f MiB of the stream", path,
                 have / 1048576.0);
        free(b);
        return -1;
      }
      b = nb, room = nr;
    }
    ssize_t r = read(fd, b + have, room - have);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      snprintf(err, el, "%s: read: %s", path, strerror(errno));
      free(b);
      return -1;
    }
    if (r == 0) break;
    have += (size_t)r;
  }
  *out = b, *len = have;
  return 0;
}

/* The tokens of raw (len bytes): w-byte little-endian ids, or text through
 * tok (w = 0). */
static int decode(gpt_data *d, const char *path, const gpt_tokenizer *tok, const char *raw,
                  size_t len, int w, char *err, size_t el) {
  if (!w) {
    size_t cap = 0;
    if (gpt_tokenizer_encode(tok, raw, len, &d->tokens, &d->n, &cap)) {
      snprintf(err, el, "%s: the tokenizer cannot encode this text (or out of memory for "
               "its tokens: %zu bytes of text)", path, len);
      return -1;
    }
    return 0;
  }
  if (len % (size_t)w) {
    snprintf(err, el, "%s: %zu bytes is not a whole number of uint%d tokens", path, len, 8 * w);
    return -1;
  }
  d->n = len / (size_t)w;
  d->tokens = malloc((d->n ? d->n : 1) * sizeof *d->tokens);
  if (!d->tokens) {
    snprintf(err, el, "%s: out of memory for %zu tokens (%.1f MiB)", path, d->n,
             d->n * sizeof *d->tokens / 1048576.0);
    return -1;
  }
  const unsigned char *b = (const unsigned char *)raw;
  for (size_t i = 0; i < d->n; i++) {
    uint32_t v = b[i * w] | (uint32_t)b[i * w + 1] << 8;
    if (w == 4) v |= (uint32_t)b[i * w + 2] << 16 | (uint32_t)b[i * w + 3] << 24;
    d->tokens[i] = (int32_t)v;
  }
  return 0;
}

int gpt_data_load(gpt_data *d, const char *path, const gpt_tokenizer *tok, int vocab,
                  uint64_t seed, char *err, size_t el) {
  return gpt_data_load_ex(d, path, tok, vocab, seed, 0, err, el);
}

int gpt_data_load_ex(gpt_data *d, const char *path, const gpt_tokenizer *tok, int vocab,
                     uint64_t seed, int flags, char *err, size_t el) {
  memset(d, 0, sizeof *d);
  d->rng = seed ^ 0xDA7A5EEDull;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    snprintf(err, el, "%s: cannot read: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  int w = ends(path, ".u16") || ends(path, ".bin") ? 2 : ends(path, ".u32") ? 4 : 0;
  int rc;
  if (S_ISREG(st.st_mode)) {
    /* mapped, not copied: the file's pages are the page cache's, and only
     * the tokens take memory of their own */
    size_t len = (size_t)st.st_size;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED) {
      snprintf(err, el, "%s: cannot map %zu bytes: %s", path, len,
               errno == ENOMEM ? "out of memory (address space)" : strerror(errno));
      return -1;
    }
    rc = decode(d, path, tok, len ? map : "", len, w, err, el);
    if (map) munmap(map, len);
  } else if (S_ISDIR(st.st_mode)) {
    close(fd);
    snprintf(err, el, "%s: a folder, not a data file", path);
    return -1;
  } else if (!(flags & GPT_DATA_STREAM)) {
    close(fd);
    snprintf(err, el, "%s: not a regular file (a %s): refused, since a stream may not end "
             "(/dev/zero would fill memory); pass --data-stream to read it to its end",
             path, S_ISCHR(st.st_mode) ? "character device" : S_ISFIFO(st.st_mode) ? "pipe"
                       : S_ISSOCK(st.st_mode) ? "socket" : S_ISBLK(st.st_mode) ? "block device"
                       : "special file");
    return -1;
  } else {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t cap = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 2 : (size_t)1 << 30;
    char *raw;
    size_t len;
    rc = read_stream(fd, path, cap, &raw, &len, err, el);
    close(fd);
    if (rc) return -1;
    rc = decode(d, path, tok, raw, len, w, err, el);
    free(raw);
  }
  if (rc) {
    gpt_data_free(d);
    return -1;
  }
  for (size_t i = 0; i < d->n; i++)
    if (d->tokens[i] < 0 || d->tokens[i] >= vocab) {
      snprintf(err, el, "%s: token %d at position %zu is outside the model's vocabulary (%d)", path,
               d->tokens[i], i, vocab);
      gpt_data_free(d);
      return -1;
    }
  return 0;
}

void gpt_data_free(gpt_data *d) {
  free(d->tokens);
  d->tokens = NULL;
  d->n = 0;
}

int gpt_data_batch(gpt_data *d, int batch, int seq, int32_t *tokens, int32_t *targets) {
  return gpt_data_batch_rank(d, batch, seq, 0, 1, tokens, targets);
}

int gpt_data_batch_rank(gpt_data *d, int batch, int seq, int rank, int nranks, int32_t *tokens,
                        int32_t *targets) {
  if ((size_t)seq + 1 > d->n || nranks < 1 || rank < 0 || rank >= nranks) return -1;
  size_t span = d->n - (size_t)seq; /* offsets 0 .. n-seq-1 */
  long first = (long)rank * batch, end = first + batch, all = (long)nranks * batch;
  for (long w = 0; w < all; w++) {
    size_t o = (size_t)(gpt_rand(&d->rng) % span); /* every draw moves the generator */
    if (w < first || w >= end) continue;
    size_t b = (size_t)(w - first);
    memcpy(tokens + b * seq, d->tokens + o, (size_t)seq * sizeof *tokens);
    memcpy(targets + b * seq, d->tokens + o + 1, (size_t)seq * sizeof *targets);
  }
  return 0;
}
