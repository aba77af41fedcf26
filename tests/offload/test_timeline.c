/* tests/offload/test_timeline.c — timeline spans from several threads, busy
 * time as the union of a lane's spans, the drop count of a full buffer, and
 * the Chrome trace file.
 */
#include "format/timeline.h"
#include "tests/test.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static ferry_timeline tl;

static void *adder(void *arg) {
  int lane = (int)(intptr_t)arg;
  for (int i = 0; i < 1000; i++) ferry_timeline_add(&tl, lane, "work", i, i + 0.5);
  return NULL;
}

int main(void) {
  REQUIRE(ferry_timeline_init(&tl, 10000) == 0);
  double o = tl.origin;
  /* lane 0: [0,1] [0.5,2] [3,4] -> busy 3; clipped to [0.5, 3.5] -> 2 */
  ferry_timeline_add(&tl, FERRY_LANE_COMPUTE, "a", o + 0, o + 1);
  ferry_timeline_add(&tl, FERRY_LANE_COMPUTE, "b", o + 0.5, o + 2);
  ferry_timeline_add(&tl, FERRY_LANE_COMPUTE, "c", o + 3, o + 4);
  ferry_timeline_add(&tl, FERRY_LANE_H2D, "h", o + 1, o + 1.25);
  EXPECT(fabs(ferry_timeline_busy(&tl, FERRY_LANE_COMPUTE, o, o + 10) - 3.0) < 1e-9);
  EXPECT(fabs(ferry_timeline_busy(&tl, FERRY_LANE_COMPUTE, o + 0.5, o + 3.5) - 2.0) < 1e-9);
  EXPECT(fabs(ferry_timeline_busy(&tl, FERRY_LANE_H2D, o, o + 10) - 0.25) < 1e-9);
  EXPECT(ferry_timeline_busy(&tl, FERRY_LANE_D2H, o, o + 10) == 0);

  char path[] = "/tmp/ferry-timeline-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  EXPECT(ferry_timeline_write(&tl, path, NULL) == 0);
  FILE *f = fopen(path, "r");
  REQUIRE(f);
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  EXPECT(strstr(buf, "\"traceEvents\"") && strstr(buf, "\"name\":\"compute\"") &&
         strstr(buf, "\"ph\":\"X\"") && strstr(buf, "\"name\":\"H2D\""));
  remove(path);

  /* threads, then a full buffer drops and counts */
  ferry_timeline_reset(&tl);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, adder, (void *)(intptr_t)(FERRY_LANE_OPTIM0 + i));
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  EXPECT(ferry_timeline_dropped(&tl) == 0);
  EXPECT(fabs(ferry_timeline_busy(&tl, FERRY_LANE_OPTIM0 + 2, -1, 1e9) - 500.0) < 1e-6);
  ferry_timeline_destroy(&tl);
  REQUIRE(ferry_timeline_init(&tl, 10) == 0);
  for (int i = 0; i < 15; i++) ferry_timeline_add(&tl, 0, "x", 0, 1);
  EXPECT(ferry_timeline_dropped(&tl) == 5);
  ferry_timeline_destroy(&tl);
  return test_finish("test_timeline");
}
