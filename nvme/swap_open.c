/* nvme/swap_open.c — a swap store's life: the configuration defaults and
 * checks, ferry_swap_open (directories probed, geometry, free space, the
 * files created and reserved, the ring and its threads started), close,
 * and what a live store tells and takes (info, stats, chunk lengths,
 * registered buffers). Reopening from an index: swap_reopen.c; the files
 * of dead processes: swap_reclaim.c.
 */
#include "nvme/swap_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

ferry_swap_config ferry_swap_config_default(void) {
  ferry_swap_config c;
  memset(&c, 0, sizeof c);
  c.spare_slots = 4;
  c.block_size = 1u << 20;
  c.queue_depth = 32;
  c.verify = 1;
  c.check_threads = 1;
  return c;
}

const char *ferry_swap_last_error(ferry_swap *s) { return s ? ferry_err_msg(&s->err) : ""; }

void ferry_swap_error_copy(ferry_swap *s, char *out, size_t cap) {
  if (!out || !cap) return;
  out[0] = 0;
  if (!s) return;
  pthread_mutex_lock(&s->err.mu);
  snprintf(out, cap, "%s", s->err.msg);
  pthread_mutex_unlock(&s->err.mu);
}

/* ------------------------------------------------------------------------ */
/* What open and reopen share                                                */

static atomic_uint g_store_seq;

static void free_store(ferry_swap *s) {
  swap_workers_stop(s);
  free(s->workers);
  if (s->ring_ok) io_uring_queue_exit(&s->ring);
  for (int i = 0; i < s->npaths; i++) {
    if (s->fds[i] >= 0) {
      /* The ring drops its reference to the file later, on its own; the
       * lock must go now (a reopen may follow at once). */
      if (!s->anonymous) flock(s->fds[i], LOCK_UN);
      close(s->fds[i]);
      if (s->owns_files && !s->cfg.keep_files) unlink(s->files[i]);
    }
  }
  free(s->psize);
  free(s->pbase);
  free(s->map);
  free(s->free_phys);
  free(s->plen);
  free(s->crc);
  free(s->busy);
  free(s->lost);
  free(s->units);
  free(s->bounce);
  free(s->regs);
  for (int i = 0; i < FERRY_SWAP_MAX_PATHS; i++) free(s->stale[i]);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->wcv);
  pthread_cond_destroy(&s->bcv);
  ferry_errbuf_destroy(&s->err);
  free(s);
}

int swap_open_fail(ferry_swap *s, int status) {
  ferry_err_thread(status, "%s", ferry_err_msg(&s->err));
  free_store(s);
  return status;
}

int swap_check_cfg(const ferry_swap_config *cfg, const char *name, int need_geometry) {
  if (need_geometry && (cfg->npaths < 1 || cfg->npaths > FERRY_SWAP_MAX_PATHS))
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': %d directories (1..%d)", name, cfg->npaths,
                            FERRY_SWAP_MAX_PATHS);
  if ((need_geometry && (!cfg->slot_size || !cfg->nslots || !cfg->block_size)) ||
      !cfg->queue_depth || cfg->queue_depth > 4096)
    return ferry_err_thread(FERRY_EINVAL,
                            "swap '%s': slot_size %zu, nslots %u, block_size %zu, queue_depth %u "
                            "(all > 0, queue_depth <= 4096)",
                            name, cfg->slot_size, cfg->nslots, cfg->block_size, cfg->queue_depth);
  if (cfg->check_threads > 64)
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': check_threads %u (0..64)", name,
                            cfg->check_threads);
  if (cfg->block_size > (1u << 30))
    return ferry_err_thread(FERRY_EINVAL, "swap '%s': block_size %zu above 1 GiB", name,
                            cfg->block_size);
  for (int i = 0; need_geometry && i < cfg->npaths; i++)
    if (!cfg->paths[i] || !cfg->paths[i][0] || strlen(cfg->paths[i]) >= 1024)
      return ferry_err_thread(FERRY_EINVAL, "swap '%s': directory %d is empty or too long", name,
                              i);
  return FERRY_OK;
}

