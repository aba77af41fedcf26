/* format/timeline.h — the engine's timeline: spans of work per lane
 * (compute, H2D, D2H, NVMe read/write, optimizer threads), recorded into a
 * buffer reserved at start (no allocation while recording), written as
 * Chrome trace JSON (Perfetto, chrome://tracing), and summed per lane into
 * busy time (the union of the lane's spans).
 */
#ifndef FERRY_FORMAT_TIMELINE_H
#define FERRY_FORMAT_TIMELINE_H

#include "core/core.h"

#include <stdatomic.h>

typedef enum {
  FERRY_LANE_COMPUTE = 0,
  FERRY_LANE_H2D = 1,
  FERRY_LANE_D2H = 2,
  FERRY_LANE_NVME_READ = 3,
  FERRY_LANE_NVME_WRITE = 4,
  FERRY_LANE_STEP = 5,   /* the engine's step driver */
  FERRY_LANE_OPTIM0 = 6, /* optimizer thread k is lane OPTIM0 + k (k < 64) */
  /* collectives between ranks, one lane per engine channel (comm/) */
  FERRY_LANE_COMM_LOOP = 6 + 64,  /* the loop's: norm, fingerprints, param reads */
  FERRY_LANE_COMM_DRAIN = 6 + 65, /* the drain's: grads all-reduced or reduce-scattered */
  FERRY_LANE_COMM_STEP = 6 + 66,  /* the stepper's: new params all-gathered */
  FERRY_LANE_MAX = 6 + 67
} ferry_lane;

typedef struct {
  double t0, t1;  /* seconds, ferry_now() clock */
  int lane;
  char name[40];
} ferry_span;

typedef struct ferry_timeline {
  ferry_span *spans;
  size_t cap;
  atomic_size_t n;       /* spans recorded (may exceed cap: the rest dropped) */
  double origin;         /* t = 0 of the trace */
  double optim_bytes_per_param; /* written at start (the engine's finalize): the metadata's
                                   "optim_bytes_per_param", 0 = left out */
} ferry_timeline;

int ferry_timeline_init(ferry_timeline *tl, size_t capacity);
void ferry_timeline_destroy(ferry_timeline *tl);
/* Restart recording (keeps the buffer); origin = now. */
void ferry_timeline_reset(ferry_timeline *tl);
/* Thread-safe and allocation-free; a full buffer drops the span (counted). */
void ferry_timeline_add(ferry_timeline *tl, int lane, const char *name, double t0, double t1);
size_t ferry_timeline_dropped(const ferry_timeline *tl);
/* Seconds during which the lane had at least one span, within [from, to]. */
double ferry_timeline_busy(const ferry_timeline *tl, int lane, double from, double to);
/* Writes {"traceEvents":[...]} with lane names; FERRY_EIO with the path. */
int ferry_timeline_write(const ferry_timeline *tl, const char *path, ferry_errbuf *err);
const char *ferry_lane_name(int lane, char *buf, size_t len);

#endif
