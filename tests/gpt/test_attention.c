/* tests/gpt/test_attention.c — the CPU references of causal attention
 * (examples/gpt/attention_ref.c): the tiled flash-style reference equals
 * the naive one (o, lse, dq, dk, dv within 2e-5 of the largest magnitude of
 * each tensor) over ragged T, grouped-query heads, head dims 16..128, packed
 * [q k v] rows and planar buffers with padded strides (columns outside the
 * heads left untouched); the naive backward against central finite
 * differences; causality (a changed future key leaves earlier rows bit for
 * bit); the shape check; and a control showing the comparison fails on a
 * wrong result.
 */
#include "gpt_attn.h"

#include "tests/test.h"

#include <math.h>
#include <string.h>

#define SENTINEL 12345.0f

typedef struct {
  gpt_attn_shape s;
  float *qkv, *dqkv, *q, *k, *v, *dq, *dk, *dv; /* q k v (and grads): views */
  float *o, *dout, *lse;
  long nqkv, no;
} bufs;

static unsigned long long seed = 0x9e3779b97f4a7c15ull;
static float q_amp = 2.5f; /* q in [-q_amp, q_amp]: larger, more peaked rows */
static float urand(float a) {
  return a * (2.0f * (float)(test_rand(&seed) >> 11) / 9007199254740992.0f - 1.0f);
}

/* packed: rows [q k v pad] in one buffer; else three planar buffers with
 * their own padding. o and dout rows padded by 16 columns. The padding
 * holds SENTINEL. */
static void make(bufs *x, int B, int T, int H, int KV, int hd, int packed) {
  memset(x, 0, sizeof *x);
  gpt_attn_shape *s = &x->s;
  s->B = B, s->T = T, s->H = H, s->KV = KV, s->hd = hd;
  s->scale = 1.0f / sqrtf((float)hd);
  long BT = (long)B * T, pad = 16;
  if (packed) {
    s->ldq = s->ldk = s->ldv = (long)(H + 2 * KV) * hd + pad;
    x->nqkv = BT * s->ldq;
  } else {
    s->ldq = (long)H * hd + pad, s->ldk = (long)KV * hd + 8, s->ldv = (long)KV * hd;
    x->nqkv = BT * (s->ldq + s->ldk + s->ldv);
  }
  s->ldo = (long)H * hd + pad;
  x->no = BT * s->ldo;
  x->qkv = malloc(x->nqkv * sizeof(float));
  x->dqkv = malloc(x->nqkv * sizeof(float));
  x->o = malloc(x->no * sizeof(float));
  x->dout = malloc(x->no * sizeof(float));
  x->lse = malloc((size_t)B * H * T * sizeof(float));
  REQUIRE(x->qkv && x->dqkv && x->o && x->dout && x->lse);
  if (packed) {
    x->q = x->qkv, x->k = x->qkv + (long)H * hd, x->v = x->qkv + (long)(H + KV) * hd;
    x->dq = x->dqkv, x->dk = x->dqkv + (long)H * hd, x->dv = x->dqkv + (long)(H + KV) * hd;
  } else {
    x->q = x->qkv, x->k = x->q + BT * s->ldq, x->v = x->k + BT * s->ldk;
    x->dq = x->dqkv, x->dk = x->dq + BT * s->ldq, x->dv = x->dk + BT * s->ldk;
  }
  for (long i = 0; i < x->nqkv; i++)
    x->qkv[i] = SENTINEL, x->dqkv[i] = SENTINEL;
  for (long i = 0; i < x->no; i++)
    x->o[i] = SENTINEL, x->dout[i] = SENTINEL;
  /* q wider than k and v: peaked rows, so the online max moves */
  for (long n = 0; n < BT; n++) {
    for (int c = 0; c < H * hd; c++)
      x->q[n * s->ldq + c] = urand(q_amp);
    for (int c = 0; c < KV * hd; c++)
      x->k[n * s->ldk + c] = urand(1.0f);
    for (int c = 0; c < KV * hd; c++)
      x->v[n * s->ldv + c] = urand(1.0f);
    for (int c = 0; c < H * hd; c++)
      x->dout[n * s->ldo + c] = urand(1.0f);
  }
}
static void drop(bufs *x) { free(x->qkv), free(x->dqkv), free(x->o), free(x->dout), free(x->lse); }

