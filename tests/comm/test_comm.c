/* tests/comm/test_comm.c — the communicators (comm/) against values each
 * rank computes alone: every collective with counts per rank that differ
 * (0 included), in place and not, each dtype and reduction, many queued
 * requests, two channels used from two threads at once, stats, the span
 * hook, bad arguments, AUTO's choice.
 *
 *   test_comm [self|mpi|auto]   the suite (mpi: under mpirun -np N)
 *   test_comm timeout           under mpirun -np 2: rank 1 is late to a
 *                               barrier; rank 0 must time out, naming it
 *   test_comm late_destroy      under mpirun -np 2: rank 0 destroys the
 *                               communicator while rank 1 is late
 *   test_comm die               under mpirun -np 2: rank 1 is killed mid-run
 *   test_comm fail              under mpirun -np 2: rank 1 fails on its own
 *                               (ferry_comm_fail); rank 0's wait names it at once
 *   test_comm nccl              the nccl backend (exits 77 without a GPU)
 */
#include "ferry.h"
#include "tests/test.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int R, N; /* this rank, the number of ranks */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Rank r's element i: small integers, exact in every dtype and in sums. */
static double val(int r, size_t i) { return (double)((int)((i * 7 + (size_t)r * 13) % 61) - 20); }

static void put(void *buf, ferry_dtype dt, size_t i, double x) {
  switch (dt) {
  case FERRY_DT_F32: ((float *)buf)[i] = (float)x; break;
  case FERRY_DT_F64: ((double *)buf)[i] = x; break;
  case FERRY_DT_I32: ((int32_t *)buf)[i] = (int32_t)x; break;
  case FERRY_DT_I64: ((int64_t *)buf)[i] = (int64_t)x; break;
  case FERRY_DT_U64: ((uint64_t *)buf)[i] = (uint64_t)(x + 100); break; /* positive */
  case FERRY_DT_U8: ((uint8_t *)buf)[i] = (uint8_t)(x + 100); break;
  case FERRY_DT_F16:
  case FERRY_DT_BF16: ferry_dtype_store(buf, dt, i, (float)x); break;
  default: REQUIRE(0);
  }
}

static double get(const void *buf, ferry_dtype dt, size_t i) {
  switch (dt) {
  case FERRY_DT_F32: return ((const float *)buf)[i];
  case FERRY_DT_F64: return ((const double *)buf)[i];
  case FERRY_DT_I32: return ((const int32_t *)buf)[i];
  case FERRY_DT_I64: return (double)((const int64_t *)buf)[i];
  case FERRY_DT_U64: return (double)((const uint64_t *)buf)[i] - 100;
  case FERRY_DT_U8: return (double)((const uint8_t *)buf)[i] - 100;
  case FERRY_DT_F16:
  case FERRY_DT_BF16: return ferry_dtype_load(buf, dt, i);
  default: REQUIRE(0);
  }
  return 0;
}

/* op over the ranks' val(r, i), as the dtype holds it. */
static double expect_reduce(ferry_dtype dt, ferry_reduce_op op, size_t i) {
  double acc = 0;
  for (int r = 0; r < N; r++) {
    double x = val(r, i);
    if (dt == FERRY_DT_U64) x += 100;
    if (r == 0)
      acc = x;
    else if (op == FERRY_REDUCE_MAX)
      acc = x > acc ? x : acc;
    else if (op == FERRY_REDUCE_MIN)
      acc = x < acc ? x : acc;
    else
      acc += x;
  }
  if (op == FERRY_REDUCE_AVG) {
    if (dt == FERRY_DT_F32) return (float)acc * (1.0f / (float)N);
    return acc * (1.0 / N);
  }
  return dt == FERRY_DT_U64 ? acc - 100 : acc;
}

static const ferry_dtype reduce_dts[] = {FERRY_DT_F32, FERRY_DT_F64, FERRY_DT_I32, FERRY_DT_I64,
                                         FERRY_DT_U64};
static const ferry_reduce_op ops[] = {FERRY_REDUCE_SUM, FERRY_REDUCE_AVG, FERRY_REDUCE_MAX,
                                      FERRY_REDUCE_MIN};

static int is_float(ferry_dtype dt) { return dt == FERRY_DT_F32 || dt == FERRY_DT_F64; }

/* Counts that differ per rank, with rank 1's 0 (and rank 0's when asked);
 * their sum, and in *lo (may be NULL) where this rank's part starts. */
static size_t uneven(size_t *counts, int zero_first, size_t *lo) {
  size_t total = 0;
  for (int r = 0; r < N; r++) {
    counts[r] = r == 1 || (r == 0 && zero_first) ? 0 : (size_t)(37 + 101 * r);
    if (r == R && lo) *lo = total;
    total += counts[r];
  }
  return total;
}

