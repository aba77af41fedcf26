/* examples/gpt/attention_cuda.cu — causal flash attention on CUDA
 * (gpt_attn.h): bf16 q k v on tensor cores (wmma 16x16x16, fp32
 * accumulators), online softmax in fp32 with the scores staged through
 * shared memory, the log-sum-exp kept for a deterministic backward (no
 * atomics): delta = rowsum(dout * o); dk, dv per (key tile, kv head, batch)
 * over the group's query heads and the q tiles from the diagonal down; dq
 * per (q tile, head, batch). It mirrors attention_ref.c's tiled reference
 * tile for tile (but for the forward's output, rescaled only when a row's
 * max moves by more than RESCALE_AT). Four warps per CTA, each owning 16
 * rows of the 64-row tile.
 * Head dims are padded to a template width PD (64 or 128): the loads fill
 * the columns past hd with zeros and the stores skip them.
 */
#include "gpt_attn.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

typedef __nv_bfloat16 bf16;
namespace wm = nvcuda::wmma;

/* every launch goes through ATTN_LAUNCH: tests/gpt/cuda_emu/ defines its
 * own to run the kernels on the host */
#ifndef ATTN_LAUNCH
#define ATTN_LAUNCH(kernel, grid, block, smem, st, ...)                                            \
  kernel<<<(grid), (block), (smem), (st)>>>(__VA_ARGS__)
#endif

enum { BR = GPT_ATTN_BR, BC = GPT_ATTN_BC, NW = 4, NT = NW * 32 };
static_assert(BR == BC && BR == NW * 16, "one 16-row slice per warp; square tiles");

/* shared-memory strides (elements): 8 bf16 / 4 floats of padding per row
 * against bank conflicts; wmma wants 16-bit strides in 8s, fp32 in 4s */
#define LDH(PD) ((PD) + 8) /* bf16 [64][PD] tiles: q, k, v, dout */
#define LDS     (BC + 4)   /* fp32 [64][64] scores */
#define LDP     (BC + 8)   /* bf16 [64][64] probabilities / dS */
#define LDO(PD) ((PD) + 4) /* fp32 [64][PD] output accumulator */
#define SCR     16         /* fp32 [16][16] per-warp scratch */

typedef wm::fragment<wm::matrix_a, 16, 16, 16, bf16, wm::row_major> frag_a;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::row_major> frag_b;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::col_major> frag_bt;
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> frag_c;

__host__ __device__ static size_t up128(size_t n) { return (n + 127) & ~(size_t)127; }

/* the byte offsets of each kernel's shared-memory regions (host and device) */
typedef struct {
  unsigned k, v, s, p, o, m, l, a, total; /* forward */
} fwd_smem;
typedef struct { /* backward: 4 tiles, P, dS, the rows' lse and delta, scratch */
  unsigned t0, t1, t2, t3, p, ds, lse, delta, scr, total;
} bwd_smem;

__host__ __device__ static fwd_smem fwd_layout(int PD) {
  fwd_smem f;
  size_t at = 0, tile = (size_t)BC * LDH(PD) * sizeof(bf16);
  f.k = (unsigned)at, at = up128(at + tile);
  f.v = (unsigned)at, at = up128(at + tile);
  f.s = (unsigned)at, at = up128(at + (size_t)BR * LDS * sizeof(float));
  f.p = (unsigned)at, at = up128(at + (size_t)BR * LDP * sizeof(bf16));
  f.o = (unsigned)at, at = up128(at + (size_t)BR * LDO(PD) * sizeof(float)); /* q first */
  f.m = (unsigned)at, at = up128(at + BR * sizeof(float));
  f.l = (unsigned)at, at = up128(at + BR * sizeof(float));
  f.a = (unsigned)at, at = up128(at + BR * sizeof(float));
  f.total = (unsigned)at;
  return f;
}
/* dkdv: t0 k, t1 v, t2 q, t3 dout, p and ds [keys][q rows]; dq: t0 q, t1
 * dout, t2 k, t3 v, ds [q rows][keys] (p unused) */
