/* tests/memory/fake_store.h — an in-memory NVMe store for the memory
 * manager's tests: requests queue to a worker thread that copies the bytes
 * after a small random delay, so completions are truly asynchronous. It
 * checks what a real store would refuse (unwritten slots, lengths beyond
 * the slot's own size from ferry_mem_store_slot_sizes, two requests on
 * one chunk) and counts reads and writes. A test can make the next reads or
 * writes fail, and hold writes back until it lets them go.
 */
#ifndef FERRY_TEST_FAKE_STORE_H
#define FERRY_TEST_FAKE_STORE_H

#include "memory/memory.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct fake_req {
  struct fake_req *next;
  int op; /* 0 read, 1 write */
  uint32_t slot;
  void *buf;
  size_t len;
  int done, status, queued;
} fake_req;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv, done_cv;
  fake_req *head, *tail;
  unsigned char *data;
  size_t *lens;
  size_t *sizes; /* each slot's own bytes (the manager's), NULL: slot_size */
  size_t slot_size;
  uint32_t nslots;
  int stop, max_delay_us;
  unsigned long long seed;
  uint64_t reads, writes, errors;
  int fail_reads; /* the next n reads fail with FERRY_EIO */
  int fail_writes; /* the next n writes fail with FERRY_EIO */
  int hold_writes; /* writes wait while set (cleared with a broadcast on cv) */
  pthread_t th;
} fake_store;

static void *fake_store_main(void *p) {
  fake_store *fs = p;
  pthread_mutex_lock(&fs->mu);
  for (;;) {
    while (!fs->head && !fs->stop) pthread_cond_wait(&fs->cv, &fs->mu);
    if (!fs->head) break;
    fake_req *r = fs->head;
    fs->head = r->next;
    if (!fs->head) fs->tail = NULL;
    fs->seed = fs->seed * 6364136223846793005ull + 1442695040888963407ull;
    int delay = fs->max_delay_us ? (int)((fs->seed >> 33) % (unsigned)fs->max_delay_us) : 0;
    pthread_mutex_unlock(&fs->mu);
    if (delay) {
      struct timespec ts = {0, (long)delay * 1000};
      nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&fs->mu);
    while (r->op == 1 && fs->hold_writes && !fs->stop) pthread_cond_wait(&fs->cv, &fs->mu);
    int st = 0;
    if (r->op == 1 && fs->fail_writes > 0) {
      fs->fail_writes--;
      st = FERRY_EIO;
    } else if (r->slot >= fs->nslots || r->len > fs->slot_size ||
        (fs->sizes && r->len > fs->sizes[r->slot]))
      st = FERRY_EINVAL;
    else if (r->op == 1) {
      memcpy(fs->data + (size_t)r->slot * fs->slot_size, r->buf, r->len);
      fs->lens[r->slot] = r->len;
      fs->writes++;
    } else if (fs->fail_reads > 0) {
      fs->fail_reads--;
      st = FERRY_EIO;
    } else if (fs->lens[r->slot] != r->len) {
      st = FERRY_ECORRUPT; /* reading what was never written, or another length */
    } else {
      memcpy(r->buf, fs->data + (size_t)r->slot * fs->slot_size, r->len);
      fs->reads++;
    }
    if (st) fs->errors++;
    r->status = st;
    r->done = 1;
    r->queued = 0;
    pthread_cond_broadcast(&fs->done_cv);
  }
  pthread_mutex_unlock(&fs->mu);
  return NULL;
}

static int fake_submit(void *user, void *req, int op, uint32_t slot, void *buf, size_t len) {
  fake_store *fs = user;
  fake_req *r = req;
  pthread_mutex_lock(&fs->mu);
  if (r->queued) {
    pthread_mutex_unlock(&fs->mu);
    return FERRY_EBUSY;
  }
  r->next = NULL;
  r->op = op;
  r->slot = slot;
  r->buf = buf;
  r->len = len;
  r->done = 0;
  r->queued = 1;
  if (fs->tail) fs->tail->next = r;
  else fs->head = r;
  fs->tail = r;
  pthread_cond_signal(&fs->cv);
  pthread_mutex_unlock(&fs->mu);
  return 0;
}