ferry_swap *swap_new_store(const ferry_swap_config *cfg, const char *name) {
  ferry_swap *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->cfg = *cfg;
  snprintf(s->name, sizeof s->name, "%s", name);
  s->cfg.name = s->name;
  s->log = cfg->log;
  s->npaths = cfg->npaths;
  for (int i = 0; i < FERRY_SWAP_MAX_PATHS; i++) s->fds[i] = -1;
  ferry_errbuf_init(&s->err);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->wcv, NULL);
  pthread_cond_init(&s->bcv, NULL);
  return s;
}

/* Says once (logger) which directories refused O_DIRECT. */
static void warn_buffered(ferry_swap *s, const ferry_path_info *pi) {
  char which[2048];
  size_t w = 0;
  which[0] = 0;
  for (int i = 0; i < s->npaths && w < sizeof which; i++)
    if (!pi[i].o_direct) {
      int k = snprintf(which + w, sizeof which - w, "%s%s (%s)", w ? ", " : "", s->dirs[i],
                       pi[i].fs_type[0] ? pi[i].fs_type : "unknown");
      if (k > 0) w += (size_t)k;
    }
  ferry_logf(&s->log, FERRY_LOG_WARN,
             "swap '%s': O_DIRECT refused by %s; this store uses buffered I/O (page cache; "
             "slower, and host RAM is used for caching)",
             s->name, which);
}

/* What each directory offers: sets s->direct, mem_align and oa, and says
 * once (logger) when a directory refuses O_DIRECT. */
int swap_probe_dirs(ferry_swap *s, ferry_path_info *pi, dev_t *devs) {
  int direct = !s->cfg.force_buffered;
  size_t mem_align = 1, oa = 1;
  for (int i = 0; i < s->npaths; i++) {
    char why[600];
    int rc = ferry_path_probe(s->dirs[i], &pi[i], why, sizeof why);
    if (rc != FERRY_OK)
      return ferry_err(&s->err, rc, "swap '%s': directory %s unusable: %s", s->name, s->dirs[i],
                       why);
    struct stat st;
    devs[i] = stat(s->dirs[i], &st) == 0 ? st.st_dev : (dev_t)i;
    if (!pi[i].o_direct) direct = 0;
    if (pi[i].dio_mem_align > mem_align) mem_align = pi[i].dio_mem_align;
    if (pi[i].dio_offset_align > oa) oa = pi[i].dio_offset_align;
  }
  if (!direct) {
    mem_align = 1;
    oa = 1;
    if (!s->cfg.force_buffered) warn_buffered(s, pi); /* once per store, naming every such directory */
  }
  s->direct = direct;
  s->mem_align = mem_align;
  s->oa = oa;
  return FERRY_OK;
}

int swap_alloc_index(ferry_swap *s) {
  uint32_t nslots = s->cfg.nslots;
  s->map = calloc(nslots, sizeof *s->map);
  s->free_phys = calloc(s->nphys, sizeof *s->free_phys);
  s->plen = calloc(s->nphys, sizeof *s->plen);
  s->crc = calloc((size_t)s->nphys * s->cps, sizeof *s->crc);
  s->busy = calloc(nslots, 1);
  s->lost = calloc(nslots, 1);
  s->units = calloc(s->cfg.queue_depth, sizeof *s->units);
  size_t bsz = ferry_align_up((size_t)s->cfg.queue_depth * s->oa, 4096);
  void *bounce = NULL;
  if (posix_memalign(&bounce, s->mem_align > 4096 ? s->mem_align : 4096, bsz) == 0)
    s->bounce = bounce;
  if (!s->map || !s->free_phys || !s->plen || !s->crc || !s->busy || !s->lost || !s->units ||
      !s->bounce)
    return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory for the index of %u slots",
                     s->name, s->nphys);
  for (unsigned i = 0; i < s->cfg.queue_depth; i++) {
    s->units[i].bounce = s->bounce + (size_t)i * s->oa;
    s->units[i].next = s->free_units;
    s->free_units = &s->units[i];
  }
  return FERRY_OK;
}

