/* plan/plan_impl.h — what the planner's files share and nobody else sees:
 * the error helper, the JSON reader's front, a model's attention widths, a
 * placement's context (homes, bytes per param, shares of ranks) and the
 * steps of one candidate (bytes, NVMe traffic, peak RSS, time).
 */
#ifndef FERRY_PLAN_PLAN_IMPL_H
#define FERRY_PLAN_PLAN_IMPL_H

#include "plan/plan.h"

#include "core/json.h"
#include "core/pack.h"
#include "plan/footprint.h"

#include <stddef.h>

#define MAX_BATCH (1ll << 24)

/* Writes the message to why (when given) and returns status. */
int plan_fail(char *why, size_t wl, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The JSON text of `name` as a tree; `status` with "name: not valid JSON:
 * line L, column C: what" when it is not JSON. */
int plan_parse_json(const char *text, size_t len, const char *name, int status,
                    ferry_json_value **root, char *why, size_t wl);

/* Query and key/value widths of a model's attention (heads x head_dim). */
double plan_q_dim(const ferry_plan_model *m);
double plan_kv_dim(const ferry_plan_model *m);

/* A group's tensors in registration order (ferry-gpt's schema, Hugging
 * Face's order: each bias after its weight): their elements in n[], at
 * most PLAN_GROUP_TENSORS of them; returns how many, or 0 for a model known
 * by its count alone (--params). Their sum is the group's params. */
enum { PLAN_GROUP_EMBED, PLAN_GROUP_BLOCK, PLAN_GROUP_HEAD, PLAN_GROUP_TENSORS = 16 };
int plan_group_tensors(const ferry_plan_model *m, int kind, double n[PLAN_GROUP_TENSORS]);

/* What a placement puts where, and the sizes its formulas share. */
typedef struct {
  int ph, gh, oh;          /* homes: FERRY_PLAN_GPU/HOST/NVME; gh a ferry_plan_grads */
  double P, G, ch;         /* params, largest group, chunk size */
  double pb, gb, ob;       /* bytes per param: param dtype, grad accumulator, optimizer family */
  double mb, sb;           /* bytes per param of the master (0: the params are it), of a state */
  int k;                   /* optimizer states */
  int cpu_path;            /* the CPU does the optimizer's arithmetic */
  double grp_p, grp_g, grp_o; /* one group's chunks of each family (grads and optimizer:
                                 this rank's piece) */
  double N;                /* ranks */
  int stage;               /* ZeRO stage */
  double so, sg, sp;       /* share of the whole family this rank keeps: optimizer and
                              master (stage >= 1), grads (>= 2), params (3); 1 alone */
  /* per family (params, grads, master, optimizer), sharded over ranks:
   * the rank whose pieces (core/part.h) are planned (-1: whole or
   * estimated), and its chunks summed, largest group and elements (with
   * in->rank -1, the largest of any rank's) */
  int frank[4];
  ferry_pack_sum fsum[4];
  double fgmax[4], felems[4];
  double range_max;        /* the largest range of a group a rank holds (elements) */
} plan_place_ctx;

plan_place_ctx plan_place_context(const ferry_plan_input *in, int p);
/* precision.master = bf16: the params are the master. */
int plan_bf16_master(const ferry_plan_input *in);

/* Placement p as the engine will lay it out, through plan/footprint.h:
 * each family's chunks (this rank's share) and home, the engine's staging
 * and grad slots, the host pool's need of one step, the NVMe swap files. */
typedef struct {
  ferry_tier home[FERRY_FAMILIES];
  ferry_footprint_family fam[FERRY_FAMILIES];
  uint64_t master; /* the optimizer family's master bytes (its row of the table) */
  uint64_t data[FERRY_FAMILIES]; /* each family's chunks' bytes as packed (else its total) */
  ferry_footprint_staging staging;
  uint64_t grad_slots;
  ferry_footprint_host need;
  uint64_t nvme_files;
} plan_fp;
void plan_footprint(const ferry_plan_input *in, int p, plan_fp *fp);
/* The NVMe swap files of that layout at the input's chunk size (0: the
 * 64 MiB --write-config writes): what the fit holds against the NVMe budget. */
uint64_t plan_nvme_file_bytes(const ferry_plan_input *in, const plan_fp *fp);
/* Whether the engine reads the next group's NVMe optimizer state ahead:
 * the host pool has room for it beside the need of one step and the host
 * copies of the device pool's chunks (c: the candidate's tier bytes). */
int plan_readahead_fits(const ferry_plan_input *in, const ferry_plan_candidate *c,
                        const plan_fp *fp);

/* A candidate, step by step (plan/bytes.c, plan/time.c): whether placement
 * p fits the budgets at batch b (short_by: bytes over each tier's budget);
 * its bytes per tier and family and the verdict; its NVMe bytes per step;
 * the process's peak RSS; its traffic and step time. */
int plan_tiers_fit(const ferry_plan_input *in, int p, double b, double *short_by);
void plan_candidate_bytes(const ferry_plan_input *in, int p, ferry_plan_candidate *c);
void plan_nvme_traffic(const ferry_plan_input *in, const plan_place_ctx *c,
                       ferry_plan_candidate *k);
void plan_rss_bytes(const ferry_plan_input *in, ferry_plan_rss *r);
void plan_candidate_time(const ferry_plan_input *in, int p, ferry_plan_candidate *c);

#endif