static int fake_write(void *user, void *req, uint32_t slot, const void *buf, size_t len) {
  return fake_submit(user, req, 1, slot, (void *)buf, len);
}
static int fake_read(void *user, void *req, uint32_t slot, void *buf, size_t len) {
  return fake_submit(user, req, 0, slot, buf, len);
}
static int fake_poll(void *user, void *req) {
  fake_store *fs = user;
  fake_req *r = req;
  pthread_mutex_lock(&fs->mu);
  int st = r->done ? r->status : FERRY_EAGAIN;
  pthread_mutex_unlock(&fs->mu);
  return st;
}
static int fake_wait(void *user, void *req) {
  fake_store *fs = user;
  fake_req *r = req;
  pthread_mutex_lock(&fs->mu);
  while (!r->done) pthread_cond_wait(&fs->done_cv, &fs->mu);
  int st = r->status;
  pthread_mutex_unlock(&fs->mu);
  return st;
}

static int fake_store_open(fake_store *fs, uint32_t nslots, size_t slot_size, int max_delay_us) {
  memset(fs, 0, sizeof *fs);
  pthread_mutex_init(&fs->mu, NULL);
  pthread_cond_init(&fs->cv, NULL);
  pthread_cond_init(&fs->done_cv, NULL);
  fs->nslots = nslots;
  fs->slot_size = slot_size;
  fs->max_delay_us = max_delay_us;
  fs->seed = 12345;
  fs->data = calloc((size_t)nslots + 1, slot_size + 1);
  fs->lens = calloc((size_t)nslots + 1, sizeof *fs->lens);
  if (!fs->data || !fs->lens) return FERRY_ENOMEM;
  return pthread_create(&fs->th, NULL, fake_store_main, fs) ? FERRY_ENOMEM : 0;
}

static void fake_store_close(fake_store *fs) {
  pthread_mutex_lock(&fs->mu);
  fs->stop = 1;
  pthread_cond_signal(&fs->cv);
  pthread_mutex_unlock(&fs->mu);
  pthread_join(fs->th, NULL);
  free(fs->data);
  free(fs->lens);
  free(fs->sizes);
  pthread_mutex_destroy(&fs->mu);
  pthread_cond_destroy(&fs->cv);
  pthread_cond_destroy(&fs->done_cv);
}

static ferry_mem_store fake_store_ops(fake_store *fs) {
  ferry_mem_store s = {fs, sizeof(fake_req), fake_write, fake_read, fake_poll, fake_wait, NULL};
  return s;
}

/* Opens a fake store sized to the manager's layout and wires it in. */
static int fake_store_attach(fake_store *fs, ferry_mem *m, int max_delay_us) {
  uint32_t n;
  size_t sz;
  int rc = ferry_mem_store_layout(m, &n, &sz);
  if (rc) return rc;
  if ((rc = fake_store_open(fs, n, sz ? sz : 1, max_delay_us))) return rc;
  /* each slot's own bytes: its chunk's, then the spares of each NVMe
   * family, the largest of them slot_size */
  uint32_t k = 0;
  if ((rc = ferry_mem_store_slot_sizes(m, NULL, 0, &k))) return rc;
  fs->sizes = calloc((size_t)k + 1, sizeof *fs->sizes);
  if (!fs->sizes) return FERRY_ENOMEM;
  if ((rc = ferry_mem_store_slot_sizes(m, fs->sizes, k, &k))) return rc;
  size_t big = 0;
  for (uint32_t i = 0; i < k; i++) big = fs->sizes[i] > big ? fs->sizes[i] : big;
  if (k < n || (n && big != sz)) return FERRY_EINVAL;
  ferry_mem_store ops = fake_store_ops(fs);
  return ferry_mem_set_store(m, &ops);
}

#endif
