/* format/timeline.c — span recording into a reserved buffer, per-lane busy
 * time (union of intervals) and the Chrome trace JSON writer.
 */
#include "format/timeline.h"
#include "core/outfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ferry_timeline_init(ferry_timeline *tl, size_t capacity) {
  memset(tl, 0, sizeof *tl);
  if (capacity) {
    tl->spans = calloc(capacity, sizeof *tl->spans);
    if (!tl->spans) return FERRY_ENOMEM;
  }
  tl->cap = capacity;
  atomic_init(&tl->n, 0);
  tl->origin = ferry_now();
  return FERRY_OK;
}

void ferry_timeline_destroy(ferry_timeline *tl) {
  free(tl->spans);
  memset(tl, 0, sizeof *tl);
}

void ferry_timeline_reset(ferry_timeline *tl) {
  atomic_store(&tl->n, 0);
  tl->origin = ferry_now();
}

void ferry_timeline_add(ferry_timeline *tl, int lane, const char *name, double t0, double t1) {
  if (!tl || !tl->cap) return;
  size_t i = atomic_fetch_add(&tl->n, 1);
  if (i >= tl->cap) return;
  ferry_span *s = &tl->spans[i];
  s->t0 = t0;
  s->t1 = t1 > t0 ? t1 : t0;
  s->lane = lane;
  snprintf(s->name, sizeof s->name, "%s", name ? name : "");
}

size_t ferry_timeline_dropped(const ferry_timeline *tl) {
  size_t n = atomic_load(&((ferry_timeline *)tl)->n);
  return n > tl->cap ? n - tl->cap : 0;
}

static size_t count(const ferry_timeline *tl) {
  size_t n = atomic_load(&((ferry_timeline *)tl)->n);
  return n < tl->cap ? n : tl->cap;
}

static int cmp_t0(const void *a, const void *b) {
  const double *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

double ferry_timeline_busy(const ferry_timeline *tl, int lane, double from, double to) {
  size_t n = count(tl), m = 0;
  double *iv = malloc((n ? n : 1) * 2 * sizeof *iv);
  if (!iv) return -1;
  for (size_t i = 0; i < n; i++) {
    const ferry_span *s = &tl->spans[i];
    if (s->lane != lane) continue;
    double a = s->t0 < from ? from : s->t0, b = s->t1 > to ? to : s->t1;
    if (b <= a) continue;
    iv[2 * m] = a;
    iv[2 * m + 1] = b;
    m++;
  }
  qsort(iv, m, 2 * sizeof *iv, cmp_t0);
  double busy = 0, cur0 = 0, cur1 = -1;
  for (size_t i = 0; i < m; i++) {
    if (iv[2 * i] > cur1) {
      if (cur1 > cur0) busy += cur1 - cur0;
      cur0 = iv[2 * i];
      cur1 = iv[2 * i + 1];
    } else if (iv[2 * i + 1] > cur1) {
      cur1 = iv[2 * i + 1];
    }
  }
  if (cur1 > cur0) busy += cur1 - cur0;
  free(iv);
  return busy;
}

const char *ferry_lane_name(int lane, char *buf, size_t len) {
  static const char *fixed[] = {"compute", "H2D", "D2H", "NVMe read", "NVMe write", "step"};
  static const char *comm[] = {"comm loop", "comm drain", "comm step"};
  if (lane >= 0 && lane < FERRY_LANE_OPTIM0) snprintf(buf, len, "%s", fixed[lane]);
  else if (lane >= FERRY_LANE_COMM_LOOP && lane < FERRY_LANE_MAX)
    snprintf(buf, len, "%s", comm[lane - FERRY_LANE_COMM_LOOP]);
  else snprintf(buf, len, "optimizer %d", lane - FERRY_LANE_OPTIM0);
  return buf;
}

static void put_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

int ferry_timeline_write(const ferry_timeline *tl, const char *path, ferry_errbuf *err) {
  ferry_outfile o;
  char why[512];
  int rc = ferry_outfile_open(&o, path, why, sizeof why);
  if (rc) return ferry_err(err, rc, "timeline: %s", why);
  FILE *f = o.f;
  size_t n = count(tl);
  int used[FERRY_LANE_MAX] = {0};
  for (size_t i = 0; i < n; i++)
    if (tl->spans[i].lane >= 0 && tl->spans[i].lane < FERRY_LANE_MAX) used[tl->spans[i].lane] = 1;
  fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
  int first = 1;
  char name[64];
  for (int lane = 0; lane < FERRY_LANE_MAX; lane++) {
    if (!used[lane]) continue;
    fprintf(f, "%s{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":",
            first ? "" : ",\n", lane);
    put_json_string(f, ferry_lane_name(lane, name, sizeof name));
    fprintf(f, "}},\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\","
               "\"args\":{\"sort_index\":%d}}",
            lane, lane);
    first = 0;
  }
  for (size_t i = 0; i < n; i++) {
    const ferry_span *s = &tl->spans[i];
    fprintf(f, "%s{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":",
            first ? "" : ",\n", s->lane, (s->t0 - tl->origin) * 1e6, (s->t1 - s->t0) * 1e6);
    put_json_string(f, s->name);
    fputc('}', f);
    first = 0;
  }
  fprintf(f, "\n],\"otherData\":{\"dropped_spans\":%zu", ferry_timeline_dropped(tl));
  if (tl->optim_bytes_per_param > 0)
    fprintf(f, ",\"optim_bytes_per_param\":%.4f", tl->optim_bytes_per_param);
  fputs("}}\n", f);
  rc = ferry_outfile_commit(&o, why, sizeof why);
  return rc ? ferry_err(err, rc, "timeline: %s", why) : FERRY_OK;
}