__host__ __device__ static bwd_smem bwd_layout(int PD, int with_p) {
  bwd_smem f;
  size_t at = 0, tile = (size_t)BC * LDH(PD) * sizeof(bf16), pt = (size_t)BR * LDP * sizeof(bf16);
  f.t0 = (unsigned)at, at = up128(at + tile);
  f.t1 = (unsigned)at, at = up128(at + tile);
  f.t2 = (unsigned)at, at = up128(at + tile);
  f.t3 = (unsigned)at, at = up128(at + tile);
  f.p = (unsigned)at, at = up128(at + (with_p ? pt : 0));
  f.ds = (unsigned)at, at = up128(at + pt);
  f.lse = (unsigned)at, at = up128(at + BR * sizeof(float));
  f.delta = (unsigned)at, at = up128(at + BR * sizeof(float));
  f.scr = (unsigned)at, at = up128(at + (size_t)NW * 2 * SCR * SCR * sizeof(float));
  f.total = (unsigned)at;
  return f;
}

/* Rows [row0, row0 + 64) of one head (src: row 0 of the batch, the head's
 * first column; stride ld) into a [64][PD] tile: zeros past T and past hd.
 * vec: 16-byte loads (src aligned, ld a multiple of 8). */
template <int PD>
__device__ static void load_tile(bf16 *dst, const bf16 *src, long ld, int row0, int T, int hd,
                                 int vec) {
  const int per = PD / 8;
  for (int i = threadIdx.x; i < 64 * per; i += NT) {
    int r = i / per, c = (i % per) * 8;
    uint4 *d = (uint4 *)(dst + r * LDH(PD) + c);
    if (row0 + r < T && c < hd) {
      const bf16 *s = src + (long)(row0 + r) * ld + c;
      if (vec) {
        *d = *(const uint4 *)s;
      } else {
        bf16 *e = (bf16 *)d;
        for (int x = 0; x < 8; x++)
          e[x] = s[x];
      }
    } else {
      *d = make_uint4(0, 0, 0, 0);
    }
  }
}

/* Per-row lse and delta of q rows [i0, i0 + 64) into shared memory (0 past T) */
__device__ static void load_rows(float *slse, float *sdelta, const float *lse, const float *delta,
                                 int i0, int T) {
  for (int r = threadIdx.x; r < BR; r += NT) {
    int ok = i0 + r < T;
    slse[r] = ok ? lse[i0 + r] : 0.0f;
    sdelta[r] = ok ? delta[i0 + r] : 0.0f;
  }
}

/* acc[c] += a b[:, c*16..] over the 64 rows of b: a is the warp's 16 rows
 * of a [64][64] bf16 tile (P or dS, stride LDP), b a [64][PD] tile */
template <int PD> __device__ static void mma_rows(frag_c *acc, const bf16 *a, const bf16 *b) {
  for (int kk = 0; kk < 64 / 16; kk++) {
    frag_a fa;
    wm::load_matrix_sync(fa, a + kk * 16, LDP);
    for (int c = 0; c < PD / 16; c++) {
      frag_b fb;
      wm::load_matrix_sync(fb, b + kk * 16 * LDH(PD) + c * 16, LDH(PD));
      wm::mma_sync(acc[c], fa, fb, acc[c]);
    }
  }
}

/* ---- forward ------------------------------------------------------------------ */

/* P = exp(S - ref) with a row's reference ref kept while its max stays
 * within RESCALE_AT of it: P stays below e^8 (fine in bf16 and fp32) and
 * the output accumulators, held in registers, go through shared memory to
 * be rescaled only when a row's max moves further (rarely after the first
 * tiles). */
#define RESCALE_AT 8.0f