static void check_allreduce(ferry_comm *c) {
  size_t ns[] = {0, 1, 1000, 70000};
  for (size_t d = 0; d < sizeof reduce_dts / sizeof reduce_dts[0]; d++)
    for (size_t o = 0; o < 4; o++)
      for (size_t k = 0; k < 4; k++)
        for (int in_place = 0; in_place < 2; in_place++) {
          ferry_dtype dt = reduce_dts[d];
          ferry_reduce_op op = ops[o];
          if (op == FERRY_REDUCE_AVG && !is_float(dt)) continue;
          size_t n = ns[k], es = ferry_dtype_size(dt);
          char *send = malloc(n * es + 8), *recv = malloc(n * es + 8);
          for (size_t i = 0; i < n; i++)
            put(send, dt, i, val(R, i));
          int st = ferry_comm_allreduce(c, send, in_place ? send : recv, n, dt, op, NULL, NULL);
          EXPECT_EQ_INT(st, 0);
          const char *out = in_place ? send : recv;
          size_t bad = 0;
          for (size_t i = 0; i < n; i++)
            if (get(out, dt, i) != expect_reduce(dt, op, i)) bad++;
          if (bad)
            fprintf(stderr, "allreduce %s op %d n %zu in_place %d: %zu wrong\n",
                    ferry_dtype_name(dt), (int)op, n, in_place, bad);
          EXPECT(bad == 0);
          free(send);
          free(recv);
        }
}

static void check_reduce_scatter(ferry_comm *c) {
  size_t counts[64];
  for (size_t d = 0; d < sizeof reduce_dts / sizeof reduce_dts[0]; d++)
    for (size_t o = 0; o < 4; o++)
      for (int z = 0; z < 2; z++) {
        ferry_dtype dt = reduce_dts[d];
        ferry_reduce_op op = ops[o];
        if (op == FERRY_REDUCE_AVG && !is_float(dt)) continue;
        size_t lo = 0, total = uneven(counts, z, &lo), es = ferry_dtype_size(dt);
        char *send = malloc(total * es + 8), *recv = malloc(counts[R] * es + 8);
        for (size_t i = 0; i < total; i++)
          put(send, dt, i, val(R, i));
        EXPECT_EQ_INT(ferry_comm_reduce_scatter(c, send, recv, counts, dt, op, NULL, NULL), 0);
        size_t bad = 0;
        for (size_t i = 0; i < counts[R]; i++)
          if (get(recv, dt, i) != expect_reduce(dt, op, lo + i)) bad++;
        EXPECT(bad == 0);
        free(send);
        free(recv);
      }
}

static void check_allgather(ferry_comm *c) {
  static const ferry_dtype dts[] = {FERRY_DT_F32, FERRY_DT_F64, FERRY_DT_I32, FERRY_DT_I64,
                                    FERRY_DT_U64, FERRY_DT_U8,  FERRY_DT_F16, FERRY_DT_BF16};
  size_t counts[64];
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (int z = 0; z < 2; z++)
      for (int in_place = 0; in_place < 2; in_place++) {
        ferry_dtype dt = dts[d];
        size_t lo = 0, total = uneven(counts, z, &lo), es = ferry_dtype_size(dt);
        char *recv = malloc(total * es + 8), *send = malloc(counts[R] * es + 8);
        memset(recv, 0xee, total * es);
        char *mine = in_place ? recv + lo * es : send;
        for (size_t i = 0; i < counts[R]; i++)
          put(mine, dt, i, val(R, i));
        EXPECT_EQ_INT(ferry_comm_allgather(c, mine, recv, counts, dt, NULL, NULL), 0);
        size_t bad = 0, at = 0;
        for (int r = 0; r < N; r++)
          for (size_t i = 0; i < counts[r]; i++, at++)
            if (get(recv, dt, at) != val(r, i)) bad++;
        if (bad)
          fprintf(stderr, "allgather %s in_place %d: %zu wrong\n", ferry_dtype_name(dt), in_place,
                  bad);
        EXPECT(bad == 0);
        free(send);
        free(recv);
      }
}

static void check_broadcast(ferry_comm *c) {
  static const ferry_dtype dts[] = {FERRY_DT_F32, FERRY_DT_U8, FERRY_DT_I64, FERRY_DT_BF16};
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (int root = 0; root < N; root++) {
      ferry_dtype dt = dts[d];
      size_t n = 513, es = ferry_dtype_size(dt);
      char *buf = malloc(n * es);
      for (size_t i = 0; i < n; i++)
        put(buf, dt, i, val(R, i));
      EXPECT_EQ_INT(ferry_comm_broadcast(c, buf, n, dt, root, NULL, NULL), 0);
      size_t bad = 0;
      for (size_t i = 0; i < n; i++)
        if (get(buf, dt, i) != val(root, i)) bad++;
      EXPECT(bad == 0);
      EXPECT_EQ_INT(ferry_comm_broadcast(c, NULL, 0, dt, root, NULL, NULL), 0);
      free(buf);
    }
}

