/* examples/gpt/footprint.h — a train run's memory footprint and NVMe
 * traffic (and, data parallel, each rank's): the process's peak RSS beside
 * the engine's tier peaks and budgets and the trainer's own host buffers,
 * the NVMe bytes per family and direction; as a text line, a JSON fragment
 * and a --stats-json file.
 */
#ifndef FERRY_GPT_FOOTPRINT_H
#define FERRY_GPT_FOOTPRINT_H

#include "ferry.h"

#include <stdint.h>
#include <stdio.h>

typedef struct {
  uint64_t params;           /* the model's parameter count */
  uint64_t peak_rss;         /* VmHWM of /proc/self/status, else ru_maxrss */
  uint64_t activation_bytes; /* the CPU model's host buffers (0 for the CUDA model) */
  uint64_t scratch_bytes;    /* the engine provider's host scratch (sync mode) */
  uint64_t data_bytes;       /* the token ids held */
  uint64_t resident_bytes;   /* pre-engine: weights, grads and AdamW state in host memory */
  int engine;                /* 1: the engine's fields below are filled */
  uint64_t tier_peak[FERRY_TIERS], budget[FERRY_TIERS];
  uint64_t nvme_read[FERRY_FAMILIES], nvme_write[FERRY_FAMILIES];   /* the whole run */
  uint64_t nvme_file, nvme_data; /* the swap files on disk, the chunks' bytes in them */
  uint64_t setup_read[FERRY_FAMILIES], setup_write[FERRY_FAMILIES]; /* before the first step */
  double optim_bytes_per_param; /* the engine's optimizer pass, bytes read + written per
                                   param and step (ferry_stats.optim_bytes_per_param) */
  uint64_t optim_peak[FERRY_TIERS]; /* peak optimizer-state bytes per tier (the fp32 master
                                       and states: ferry_stats.peak[t][FERRY_FAMILY_OPTIM]) */
  uint64_t params_peak[FERRY_TIERS]; /* peak param bytes per tier (FERRY_FAMILY_PARAMS) */
  int nranks;                /* ranks of a data-parallel run (0 or 1: alone) */
  const uint64_t *rank_figs; /* nranks > 1: GPT_RANK_FIGS figures of each rank, in rank order */
  double startup_seconds;    /* from the launch of the process to its first step */
  int steps;                 /* steps this process ran */
  const float *losses;       /* their losses (steps of them), or NULL */
} gpt_footprint;

/* One rank's figures in gpt_footprint.rank_figs: its optimizer-state and
 * tier peaks (gpu, host, nvme), peak RSS, the bytes it sent to other ranks
 * (the engine's comm_bytes) and its params peaks (gpu, host, nvme). */
enum { GPT_RANK_OPTIM = 0, GPT_RANK_TIER = 3, GPT_RANK_RSS = 6, GPT_RANK_COMM = 7,
       GPT_RANK_PARAMS = 8, GPT_RANK_FIGS = 11 };

/* The process's peak resident set in bytes. */
/* The "KEY: N kB" line of /proc/self/status as N (*found 0 and 0 when absent). */
uint64_t gpt_proc_status_kb(const char *key, int *found);
uint64_t gpt_peak_rss_bytes(void);
/* Seconds since the process was launched (its start time in /proc/self/stat,
 * which an exec keeps), or since the first call when /proc says nothing. */
double gpt_seconds_since_launch(void);
/* Takes the tier peaks, budgets and NVMe totals from the engine's stats;
 * sets engine. */
void gpt_footprint_engine(gpt_footprint *f, const ferry_stats *fs);
/* "memory: peak RSS ...; engine peaks ...; trainer ..." and, on the engine,
 * "nvme: read ..., written ...; per step ...". */
void gpt_footprint_print(const gpt_footprint *f, FILE *out);
/* "peak_rss_bytes": ..., ...: the keys of gpt_footprint_write but steps,
 * losses and engine, without braces (for a JSON object under way). */
void gpt_footprint_json(const gpt_footprint *f, FILE *out);
/* "key": {"params": v[0], "grads": v[1], "optimizer": v[2]} */
void gpt_footprint_json_families(FILE *out, const char *key, const uint64_t *v);
/* s as a JSON string, escaped (null when NULL). */
void gpt_json_string(FILE *out, const char *s);
/* One JSON object into path: params, steps, losses[], engine (the config, or null)
 * and the fragment above. 0, or -1 with the reason in err. */
int gpt_footprint_write(const gpt_footprint *f, const char *engine, const char *path, char *err,
                        size_t len);

#endif
