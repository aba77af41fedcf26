/* format/checkpoint_verify.c — finding a checkpoint (ferry_checkpoint_find)
 * and checking one with no engine (ferry_checkpoint_verify): its manifest,
 * every listed file's size and CRC32C, the files a checkpoint must hold, its
 * per-param step counts, and its safetensors parts opened only over listed
 * files (ckpt_open, ckpt_open_part, which ferry_checkpoint_load uses too).
 */
#include "format/checkpoint_files.h"
#include "core/crc32c.h"
#include "core/file.h"
#include "core/untrusted.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The checkpoint folder of path: path itself when it holds a manifest,
 * else its newest step-* folder; *step: the N of that folder's name (-1
 * for a checkpoint folder named otherwise). Reads no manifest. */
static int find_folder(const char *path, char *folder, size_t cap, int64_t *step, char *why,
                       size_t wl) {
  char mp[4096];
  struct stat st;
  if (ckpt_join(mp, sizeof mp, path, CKPT_MANIFEST_NAME)) {
    snprintf(why, wl, "path too long");
    return FERRY_EOVERFLOW;
  }
  int len;
  if (stat(mp, &st) == 0) {
    char name[4096]; /* the last component, trailing slashes dropped */
    size_t nl = strlen(path);
    while (nl > 1 && path[nl - 1] == '/')
      nl--;
    if (nl >= sizeof name) nl = sizeof name - 1;
    memcpy(name, path, nl);
    name[nl] = '\0';
    const char *base = strrchr(name, '/');
    *step = ckpt_step_of(base ? base + 1 : name);
    len = snprintf(folder, cap, "%s", path);
  } else {
    ckpt_entry *list;
    size_t n;
    int r = ckpt_list(path, &list, &n);
    if (r || n == 0) {
      if (!r) free(list);
      snprintf(why, wl,
               "%.400s: no checkpoint there (no %.300s, no " CKPT_PREFIX "* folder)%.300s%.300s",
               path, CKPT_MANIFEST_NAME, r ? ": " : "", r ? strerror(-r) : "");
      return r && r != -ENOENT ? ckpt_io_status(-r) : FERRY_ENOENT;
    }
    *step = list[0].step;
    len = snprintf(folder, cap, "%s/%s", path, list[0].name);
    free(list);
    if (len >= 0 && (size_t)len < cap && (lstat(folder, &st) || !S_ISDIR(st.st_mode))) {
      snprintf(why, wl, "%.400s: not a folder (a checkpoint's step folder is never a link)",
               folder);
      return FERRY_ECORRUPT;
    }
  }
  if (len < 0 || (size_t)len >= cap) {
    snprintf(why, wl, "path too long");
    return FERRY_EOVERFLOW;
  }
  return FERRY_OK;
}

int ferry_checkpoint_find(const char *path, char *folder, size_t cap, int64_t *step) {
  if (!path || !path[0] || !folder || !cap)
    return ferry_err_thread(FERRY_EINVAL, "checkpoint find: no path or no buffer");
  char why[1024] = "";
  int64_t s;
  int rc = find_folder(path, folder, cap, &s, why, sizeof why);
  if (rc) return ferry_err_thread(rc, "checkpoint find: %s", why);
  if (step) *step = s;
  return FERRY_OK;
}

/* The whole manifest of folder, at most CKPT_MANIFEST_MAX bytes, into a
 * new buffer *text (the caller frees it). */
static int read_manifest(const char *folder, char **text, size_t *len, char *why, size_t wl) {
  int rc = ferry_read_below(folder, CKPT_MANIFEST_NAME, CKPT_MANIFEST_MAX, text, len, why, wl);
  return rc == FERRY_EINVAL || rc == FERRY_EOVERFLOW ? FERRY_ECORRUPT : rc;
}

/* Every file the manifest lists is in folder, a regular file of the
 * listed size and CRC32C. */
