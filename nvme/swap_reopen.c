/* nvme/swap_reopen.c — the kept-files half of a swap store's life:
 * ferry_swap_save_index, and ferry_swap_reopen, which opens a store again
 * from its index (swap_index.c reads it): the caller's configuration
 * checked against it, the geometry and arrays restored, the files opened
 * and checked, the index removed once the store is live.
 */
#include "nvme/swap_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int ferry_swap_save_index(ferry_swap *s) {
  if (!s) return FERRY_EINVAL;
  if (s->anonymous)
    return ferry_err(&s->err, FERRY_ESTATE,
                     "swap '%s': its files have no name (keep_files off): nothing to index",
                     s->name);
  ferry_swap_drain(s);
  pthread_mutex_lock(&s->mu);
  int rc = s->active ? ferry_err(&s->err, FERRY_EBUSY, "swap '%s': requests started while saving",
                                 s->name)
                     : swap_index_save(s);
  if (rc == FERRY_OK) s->index_saved = 1;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* The caller's geometry, where given, must be the store's; and a store
 * written without CRCs reopens only with verify off. */
static int check_against_index(const ferry_swap_config *cfg, const swap_saved *sv,
                               const char *name, const char *index_path) {
  const char *field = NULL;
  unsigned long long want = 0, have = 0;
  if (cfg->slot_size && cfg->slot_size != sv->slot_size)
    field = "slot_size", want = cfg->slot_size, have = sv->slot_size;
  else if (cfg->nslots && cfg->nslots != sv->nslots)
    field = "nslots", want = cfg->nslots, have = sv->nslots;
  else if (cfg->npaths && cfg->npaths != sv->npaths)
    field = "npaths", want = (unsigned)cfg->npaths, have = (unsigned)sv->npaths;
  if (field)
    return ferry_err_thread(FERRY_EINVAL,
                            "swap '%s': the configuration asks %s %llu but the store of %s has "
                            "%llu (0 takes the store's)",
                            name, field, want, index_path, have);
  if (cfg->verify && !sv->verify)
    return ferry_err_thread(FERRY_EINVAL,
                            "swap '%s': %s was written without CRCs (verify off); reopen it with "
                            "verify off",
                            name, index_path);
  return FERRY_OK;
}

/* Checks cfg and reads the index at index_path into sv (freed on failure;
 * errors go to ferry_last_error). */
static int load_index(const ferry_swap_config *cfg, const char *index_path, const char *name,
                      swap_saved *sv) {
  ferry_swap_config c = *cfg;
  if (!c.block_size) c.block_size = 1; /* from the index */
  int rc = swap_check_cfg(&c, name, 0);
  if (rc != FERRY_OK) return rc;
  if (strlen(index_path) >= 1024)
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': index path too long", name);
  ferry_errbuf e;
  ferry_errbuf_init(&e);
  rc = swap_index_load(index_path, sv, &e);
  if (rc != FERRY_OK) {
    ferry_err_thread(rc, "swap '%s': %s", name, ferry_err_msg(&e));
    ferry_errbuf_destroy(&e);
    return rc;
  }
  ferry_errbuf_destroy(&e);
  rc = check_against_index(cfg, sv, name, index_path);
  if (rc != FERRY_OK) swap_saved_free(sv);
  return rc;
}

/* The files the index names, and their directories. */
static int take_paths(ferry_swap *s, const swap_saved *sv, const char *name,
                      const char *index_path) {
  for (int i = 0; i < s->npaths; i++) {
    size_t flen = strlen(sv->files[i]); /* < sizeof sv->files[i] == sizeof s->files[i] */
    if (flen >= sizeof s->dirs[i])
      return ferry_err(&s->err, FERRY_EINVAL,
                       "swap '%s': %s names a file path of %zu bytes (at most %zu)", name,
                       index_path, flen, sizeof s->dirs[i] - 1);
    memcpy(s->files[i], sv->files[i], flen + 1);
    memcpy(s->dirs[i], sv->files[i], flen + 1);
    char *slash = strrchr(s->dirs[i], '/');
    if (slash == s->dirs[i]) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(s->dirs[i], sizeof s->dirs[i], ".");
    s->cfg.paths[i] = s->dirs[i];
  }
  return FERRY_OK;
}

/* Probes the directories. Block and tail boundaries (and so the CRC of
 * each piece) follow the alignment the store was written with; O_DIRECT
 * here must accept it. */
static int check_alignment(ferry_swap *s, const swap_saved *sv, const char *name,
                           const char *index_path) {
  ferry_path_info pi[FERRY_SWAP_MAX_PATHS];
  dev_t devs[FERRY_SWAP_MAX_PATHS];
  int rc = swap_probe_dirs(s, pi, devs);
  if (rc == FERRY_OK && s->direct && (sv->oa % s->oa || sv->bs % s->oa)) {
    rc = ferry_err(&s->err, FERRY_EINVAL,
                   "swap '%s': %s was written with %llu-byte alignment (blocks of %llu), which "
                   "O_DIRECT here (alignment %zu) cannot read; reopen it with force_buffered",
                   name, index_path, (unsigned long long)sv->oa, (unsigned long long)sv->bs,
                   s->oa);
  }
  return rc;
}