int swap_start_ring(ferry_swap *s) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  if (s->cfg.sqpoll) {
    p.flags |= IORING_SETUP_SQPOLL;
    p.sq_thread_idle = 50;
  }
  unsigned entries = s->cfg.queue_depth * 2 + 2;
  int rc = io_uring_queue_init_params(entries, &s->ring, &p);
  if (rc < 0)
    return ferry_err(&s->err, rc == -ENOSYS || rc == -EPERM ? FERRY_ENOTSUP : FERRY_EIO,
                     "swap '%s': io_uring_queue_init(%u%s): %s", s->name, entries,
                     s->cfg.sqpoll ? ", SQPOLL" : "", strerror(-rc));
  s->ring_ok = 1;
  s->sqpoll = s->cfg.sqpoll;
  rc = io_uring_register_files(&s->ring, s->fds, (unsigned)s->npaths);
  if (rc == 0) s->fixed_files = 1;
  else
    ferry_logf(&s->log, FERRY_LOG_INFO, "swap '%s': files not registered with the ring: %s",
               s->name, strerror(-rc));
  rc = swap_workers_start(s);
  if (rc != FERRY_OK) return rc;
  rc = swap_completion_start(s);
  if (rc != FERRY_OK) return rc;
  ferry_logf(&s->log, FERRY_LOG_DEBUG,
             "swap '%s': %d file(s) of %llu bytes, %s, block %zu, qd %u, %u+%u slots of %zu",
             s->name, s->npaths, (unsigned long long)s->file_bytes,
             s->direct ? "O_DIRECT" : "buffered", s->bs, s->cfg.queue_depth, s->cfg.nslots,
             s->cfg.spare_slots, s->cfg.slot_size);
  return FERRY_OK;
}

/* ------------------------------------------------------------------------ */
/* Open: the steps of ferry_swap_open                                        */

int swap_place_slots(ferry_swap *s) {
  s->pbase = calloc(s->nphys, sizeof *s->pbase);
  if (!s->pbase)
    return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory for %u slots", s->name,
                     s->nphys);
  uint64_t at = 0;
  s->below_max = 0;
  for (uint32_t p = 0; p < s->nphys; p++) {
    s->pbase[p] = at;
    if (s->psize[p] < s->cfg.slot_size && s->psize[p] > s->below_max) s->below_max = s->psize[p];
    uint64_t h = swap_slot_height(s->psize[p], s->bs, s->oa, (uint32_t)s->npaths, s->tight);
    if (__builtin_add_overflow(at, h, &at) || at > (uint64_t)INT64_MAX)
      return ferry_err(&s->err, FERRY_EOVERFLOW,
                       "swap '%s': %u slots of up to %zu bytes do not fit in a file", s->name,
                       s->cfg.nslots, s->cfg.slot_size);
  }
  s->file_bytes = at;
  return FERRY_OK;
}

/* Positions per slot, slots, positions per file, each slot's bytes and
 * start, and the file size, with overflow checks: the sizes come from a
 * config file. */
static int set_geometry(ferry_swap *s, const ferry_swap_config *cfg, const char *name) {
  uint64_t positions = (cfg->slot_size + s->bs - 1) / s->bs;
  uint64_t nphys = (uint64_t)cfg->nslots + cfg->spare_slots;
  uint64_t ppf = (positions + (uint64_t)s->npaths - 1) / (uint64_t)s->npaths, fb;
  if (positions >= UINT32_MAX || nphys >= UINT32_MAX ||
      __builtin_mul_overflow(nphys, ppf, &fb) || __builtin_mul_overflow(fb, (uint64_t)s->bs, &fb) ||
      fb > (uint64_t)INT64_MAX)
    return ferry_err(&s->err, FERRY_EOVERFLOW,
                     "swap '%s': %u slots of %zu bytes do not fit in a file", name, cfg->nslots,
                     cfg->slot_size);
  s->positions = (uint32_t)positions;
  s->cps = s->positions + 1;
  s->ppf = (uint32_t)ppf;
  s->nphys = (uint32_t)nphys;
  s->tight = cfg->slot_sizes != NULL;
  s->psize = malloc(nphys * sizeof *s->psize);
  if (!s->psize)
    return ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory for %u slots", name,
                     s->nphys);
  int has_max = 0;
  for (uint32_t p = 0; p < s->nphys; p++) {
    size_t z = cfg->slot_sizes ? cfg->slot_sizes[p] : cfg->slot_size;
    if (!z || z > cfg->slot_size)
      return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': slot %u of %zu bytes (1..%zu)", name,
                       p, z, cfg->slot_size);
    s->psize[p] = z;
    has_max |= z == cfg->slot_size;
  }
  if (!has_max)
    return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': no slot of slot_size (%zu bytes)", name,
                     cfg->slot_size);
  s->cfg.slot_sizes = NULL; /* the caller's array: read at open only */
  return swap_place_slots(s);
}