/* max |a - b| over the heads' columns, and max |b| */
static double maxdiff(const float *a, const float *b, long ld, long rows, int cols, double *bmax) {
  double m = 0, bm = 0;
  for (long n = 0; n < rows; n++)
    for (int c = 0; c < cols; c++) {
      double d = fabs((double)a[n * ld + c] - b[n * ld + c]);
      if (!(d <= m)) m = d; /* NaN counts */
      if (fabs(b[n * ld + c]) > bm) bm = fabs(b[n * ld + c]);
    }
  *bmax = bm;
  return m;
}

/* every element outside the heads' columns still SENTINEL */
static int pads_kept(const float *base, long n, const bufs *x, int is_o) {
  (void)n;
  const gpt_attn_shape *s = &x->s;
  long BT = (long)s->B * s->T;
  if (is_o) {
    for (long r = 0; r < BT; r++)
      for (long c = (long)s->H * s->hd; c < s->ldo; c++)
        if (base[r * s->ldo + c] != SENTINEL) return 0;
    return 1;
  }
  /* q k v grads: whatever of the buffer is not a head column */
  char *used = calloc((size_t)x->nqkv, 1);
  REQUIRE(used);
  for (long r = 0; r < BT; r++) {
    for (int c = 0; c < s->H * s->hd; c++)
      used[(x->dq - x->dqkv) + r * s->ldq + c] = 1;
    for (int c = 0; c < s->KV * s->hd; c++)
      used[(x->dk - x->dqkv) + r * s->ldk + c] = 1;
    for (int c = 0; c < s->KV * s->hd; c++)
      used[(x->dv - x->dqkv) + r * s->ldv + c] = 1;
  }
  int ok = 1;
  for (long i = 0; i < x->nqkv; i++)
    if (!used[i] && base[i] != SENTINEL) ok = 0;
  free(used);
  return ok;
}

static const double TOL = 2e-5;

static int close_enough(const char *what, const float *a, const float *b, long ld, long rows,
                        int cols, const char *tag) {
  double bm, d = maxdiff(a, b, ld, rows, cols, &bm);
  int ok = d <= TOL * (bm > 1 ? bm : 1);
  printf("  %-4s max|diff| %.3g (max|naive| %.3g)%s\n", what, d, bm, ok ? "" : "  <-- FAILED");
  if (!ok) fprintf(stderr, "%s: %s differs by %.3g\n", tag, what, d);
  return ok;
}

