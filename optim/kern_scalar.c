/* optim/kern_scalar.c — the scalar reference kernels: every optimizer one
 * element at a time (optim/scalar_impl.h). The oracle of the SIMD kernels, and
 * the fallback on CPUs without AVX2.
 */
#include "optim/scalar_impl.h"

static void scalar_step(const optim_scalars *s, const optim_tile *t) {
  if (t->sdt == FERRY_DT_I8)
    optim_ref_qstep_from(s, t, 0);
  else
    optim_ref_step_range(s, t, 0, t->n);
}

static void scalar_lamb1(const optim_scalars *s, const optim_tile *t, double *psq, double *usq) {
  optim_ref_lamb1_range(s, t, 0, t->n, psq, usq);
}

static double scalar_sumsq(const void *g, int dt, size_t n) {
  return optim_ref_sumsq_range(g, dt, 0, n);
}

static void scalar_accumulate(float *acc, const void *g, int dt, size_t n, float scale) {
  optim_ref_accumulate_range(acc, g, dt, 0, n, scale);
}

const optim_kernels optim_kernels_scalar = {
    /* .name = */ "scalar",
    /* .step = */ scalar_step,
    /* .lamb_phase1 = */ scalar_lamb1,
    /* .sumsq = */ scalar_sumsq,
    /* .accumulate = */ scalar_accumulate,
};
