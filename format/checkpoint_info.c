/* format/checkpoint_info.c — reads what a checkpoint holds for `ferry
 * checkpoint info` (format/checkpoint_info.h): the manifest through the
 * strict parser of checkpoint_manifest.c, and the tensor headers of
 * params/ and optim/ through the safetensors reader (only files the
 * manifest lists), counted per family.
 */
#include "format/checkpoint_info.h"

#include "core/file.h"
#include "ferry.h"
#include "format/checkpoint_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ckpt_family *family(ckpt_info *in, const char *name, size_t len) {
  for (int i = 0; i < in->nfamilies; i++)
    if (strlen(in->families[i].name) == len && !strncmp(in->families[i].name, name, len))
      return &in->families[i];
  if (in->nfamilies == CKPT_INFO_MAX_FAMILIES) return &in->families[CKPT_INFO_MAX_FAMILIES - 1];
  ckpt_family *f = &in->families[in->nfamilies++];
  snprintf(f->name, sizeof f->name, "%.*s", (int)(len < 31 ? len : 31), name);
  return f;
}

static void count(ckpt_family *f, const ferry_safetensors_tensor *t) {
  const char *dt = ferry_dtype_name(t->dtype);
  if (!f->tensors) snprintf(f->dtype, sizeof f->dtype, "%s", dt);
  else if (strcmp(f->dtype, dt)) snprintf(f->dtype, sizeof f->dtype, "mixed");
  f->tensors++;
  f->bytes += t->nbytes;
}

/* The tensors of folder/sub into families: all of them in one named
 * `whole`, or (whole NULL) each in the family of its name's suffix. */
static int part(ckpt_info *in, const char *sub, const char *whole, char *why, size_t wl) {
  ferry_safetensors *f = NULL;
  int rc = ckpt_open_part(&in->m, in->folder, sub, &f, why, wl);
  if (rc) return rc;
  if (whole) family(in, whole, strlen(whole)); /* listed even when empty */
  for (size_t i = 0; i < ferry_safetensors_count(f); i++) {
    ferry_safetensors_tensor t;
    if (ferry_safetensors_get(f, i, &t)) continue;
    const char *name = whole, *dot = whole ? NULL : strrchr(t.name, '.');
    if (!whole) name = dot ? dot + 1 : "other";
    count(family(in, name, strlen(name)), &t);
  }
  ferry_safetensors_close(f);
  return FERRY_OK;
}

/* Families in the order a reader expects them: the params, the master,
 * the states, then any other in the order met. */
static int rank(const char *name) {
  static const char *const order[] = {"params", "master", "exp_avg", "exp_avg_sq", "momentum"};
  for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++)
    if (!strcmp(order[i], name)) return i;
  return 99;
}

static void sort_families(ckpt_info *in) {
  for (int i = 1; i < in->nfamilies; i++) /* insertion sort, stable */
    for (int j = i; j > 0 && rank(in->families[j].name) < rank(in->families[j - 1].name); j--) {
      ckpt_family t = in->families[j];
      in->families[j] = in->families[j - 1];
      in->families[j - 1] = t;
    }
}

int ckpt_info_read(const char *path, ckpt_info *out, char *why, size_t wl) {
  memset(out, 0, sizeof *out);
  int64_t step;
  if (ferry_checkpoint_find(path, out->folder, sizeof out->folder, &step)) {
    snprintf(why, wl, "%.900s", ferry_last_error());
    return FERRY_ENOENT;
  }
  char *text = NULL;
  size_t len = 0;
  int rc = ferry_read_below(out->folder, CKPT_MANIFEST_NAME, CKPT_MANIFEST_MAX, &text, &len, why,
                            wl);
  if (rc) return rc == FERRY_ENOMEM ? rc : FERRY_ECORRUPT; /* missing, unreadable or too big */
  char pw[768];
  rc = ckpt_manifest_parse(text, len, 1, &out->m, pw, sizeof pw);
  free(text);
  if (rc) {
    snprintf(why, wl, "%.400s/%s: %s", out->folder, CKPT_MANIFEST_NAME, pw);
    return rc;
  }
  for (size_t i = 0; i < out->m.nfiles; i++) out->total_bytes += out->m.files[i].bytes;
  rc = part(out, "params", "params", why, wl);
  if (!rc) rc = part(out, "optim", NULL, why, wl);
  if (rc) ckpt_info_free(out);
  else sort_families(out);
  return rc;
}

void ckpt_info_free(ckpt_info *info) {
  if (!info) return;
  ckpt_manifest_free(&info->m);
  memset(&info->m, 0, sizeof info->m);
}