/* The span hook: names and spans in completion order. */
typedef struct {
  pthread_mutex_t mu;
  int n;
  char names[256][24];
  double t0[256], t1[256];
} spans;

static void on_span(void *user, const char *name, double t0, double t1) {
  spans *s = user;
  pthread_mutex_lock(&s->mu);
  if (s->n < 256) {
    snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    s->t0[s->n] = t0;
    s->t1[s->n] = t1;
    s->n++;
  }
  pthread_mutex_unlock(&s->mu);
}

/* Many queued requests: they complete in call order, whatever order they
 * are waited in; the hook sees each, the stats count them. */
static void check_queue(ferry_comm *parent) {
  ferry_comm *c;
  REQUIRE(ferry_comm_dup(parent, &c) == 0);
  static spans sp = {.mu = PTHREAD_MUTEX_INITIALIZER};
  ferry_comm_set_span_hook(c, on_span, &sp);
  enum { K = 60, M = 4096 };
  float *bufs = malloc(sizeof(float) * K * M);
  ferry_comm_req *reqs[K];
  size_t counts[64];
  size_t total = uneven(counts, 0, NULL);
  REQUIRE(total <= M);
  uint64_t sent = 0;
  for (int k = 0; k < K; k++) {
    float *b = bufs + (size_t)k * M;
    for (size_t i = 0; i < M; i++)
      b[i] = (float)(val(R, i) + k);
    int st;
    if (k % 3 == 0) {
      st = ferry_comm_allreduce(c, b, b, M, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, &reqs[k]);
      sent += M * sizeof(float);
    } else if (k % 3 == 1) {
      st = ferry_comm_broadcast(c, b, M, FERRY_DT_F32, k % N, NULL, &reqs[k]);
      sent += k % N == R ? M * sizeof(float) : 0;
    } else {
      size_t lo = 0;
      for (int r = 0; r < R; r++)
        lo += counts[r];
      for (size_t i = 0; i < counts[R]; i++)
        b[lo + i] = (float)(val(R, i) + k);
      st = ferry_comm_allgather(c, b + lo, b, counts, FERRY_DT_F32, NULL, &reqs[k]);
      sent += counts[R] * sizeof(float);
    }
    EXPECT_EQ_INT(st, 0);
  }
  int done = -1;
  EXPECT_EQ_INT(ferry_comm_test(c, reqs[K - 1], &done), 0);
  EXPECT(done == 0 || done == 1);
  for (int k = K - 1; k >= 0; k--)
    EXPECT_EQ_INT(ferry_comm_wait(c, reqs[k]), 0);
  size_t bad = 0;
  for (int k = 0; k < K; k++) {
    float *b = bufs + (size_t)k * M;
    if (k % 3 == 0) {
      for (size_t i = 0; i < M; i++)
        if (b[i] != (float)(expect_reduce(FERRY_DT_F32, FERRY_REDUCE_SUM, i) + N * k)) bad++;
    } else if (k % 3 == 1) {
      for (size_t i = 0; i < M; i++)
        if (b[i] != (float)(val(k % N, i) + k)) bad++;
    } else {
      size_t at = 0;
      for (int r = 0; r < N; r++)
        for (size_t i = 0; i < counts[r]; i++, at++)
          if (b[at] != (float)(val(r, i) + k)) bad++;
    }
  }
  EXPECT(bad == 0);
  ferry_comm_stats st;
  EXPECT_EQ_INT(ferry_comm_get_stats(c, &st), 0);
  EXPECT_EQ_INT(st.ops, K);
  EXPECT_EQ_INT(st.bytes, sent);
  EXPECT(st.seconds >= 0 && st.wait_seconds >= 0);
  pthread_mutex_lock(&sp.mu);
  EXPECT_EQ_INT(sp.n, K);
  for (int k = 0; k < sp.n; k++) {
    const char *want = k % 3 == 0 ? "allreduce" : k % 3 == 1 ? "broadcast" : "allgather";
    EXPECT(strcmp(sp.names[k], want) == 0);
    EXPECT(sp.t1[k] >= sp.t0[k]);
    if (k) EXPECT(sp.t0[k] >= sp.t1[k - 1]); /* one after another, in call order */
  }
  pthread_mutex_unlock(&sp.mu);
  free(bufs);
  ferry_comm_destroy(c);
}

/* Two channels, each used by its own thread at the same time. */
typedef struct {
  ferry_comm *c;
  int which;
  int bad;
} chan_arg;