/* Space, per file system: directories on one device share its free bytes. */
static int check_space(ferry_swap *s, const ferry_path_info *pi, const dev_t *devs,
                       const char *name) {
  for (int i = 0; i < s->npaths; i++) {
    int first = 1, nfiles = 0;
    for (int j = 0; j < s->npaths; j++) {
      if (devs[j] != devs[i]) continue;
      if (j < i) first = 0;
      nfiles++;
    }
    if (!first) continue;
    if (!pi[i].total_bytes) { /* ramfs: no size at all, memory until the host runs out */
      ferry_logf(&s->log, FERRY_LOG_WARN,
                 "swap '%s': %s (%s) reports no size; its free space is not checked (a "
                 "memory-backed file system uses host RAM)",
                 name, s->dirs[i], pi[i].fs_type[0] ? pi[i].fs_type : "unknown");
      continue;
    }
    uint64_t need = s->file_bytes * (uint64_t)nfiles;
    if (need / (uint64_t)nfiles != s->file_bytes || need > pi[i].free_bytes) {
      char a[32], b[32], stale[4096];
      size_t w = 0;
      stale[0] = 0;
      for (int j = 0; j < s->npaths; j++) /* what other ferry stores hold there */
        if (devs[j] == devs[i] && swap_stale_of(s, j)[0] && w < sizeof stale) {
          int k = snprintf(stale + w, sizeof stale - w, "%s%s", w ? ", " : "", swap_stale_of(s, j));
          if (k > 0) w += (size_t)k;
        }
      return ferry_err(&s->err, FERRY_ENOSPC,
                       "swap '%s': directory %s needs %llu bytes (%s: %d file(s) of %llu) but only "
                       "%llu (%s) are free%s%s",
                       name, s->dirs[i], (unsigned long long)need,
                       ferry_format_size(need, a, sizeof a), nfiles,
                       (unsigned long long)s->file_bytes, (unsigned long long)pi[i].free_bytes,
                       ferry_format_size(pi[i].free_bytes, b, sizeof b),
                       stale[0] ? "; ferry swap files there that this run could not remove: " : "",
                       stale);
    }
  }
  return FERRY_OK;
}

/* Reserves file_bytes for file i (open as fd): fallocate, else (a file
 * system without it) ftruncate and a warning. */
static int reserve_file(ferry_swap *s, int i, int fd, const ferry_path_info *pi,
                        const char *name) {
  if (fallocate(fd, 0, 0, (off_t)s->file_bytes) == 0) return FERRY_OK;
  int e = errno;
  if (e == EOPNOTSUPP || e == ENOSYS) {
    ferry_logf(&s->log, FERRY_LOG_WARN,
               "swap '%s': %s cannot reserve space (fallocate unsupported); a full disk will "
               "show up as write errors",
               name, s->dirs[i]);
    if (ftruncate(fd, (off_t)s->file_bytes) == 0) return FERRY_OK;
    e = errno;
  }
  return ferry_err(&s->err, status_of_errno(e),
                   "swap '%s': cannot reserve %llu bytes for %s: %s (free there: %llu)", name,
                   (unsigned long long)s->file_bytes, s->files[i], strerror(e),
                   (unsigned long long)pi[i].free_bytes);
}

/* File i, named s->files[i], made for this store: anonymous (O_TMPFILE
 * where the file system has it, else made and unlinked at once) so that it
 * cannot outlive the process; with keep_files named and flock'ed for the
 * store's life (swap_reclaim.c removes it once no one holds it and no index
 * keeps it). The directory's shared lock keeps a reclaiming store from
 * seeing a named file before its lock is taken. Returns the fd, or a
 * FERRY_E status (negative). */