/* The online softmax of one key tile for the warp's 16 rows, two lanes per
 * row (32 columns each): each row's scaled, masked max; a new reference
 * on the first tile or where the max passed ref + RESCALE_AT, with alpha =
 * exp(old - new) for the row's sum and output (into sA; 1 elsewhere); P =
 * exp(S scale - ref) into sP (bf16), its sum into sL. Returns, the same in
 * every lane, whether a row of the warp must rescale its output. */
__device__ static int online_softmax(const float *sS, bf16 *sP, float *sM, float *sL, float *sA,
                                     int i0, int j0, int T, float scale) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = w * 16 + lane / 2, half = lane & 1, jb = j0 + half * 32;
  const int nvalid = min(i0 + r - jb + 1, T - jb); /* columns e < nvalid: keys j <= i, j < T */
  const float *srow = sS + r * LDS + half * 32;
  bf16 *prow = sP + r * LDP + half * 32;
  float mx = -INFINITY;
  for (int e = 0; e < 32; e++)
    if (e < nvalid) mx = fmaxf(mx, srow[e] * scale);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  const float ref = sM[r];
  const float nref = ref == -INFINITY || mx > ref + RESCALE_AT ? mx : ref;
  const float mref = nref == -INFINITY ? 0.0f : nref; /* a row with no key yet */
  float sum = 0.0f;
  for (int e = 0; e < 32; e++) {
    float p = e < nvalid ? __expf(srow[e] * scale - mref) : 0.0f;
    sum += p;
    prow[e] = __float2bfloat16(p);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float alpha = nref == ref ? 1.0f : __expf(ref - mref); /* 0 on the first tile */
  __syncwarp(); /* both lanes of the row have read sM[r] */
  if (!half) sM[r] = nref, sL[r] = sL[r] * alpha + sum, sA[r] = alpha;
  return __any_sync(0xffffffffu, nref != ref && ref != -INFINITY);
}

/* The warp's output rows (fragments acc) times their alpha (sA), through
 * the warp's rows of sO */
template <int PD> __device__ static void rescale_rows(frag_c *acc, float *sO, const float *sA) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  float *ot = sO + w * 16 * LDO(PD);
  for (int c = 0; c < PD / 16; c++)
    wm::store_matrix_sync(ot + c * 16, acc[c], LDO(PD), wm::mem_row_major);
  __syncwarp();
  const int r = lane / 2, half = lane & 1;
  const float a = sA[w * 16 + r];
  for (int e = 0; e < PD / 2; e++)
    ot[r * LDO(PD) + half * (PD / 2) + e] *= a;
  __syncwarp();
  for (int c = 0; c < PD / 16; c++)
    wm::load_matrix_sync(acc[c], ot + c * 16, LDO(PD), wm::mem_row_major);
}

/* One CTA per (q tile, head, batch), q tiles in reverse (the longest rows
 * start first). Per key tile up to the diagonal: S = q k^T (wmma) staged
 * in shared memory; the online softmax; then O += P v into the output
 * accumulators (fragments in registers). */