/* The geometry and the in-memory index (map, lengths, CRCs, lost flags,
 * free slots) as the index holds them. */
static int restore_index(ferry_swap *s, const swap_saved *sv, const char *name) {
  s->oa = sv->oa;
  s->bs = sv->bs;
  s->positions = sv->positions;
  s->cps = sv->cps;
  s->ppf = sv->ppf;
  s->nphys = sv->nphys;
  s->tight = sv->tight;
  s->psize = malloc((size_t)s->nphys * sizeof *s->psize);
  if (!s->psize) return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory", name);
  memcpy(s->psize, sv->psize, (size_t)s->nphys * sizeof *s->psize);
  int rc = swap_place_slots(s); /* the index's file_bytes adds up (swap_index.c) */
  if (rc == FERRY_OK) rc = swap_alloc_index(s);
  if (rc != FERRY_OK) return rc;
  unsigned char *used = calloc(s->nphys, 1);
  if (!used) return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory", name);
  for (uint32_t i = 0; i < s->cfg.nslots; i++) {
    s->map[i] = sv->map[i];
    used[sv->map[i]] = 1;
    s->lost[i] = sv->lost[i];
  }
  for (uint32_t p = 0; p < s->nphys; p++) s->plen[p] = used[p] ? (size_t)sv->plen[p] : 0;
  for (uint32_t p = s->nphys; p > 0; p--)
    if (!used[p - 1]) s->free_phys[s->nfree_phys++] = p - 1;
  memcpy(s->crc, sv->crc, (size_t)s->nphys * s->cps * sizeof *s->crc);
  free(used);
  return FERRY_OK;
}

/* Opens the kept files; each must be a regular file of the index's size. */
static int open_kept_files(ferry_swap *s, const char *name, const char *index_path) {
  for (int i = 0; i < s->npaths; i++) {
    int fd = open(s->files[i], O_RDWR | O_CLOEXEC | (s->direct ? O_DIRECT : 0));
    if (fd < 0) {
      int er = errno;
      return ferry_err(&s->err, status_of_errno(er), "swap '%s': cannot open %s (named by %s): %s",
                       name, s->files[i], index_path, strerror(er));
    }
    s->fds[i] = fd;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) { /* held for the store's life, as at open */
      int er = errno;
      return ferry_err(&s->err, er == EWOULDBLOCK ? FERRY_EBUSY : FERRY_EIO,
                       "swap '%s': %s (named by %s) is in use by another store: %s", name,
                       s->files[i], index_path, strerror(er));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != s->file_bytes)
      return ferry_err(&s->err, FERRY_ECORRUPT,
                       "swap '%s': %s is %lld bytes, the index %s says %llu", name, s->files[i],
                       (long long)st.st_size, index_path, (unsigned long long)s->file_bytes);
  }
  return FERRY_OK;
}

int ferry_swap_reopen(const ferry_swap_config *cfg, const char *index_path, ferry_swap **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  if (!cfg || !index_path || !index_path[0])
    return ferry_err_thread(FERRY_EINVAL, "swap: reopen needs a configuration and an index path");
  const char *name = cfg->name ? cfg->name : "swap";
  swap_saved sv;
  int rc = load_index(cfg, index_path, name, &sv);
  if (rc != FERRY_OK) return rc;
  ferry_swap_config c = *cfg;
  c.npaths = sv.npaths;
  c.slot_size = sv.slot_size;
  c.nslots = sv.nslots;
  c.spare_slots = sv.spare_slots;
  c.block_size = sv.bs;
  c.slot_sizes = NULL; /* the index holds each slot's size */
  ferry_swap *s = swap_new_store(&c, name);
  if (!s) {
    swap_saved_free(&sv);
    return ferry_err_thread(FERRY_ENOMEM, "swap '%s': out of memory", name);
  }
  rc = take_paths(s, &sv, name, index_path);
  if (rc == FERRY_OK) {
    snprintf(s->index_path, sizeof s->index_path, "%s", index_path);
    rc = check_alignment(s, &sv, name, index_path);
  }
  if (rc == FERRY_OK) rc = restore_index(s, &sv, name);
  swap_saved_free(&sv);
  if (rc == FERRY_OK) rc = open_kept_files(s, name, index_path); /* owns_files 0: a failure unlinks nothing */
  if (rc == FERRY_OK) rc = swap_start_ring(s);
  if (rc != FERRY_OK) return swap_open_fail(s, rc);
  /* From the first write on the index no longer describes the files: it
   * goes now, and a close that keeps the files writes a new one. The store
   * is live: a close without keep_files removes them. */
  unlink(index_path);
  s->owns_files = 1;
  *out = s;
  return FERRY_OK;
}