/* tiled reference == naive on one shape */
static void equal_to_naive(int B, int T, int H, int KV, int hd, int packed) {
  char tag[128];
  snprintf(tag, sizeof tag, "B %d T %d H %d KV %d hd %d %s", B, T, H, KV, hd,
           packed ? "packed" : "planar");
  printf("%s\n", tag);
  bufs x;
  make(&x, B, T, H, KV, hd, packed);
  const gpt_attn_shape *s = &x.s;
  char why[128];
  EXPECT(gpt_attn_check(s, why, sizeof why) == 0);
  long BT = (long)B * T, nl = (long)B * H * T;
  float *o2 = malloc(x.no * sizeof(float)), *lse2 = malloc(nl * sizeof(float));
  float *g2 = malloc(x.nqkv * sizeof(float));
  REQUIRE(o2 && lse2 && g2);
  memcpy(o2, x.o, x.no * sizeof(float));
  memcpy(g2, x.dqkv, x.nqkv * sizeof(float));

  gpt_attn_naive_fwd(s, x.q, x.k, x.v, x.o, x.lse);
  gpt_attn_ref_fwd(s, x.q, x.k, x.v, o2, lse2);
  EXPECT(close_enough("o", o2, x.o, s->ldo, BT, H * hd, tag));
  EXPECT(close_enough("lse", lse2, x.lse, T, (long)B * H, T, tag));
  EXPECT(pads_kept(o2, x.no, &x, 1));
  EXPECT(pads_kept(x.o, x.no, &x, 1));

  float *g2q = g2 + (x.dq - x.dqkv), *g2k = g2 + (x.dk - x.dqkv), *g2v = g2 + (x.dv - x.dqkv);
  gpt_attn_naive_bwd(s, x.q, x.k, x.v, x.dout, x.dq, x.dk, x.dv);
  gpt_attn_ref_bwd(s, x.q, x.k, x.v, x.o, x.dout, x.lse, g2q, g2k, g2v);
  EXPECT(close_enough("dq", g2q, x.dq, s->ldq, BT, H * hd, tag));
  EXPECT(close_enough("dk", g2k, x.dk, s->ldk, BT, KV * hd, tag));
  EXPECT(close_enough("dv", g2v, x.dv, s->ldv, BT, KV * hd, tag));
  EXPECT(pads_kept(g2, x.nqkv, &x, 0));
  EXPECT(pads_kept(x.dqkv, x.nqkv, &x, 0));

  /* the control: a wrong scale is caught by the same comparison (T > 1:
   * with one key o is v whatever the scale) */
  if (T > 1) {
    gpt_attn_shape bad = *s;
    bad.scale *= 1.01f;
    gpt_attn_ref_fwd(&bad, x.q, x.k, x.v, o2, lse2);
    double bm;
    EXPECT(maxdiff(o2, x.o, s->ldo, BT, H * hd, &bm) > TOL * (bm > 1 ? bm : 1));
  }
  free(o2), free(lse2), free(g2);
  drop(&x);
}

/* L = sum dout . o; dL/dx by central differences against the naive backward */
static double loss_of(bufs *x) {
  const gpt_attn_shape *s = &x->s;
  gpt_attn_naive_fwd(s, x->q, x->k, x->v, x->o, x->lse);
  double L = 0;
  for (long n = 0; n < (long)s->B * s->T; n++)
    for (int c = 0; c < s->H * s->hd; c++)
      L += (double)x->dout[n * s->ldo + c] * x->o[n * s->ldo + c];
  return L;
}
static void finite_differences(void) {
  printf("finite differences: B 1 T 5 H 2 KV 1 hd 16\n");
  bufs x;
  make(&x, 1, 5, 2, 1, 16, 1);
  gpt_attn_naive_bwd(&x.s, x.q, x.k, x.v, x.dout, x.dq, x.dk, x.dv);
  const float eps = 1e-2f;
  double worst = 0;
  int checked = 0;
  for (long i = 0; i < x.nqkv; i++) {
    if (x.dqkv[i] == SENTINEL) continue; /* padding */
    float keep = x.qkv[i];
    x.qkv[i] = keep + eps;
    double lp = loss_of(&x);
    x.qkv[i] = keep - eps;
    double lm = loss_of(&x);
    x.qkv[i] = keep;
    double fd = (lp - lm) / (2.0 * eps), d = fabs(fd - x.dqkv[i]);
    if (!(d <= 2e-3 + 1e-2 * fabs(fd))) {
      fprintf(stderr, "finite differences: element %ld: %g vs %g\n", i, fd, x.dqkv[i]);
      test_failures++;
    }
    if (d > worst) worst = d;
    checked++;
  }
  printf("  %d elements, max|fd - grad| %.3g\n", checked, worst);
  EXPECT_EQ_INT(checked, 5 * (2 + 1 + 1) * 16);
  drop(&x);
}