static void *chan_main(void *p) {
  chan_arg *a = p;
  enum { M = 999 };
  double *b = malloc(sizeof(double) * M * (size_t)(N + 1));
  for (int it = 0; it < 150; it++) {
    for (size_t i = 0; i < M; i++)
      b[i] = val(R, i) * (a->which + 1) + it;
    int st;
    if (a->which == 0) {
      st = ferry_comm_allreduce(a->c, b, b, M, FERRY_DT_F64, FERRY_REDUCE_SUM, NULL, NULL);
      for (size_t i = 0; i < M && !st; i++)
        if (b[i] != expect_reduce(FERRY_DT_F64, FERRY_REDUCE_SUM, i) + N * it) a->bad++;
    } else {
      size_t counts[64];
      for (int r = 0; r < N; r++)
        counts[r] = M;
      st = ferry_comm_allgather(a->c, b, b + M, counts, FERRY_DT_F64, NULL, NULL);
      for (int r = 0; r < N && !st; r++)
        for (size_t i = 0; i < M; i++)
          if (b[M + (size_t)r * M + i] != val(r, i) * 2 + it) a->bad++;
    }
    if (st) a->bad++;
  }
  free(b);
  return NULL;
}

static void check_channels(ferry_comm *c) {
  ferry_comm *c1, *c2;
  REQUIRE(ferry_comm_dup(c, &c1) == 0);
  REQUIRE(ferry_comm_dup(c, &c2) == 0);
  EXPECT_EQ_INT(ferry_comm_rank(c1), R);
  EXPECT_EQ_INT(ferry_comm_size(c2), N);
  EXPECT_EQ_INT(ferry_comm_get_kind(c1), ferry_comm_get_kind(c));
  EXPECT_EQ_INT(ferry_comm_local_rank(c1), ferry_comm_local_rank(c));
  {
    chan_arg a = {c1, 0, 0}, b = {c2, 1, 0};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, chan_main, &a);
    pthread_create(&tb, NULL, chan_main, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    EXPECT_EQ_INT(a.bad, 0);
    EXPECT_EQ_INT(b.bad, 0);
  }
  ferry_comm_destroy(c2);
  ferry_comm_destroy(c1);
}

static void check_bad_args(ferry_comm *c) {
  float x[16] = {0}, y[16] = {0};
  size_t counts[64];
  for (int r = 0; r < N; r++)
    counts[r] = 1;
  EXPECT_EQ_INT(ferry_comm_allreduce(NULL, x, y, 1, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_EINVAL);
  EXPECT(strstr(ferry_last_error(), "NULL") != NULL);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, NULL, y, 4, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_EINVAL);
  EXPECT(strstr(ferry_comm_last_error(c), "send is NULL") != NULL);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, x, x + 1, 4, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_EINVAL);
  EXPECT(strstr(ferry_comm_last_error(c), "overlap") != NULL);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, x, y, 4, FERRY_DT_U8, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_EINVAL);
  EXPECT(strstr(ferry_comm_last_error(c), "U8") != NULL);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, x, y, 4, FERRY_DT_I32, FERRY_REDUCE_AVG, NULL, NULL),
                FERRY_EINVAL);
  EXPECT(strstr(ferry_comm_last_error(c), "avg") != NULL);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, x, y, 4, FERRY_DT_F32, (ferry_reduce_op)9, NULL, NULL),
                FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, x, y, 4, (ferry_dtype)99, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_EINVAL);
  if (ferry_comm_get_kind(c) == FERRY_COMM_MPI) {
    EXPECT_EQ_INT(ferry_comm_allreduce(c, x, y, 4, FERRY_DT_F16, FERRY_REDUCE_SUM, NULL, NULL),
                  FERRY_ENOTSUP);
    EXPECT(strstr(ferry_comm_last_error(c), "F16") != NULL);
  }
  EXPECT_EQ_INT(
      ferry_comm_allreduce(c, x, y, SIZE_MAX / 2, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
      FERRY_EOVERFLOW);
  EXPECT_EQ_INT(ferry_comm_broadcast(c, x, 1, FERRY_DT_F32, N, NULL, NULL), FERRY_EINVAL);
  EXPECT(strstr(ferry_comm_last_error(c), "root") != NULL);
  EXPECT_EQ_INT(ferry_comm_broadcast(c, x, 1, FERRY_DT_F32, -1, NULL, NULL), FERRY_EINVAL);
  EXPECT_EQ_INT(
      ferry_comm_reduce_scatter(c, x, y, NULL, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
      FERRY_EINVAL);
  EXPECT_EQ_INT(
      ferry_comm_reduce_scatter(c, x, x, counts, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
      FERRY_EINVAL);
  EXPECT(strstr(ferry_comm_last_error(c), "overlaps") != NULL);
  for (int r = 0; r < N; r++)
    counts[r] = 2;
  EXPECT_EQ_INT(ferry_comm_allgather(c, x + 2 * R + 1, x, counts, FERRY_DT_F32, NULL, NULL),
                FERRY_EINVAL);
  EXPECT(strstr(ferry_comm_last_error(c), "place") != NULL);
  for (int r = 0; r < N; r++)
    counts[r] = SIZE_MAX / 2;
  EXPECT_EQ_INT(ferry_comm_allgather(c, x, y, counts, FERRY_DT_F32, NULL, NULL), FERRY_EOVERFLOW);
  EXPECT_EQ_INT(ferry_comm_wait(c, NULL), 0);
  int done;
  EXPECT_EQ_INT(ferry_comm_test(c, NULL, &done), FERRY_EINVAL);
  ferry_comm_stats st;
  EXPECT_EQ_INT(ferry_comm_get_stats(NULL, &st), FERRY_EINVAL);
  /* Refused calls broke nothing: the ranks still agree. */
  EXPECT_EQ_INT(ferry_comm_barrier(c, NULL), 0);
  ferry_comm_req *req = NULL;
  EXPECT_EQ_INT(ferry_comm_barrier(c, &req), 0);
  EXPECT(req != NULL);
  EXPECT_EQ_INT(ferry_comm_wait(c, req), 0);
}

static void check_create_args(void) {
  EXPECT_EQ_INT(ferry_comm_create(NULL, NULL), FERRY_EINVAL);
  ferry_comm_options o = ferry_comm_options_default();
  ferry_comm *c = NULL;
  o.timeout = -1;
  EXPECT_EQ_INT(ferry_comm_create(&o, &c), FERRY_EINVAL);
  EXPECT(strstr(ferry_last_error(), "timeout") != NULL);
  o = ferry_comm_options_default();
  o.kind = (ferry_comm_kind)7;
  EXPECT_EQ_INT(ferry_comm_create(&o, &c), FERRY_EINVAL);
  o.kind = FERRY_COMM_NCCL;
  int st = ferry_comm_create(&o, &c);
  if (ferry_comm_compiled(FERRY_COMM_NCCL)) {
    EXPECT_EQ_INT(st, FERRY_EINVAL); /* no cuda device given */
    EXPECT(strstr(ferry_last_error(), "cuda device") != NULL);
  } else {
    EXPECT_EQ_INT(st, FERRY_ENOTSUP);
    EXPECT(strstr(ferry_last_error(), "not compiled") != NULL);
  }
  EXPECT(c == NULL);
  if (!ferry_comm_compiled(FERRY_COMM_MPI)) {
    o.kind = FERRY_COMM_MPI;
    EXPECT_EQ_INT(ferry_comm_create(&o, &c), FERRY_ENOTSUP);
    EXPECT(strstr(ferry_last_error(), "not compiled") != NULL);
  }
  EXPECT(ferry_comm_compiled(FERRY_COMM_SELF) && ferry_comm_compiled(FERRY_COMM_AUTO));
  EXPECT(strcmp(ferry_comm_kind_name(FERRY_COMM_MPI), "mpi") == 0);
}

/* 1 when OpenMPI's libmpi is mapped into this process: ferry opens it
 * with the first MPI communicator, never at program start. */
static int libmpi_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  REQUIRE(f != NULL);
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, "/libmpi.so") != NULL;
  fclose(f);
  return found;
}

