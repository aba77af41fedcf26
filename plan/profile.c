/* plan/profile.c — the hardware numbers: the documented bandwidth defaults
 * with their sources, and the profile file `ferry bench all` writes
 * (docs/PLANNING.md, "Bandwidth defaults and the profile file").
 */
#include "plan/plan_impl.h"

#include "ferry.h"

#include "core/file.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  unsigned bit;
  const char *key;
  size_t off;
  double def;
  const char *source;
} bw_keys[] = {
    {FERRY_PLAN_BW_H2D, "h2d_gbps", offsetof(ferry_plan_bandwidth, h2d_gbps), 25.0,
     "PCIe Gen4 x16 pinned copies (~25 GB/s of 31.5 GB/s raw)"},
    {FERRY_PLAN_BW_D2H, "d2h_gbps", offsetof(ferry_plan_bandwidth, d2h_gbps), 25.0,
     "PCIe Gen4 x16 pinned copies"},
    {FERRY_PLAN_BW_NVME_READ, "nvme_read_gbps", offsetof(ferry_plan_bandwidth, nvme_read_gbps),
     3.5, "one PCIe Gen3/Gen4 NVMe drive, large O_DIRECT reads"},
    {FERRY_PLAN_BW_NVME_WRITE, "nvme_write_gbps", offsetof(ferry_plan_bandwidth, nvme_write_gbps),
     3.0, "one NVMe drive, sustained large writes"},
    {FERRY_PLAN_BW_CPU_OPT, "cpu_optimizer_gbps",
     offsetof(ferry_plan_bandwidth, cpu_optimizer_gbps), 25.0,
     "memory-bound CPU Adam, 25-29 GB/s measured at 2 threads (shared/ANCHORS.md)"},
    {FERRY_PLAN_BW_TFLOPS, "device_tflops", offsetof(ferry_plan_bandwidth, device_tflops), 50.0,
     "16-bit training throughput of a workstation GPU (~30-40% of an RTX 4090 / A100 peak)"},
    {FERRY_PLAN_BW_TFLOPS32, "device_tflops_fp32",
     offsetof(ferry_plan_bandwidth, device_tflops_fp32), 12.5, "a quarter of device_tflops"},
    {FERRY_PLAN_BW_DEVMEM, "device_mem_gbps", offsetof(ferry_plan_bandwidth, device_mem_gbps),
     900.0, "GDDR6X / HBM2e device memory (optimizer on the GPU)"},
};
#define NBW (int)(sizeof bw_keys / sizeof bw_keys[0])

ferry_plan_bandwidth ferry_plan_bandwidth_default(void) {
  ferry_plan_bandwidth b;
  memset(&b, 0, sizeof b);
  for (int i = 0; i < NBW; i++) *(double *)((char *)&b + bw_keys[i].off) = bw_keys[i].def;
  return b;
}

const char *ferry_plan_bandwidth_key(unsigned bit) {
  for (int i = 0; i < NBW; i++)
    if (bw_keys[i].bit == bit) return bw_keys[i].key;
  return NULL;
}
double ferry_plan_bandwidth_value(const ferry_plan_bandwidth *b, unsigned bit) {
  for (int i = 0; i < NBW; i++)
    if (bw_keys[i].bit == bit) return *(const double *)((const char *)b + bw_keys[i].off);
  return 0;
}
const char *ferry_plan_bandwidth_source(unsigned bit) {
  for (int i = 0; i < NBW; i++)
    if (bw_keys[i].bit == bit) return bw_keys[i].source;
  return NULL;
}

int ferry_plan_profile_parse(const char *text, size_t len, const char *name,
                             ferry_plan_bandwidth *bw, char *why, size_t wl) {
  if (!name) name = "profile";
  ferry_json_value *root = NULL;
  if (plan_parse_json(text, len, name, FERRY_ECONFIG, &root, why, wl)) return FERRY_ECONFIG;
  int rc = FERRY_ECONFIG;
  ferry_plan_bandwidth b = *bw;
  if (root->type != FERRY_JSON_OBJ) {
    plan_fail(why, wl, rc, "%s: expected a JSON object", name);
    goto out;
  }
  const ferry_json_value *fmt = ferry_json_get(root, "format");
  const ferry_json_value *ver = ferry_json_get(root, "version");
  if (!fmt || fmt->type != FERRY_JSON_STR || strcmp(fmt->str, "ferry-profile")) {
    plan_fail(why, wl, rc, "%s: \"format\": \"ferry-profile\" is missing", name);
    goto out;
  }
  if (!ver || ver->type != FERRY_JSON_NUM || !ver->is_int || ver->i != 1) {
    plan_fail(why, wl, rc, "%s: \"version\" must be 1 (this ferry reads profile version 1)", name);
    goto out;
  }
  for (size_t i = 0; i < root->n; i++) {
    const char *k = root->keys[i];
    const ferry_json_value *v = &root->items[i];
    if (!strcmp(k, "format") || !strcmp(k, "version")) continue;
    if (!strcmp(k, "machine") || !strcmp(k, "created") || !strcmp(k, "ferry_version")) {
      if (v->type != FERRY_JSON_STR) {
        plan_fail(why, wl, rc, "%s:%d: \"%s\" must be a string", name, v->line, k);
        goto out;
      }
      continue;
    }
    if (!strcmp(k, "sources")) { /* free-form notes per measurement */
      if (v->type != FERRY_JSON_OBJ) {
        plan_fail(why, wl, rc, "%s:%d: \"sources\" must be an object", name, v->line);
        goto out;
      }
      continue;
    }
    int j = 0;
    while (j < NBW && strcmp(bw_keys[j].key, k)) j++;
    if (j == NBW) {
      char known[400] = "";
      size_t o = 0;
      for (int t = 0; t < NBW && o < sizeof known; t++)
        o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", t ? ", " : "", bw_keys[t].key);
      plan_fail(why, wl, rc, "%s:%d: unknown key \"%s\" (known: %s, machine, created, "
           "ferry_version, sources)", name, v->line, k, known);
      goto out;
    }
    if (v->type != FERRY_JSON_NUM || !(v->num > 0) || v->num > 1e7) {
      plan_fail(why, wl, rc, "%s:%d: \"%s\" must be a number > 0 (GB/s or TFLOP/s)", name, v->line,
           k);
      goto out;
    }
    *(double *)((char *)&b + bw_keys[j].off) = v->num;
    b.measured |= bw_keys[j].bit;
  }
  if ((b.measured & FERRY_PLAN_BW_TFLOPS) && !(b.measured & FERRY_PLAN_BW_TFLOPS32) &&
      !(bw->measured & FERRY_PLAN_BW_TFLOPS32))
    b.device_tflops_fp32 = b.device_tflops / 4;
  *bw = b;
  rc = FERRY_OK;
out:
  ferry_json_free(root);
  return rc;
}

int ferry_plan_profile_load(const char *path, ferry_plan_bandwidth *bw, char *why, size_t wl) {
  char *text;
  size_t len;
  int rc = ferry_read_file(path, 1u << 20, &text, &len, why, wl);
  if (rc) return rc == FERRY_ENOENT ? rc : FERRY_ECONFIG;
  rc = ferry_plan_profile_parse(text, len, path, bw, why, wl);
  free(text);
  return rc;
}