/* changing key / value row t0 leaves rows < t0 bit for bit, and changes row t0 */
static void causality(void) {
  printf("causality: B 1 T 100 H 4 KV 2 hd 32\n");
  bufs x;
  make(&x, 1, 100, 4, 2, 32, 0);
  const gpt_attn_shape *s = &x.s;
  int t0 = 70;
  float *o1 = malloc(x.no * sizeof(float)), *l1 = malloc(4 * 100 * sizeof(float));
  float *o2 = malloc(x.no * sizeof(float)), *l2 = malloc(4 * 100 * sizeof(float));
  REQUIRE(o1 && l1 && o2 && l2);
  memset(o1, 0, x.no * sizeof(float)), memset(o2, 0, x.no * sizeof(float)); /* the padding */
  for (int tiled = 0; tiled < 2; tiled++) {
    void (*fwd)(const gpt_attn_shape *, const float *, const float *, const float *, float *,
                float *) = tiled ? gpt_attn_ref_fwd : gpt_attn_naive_fwd;
    fwd(s, x.q, x.k, x.v, o1, l1);
    float kk = x.k[t0 * s->ldk + 3], vv = x.v[t0 * s->ldv + 40];
    x.k[t0 * s->ldk + 3] += 0.75f, x.v[t0 * s->ldv + 40] -= 0.5f; /* kv heads 0 and 1 */
    fwd(s, x.q, x.k, x.v, o2, l2);
    x.k[t0 * s->ldk + 3] = kk, x.v[t0 * s->ldv + 40] = vv;
    EXPECT(memcmp(o1, o2, (size_t)t0 * s->ldo * sizeof(float)) == 0);
    for (int h = 0; h < 4; h++)
      EXPECT(memcmp(l1 + h * 100, l2 + h * 100, t0 * sizeof(float)) == 0);
    int changed = 0;
    for (int c = 0; c < 4 * 32; c++)
      changed += o1[t0 * s->ldo + c] != o2[t0 * s->ldo + c];
    EXPECT(changed > 0);
  }
  free(o1), free(l1), free(o2), free(l2);
  drop(&x);
}

static void shape_check(void) {
  gpt_attn_shape s = {2, 10, 4, 2, 64, 4 * 64, 2 * 64, 2 * 64, 4 * 64, 0.125f};
  char why[128] = "";
  EXPECT(gpt_attn_check(&s, why, sizeof why) == 0);
  gpt_attn_shape t = s;
  t.KV = 3;
  EXPECT(gpt_attn_check(&t, why, sizeof why) == -1 && strstr(why, "multiple"));
  t = s, t.hd = 24;
  EXPECT(gpt_attn_check(&t, why, sizeof why) == -1);
  t = s, t.hd = 144, t.ldq = t.ldo = 4 * 144, t.ldk = t.ldv = 2 * 144;
  EXPECT(gpt_attn_check(&t, why, sizeof why) == -1);
  t = s, t.ldk = 2 * 64 - 1;
  EXPECT(gpt_attn_check(&t, why, sizeof why) == -1);
  t = s, t.T = 0;
  EXPECT(gpt_attn_check(&t, why, sizeof why) == -1);
  t = s, t.scale = 0;
  EXPECT(gpt_attn_check(&t, why, sizeof why) == -1);
}

int main(void) {
  shape_check();
  equal_to_naive(1, 1, 1, 1, 16, 0);
  equal_to_naive(2, 37, 2, 2, 64, 1);
  equal_to_naive(1, 130, 4, 2, 64, 0);
  equal_to_naive(2, 200, 4, 2, 16, 1);
  equal_to_naive(1, 130, 8, 1, 128, 1);
  equal_to_naive(1, 64, 2, 2, 128, 0);
  equal_to_naive(2, 129, 8, 1, 32, 0);
  q_amp = 40.0f; /* scores in the hundreds: nearly one-hot rows */
  equal_to_naive(1, 150, 4, 2, 64, 1);
  q_amp = 2.5f;
  finite_differences();
  causality();
  return test_finish("gpt.attention");
}