static int create_file(ferry_swap *s, int i, const char *name) {
  int flags = O_RDWR | O_CLOEXEC | (s->direct ? O_DIRECT : 0);
  int fd = -1;
#ifdef O_TMPFILE
  if (!s->cfg.keep_files) fd = open(s->dirs[i], O_TMPFILE | O_EXCL | flags, 0600);
#endif
  if (fd >= 0) return fd;
  int lk = swap_dir_lock(s->dirs[i], 1);
  fd = open(s->files[i], O_CREAT | O_EXCL | flags, 0600);
  int e = errno;
  if (fd >= 0 && s->cfg.keep_files && flock(fd, LOCK_EX | LOCK_NB) != 0) {
    e = errno;
    close(fd);
    unlink(s->files[i]);
    fd = -1;
  } else if (fd >= 0 && !s->cfg.keep_files) {
    unlink(s->files[i]);
  }
  swap_dir_unlock(lk);
  if (fd < 0)
    return ferry_err(&s->err, status_of_errno(e), "swap '%s': cannot create %s: %s", name,
                     s->files[i], strerror(e));
  return fd;
}

/* The files (0600, O_EXCL, reserved) and the index path, named after the
 * store, the process and seq. */
static int create_files(ferry_swap *s, const ferry_path_info *pi, const char *name,
                        unsigned seq) {
  s->owns_files = s->cfg.keep_files; /* a failed open removes the named ones it made */
  s->anonymous = !s->cfg.keep_files;
  for (int i = 0; i < s->npaths; i++) {
    int len = snprintf(s->files[i], sizeof s->files[i], "%s/ferry-%s-%ld-%u-%d.swap",
                       s->dirs[i], s->name, (long)getpid(), seq, i);
    if (len < 0 || (size_t)len >= sizeof s->files[i])
      return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': file path in %s is too long", name,
                       s->dirs[i]);
    int fd = create_file(s, i, name);
    if (fd < 0) return fd;
    s->fds[i] = fd;
    int rc = reserve_file(s, i, fd, pi, name);
    if (rc != FERRY_OK) return rc;
  }
  int ilen = snprintf(s->index_path, sizeof s->index_path, "%s/ferry-%s-%ld-%u.index",
                      s->dirs[0], s->name, (long)getpid(), seq);
  if (ilen < 0 || (size_t)ilen >= sizeof s->index_path) /* shorter than files[0]: cannot */
    return ferry_err(&s->err, FERRY_EINVAL, "swap '%s': index path in %s is too long", name,
                     s->dirs[0]);
  return FERRY_OK;
}

int ferry_swap_open(const ferry_swap_config *cfg, ferry_swap **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  if (!cfg) return ferry_err_thread(FERRY_EINVAL, "swap: no configuration");
  const char *name = cfg->name ? cfg->name : "swap";
  int rc = swap_check_cfg(cfg, name, 1);
  if (rc != FERRY_OK) return rc;
  ferry_swap *s = swap_new_store(cfg, name);
  if (!s) return ferry_err_thread(FERRY_ENOMEM, "swap '%s': out of memory", name);
  for (int i = 0; i < s->npaths; i++) {
    snprintf(s->dirs[i], sizeof s->dirs[i], "%s", cfg->paths[i]);
    s->cfg.paths[i] = s->dirs[i];
  }
  ferry_path_info pi[FERRY_SWAP_MAX_PATHS];
  dev_t devs[FERRY_SWAP_MAX_PATHS];
  swap_reclaim_dirs(s); /* before the probe counts the free space */
  rc = swap_probe_dirs(s, pi, devs);
  if (rc == FERRY_OK) {
    s->bs = ferry_align_up(cfg->block_size, s->oa);
    rc = set_geometry(s, cfg, name);
  }
  if (rc == FERRY_OK) rc = check_space(s, pi, devs, name);
  if (rc == FERRY_OK) rc = swap_alloc_index(s);
  if (rc == FERRY_OK) {
    for (uint32_t i = 0; i < cfg->nslots; i++) s->map[i] = i;
    for (uint32_t p = s->nphys; p > cfg->nslots; p--) s->free_phys[s->nfree_phys++] = p - 1;
    rc = create_files(s, pi, name, atomic_fetch_add(&g_store_seq, 1));
  }
  if (rc == FERRY_OK) rc = swap_start_ring(s);
  if (rc != FERRY_OK) return swap_open_fail(s, rc);
  *out = s;
  return FERRY_OK;
}

