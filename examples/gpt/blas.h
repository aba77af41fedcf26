/* examples/gpt/blas.h — which OpenBLAS kernel ferry-gpt runs: OpenBLAS's
 * own pick, or on a CPU it does not know the one the CPU's features call
 * for, checked against a reference GEMM; a user's OPENBLAS_CORETYPE as is.
 */
#ifndef FERRY_GPT_BLAS_H
#define FERRY_GPT_BLAS_H

#include <stdio.h>

/* First thing in main. restart: 1 when the caller has set environment
 * variables that OpenBLAS reads as it loads (its thread count under
 * ulimit -v) and needs the process run again. Picks the kernel (train and
 * sample only) and runs ferry-gpt again at most once, for both; a restart
 * that fails goes on as it is, without the variables. In the reference
 * GEMM's child process (FERRY_GPT_BLAS_PROBE) it does not return. */
void gpt_blas_start(char **argv, int restart);

/* {"config": ..., "kernel": ..., "chosen_by": ..., "rejected": ...}:
 * OpenBLAS's config string, the kernel running (openblas_get_corename),
 * who chose it ("openblas", "cpuid" or "OPENBLAS_CORETYPE") and the kernel
 * the reference GEMM turned down (null when none). */
void gpt_blas_json(FILE *out);

#endif