static int check_files(const ckpt_manifest *m, const char *folder, char *why, size_t wl) {
  for (size_t i = 0; i < m->nfiles; i++) {
    const ckpt_file *f = &m->files[i];
    char fp[4096];
    uint64_t size, bytes;
    uint32_t crc;
    if (ckpt_join(fp, sizeof fp, folder, f->path)) {
      snprintf(why, wl, "path too long");
      return FERRY_EOVERFLOW;
    }
    int rc = ckpt_file_crc_at(folder, f->path, &size, &bytes, &crc, why, wl);
    if (rc == FERRY_ENOENT) {
      snprintf(why, wl, "%.400s: listed in the manifest but missing", fp);
      return FERRY_ECORRUPT;
    }
    if (rc) return rc;
    if (size != f->bytes) {
      snprintf(why, wl, "%.400s: %llu bytes, the manifest says %llu (truncated or replaced)", fp,
               (unsigned long long)size, (unsigned long long)f->bytes);
      return FERRY_ECORRUPT;
    }
    if (bytes != f->bytes || crc != f->crc) {
      snprintf(why, wl, "%.400s: CRC32C %08x over %llu bytes, the manifest says %08x over %llu", fp,
               crc, (unsigned long long)bytes, f->crc, (unsigned long long)f->bytes);
      return FERRY_ECORRUPT;
    }
  }
  return FERRY_OK;
}

/* The manifest (mp) lists user.bin, of blob_bytes bytes, and at least one
 * params/ and one optim/ file. */
static int check_required_files(const ckpt_manifest *m, const char *mp, char *why, size_t wl) {
  int have_user = 0, have_params = 0, have_optim = 0;
  for (size_t i = 0; i < m->nfiles; i++) {
    const char *p = m->files[i].path;
    if (!strcmp(p, "user.bin")) have_user = 1;
    if (!strncmp(p, "params/", 7)) have_params = 1;
    if (!strncmp(p, "optim/", 6)) have_optim = 1;
  }
  if (!have_user || !have_params || !have_optim) {
    snprintf(why, wl, "%.400s: the manifest lists no %.300s", mp,
             !have_user     ? "user.bin"
             : !have_params ? "params/ file"
                            : "optim/ file");
    return FERRY_ECORRUPT;
  }
  for (size_t i = 0; i < m->nfiles; i++)
    if (!strcmp(m->files[i].path, "user.bin") && m->files[i].bytes != m->blob_bytes) {
      snprintf(why, wl, "%.400s: user.bin has %llu bytes, blob_bytes says %llu", mp,
               (unsigned long long)m->files[i].bytes, (unsigned long long)m->blob_bytes);
      return FERRY_ECORRUPT;
    }
  return FERRY_OK;
}

/* Version 5: the file CKPT_STEPS_NAME the manifest (mp) lists, within the
 * bytes its param count allows (checked before a byte is read), read
 * whole, its size and CRC32C checked (also where check_files was not run)
 * and its lines parsed into m->steps. */
static int read_param_steps(ckpt_manifest *m, const char *folder, const char *mp, char *why,
                            size_t wl) {
  if (m->version < 5) return FERRY_OK;
  const ckpt_file *f = NULL;
  for (size_t i = 0; i < m->nfiles && !f; i++)
    if (!strcmp(m->files[i].path, CKPT_STEPS_NAME)) f = &m->files[i];
  if (!f) {
    snprintf(why, wl, "%.400s: param_steps %llu, and no file " CKPT_STEPS_NAME " listed", mp,
             (unsigned long long)m->steps_listed);
    return FERRY_ECORRUPT;
  }
  uint64_t limit = ckpt_param_steps_limit(m);
  if (f->bytes > limit) {
    snprintf(why, wl, "%.400s: " CKPT_STEPS_NAME " of %llu bytes, more than %llu for %llu params",
             mp, (unsigned long long)f->bytes, (unsigned long long)limit,
             (unsigned long long)m->steps_listed);
    return FERRY_ECORRUPT;
  }
  char *text = NULL;
  size_t len = 0;
  int rc = ferry_read_below(folder, CKPT_STEPS_NAME, (size_t)f->bytes, &text, &len, why, wl);
  if (rc) return rc == FERRY_EINVAL || rc == FERRY_EOVERFLOW ? FERRY_ECORRUPT : rc;
  if (len != f->bytes || ferry_crc32c(0, text, len) != f->crc) {
    free(text);
    snprintf(why, wl, "%.400s/" CKPT_STEPS_NAME ": %zu bytes not those the manifest lists "
             "(%llu bytes, CRC32C %08x): damaged", folder, len, (unsigned long long)f->bytes,
             f->crc);
    return FERRY_ECORRUPT;
  }
  char pwhy[400];
  rc = ckpt_param_steps_parse(text, len, m, pwhy, sizeof pwhy);
  free(text);
  if (rc) snprintf(why, wl, "%.400s/%.300s (the step counts the manifest lists)", folder, pwhy);
  return rc;
}

/* Finds the checkpoint folder of path (find_folder), reads its manifest
 * into *m and checks every file it lists; on failure *m is empty. */