static ferry_comm *create(ferry_comm_kind kind, double timeout) {
  ferry_comm_options o = ferry_comm_options_default();
  o.kind = kind;
  o.timeout = timeout;
  ferry_comm *c = NULL;
  int st = ferry_comm_create(&o, &c);
  if (st)
    fprintf(stderr, "ferry_comm_create(%s): %s\n", ferry_comm_kind_name(kind), ferry_last_error());
  REQUIRE(st == 0);
  R = ferry_comm_rank(c);
  N = ferry_comm_size(c);
  return c;
}

/* SELF has no other rank to tell: ferry_comm_fail on a channel breaks the
 * communicator it was made from and its other channels, whose later calls
 * name the rank and the cause; another communicator stays whole. */
static void check_self_fail(void) {
  ferry_comm *c = create(FERRY_COMM_SELF, 60), *ch = NULL, *ch2 = NULL, *other = NULL;
  REQUIRE(ferry_comm_dup(c, &ch) == 0 && ferry_comm_dup(c, &ch2) == 0);
  other = create(FERRY_COMM_SELF, 60);
  EXPECT_EQ_INT(ferry_comm_fail(ch, "the disk is on fire"), 0);
  float x = 1;
  EXPECT_EQ_INT(ferry_comm_barrier(c, NULL), FERRY_EIO);
  EXPECT(strstr(ferry_comm_last_error(c), "rank 0 failed: the disk is on fire") != NULL);
  EXPECT_EQ_INT(ferry_comm_allreduce(ch2, &x, &x, 1, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_EIO);
  EXPECT(strstr(ferry_comm_last_error(ch2), "rank 0 failed: the disk is on fire") != NULL);
  ferry_comm *late = NULL;
  EXPECT_EQ_INT(ferry_comm_dup(c, &late), FERRY_EIO);
  EXPECT(late == NULL);
  EXPECT_EQ_INT(ferry_comm_barrier(other, NULL), 0);
  ferry_comm_destroy(ch);
  ferry_comm_destroy(c);
  EXPECT_EQ_INT(ferry_comm_barrier(ch2, NULL), FERRY_EIO); /* outlives its parent */
  ferry_comm_destroy(ch2);
  ferry_comm_destroy(other);
}

static int suite(ferry_comm_kind kind) {
  int under_mpi = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
  if (kind == FERRY_COMM_MPI && !ferry_comm_compiled(FERRY_COMM_MPI))
    TEST_SKIP("the mpi backend is not compiled into this build");
  if (kind == FERRY_COMM_MPI && !under_mpi) TEST_SKIP("run me under mpirun");
  EXPECT(!libmpi_mapped()); /* a program maps no MPI until it makes an MPI communicator */
  ferry_comm *c = create(kind, 60);
  REQUIRE(N >= 1 && N <= 64 && R >= 0 && R < N);
  ferry_comm_kind want = kind;
  if (kind == FERRY_COMM_AUTO)
    want = under_mpi && ferry_comm_compiled(FERRY_COMM_MPI) ? FERRY_COMM_MPI : FERRY_COMM_SELF;
  EXPECT_EQ_INT(ferry_comm_get_kind(c), want);
  EXPECT_EQ_INT(libmpi_mapped(), want == FERRY_COMM_MPI);
  if (want == FERRY_COMM_MPI && under_mpi) EXPECT_EQ_INT(N, atoi(getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT(ferry_comm_local_size(c) >= 1 && ferry_comm_local_rank(c) < ferry_comm_local_size(c));
  if (want == FERRY_COMM_SELF) EXPECT_EQ_INT(N, 1);
  if (kind != FERRY_COMM_AUTO) {
    /* A second communicator of the same job: AUTO picks the same kind. */
    ferry_comm *a = create(FERRY_COMM_AUTO, 0);
    EXPECT_EQ_INT(ferry_comm_get_kind(a), want);
    ferry_comm_destroy(a);
  }
  check_create_args();
  check_allreduce(c);
  check_reduce_scatter(c);
  check_allgather(c);
  check_broadcast(c);
  check_queue(c);
  check_channels(c);
  check_bad_args(c);
  ferry_comm_stats st;
  EXPECT_EQ_INT(ferry_comm_get_stats(c, &st), 0);
  EXPECT(st.ops > 100);
  EXPECT(st.bytes > 0);
  ferry_comm_destroy(c);
  if (want == FERRY_COMM_SELF) check_self_fail();
  return test_finish("test_comm");
}

/* Rank 1 is late to a barrier: rank 0's wait times out naming it, later
 * calls fail the same way, and rank 0 ends the job. */
static int late_rank(void) {
  ferry_comm *c = create(FERRY_COMM_MPI, 1.0);
  REQUIRE(N == 2);
  EXPECT_EQ_INT(ferry_comm_barrier(c, NULL), 0);
  if (R == 1) {
    sleep(8); /* the abort below ends this process first */
    ferry_comm_barrier(c, NULL);
    fprintf(stderr, "rank 1: still alive after rank 0's abort\n");
    return 1;
  }
  double t0 = now_s();
  int st = ferry_comm_barrier(c, NULL);
  double waited = now_s() - t0;
  EXPECT_EQ_INT(st, FERRY_ETIMEDOUT);
  EXPECT(waited >= 0.9 && waited < 5);
  const char *msg = ferry_comm_last_error(c);
  EXPECT(strstr(msg, "barrier of 0 bytes on rank 0 did not complete within 1 s") != NULL);
  float x = 1;
  EXPECT_EQ_INT(ferry_comm_allreduce(c, &x, &x, 1, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_ETIMEDOUT);
  EXPECT(strstr(ferry_comm_last_error(c), "did not complete") != NULL);
  ferry_comm *d = NULL;
  EXPECT_EQ_INT(ferry_comm_dup(c, &d), FERRY_ETIMEDOUT);
  if (test_failures) return test_finish("test_comm timeout");
  fprintf(stderr, "rank 0: as expected: %s\n", msg);
  ferry_comm_abort(c, 3);
  return 1;
}

/* Rank 1 is late to a queued barrier that rank 0 never waits for: rank 0's
 * destroy gives up after the timeout instead of hanging, and the job ends
 * by ferry_comm_abort(NULL, ...). */
static int late_destroy(void) {
  ferry_comm *c = create(FERRY_COMM_MPI, 1.0);
  REQUIRE(N == 2);
  EXPECT_EQ_INT(ferry_comm_barrier(c, NULL), 0);
  if (R == 1) {
    sleep(8);
    fprintf(stderr, "rank 1: still alive after rank 0's abort\n");
    return 1;
  }
  ferry_comm_req *req;
  EXPECT_EQ_INT(ferry_comm_barrier(c, &req), 0);
  double t0 = now_s();
  ferry_comm_destroy(c);
  double took = now_s() - t0;
  EXPECT(took >= 0.9 && took < 5);
  const char *msg = ferry_last_error();
  EXPECT(strstr(msg, "did not complete within 1 s on rank 0") != NULL);
  if (test_failures) return test_finish("test_comm late_destroy");
  fprintf(stderr, "rank 0: as expected: %s\n", msg);
  ferry_comm_abort(NULL, 3);
  return 1;
}

/* Rank 1 fails on its own (ferry_comm_fail) while rank 0 waits on a
 * channel with a 60 s timeout: rank 0's wait fails within 2 s with
 * FERRY_EIO naming rank 1 and its cause; rank 0's own ferry_comm_fail
 * then returns at once (nothing sent to rank 1), and rank 0 ends the job. */
static int failing_rank(void) {
  ferry_comm *c = create(FERRY_COMM_MPI, 60.0), *ch = NULL;
  REQUIRE(N == 2);
  REQUIRE(ferry_comm_dup(c, &ch) == 0);
  EXPECT_EQ_INT(ferry_comm_barrier(c, NULL), 0);
  if (R == 1) {
    EXPECT_EQ_INT(ferry_comm_fail(c, "the disk is on fire"), 0);
    EXPECT_EQ_INT(ferry_comm_barrier(c, NULL), FERRY_EIO); /* broken here too */
    EXPECT(strstr(ferry_comm_last_error(c), "rank 1 failed: the disk is on fire") != NULL);
    if (test_failures) return test_finish("test_comm fail (rank 1)");
    sleep(8); /* rank 0's abort ends this process first */
    fprintf(stderr, "rank 1: still alive after rank 0's abort\n");
    return 1;
  }
  double t0 = now_s();
  int st = ferry_comm_barrier(ch, NULL);
  double waited = now_s() - t0;
  EXPECT_EQ_INT(st, FERRY_EIO);
  EXPECT(waited < 2);
  const char *msg = ferry_comm_last_error(ch);
  EXPECT(strstr(msg, "barrier of 0 bytes on rank 0: rank 1 failed: the disk is on fire") != NULL);
  float x = 1; /* the parent learns it at its next wait */
  EXPECT_EQ_INT(ferry_comm_allreduce(c, &x, &x, 1, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL),
                FERRY_EIO);
  EXPECT(strstr(ferry_comm_last_error(c), "rank 1 failed: the disk is on fire") != NULL);
  /* rank 0 fails in turn: it tells no rank 1, which failed first and does
   * not take messages (asleep), so the call does not wait out the second
   * a send to it may take */
  t0 = now_s();
  EXPECT_EQ_INT(ferry_comm_fail(c, "following rank 1"), 0);
  double told = now_s() - t0;
  EXPECT(told < 0.5);
  if (test_failures) return test_finish("test_comm fail");
  fprintf(stderr, "rank 0: as expected after %.2f s (told in %.3f s): %s\n", waited, told, msg);
  ferry_comm_abort(c, 3);
  return 1;
}

/* Rank 1 dies (SIGKILL) between collectives; the job must end. */
static int dying_rank(void) {
  ferry_comm *c = create(FERRY_COMM_MPI, 20.0);
  REQUIRE(N == 2);
  float x[256];
  for (int it = 0;; it++) {
    if (R == 1 && it == 5) kill(getpid(), SIGKILL);
    int st = ferry_comm_allreduce(c, x, x, 256, FERRY_DT_F32, FERRY_REDUCE_SUM, NULL, NULL);
    if (st) {
      fprintf(stderr, "rank %d: allreduce failed as expected: %s\n", R, ferry_comm_last_error(c));
      ferry_comm_abort(c, 4);
    }
    if (it > 100000) break;
  }
  return 1;
}

/* Without OpenMPI's library the mpi communicator fails cleanly, naming
 * the library and the loader's reason, and nothing of MPI is mapped. */
static int missing_libmpi(void) {
  if (!ferry_comm_compiled(FERRY_COMM_MPI))
    TEST_SKIP("the mpi backend is not compiled into this build");
  setenv("FERRY_LIBMPI", "/nonexistent/libmpi.so.40", 1);
  ferry_comm_options o = ferry_comm_options_default();
  o.kind = FERRY_COMM_MPI;
  ferry_comm *c = NULL;
  EXPECT_EQ_INT(ferry_comm_create(&o, &c), FERRY_ENOTSUP);
  EXPECT(c == NULL);
  const char *msg = ferry_last_error();
  EXPECT(strstr(msg, "cannot load OpenMPI's library /nonexistent/libmpi.so.40") != NULL);
  EXPECT(strstr(msg, "No such file") != NULL); /* dlerror() */
  EXPECT(!libmpi_mapped());
  if (test_failures) fprintf(stderr, "message: %s\n", msg);
  return test_finish("test_comm no_libmpi");
}

/* NCCL: an all-reduce and an uneven all-gather on device buffers. */
static int nccl_suite(void) {
  if (!ferry_comm_compiled(FERRY_COMM_NCCL))
    TEST_SKIP("the nccl backend is not compiled into this build");
  ferry_gpu_info g[1];
  int ng = 0;
  char why[256] = "";
  ferry_gpu_list(g, 1, &ng, why, sizeof why);
  if (ng == 0) TEST_SKIP("no CUDA device (%s)", why);
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_CUDA;
  dc.capacity = 64u << 20;
  ferry_device *dev;
  REQUIRE(ferry_device_create(&dc, &dev) == 0);
  ferry_comm_options o = ferry_comm_options_default();
  o.kind = FERRY_COMM_NCCL;
  o.dev = dev;
  o.timeout = 60;
  ferry_comm *c;
  int st = ferry_comm_create(&o, &c);
  if (st) fprintf(stderr, "nccl create: %s\n", ferry_last_error());
  REQUIRE(st == 0);
  R = ferry_comm_rank(c);
  N = ferry_comm_size(c);
  ferry_stream *s;
  REQUIRE(ferry_stream_create(dev, &s) == 0);
  enum { M = 1000 };
  float h[M * 64], *d;
  REQUIRE(ferry_device_alloc(dev, sizeof h, (void **)&d) == 0);
  for (size_t i = 0; i < M; i++)
    h[i] = (float)val(R, i);
  REQUIRE(ferry_memcpy_async(s, d, h, M * sizeof(float), FERRY_COPY_H2D) == 0);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, d, d, M, FERRY_DT_F32, FERRY_REDUCE_SUM, s, NULL), 0);
  REQUIRE(ferry_memcpy_async(s, h, d, M * sizeof(float), FERRY_COPY_D2H) == 0);
  REQUIRE(ferry_stream_synchronize(s) == 0);
  for (size_t i = 0; i < M; i++)
    EXPECT(h[i] == (float)expect_reduce(FERRY_DT_F32, 0, i));
  size_t counts[64], lo = 0, total = uneven(counts, 0, &lo);
  for (size_t i = 0; i < counts[R]; i++)
    h[lo + i] = (float)val(R, i);
  REQUIRE(ferry_memcpy_async(s, d, h, total * sizeof(float), FERRY_COPY_H2D) == 0);
  ferry_comm_req *req;
  EXPECT_EQ_INT(ferry_comm_allgather(c, d + lo, d, counts, FERRY_DT_F32, s, &req), 0);
  EXPECT_EQ_INT(ferry_comm_wait(c, req), 0);
  REQUIRE(ferry_memcpy_async(s, h, d, total * sizeof(float), FERRY_COPY_D2H) == 0);
  REQUIRE(ferry_stream_synchronize(s) == 0);
  size_t at = 0, bad = 0;
  for (int r = 0; r < N; r++)
    for (size_t i = 0; i < counts[r]; i++, at++)
      bad += h[at] != (float)val(r, i);
  EXPECT(bad == 0);
  EXPECT_EQ_INT(ferry_comm_barrier(c, NULL), 0);
  /* ferry_comm_fail on a channel: told over MPI, process-wide as on MPI,
   * so the parent's next collective fails naming it (last: nothing of this
   * process's NCCL works after it) */
  ferry_comm *ch = NULL;
  REQUIRE(ferry_comm_dup(c, &ch) == 0);
  EXPECT_EQ_INT(ferry_comm_fail(ch, "the disk is on fire"), 0);
  EXPECT_EQ_INT(ferry_comm_allreduce(c, d, d, M, FERRY_DT_F32, FERRY_REDUCE_SUM, s, NULL),
                FERRY_EIO);
  EXPECT(strstr(ferry_comm_last_error(c), "failed: the disk is on fire") != NULL);
  ferry_comm_destroy(ch);
  ferry_comm_destroy(c);
  ferry_stream_destroy(s);
  ferry_device_destroy(dev);
  return test_finish("test_comm nccl");
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "auto";
  if (!strcmp(mode, "-h") || !strcmp(mode, "--help")) {
    printf("usage: test_comm [self|mpi|auto|timeout|late_destroy|die|fail|nccl|no_libmpi]\n");
    return 0;
  }
  if (!strcmp(mode, "self")) return suite(FERRY_COMM_SELF);
  if (!strcmp(mode, "mpi")) return suite(FERRY_COMM_MPI);
  if (!strcmp(mode, "auto")) return suite(FERRY_COMM_AUTO);
  if (!strcmp(mode, "timeout")) return late_rank();
  if (!strcmp(mode, "late_destroy")) return late_destroy();
  if (!strcmp(mode, "die")) return dying_rank();
  if (!strcmp(mode, "fail")) return failing_rank();
  if (!strcmp(mode, "nccl")) return nccl_suite();
  if (!strcmp(mode, "no_libmpi")) return missing_libmpi();
  fprintf(stderr, "test_comm: unknown mode '%s' (see --help)\n", mode);
  return 2;
}