/* ------------------------------------------------------------------------ */
/* Close, and what a live store tells                                        */

void ferry_swap_close(ferry_swap *s) {
  if (!s) return;
  ferry_swap_drain(s);
  if (s->cfg.keep_files && !s->index_saved) {
    pthread_mutex_lock(&s->mu);
    int rc = swap_index_save(s);
    pthread_mutex_unlock(&s->mu);
    if (rc != FERRY_OK) /* close cannot fail: the logger is how this is told */
      ferry_logf(&s->log, FERRY_LOG_ERROR, "%s", ferry_err_msg(&s->err));
  }
  swap_completion_stop(s);
  free_store(s);
}

int ferry_swap_get_info(ferry_swap *s, ferry_swap_info *out) {
  if (!s || !out) return FERRY_EINVAL;
  memset(out, 0, sizeof *out);
  out->o_direct = s->direct;
  out->mem_align = s->mem_align;
  out->offset_align = s->oa;
  out->block_size = s->bs;
  out->slot_size = s->cfg.slot_size;
  out->nslots = s->cfg.nslots;
  out->spare_slots = s->cfg.spare_slots;
  out->queue_depth = s->cfg.queue_depth;
  out->sqpoll = s->sqpoll;
  out->fixed_files = s->fixed_files;
  out->verify = s->cfg.verify;
  out->check_threads = s->nworkers;
  out->file_bytes = s->file_bytes;
  out->index_path = s->index_path;
  out->reclaimed_files = s->reclaimed_files;
  out->reclaimed_bytes = s->reclaimed_bytes;
  return FERRY_OK;
}

int ferry_swap_register_buffers(ferry_swap *s, const struct iovec *iov, unsigned n) {
  if (!s || (n && !iov)) return FERRY_EINVAL;
  pthread_mutex_lock(&s->mu);
  int rc = FERRY_OK;
  if (s->active) {
    rc = ferry_err(&s->err, FERRY_EBUSY, "swap '%s': buffers registered while %u requests run",
                   s->name, s->active);
    goto out;
  }
  for (unsigned i = 0; i < n; i++) /* the kernel's limit, which it gives as EFAULT */
    if (iov[i].iov_len > SWAP_REG_MAX) {
      rc = ferry_err(&s->err, FERRY_EINVAL,
                     "swap '%s': buffer %u of %u is %zu bytes; io_uring registers at most 1 GiB "
                     "a buffer (register it in pieces); the buffers registered before stay",
                     s->name, i + 1, n, iov[i].iov_len);
      goto out;
    }
  if (s->nregs) {
    io_uring_unregister_buffers(&s->ring);
    free(s->regs);
    s->regs = NULL;
    s->nregs = 0;
  }
  if (!n) goto out;
  s->regs = malloc(n * sizeof *iov);
  if (!s->regs) {
    rc = ferry_err(&s->err, FERRY_ENOMEM, "swap '%s': out of memory", s->name);
    goto out;
  }
  int r = io_uring_register_buffers(&s->ring, iov, n);
  if (r < 0) {
    free(s->regs);
    s->regs = NULL;
    rc = ferry_err(&s->err, r == -ENOMEM ? FERRY_ENOMEM : FERRY_EIO,
                   "swap '%s': IORING_REGISTER_BUFFERS of %u buffers: %s%s", s->name, n,
                   strerror(-r), r == -ENOMEM ? " (raise ulimit -l)" : "");
    goto out;
  }
  memcpy(s->regs, iov, n * sizeof *iov);
  s->nregs = n;
out:
  pthread_mutex_unlock(&s->mu);
  return rc;
}

size_t ferry_swap_chunk_len(ferry_swap *s, uint32_t chunk) {
  if (!s || chunk >= s->cfg.nslots) return 0;
  pthread_mutex_lock(&s->mu);
  size_t n = s->lost[chunk] ? 0 : s->plen[s->map[chunk]];
  pthread_mutex_unlock(&s->mu);
  return n;
}

void ferry_swap_get_stats(ferry_swap *s, ferry_swap_stats *out) {
  if (!s || !out) return;
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  pthread_mutex_unlock(&s->mu);
}