int ckpt_open(const char *path, char *folder, size_t cap, ckpt_manifest *m, int check_crc,
                     char *why, size_t wl) {
  memset(m, 0, sizeof *m);
  char mp[4096];
  int64_t step;
  int rc = find_folder(path, folder, cap, &step, why, wl);
  if (rc) return rc;
  if (ckpt_join(mp, sizeof mp, folder, CKPT_MANIFEST_NAME)) {
    snprintf(why, wl, "path too long");
    return FERRY_EOVERFLOW;
  }
  char *text = NULL;
  size_t len = 0;
  rc = read_manifest(folder, &text, &len, why, wl);
  if (rc) return rc;
  char pwhy[400];
  rc = ckpt_manifest_parse(text, len, 1, m, pwhy, sizeof pwhy);
  free(text);
  if (rc) {
    snprintf(why, wl, "%.400s: %.300s", mp, pwhy);
    return rc;
  }
  rc = check_crc ? check_files(m, folder, why, wl) : FERRY_OK;
  if (!rc) rc = check_required_files(m, mp, why, wl);
  if (!rc) rc = read_param_steps(m, folder, mp, why, wl);
  if (rc) ckpt_manifest_free(m);
  return rc;
}

/* st_allow_fn: rel (a path below the checkpoint folder) is listed in the
 * manifest ctx, so it is opened only after its name was checked. */
int ckpt_listed(void *ctx, const char *rel, char *why, size_t wl) {
  const ckpt_manifest *m = ctx;
  for (size_t i = 0; i < m->nfiles; i++)
    if (!strcmp(m->files[i].path, rel)) return FERRY_OK;
  snprintf(why, wl, "not listed in the manifest");
  return FERRY_ECORRUPT;
}

/* Opens folder/sub as a safetensors model whose every file the manifest
 * lists (and so was CRC-checked): names checked before any file is
 * opened, every file opened below folder through core/untrusted.h. */
int ckpt_open_part(const ckpt_manifest *m, const char *folder, const char *sub,
                     ferry_safetensors **out, char *why, size_t wl) {
  int rc = st_open_below(folder, sub, ckpt_listed, (void *)m, out);
  if (rc) {
    snprintf(why, wl, "%.900s", ferry_last_error());
    return rc == FERRY_ENOENT || rc == FERRY_EINVAL ? FERRY_ECORRUPT : rc;
  }
  return FERRY_OK;
}

int ferry_checkpoint_verify(const char *path, ferry_checkpoint_info *info) {
  if (!path || !path[0]) return ferry_err_thread(FERRY_EINVAL, "checkpoint verify: no path");
  char folder[4096], why[1024] = "";
  ckpt_manifest m;
  int rc = ckpt_open(path, folder, sizeof folder, &m, 1, why, sizeof why);
  if (rc) return ferry_err_thread(rc, "checkpoint verify: %s", why);
  ferry_safetensors *pf = NULL, *of = NULL;
  rc = ckpt_open_part(&m, folder, "params", &pf, why, sizeof why);
  if (!rc) rc = ckpt_open_part(&m, folder, "optim", &of, why, sizeof why);
  if (!rc && ferry_safetensors_count(pf) != m.tensors) {
    snprintf(why, sizeof why, "%.400s/params holds %zu tensors, the manifest says %llu", folder,
             ferry_safetensors_count(pf), (unsigned long long)m.tensors);
    rc = FERRY_ECORRUPT;
  }
  /* a master per param (none with a bf16 master) and its states */
  uint64_t per = (uint64_t)m.states + (strcmp(m.master_dtype, "BF16") ? 1 : 0);
  if (!rc && ferry_safetensors_count(of) != m.tensors * per) {
    snprintf(why, sizeof why, "%.400s/optim holds %zu tensors, expected %llu", folder,
             ferry_safetensors_count(of), (unsigned long long)(m.tensors * per));
    rc = FERRY_ECORRUPT;
  }
  if (!rc && info) {
    memset(info, 0, sizeof *info);
    info->step = m.step;
    info->blob_bytes = m.blob_bytes;
    info->tensors = m.tensors;
    info->files = (int)m.nfiles;
    for (size_t i = 0; i < m.nfiles; i++)
      info->total_bytes += m.files[i].bytes;
    snprintf(info->path, sizeof info->path, "%.1000s", folder);
  }
  ferry_safetensors_close(pf);
  ferry_safetensors_close(of);
  ckpt_manifest_free(&m);
  if (rc) return ferry_err_thread(rc, "checkpoint verify: %s", why);
  return FERRY_OK;
}
