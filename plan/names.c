/* plan/names.c — the names the planner prints: placements (with their
 * tiers and descriptions), gradient homes, families, tiers, components,
 * precisions, optimizers and dtypes; and the error text helper every
 * planner file uses.
 */
#include "plan/plan_impl.h"

#include "ferry.h"

#include <stdarg.h>
#include <stdio.h>

int plan_fail(char *why, size_t wl, int status, const char *fmt, ...) {
  if (why && wl) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wl, fmt, ap);
    va_end(ap);
  }
  return status;
}

static const char *const place_names[FERRY_PLACEMENTS] = {
    "all-gpu", "zero-offload", "zero3-offload", "nvme-optimizer", "zero-infinity"};
static const char *const place_desc[FERRY_PLACEMENTS] = {
    "everything on the GPU, optimizer on the GPU",
    "params on the GPU; grads, master and optimizer states on the host (ZeRO-Offload)",
    "params streamed from the host per group; grads and optimizer on the host (ZeRO-3 offload)",
    "params streamed from the host; master and optimizer states on NVMe",
    "params, master and optimizer states on NVMe (ZeRO-Infinity)"};
/* grads: the home when they are kept (placement.grads = "auto" may resolve
 * to "none": ferry_plan_grads_auto) */
static const char *const place_tiers[FERRY_PLACEMENTS][3] = {
    {"gpu", "gpu", "gpu"},    {"gpu", "host", "host"},  {"host", "host", "host"},
    {"host", "nvme", "nvme"}, {"nvme", "nvme", "nvme"}};

const char *ferry_plan_placement_name(int p) {
  return p >= 0 && p < FERRY_PLACEMENTS ? place_names[p] : "?";
}
const char *ferry_plan_placement_desc(int p) {
  return p >= 0 && p < FERRY_PLACEMENTS ? place_desc[p] : "?";
}
void ferry_plan_placement_tiers(int p, const char **params, const char **grads,
                                const char **optimizer) {
  if (p < 0 || p >= FERRY_PLACEMENTS) p = 0;
  if (params) *params = place_tiers[p][0];
  if (grads) *grads = place_tiers[p][1];
  if (optimizer) *optimizer = place_tiers[p][2];
}
const char *ferry_plan_grads_name(int g) {
  static const char *const n[] = {"gpu", "host", "nvme", "none"};
  return g >= 0 && g <= 3 ? n[g] : "?";
}
const char *ferry_plan_family_name(int f) {
  static const char *const n[FERRY_PLAN_FAMILIES] = {
      "params", "grads", "master", "optimizer", "activations", "buffers", "workspace", "swap"};
  return f >= 0 && f < FERRY_PLAN_FAMILIES ? n[f] : "?";
}
const char *ferry_plan_tier_name(int t) {
  static const char *const n[FERRY_PLAN_TIERS] = {"gpu", "host", "nvme"};
  return t >= 0 && t < FERRY_PLAN_TIERS ? n[t] : "?";
}
const char *ferry_plan_component_name(int c) {
  static const char *const n[FERRY_COMPONENTS] = {"compute", "h2d", "d2h", "cpu_optimizer",
                                                  "nvme", "network"};
  return c >= 0 && c < FERRY_COMPONENTS ? n[c] : "?";
}
const char *ferry_plan_precision_name(int prec) {
  static const char *const n[] = {"fp32", "fp16", "bf16"};
  return prec >= 0 && prec <= 2 ? n[prec] : "?";
}
const char *ferry_plan_optimizer_name(int opt) {
  static const char *const n[] = {"adamw", "adam", "adagrad", "lamb", "sgd", "lion"};
  return opt >= 0 && opt <= 5 ? n[opt] : "?";
}
int ferry_plan_optimizer_states(int opt) {
  return opt == FERRY_OPTIM_ADAMW || opt == FERRY_OPTIM_ADAM || opt == FERRY_OPTIM_LAMB ? 2 : 1;
}

const char *ferry_plan_dtype_name(int dt) {
  switch (dt) {
  case FERRY_DT_F32: return "fp32";
  case FERRY_DT_BF16: return "bf16";
  case FERRY_DT_I8: return "int8";
  default: return NULL;
  }
}