template <int PD>
__global__ void __launch_bounds__(NT) k_attn_fwd(gpt_attn_shape s, const bf16 *q, const bf16 *k,
                                                 const bf16 *v, bf16 *o, float *lse, int vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  const fwd_smem L = fwd_layout(PD);
  bf16 *sK = (bf16 *)(smem + L.k), *sV = (bf16 *)(smem + L.v), *sP = (bf16 *)(smem + L.p);
  float *sS = (float *)(smem + L.s), *sO = (float *)(smem + L.o);
  float *sM = (float *)(smem + L.m), *sL = (float *)(smem + L.l), *sA = (float *)(smem + L.a);
  bf16 *sQ = (bf16 *)sO; /* q's tile lives where O will, until its fragments are loaded */

  const int T = s.T, hd = s.hd, nt = (T + BR - 1) / BR;
  const int i0 = (nt - 1 - (int)blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
  const int g = h / (s.H / s.KV), w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16 *qb = q + (long)b * T * s.ldq + (long)h * hd;
  const bf16 *kb = k + (long)b * T * s.ldk + (long)g * hd;
  const bf16 *vb = v + (long)b * T * s.ldv + (long)g * hd;

  load_tile<PD>(sQ, qb, s.ldq, i0, T, hd, vec);
  __syncthreads();
  frag_a fq[PD / 16];
  for (int d = 0; d < PD / 16; d++)
    wm::load_matrix_sync(fq[d], sQ + w * 16 * LDH(PD) + d * 16, LDH(PD));
  __syncthreads();
  for (int r = threadIdx.x; r < BR; r += NT)
    sM[r] = -INFINITY, sL[r] = 0.0f;
  frag_c acc[PD / 16]; /* the warp's 16 output rows */
  for (int c = 0; c < PD / 16; c++)
    wm::fill_fragment(acc[c], 0.0f);

  for (int j0 = 0; j0 <= i0; j0 += BC) { /* key tiles up to the diagonal */
    __syncthreads();                     /* the last tile's k and v read; the zeros above visible */
    load_tile<PD>(sK, kb, s.ldk, j0, T, hd, vec);
    load_tile<PD>(sV, vb, s.ldv, j0, T, hd, vec);
    __syncthreads();
    for (int c = 0; c < BC / 16; c++) { /* S = q k^T, this warp's 16 rows */
      frag_c fs;
      wm::fill_fragment(fs, 0.0f);
      for (int d = 0; d < PD / 16; d++) {
        frag_bt fk;
        wm::load_matrix_sync(fk, sK + c * 16 * LDH(PD) + d * 16, LDH(PD));
        wm::mma_sync(fs, fq[d], fk, fs);
      }
      wm::store_matrix_sync(sS + w * 16 * LDS + c * 16, fs, LDS, wm::mem_row_major);
    }
    __syncwarp();
    if (online_softmax(sS, sP, sM, sL, sA, i0, j0, T, s.scale)) rescale_rows<PD>(acc, sO, sA);
    __syncwarp();
    mma_rows<PD>(acc, sP + w * 16 * LDP, sV); /* O += P v */
  }
  for (int c = 0; c < PD / 16; c++)
    wm::store_matrix_sync(sO + w * 16 * LDO(PD) + c * 16, acc[c], LDO(PD), wm::mem_row_major);
  __syncwarp();
  /* each warp writes its own 16 rows: o = O / l (bf16), lse = ref + log l */
  for (int x = lane; x < 16 * hd; x += 32) {
    int r = w * 16 + x / hd, e = x % hd, i = i0 + r;
    if (i < T)
      o[((long)b * T + i) * s.ldo + (long)h * hd + e] =
          __float2bfloat16(sO[r * LDO(PD) + e] / sL[r]);
  }
  if (lane < 16) {
    int r = w * 16 + lane, i = i0 + r;
    if (i < T) lse[((long)b * s.H + h) * T + i] = sM[r] + logf(sL[r]);
  }
}

/* ---- backward -------------------------------------------------------------------- */

/* delta[b][h][t] = dout . o of row (b, t), head h: one warp per row */
__global__ void k_attn_delta(gpt_attn_shape s, const bf16 *o, const bf16 *dout, float *delta) {
  const long rows = (long)s.B * s.H * s.T;
  const int lane = threadIdx.x % 32;
  for (long r = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32; r < rows;
       r += (long)gridDim.x * blockDim.x / 32) {
    int t = (int)(r % s.T), h = (int)(r / s.T % s.H);
    long b = r / ((long)s.T * s.H), at = (b * s.T + t) * s.ldo + (long)h * s.hd;
    float acc = 0.0f;
    for (int e = lane; e < s.hd; e += 32)
      acc += __bfloat162float(o[at + e]) * __bfloat162float(dout[at + e]);
    for (int x = 16; x > 0; x >>= 1)
      acc += __shfl_xor_sync(0xffffffffu, acc, x);
    if (!lane) delta[r] = acc;
  }
}

/* Fragment d of a warp's 16-row A operand: loaded from its tile, or
 * already in registers */
template <int PD> __device__ static const frag_a &a_frag(const bf16 *rows, int d, frag_a &tmp) {
  wm::load_matrix_sync(tmp, rows + d * 16, LDH(PD));
  return tmp;
}
template <int PD> __device__ static const frag_a &a_frag(const frag_a *held, int d, frag_a &tmp) {
  (void)tmp;
  return held[d];
}

/* The two 16 x 16 score blocks of the backward over the head dim, into the
 * warp's scratch: scr = a1 b1^T, scr2 = a2 b2^T (a: 16 rows of a tile, or
 * their fragments; b: 16 rows read as columns) */
template <int PD, typename A>
__device__ static void two_dots(A a1, const bf16 *b1, A a2, const bf16 *b2, float *scr,
                                float *scr2) {
  frag_c f1, f2;
  wm::fill_fragment(f1, 0.0f), wm::fill_fragment(f2, 0.0f);
  for (int d = 0; d < PD / 16; d++) {
    frag_a ta;
    frag_bt fb;
    wm::load_matrix_sync(fb, b1 + d * 16, LDH(PD));
    wm::mma_sync(f1, a_frag<PD>(a1, d, ta), fb, f1);
    wm::load_matrix_sync(fb, b2 + d * 16, LDH(PD));
    wm::mma_sync(f2, a_frag<PD>(a2, d, ta), fb, f2);
  }
  wm::store_matrix_sync(scr, f1, SCR, wm::mem_row_major);
  wm::store_matrix_sync(scr2, f2, SCR, wm::mem_row_major);
  __syncwarp();
}

/* One 16 x 16 block of P and dS from the staged scores: rows of the
 * warp's slice, columns one block; key index jr + row / query index ic +
 * column when keys_rows (dkdv's transposed tile), else the other way. */
__device__ static void grad_block(const float *ss, const float *sdp, const float *slse,
                                  const float *sdelta, int lrow0, int lcol0, int grow0, int gcol0,
                                  int keys_rows, int T, float scale, bf16 *p, bf16 *ds, int ldp) {
  const int lane = threadIdx.x % 32;
  for (int x = lane * 8; x < lane * 8 + 8; x++) {
    int rr = x / 16, cc = x % 16;
    int gr = grow0 + rr, gc = gcol0 + cc;
    int qi = keys_rows ? gc : gr, kj = keys_rows ? gr : gc;
    int li = keys_rows ? lcol0 + cc : lrow0 + rr; /* q row within its tile */
    float pv = kj <= qi && qi < T && kj < T ? __expf(ss[x] * scale - slse[li]) : 0.0f;
    float dsv = pv * (sdp[x] - sdelta[li]);
    if (p) p[rr * ldp + cc] = __float2bfloat16(pv);
    ds[rr * ldp + cc] = __float2bfloat16(dsv);
  }
}

/* A warp's 16-row slice of accumulators times scale into fp32 rows
 * [row0, row0 + 16) of dst (stride ld), through the warp's scratch */
template <int PD>
__device__ static void store_rows(frag_c *acc, float *scr, float *dst, long ld, int row0, int T,
                                  int hd, float scale) {
  const int lane = threadIdx.x % 32;
  for (int c = 0; c < PD / 16; c++) { /* constant indices: acc stays in registers */
    if (c * 16 >= hd) break;
    wm::store_matrix_sync(scr, acc[c], SCR, wm::mem_row_major);
    __syncwarp();
    for (int x = lane; x < 256; x += 32) {
      int rr = x / 16, cc = x % 16;
      if (row0 + rr < T) dst[(long)(row0 + rr) * ld + c * 16 + cc] = scr[x] * scale;
    }
    __syncwarp();
  }
}

/* dk, dv: one CTA per (key tile, kv head, batch); the warps own 16 keys
 * each and keep dk, dv in fragments. For each query head of the group and
 * each q tile from the diagonal down: S^T = k q^T and dP^T = v dout^T per
 * 16 x 16 block, P^T and dS^T into shared memory (bf16), then
 * dv += P^T dout and dk += dS^T q. */
template <int PD>
__global__ void __launch_bounds__(NT)
    k_attn_bwd_dkdv(gpt_attn_shape s, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                    const float *lse, const float *delta, float *dk, float *dv, int vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  const bwd_smem L = bwd_layout(PD, 1);
  bf16 *sK = (bf16 *)(smem + L.t0), *sV = (bf16 *)(smem + L.t1);
  bf16 *sQ = (bf16 *)(smem + L.t2), *sD = (bf16 *)(smem + L.t3);
  bf16 *sP = (bf16 *)(smem + L.p), *sDS = (bf16 *)(smem + L.ds);
  float *sLse = (float *)(smem + L.lse), *sDelta = (float *)(smem + L.delta);
  const int T = s.T, hd = s.hd, grp = s.H / s.KV;
  const int j0 = blockIdx.x * BC, g = blockIdx.y, b = blockIdx.z;
  const int w = threadIdx.x / 32;
  float *scr = (float *)(smem + L.scr) + w * 2 * SCR * SCR, *scr2 = scr + SCR * SCR;

  load_tile<PD>(sK, k + (long)b * T * s.ldk + (long)g * hd, s.ldk, j0, T, hd, vec);
  load_tile<PD>(sV, v + (long)b * T * s.ldv + (long)g * hd, s.ldv, j0, T, hd, vec);
  frag_c adk[PD / 16], adv[PD / 16];
  for (int c = 0; c < PD / 16; c++)
    wm::fill_fragment(adk[c], 0.0f), wm::fill_fragment(adv[c], 0.0f);

  for (int h = g * grp; h < (g + 1) * grp; h++) {
    const float *lh = lse + ((long)b * s.H + h) * T, *dh = delta + ((long)b * s.H + h) * T;
    for (int i0 = j0; i0 < T; i0 += BR) { /* the diagonal tile first, then down */
      __syncthreads();                    /* the last q tile read */
      load_tile<PD>(sQ, q + (long)b * T * s.ldq + (long)h * hd, s.ldq, i0, T, hd, vec);
      load_tile<PD>(sD, dout + (long)b * T * s.ldo + (long)h * hd, s.ldo, i0, T, hd, vec);
      load_rows(sLse, sDelta, lh, dh, i0, T);
      __syncthreads();
      for (int c = 0; c < BR / 16; c++) { /* q rows c*16.. as columns of S^T */
        two_dots<PD, const bf16 *>(sK + w * 16 * LDH(PD), sQ + c * 16 * LDH(PD),
                                   sV + w * 16 * LDH(PD), sD + c * 16 * LDH(PD), scr, scr2);
        grad_block(scr, scr2, sLse, sDelta, w * 16, c * 16, j0 + w * 16, i0 + c * 16, 1, T, s.scale,
                   sP + w * 16 * LDP + c * 16, sDS + w * 16 * LDP + c * 16, LDP);
        __syncwarp();
      }
      mma_rows<PD>(adv, sP + w * 16 * LDP, sD);  /* dv += P^T dout */
      mma_rows<PD>(adk, sDS + w * 16 * LDP, sQ); /* dk += dS^T q */
    }
  }
  const int jw = j0 + w * 16;
  store_rows<PD>(adk, scr, dk + (long)b * T * s.ldk + (long)g * hd, s.ldk, jw, T, hd, s.scale);
  store_rows<PD>(adv, scr, dv + (long)b * T * s.ldv + (long)g * hd, s.ldv, jw, T, hd, 1.0f);
}

/* dq: one CTA per (q tile, head, batch), q tiles in reverse; the warps own
 * 16 q rows each and keep dq, and their q and dout rows, in fragments. Per
 * key tile up to the diagonal: S = q k^T and dP = dout v^T per 16 x 16
 * block, dS into shared memory (bf16), then dq += dS k. */
template <int PD>
__global__ void __launch_bounds__(NT)
    k_attn_bwd_dq(gpt_attn_shape s, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                  const float *lse, const float *delta, float *dq, int vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  const bwd_smem L = bwd_layout(PD, 0);
  bf16 *sQ = (bf16 *)(smem + L.t0), *sD = (bf16 *)(smem + L.t1);
  bf16 *sK = (bf16 *)(smem + L.t2), *sV = (bf16 *)(smem + L.t3);
  bf16 *sDS = (bf16 *)(smem + L.ds);
  float *sLse = (float *)(smem + L.lse), *sDelta = (float *)(smem + L.delta);
  const int T = s.T, hd = s.hd, nt = (T + BR - 1) / BR;
  const int i0 = (nt - 1 - (int)blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
  const int g = h / (s.H / s.KV), w = threadIdx.x / 32;
  float *scr = (float *)(smem + L.scr) + w * 2 * SCR * SCR, *scr2 = scr + SCR * SCR;
  const bf16 *kb = k + (long)b * T * s.ldk + (long)g * hd;
  const bf16 *vb = v + (long)b * T * s.ldv + (long)g * hd;

  load_tile<PD>(sQ, q + (long)b * T * s.ldq + (long)h * hd, s.ldq, i0, T, hd, vec);
  load_tile<PD>(sD, dout + (long)b * T * s.ldo + (long)h * hd, s.ldo, i0, T, hd, vec);
  load_rows(sLse, sDelta, lse + ((long)b * s.H + h) * T, delta + ((long)b * s.H + h) * T, i0, T);
  frag_c adq[PD / 16];
  for (int c = 0; c < PD / 16; c++)
    wm::fill_fragment(adq[c], 0.0f);
  __syncthreads();
  frag_a fq[PD / 16], fd[PD / 16]; /* the warp's q and dout rows, held */
  for (int d = 0; d < PD / 16; d++) {
    wm::load_matrix_sync(fq[d], sQ + w * 16 * LDH(PD) + d * 16, LDH(PD));
    wm::load_matrix_sync(fd[d], sD + w * 16 * LDH(PD) + d * 16, LDH(PD));
  }

  for (int j0 = 0; j0 <= i0; j0 += BC) {
    __syncthreads(); /* the last key tile read */
    load_tile<PD>(sK, kb, s.ldk, j0, T, hd, vec);
    load_tile<PD>(sV, vb, s.ldv, j0, T, hd, vec);
    __syncthreads();
    for (int c = 0; c < BC / 16; c++) { /* keys c*16.. */
      two_dots<PD, const frag_a *>(fq, sK + c * 16 * LDH(PD), fd, sV + c * 16 * LDH(PD), scr, scr2);
      grad_block(scr, scr2, sLse, sDelta, w * 16, c * 16, i0 + w * 16, j0 + c * 16, 0, T, s.scale,
                 NULL, sDS + w * 16 * LDP + c * 16, LDP);
      __syncwarp();
    }
    mma_rows<PD>(adq, sDS + w * 16 * LDP, sK); /* dq += dS k */
  }
  store_rows<PD>(adq, scr, dq + (long)b * T * s.ldq + (long)h * hd, s.ldq, i0 + w * 16, T, hd,
                 s.scale);
}

/* ---- host ------------------------------------------------------------------------ */

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen) {
  if (e == cudaSuccess) return 0;
  if (err && errlen) snprintf(err, errlen, "attention: %s: %s", what, cudaGetErrorString(e));
  (void)cudaGetLastError();
  return -1;
}

static int aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* 0 and the padded head width; -1 with why */
static int prepare(const gpt_attn_shape *s, int *pd, char *err, size_t errlen) {
  if (gpt_attn_check(s, err, errlen)) return -1;
  if (s->B > 65535 || (long)s->H > 65535) {
    snprintf(err, errlen, "attention shape: batch and heads must be at most 65535");
    return -1;
  }
  *pd = s->hd <= 64 ? 64 : 128;
  return 0;
}

/* launch one instance with its dynamic shared memory (above 48 KiB needs the opt-in) */
template <typename K, typename... A>
static int launch(K kernel, dim3 grid, unsigned smem, cudaStream_t st, const char *what, char *err,
                  size_t errlen, A... args) {
  if (cuda_fail(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
          what, err, errlen))
    return -1;
  ATTN_LAUNCH(kernel, grid, NT, smem, st, args...);
  return cuda_fail(cudaGetLastError(), what, err, errlen);
}

extern "C" int gpt_attn_cuda_fwd(const gpt_attn_shape *s, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, uint16_t *o, float *lse, void *stream,
                                 char *err, size_t errlen) {
  int pd;
  if (prepare(s, &pd, err, errlen)) return -1;
  int vec = aligned(q) && aligned(k) && aligned(v) && s->ldq % 8 == 0 && s->ldk % 8 == 0 &&
            s->ldv % 8 == 0;
  dim3 grid((s->T + BR - 1) / BR, s->H, s->B);
  cudaStream_t st = (cudaStream_t)stream;
  const bf16 *bq = (const bf16 *)q, *bk = (const bf16 *)k, *bv = (const bf16 *)v;
  if (pd == 64)
    return launch(k_attn_fwd<64>, grid, fwd_layout(64).total, st, "forward", err, errlen, *s, bq,
                  bk, bv, (bf16 *)o, lse, vec);
  return launch(k_attn_fwd<128>, grid, fwd_layout(128).total, st, "forward", err, errlen, *s, bq,
                bk, bv, (bf16 *)o, lse, vec);
}

extern "C" int gpt_attn_cuda_bwd(const gpt_attn_shape *s, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, const uint16_t *o, const uint16_t *dout,
                                 const float *lse, float *delta, float *dq, float *dk, float *dv,
                                 void *stream, char *err, size_t errlen) {
  int pd;
  if (prepare(s, &pd, err, errlen)) return -1;
  int vec = aligned(q) && aligned(k) && aligned(v) && aligned(dout) && s->ldq % 8 == 0 &&
            s->ldk % 8 == 0 && s->ldv % 8 == 0 && s->ldo % 8 == 0;
  cudaStream_t st = (cudaStream_t)stream;
  const bf16 *bq = (const bf16 *)q, *bk = (const bf16 *)k, *bv = (const bf16 *)v;
  const bf16 *bo = (const bf16 *)o, *bd = (const bf16 *)dout;
  long rows = (long)s->B * s->H * s->T, blocks = (rows + 7) / 8;
  unsigned nb = (unsigned)(blocks < (1 << 20) ? blocks : (1 << 20));
  ATTN_LAUNCH(k_attn_delta, nb, 256, 0, st, *s, bo, bd, delta);
  if (cuda_fail(cudaGetLastError(), "delta", err, errlen)) return -1;
  int nt = (s->T + BR - 1) / BR;
  dim3 gkv(nt, s->KV, s->B), gq(nt, s->H, s->B);
  if (pd == 64) {
    if (launch(k_attn_bwd_dkdv<64>, gkv, bwd_layout(64, 1).total, st, "backward dk dv", err, errlen,
               *s, bq, bk, bv, bd, (const float *)lse, (const float *)delta, dk, dv, vec))
      return -1;
    return launch(k_attn_bwd_dq<64>, gq, bwd_layout(64, 0).total, st, "backward dq", err, errlen,
                  *s, bq, bk, bv, bd, (const float *)lse, (const float *)delta, dq, vec);
  }
  if (launch(k_attn_bwd_dkdv<128>, gkv, bwd_layout(128, 1).total, st, "backward dk dv", err, errlen,
             *s, bq, bk, bv, bd, (const float *)lse, (const float *)delta, dk, dv, vec))
    return -1;
  return launch(k_attn_bwd_dq<128>, gq, bwd_layout(128, 0).total, st, "backward dq", err, errlen,
                *s, bq, bk, bv, bd, (const float *)lse, (const float *)delta, dq, vec);
}
