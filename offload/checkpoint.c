/* offload/checkpoint.c — checkpoints of the engine and the export of its
 * weights. A checkpoint is a folder: params/ (the params in their dtype, a
 * plain safetensors model), optim/ (the fp32 master, none with a bf16
 * master, and the optimizer states as they are kept: fp32, bf16, or int8
 * codes with their absmax as one U8 tensor of bytes),
 * user.bin (the caller's blob) and a manifest (scalars, every file's size
 * and CRC32C). Tensors stream one group at a time through the memory
 * manager; folders appear only complete (temporary folder, fsync, rename).
 * With ranks, save and load are collectives: the folder is the one a
 * single rank writes (every tensor whole), each rank of a sharded engine
 * writes and reads its pieces at their offsets, and the ranks agree on
 * every phase's status.
 */
#include "format/manifest.h"
#include "core/crc32c.h"
#include "offload/engine_impl.h"
#include "format/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_BOUNCE (4u << 20)            /* device <-> host copies go through this */
#define CKPT_DEFAULT_SHARD (4ull << 30)
#define CKPT_PREFIX "step-"

static const char *optim_names[] = {"adamw", "adam", "adagrad", "lamb", "sgd", "lion"};

ferry_checkpoint_options ferry_checkpoint_options_default(void) {
  ferry_checkpoint_options o;
  memset(&o, 0, sizeof o);
  o.keep = 3;
  o.max_shard_bytes = CKPT_DEFAULT_SHARD;
  return o;
}

/* ---- files and folders ------------------------------------------------- */

static int io_status(int err) {
  return err == ENOSPC || err == EDQUOT ? FERRY_ENOSPC
         : err == EACCES || err == EPERM ? FERRY_EPERM
         : err == ENOENT                 ? FERRY_ENOENT
                                         : FERRY_EIO;
}

static int join(char *out, size_t cap, const char *a, const char *b) {
  int n = snprintf(out, cap, "%s/%s", a, b);
  return n < 0 || (size_t)n >= cap ? FERRY_EOVERFLOW : FERRY_OK;
}

static int fsync_path(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int r = fsync(fd) ? -errno : 0;
  close(fd);
  return r;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(p) ? -1 : 0;
}

/* Removes a folder and everything under it (no symlinks followed). */
static void rm_tree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Writes a whole small file and fsyncs it; -errno on failure. */
static int write_file(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  int r = write_all(fd, data, n);
  if (!r && fsync(fd)) r = -errno;
  if (close(fd) && !r) r = -errno;
  return r;
}

/* Size and CRC32C of a file, streamed. */
static int file_crc(const char *path, uint64_t *bytes, uint32_t *crc, char *why, size_t wl) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    snprintf(why, wl, "%.400s: %.300s", path, strerror(err));
    return io_status(err);
  }
  char *buf = malloc(1u << 20);
  if (!buf) {
    close(fd);
    snprintf(why, wl, "out of memory");
    return FERRY_ENOMEM;
  }
  uint32_t c = 0;
  uint64_t n = 0;
  int rc = FERRY_OK;
  for (;;) {
    ssize_t r = read(fd, buf, 1u << 20);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      snprintf(why, wl, "%.400s: read: %.300s", path, strerror(errno));
      rc = FERRY_EIO;
      break;
    }
    if (r == 0) break;
    c = ferry_crc32c(c, buf, (size_t)r);
    n += (uint64_t)r;
  }
  free(buf);
  close(fd);
  *bytes = n;
  *crc = c;
  return rc;
}

/* Parses "step-<digits>" (the folder of one checkpoint); -1 otherwise. */
static int64_t step_of(const char *name) {
  if (strncmp(name, CKPT_PREFIX, strlen(CKPT_PREFIX))) return -1;
  const char *d = name + strlen(CKPT_PREFIX);
  if (!*d || strlen(d) > 18) return -1;
  int64_t v = 0;
  for (; *d; d++) {
    if (*d < '0' || *d > '9') return -1;
    v = v * 10 + (*d - '0');
  }
  return v;
}

typedef struct {
  int64_t step;
  char name[64];
} ckpt_entry;

static int cmp_entry_desc(const void *a, const void *b) {
  const ckpt_entry *x = a, *y = b;
  return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

/* The checkpoint folders in root, newest first (malloc'd). */
static int list_checkpoints(const char *root, ckpt_entry **out, size_t *n) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(root);
  if (!d) return -errno;
  size_t cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    int64_t s = step_of(de->d_name);
    size_t len = strlen(de->d_name);
    if (s < 0 || len >= sizeof((ckpt_entry *)0)->name) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      ckpt_entry *ne = realloc(*out, cap * sizeof *ne);
      if (!ne) {
        closedir(d);
        free(*out);
        *out = NULL;
        return -ENOMEM;
      }
      *out = ne;
    }
    (*out)[*n].step = s;
    memcpy((*out)[*n].name, de->d_name, len + 1); /* len < sizeof name */
    (*n)++;
  }
  closedir(d);
  if (*n) qsort(*out, *n, sizeof **out, cmp_entry_desc);
  return 0;
}

/* ---- one writer per DIR ---------------------------------------------------
 *
 * A save holds flock(LOCK_EX) on DIR/.lock (holding its pid) from before
 * it makes its temporary folder until pruning is done, so two savers
 * never interleave: the second gets FERRY_EBUSY. Its temporary folder
 * holds .owner (the pid, locked for the save's life): a leftover is
 * removed only when that lock can be taken, i.e. its owner is dead. */
#define CKPT_LOCK_NAME ".lock"
#define CKPT_OWNER_NAME ".owner"

/* The pid written in the lock file fd (0 when none yet). */
static long lock_pid(int fd) {
  char buf[32];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  return strtol(buf, NULL, 10);
}

/* Opens (creating) path, takes its lock without waiting and writes this
 * process's pid in it. Returns the fd, -EWOULDBLOCK (*holder: the pid the
 * file names, 0 when unknown) or -errno. The holder removes the file when
 * done (dir_unlock), so a lock taken on a file that is no longer at path
 * (removed between our open and our flock) is retried on the new one. */
static int lock_file(const char *path, long *holder) {
  for (int tries = 0;; tries++) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      if (holder) *holder = lock_pid(fd);
      close(fd);
      return -err;
    }
    struct stat a, b;
    if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
      char buf[32];
      int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
      if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n) { /* the pid is a courtesy */
      }
      return fd;
    }
    close(fd);
    if (tries == 100) return -EWOULDBLOCK; /* replaced 100 times over: someone is busy there */
  }
}

/* DIR made if needed and locked for this save (*fd). Another saver
 * holding it: FERRY_EBUSY naming DIR and its pid. */
static int dir_lock(ferry_engine *e, const char *dir, int *fd) {
  *fd = -1;
  if (mkdir(dir, 0777) && errno != EEXIST)
    return ferry_err(&e->err, io_status(errno), "checkpoint save: mkdir %s: %s", dir, strerror(errno));
  char path[4096];
  if (join(path, sizeof path, dir, CKPT_LOCK_NAME))
    return ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint save: folder name too long");
  long holder = 0;
  int r = lock_file(path, &holder);
  if (r == -EWOULDBLOCK) {
    char who[64] = "another process";
    if (holder > 0) snprintf(who, sizeof who, "process %ld", holder);
    return ferry_err(&e->err, FERRY_EBUSY,
                     "checkpoint save: %s is being written by %s (it holds the lock on %s); one "
                     "writer per checkpoint folder",
                     dir, who, path);
  }
  if (r < 0)
    return ferry_err(&e->err, io_status(-r), "checkpoint save: cannot lock %s: %s", path,
                     strerror(-r));
  *fd = r;
  return FERRY_OK;
}

/* The pid at the end of a leftover's name (".tmp-step-N-PID"); 0 when none. */
static long name_pid(const char *name) {
  const char *dash = strrchr(name, '-');
  if (!dash || !dash[1]) return 0;
  char *end;
  long pid = strtol(dash + 1, &end, 10);
  return *end || pid <= 0 ? 0 : pid;
}

static int pid_alive(long pid) { return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM); }

/* Whether the leftover folder path (named name) belongs to a live save:
 * its .owner is locked, or (a folder without one: killed before it was
 * made, or another version's) the pid in its name is another live
 * process. */
static int leftover_live(const char *path, const char *name) {
  char owner[4096];
  if (!join(owner, sizeof owner, path, CKPT_OWNER_NAME)) {
    int fd = open(owner, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      int live = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
      close(fd); /* (a lock taken goes with it) */
      return live;
    }
  }
  long pid = name_pid(name);
  return pid != (long)getpid() && pid_alive(pid);
}

/* Leftovers of saves that were killed: ".tmp-*" and ".trash-*" folders
 * whose owner is dead (called with DIR locked). */
static void remove_leftovers(ferry_engine *e, const char *root) {
  DIR *d = opendir(root);
  if (!d) return;
  struct dirent *de;
  char path[4096];
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, ".tmp-", 5) && strncmp(de->d_name, ".trash-", 7)) continue;
    if (join(path, sizeof path, root, de->d_name)) continue;
    if (leftover_live(path, de->d_name)) {
      ferry_logf(&e->log, FERRY_LOG_WARN,
                 "checkpoint save: %s belongs to a save that is still running; left alone", path);
      continue;
    }
    rm_tree(path);
    ferry_logf(&e->log, FERRY_LOG_INFO,
               "checkpoint save: removed %s, left by a save whose process is gone", path);
  }
  closedir(d);
}

static int cmp_file(const void *a, const void *b) {
  return strcmp(((const ckpt_file *)a)->path, ((const ckpt_file *)b)->path);
}

/* Adds every regular file of folder/sub (sub "" = the folder itself, files
 * only) to the list. */
static int list_files(const char *folder, const char *sub, ckpt_file **files, size_t *n,
                      size_t *cap) {
  char dir[4096];
  if (sub[0] ? join(dir, sizeof dir, folder, sub) : snprintf(dir, sizeof dir, "%s", folder) < 0)
    return -ENAMETOOLONG;
  DIR *d = opendir(dir);
  if (!d) return -errno;
  struct dirent *de;
  int r = 0;
  while (!r && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[4096];
    struct stat st;
    if (join(p, sizeof p, dir, de->d_name) || lstat(p, &st)) continue;
    if (!S_ISREG(st.st_mode)) continue;
    if (*n == *cap) {
      size_t nc = *cap ? 2 * *cap : 16;
      ckpt_file *nf = realloc(*files, nc * sizeof *nf);
      if (!nf) {
        r = -ENOMEM;
        break;
      }
      *files = nf;
      *cap = nc;
    }
    ckpt_file *f = &(*files)[*n];
    memset(f, 0, sizeof *f);
    int len = sub[0] ? snprintf(f->path, sizeof f->path, "%s/%s", sub, de->d_name)
                     : snprintf(f->path, sizeof f->path, "%s", de->d_name);
    if (len < 0 || (size_t)len >= sizeof f->path) r = -ENAMETOOLONG;
    else (*n)++;
  }
  closedir(d);
  return r;
}

/* ---- the engine's tensors ------------------------------------------------ */

static int family_tier(const ferry_engine *e, int family) {
  int home = family == FERRY_FAMILY_PARAMS ? e->param_home : e->optim_home;
  return home == FERRY_TIER_DEVICE ? FERRY_TIER_DEVICE : FERRY_TIER_HOST;
}

/* One group of one family held at a time, in the tier the bytes are read
 * or written in; device bytes go through a host bounce buffer. */
typedef struct {
  ferry_engine *e;
  ferry_stream *s;
  char *bounce;
  int held, writing;
  uint32_t group;
  int family, tier;
} holder;

static int holder_init(holder *h, ferry_engine *e) {
  memset(h, 0, sizeof *h);
  h->e = e;
  int rc = ferry_stream_create(e->dev, &h->s);
  if (rc) return ferry_err(&e->err, rc, "checkpoint: stream: %s", ferry_device_last_error(e->dev));
  h->bounce = malloc(CKPT_BOUNCE);
  if (!h->bounce) return ferry_err(&e->err, FERRY_ENOMEM, "checkpoint: out of memory");
  return FERRY_OK;
}

static int holder_drop(holder *h) {
  if (!h->held) return FERRY_OK;
  ferry_engine *e = h->e;
  int rc = FERRY_OK;
  if (h->tier == FERRY_TIER_DEVICE) rc = ferry_stream_synchronize(h->s);
  int home = h->family == FERRY_FAMILY_PARAMS ? e->param_home : e->optim_home;
  if (!rc && h->writing && home == FERRY_TIER_NVME)
    rc = ferry_mem_writeback(e->mem, h->group, h->family, h->tier);
  int r2 = ferry_mem_release(e->mem, h->group, h->family, h->tier,
                             h->tier == FERRY_TIER_DEVICE ? h->s : NULL);
  h->held = 0;
  if (!rc) rc = r2;
  if (rc)
    return ferry_err(&e->err, rc, "checkpoint: group %u (%s): %s", h->group,
                     ferry_family_name(h->family), ferry_mem_last_error(e->mem));
  return FERRY_OK;
}

static void holder_destroy(holder *h) {
  holder_drop(h);
  if (h->s) ferry_stream_destroy(h->s);
  free(h->bounce);
}

/* Holds the group of tensor `id`; *ptr: its bytes in the holder's tier. */
static int holder_get(holder *h, uint32_t id, int writing, void **ptr, size_t *bytes) {
  ferry_engine *e = h->e;
  ferry_mem_tensor_info ti;
  int rc = ferry_mem_tensor_get(e->mem, id, &ti);
  if (rc) return ferry_err(&e->err, rc, "checkpoint: tensor %u: %s", id, ferry_mem_last_error(e->mem));
  int tier = family_tier(e, ti.family);
  if (!h->held || h->group != ti.group || h->family != ti.family || h->writing != writing) {
    rc = holder_drop(h);
    if (rc) return rc;
    rc = ferry_mem_fetch(e->mem, ti.group, ti.family, tier, tier == FERRY_TIER_DEVICE ? h->s : NULL,
                         FERRY_MEM_NOTRACE);
    if (rc)
      return ferry_err(&e->err, rc, "checkpoint: fetching group %u (%s): %s", ti.group,
                       ferry_family_name(ti.family), ferry_mem_last_error(e->mem));
    h->held = 1;
    h->group = ti.group;
    h->family = ti.family;
    h->tier = tier;
    h->writing = writing;
    if (writing) {
      rc = ferry_mem_mark_dirty(e->mem, ti.group, ti.family, tier, tier == FERRY_TIER_DEVICE ? h->s : NULL);
      if (rc)
        return ferry_err(&e->err, rc, "checkpoint: group %u (%s): %s", ti.group,
                         ferry_family_name(ti.family), ferry_mem_last_error(e->mem));
    }
  }
  rc = ferry_mem_tensor_ptr(e->mem, id, tier, ptr);
  if (rc) return ferry_err(&e->err, rc, "checkpoint: %s: %s", ti.name, ferry_mem_last_error(e->mem));
  *bytes = ti.bytes;
  return FERRY_OK;
}

/* Streams tensors into a writer: `roles` selects which (bit per role). */
static int write_tensors(ferry_engine *e, holder *h, ferry_safetensors_writer *w, unsigned roles,
                         ferry_dtype param_dt) {
  int rc = ferry_safetensors_writer_metadata(w, "format", "pt");
  for (size_t i = 0; i < e->gt.nparams && !rc; i++) {
    eng_param *p = &e->gt.params[e->gt.by_group[i]];
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc; r++) {
      if (!(roles >> r & 1) || p->id[r] == UINT32_MAX) continue;
      char nm[FERRY_MEM_NAME_MAX + 1];
      snprintf(nm, sizeof nm, "%s%s", p->name, group_role_suffix(r));
      /* as registered: compact states as they are (bf16, or int8 codes and
       * absmax as one U8 tensor of bytes) */
      ferry_mem_tensor_info ti;
      rc = ferry_mem_tensor_get(e->mem, p->id[r], &ti);
      if (rc) return ferry_err(&e->err, rc, "checkpoint: %s: %s", nm, ferry_mem_last_error(e->mem));
      rc = ferry_safetensors_writer_add(w, nm, r == FERRY_ROLE_PARAM ? param_dt : ti.dtype,
                                        ti.ndim, ti.shape);
    }
  }
  if (rc) return ferry_err(&e->err, rc, "%s", ferry_safetensors_writer_last_error(w));
  /* A zero-byte write lays the files out now (their headers are written),
   * so a failure there (ENOSPC) keeps its status; any other answer is the
   * name check, which the loop below passes. */
  rc = ferry_safetensors_writer_write(w, "", NULL, 0);
  if (rc && rc != FERRY_ESTATE) return ferry_err(&e->err, rc, "%s", ferry_safetensors_writer_last_error(w));
  rc = FERRY_OK;
  const char *nm;
  while ((nm = ferry_safetensors_writer_next(w))) {
    uint32_t id;
    if (ferry_mem_lookup(e->mem, nm, &id))
      return ferry_err(&e->err, FERRY_ESTATE, "checkpoint: no tensor '%s'", nm);
    void *ptr;
    size_t bytes;
    rc = holder_get(h, id, 0, &ptr, &bytes);
    if (rc) return rc;
    if (h->tier != FERRY_TIER_DEVICE) {
      rc = ferry_safetensors_writer_write(w, nm, ptr, bytes);
    } else {
      for (size_t at = 0; at < bytes && !rc; at += CKPT_BOUNCE) {
        size_t n = bytes - at < CKPT_BOUNCE ? bytes - at : CKPT_BOUNCE;
        rc = ferry_memcpy_async(h->s, h->bounce, (char *)ptr + at, n, FERRY_COPY_D2H);
        if (!rc) rc = ferry_stream_synchronize(h->s);
        if (rc) return ferry_err(&e->err, rc, "checkpoint: %s: %s", nm, ferry_device_last_error(e->dev));
        rc = ferry_safetensors_writer_write(w, nm, h->bounce, n);
      }
    }
    if (rc) return ferry_err(&e->err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  return holder_drop(h);
}

/* ---- sharded engines (ZeRO stage >= 1 with ranks) -------------------------
 * The checkpoint of a sharded engine has the files and layout of one a
 * single rank writes: every master and state whole (and at stage 3 every
 * param), so it loads on any number of ranks. Rank 0 lays the files of a
 * sharded part out (headers, every tensor's bytes a hole,
 * st_writer_finish_holes); then every rank writes its pieces into them at
 * their offsets (pwrite), and each rank loads only its pieces (reads at
 * the same offsets). The export at stage 3 gathers the params whole on
 * rank 0 instead (optim_phase). */

/* A sharded engine keeps role r of its params in pieces, written whole:
 * the master and states (stage >= 1) and the params (stage 3). */
static int keeps_whole(const ferry_engine *e, int r) {
  if (r == FERRY_ROLE_PARAM) return engine_params_sharded(e);
  if (r == FERRY_ROLE_GRAD) return 0;
  return r == FERRY_ROLE_MASTER ? !e->master_bf16 : e->nstates >= r - FERRY_ROLE_MASTER;
}
#define OPTIM_ROLES                                                                                \
  (1u << FERRY_ROLE_MASTER | 1u << FERRY_ROLE_EXP_AVG | 1u << FERRY_ROLE_EXP_AVG_SQ)

/* Bytes per element of role r's whole tensor (not int8 states). */
static size_t whole_esize(const ferry_engine *e, int r) {
  return r == FERRY_ROLE_PARAM    ? e->esize
         : r == FERRY_ROLE_MASTER ? 4
                                  : ferry_dtype_size(e->ocfg.state_dtype);
}

/* Role r of p whole, as one rank keeps it: dtype and shape. */
static void whole_info(const ferry_engine *e, const eng_param *p, int r, ferry_dtype *dt, int *ndim,
                       int64_t *shape) {
  *ndim = p->ndim;
  memcpy(shape, p->shape, (size_t)p->ndim * sizeof *shape);
  *dt = r == FERRY_ROLE_PARAM    ? e->dtype
        : r == FERRY_ROLE_MASTER ? (ferry_dtype)FERRY_DT_F32
                                 : (ferry_dtype)e->ocfg.state_dtype;
  if (*dt == FERRY_DT_I8) { /* codes and absmax as bytes */
    *dt = FERRY_DT_U8;
    *ndim = 1;
    shape[0] = (int64_t)ferry_optimizer_state_bytes(&e->ocfg, p->n);
  }
}

/* int8 states of n elements: codes padded to 64 bytes, then one fp32
 * absmax per block (ferry_optimizer_state_bytes). A piece starts at a
 * block boundary, so its blocks are the whole tensor's. */
static size_t codes_bytes(size_t n) { return (n + 63) / 64 * 64; }
static size_t blocks_of(const ferry_engine *e, size_t n) {
  size_t b = e->ocfg.state_block ? e->ocfg.state_block : 256;
  return (n + b - 1) / b;
}
static int is_int8(const ferry_engine *e, int r) {
  return r >= FERRY_ROLE_EXP_AVG && e->ocfg.state_dtype == FERRY_DT_I8;
}

/* This rank's piece of role r of p into host memory `mine` (nothing when
 * it has none). */
static int piece_out(ferry_engine *e, holder *h, const eng_param *p, int r, char *mine) {
  if (!p->pn) return FERRY_OK;
  void *ptr;
  size_t bytes;
  int rc = holder_get(h, p->id[r], 0, &ptr, &bytes);
  if (rc) return rc;
  if (h->tier != FERRY_TIER_DEVICE) {
    memcpy(mine, ptr, bytes);
    return FERRY_OK;
  }
  rc = ferry_memcpy_async(h->s, mine, ptr, bytes, FERRY_COPY_D2H);
  if (!rc) rc = ferry_stream_synchronize(h->s);
  return rc ? ferry_err(&e->err, rc, "checkpoint: %s", ferry_device_last_error(e->dev)) : FERRY_OK;
}

/* Role r of p whole into `full` on every rank (a collective): every rank's
 * piece gathered in rank order (int8: the codes, then the absmax). */
static int gather_whole(ferry_engine *e, const eng_param *p, int r, const char *mine, char *full,
                        size_t *counts) {
  size_t off;
  int rc;
  if (is_int8(e, r)) {
    for (int k = 0; k < e->nranks; k++)
      counts[k] = group_param_piece(e, p, k, &off);
    rc = ferry_comm_allgather(e->ch_loop, mine, full, counts, FERRY_DT_U8, NULL, NULL);
    memset(full + p->n, 0, codes_bytes(p->n) - p->n);
    for (int k = 0; !rc && k < e->nranks; k++)
      counts[k] = blocks_of(e, group_param_piece(e, p, k, &off)) * sizeof(float);
    if (!rc)
      rc = ferry_comm_allgather(e->ch_loop, mine + codes_bytes(p->pn), full + codes_bytes(p->n),
                                counts, FERRY_DT_U8, NULL, NULL);
  } else {
    size_t es = whole_esize(e, r);
    for (int k = 0; k < e->nranks; k++)
      counts[k] = group_param_piece(e, p, k, &off) * es;
    rc = ferry_comm_allgather(e->ch_loop, mine, full, counts, FERRY_DT_U8, NULL, NULL);
  }
  if (rc)
    return ferry_err(&e->err, rc, "checkpoint: gathering %s%s: %s", p->name, group_role_suffix(r),
                     ferry_comm_last_error(e->ch_loop));
  return FERRY_OK;
}

/* Bytes of the largest whole optim tensor. */
static size_t largest_whole(const ferry_engine *e) {
  size_t m = 0;
  for (size_t i = 0; i < e->gt.nparams; i++) {
    size_t n = e->gt.params[i].n, b = 4 * n, sb = ferry_optimizer_state_bytes(&e->ocfg, n);
    if (b > m) m = b;
    if (sb > m) m = sb;
  }
  return m;
}

/* The optim part of a sharded save, on every rank (a collective): rank 0
 * names each tensor its writer `w` asks for next (a broadcast; -1 ends it,
 * also when rank 0 has no writer or failed), every rank gives its piece,
 * rank 0 writes the whole. Returns this rank's status. */
static int optim_phase(ferry_engine *e, holder *h, ferry_safetensors_writer *w) {
  e->ckpt_phases++;
  size_t big = largest_whole(e);
  char *mine = malloc(big + 64), *full = malloc(big + 64);
  size_t *counts = calloc((size_t)e->nranks, sizeof *counts);
  int rc = mine && full && counts ? FERRY_OK
                                  : ferry_err(&e->err, FERRY_ENOMEM, "checkpoint: out of memory");
  int wrc = rc; /* rank 0: the writer's first failure */
  for (;;) {
    int32_t msg[2] = {-1, -1};
    const char *nm = e->rank == 0 && w && !wrc ? ferry_safetensors_writer_next(w) : NULL;
    for (size_t i = 0; nm && i < e->gt.nparams && msg[0] < 0; i++)
      for (int r = 0; r < FERRY_ROLE_COUNT && msg[0] < 0; r++) {
        char t[FERRY_MEM_NAME_MAX + 1];
        snprintf(t, sizeof t, "%s%s", e->gt.params[i].name, group_role_suffix(r));
        if (keeps_whole(e, r) && !strcmp(t, nm)) msg[0] = (int32_t)i, msg[1] = r;
      }
    if (nm && msg[0] < 0) wrc = ferry_err(&e->err, FERRY_ESTATE, "checkpoint: no tensor '%s'", nm);
    int crc = ferry_comm_broadcast(e->ch_loop, msg, 2, FERRY_DT_I32, 0, NULL, NULL);
    if (crc) {
      rc = ferry_err(&e->err, crc, "checkpoint: %s", ferry_comm_last_error(e->ch_loop));
      break;
    }
    if (msg[0] < 0) break;
    const eng_param *p = &e->gt.params[msg[0]];
    int prc = mine ? piece_out(e, h, p, msg[1], mine) : FERRY_ENOMEM;
    if (prc && !rc) rc = prc; /* still takes part in the gather */
    crc = gather_whole(e, p, msg[1], mine ? mine : "", full ? full : mine, counts);
    if (crc) {
      rc = crc;
      break;
    }
    if (e->rank == 0 && !wrc) {
      ferry_dtype dt;
      int nd;
      int64_t shape[FERRY_MEM_MAX_DIMS];
      whole_info(e, p, msg[1], &dt, &nd, shape);
      size_t bytes = ferry_dtype_size(dt);
      for (int d = 0; d < nd; d++)
        bytes *= (size_t)shape[d];
      wrc = ferry_safetensors_writer_write(w, nm, full, bytes);
      if (wrc) wrc = ferry_err(&e->err, wrc, "%s", ferry_safetensors_writer_last_error(w));
    }
  }
  free(mine);
  free(full);
  free(counts);
  int drc = holder_drop(h);
  if (!rc) rc = wrc;
  return rc ? rc : drc;
}

/* Every tensor of a part (roles) whole into w, after its metadata. */
static int add_whole(ferry_engine *e, ferry_safetensors_writer *w, unsigned roles) {
  int rc = ferry_safetensors_writer_metadata(w, "format", "pt");
  for (size_t i = 0; i < e->gt.nparams && !rc; i++) {
    eng_param *p = &e->gt.params[e->gt.by_group[i]];
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc; r++) {
      if (!(roles >> r & 1) || !keeps_whole(e, r)) continue;
      char nm[FERRY_MEM_NAME_MAX + 1];
      ferry_dtype dt;
      int nd;
      int64_t shape[FERRY_MEM_MAX_DIMS];
      snprintf(nm, sizeof nm, "%s%s", p->name, group_role_suffix(r));
      whole_info(e, p, r, &dt, &nd, shape);
      rc = ferry_safetensors_writer_add(w, nm, dt, nd, shape);
    }
  }
  return rc;
}

/* Rank 0's part (roles) of a sharded save: every tensor whole. */
static int write_whole(ferry_engine *e, holder *h, const char *path, uint64_t max_shard,
                       unsigned roles) {
  ferry_safetensors_writer *w = NULL;
  int rc = ferry_safetensors_writer_create(path, max_shard, &w);
  if (rc) rc = ferry_err(&e->err, rc, "checkpoint: %s", ferry_last_error());
  if (!rc) rc = add_whole(e, w, roles);
  if (w && rc) rc = ferry_err(&e->err, rc, "%s", ferry_safetensors_writer_last_error(w));
  if (!rc) { /* lays the files out now (see write_tensors) */
    rc = ferry_safetensors_writer_write(w, "", NULL, 0);
    if (rc == FERRY_ESTATE)
      rc = FERRY_OK;
    else if (rc)
      rc = ferry_err(&e->err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  int prc = optim_phase(e, h, rc ? NULL : w); /* the others wait for it */
  if (!rc) rc = prc;
  if (!rc) {
    rc = ferry_safetensors_writer_finish(w);
    if (rc) rc = ferry_err(&e->err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  ferry_safetensors_writer_destroy(w);
  return rc;
}

/* A run of bytes of this rank's tensor (at `at`) and where it lies in the
 * whole tensor of the checkpoint (`whole`). */
typedef struct {
  size_t at, whole, bytes;
} piece_run;

/* The runs of this rank's piece [plo, plo + pn) of role r of p; the runs of
 * all ranks tile the whole tensor. fp32 and bf16: one run at plo. int8:
 * the codes at plo (the last piece also covers the whole tensor's code
 * padding: plo is a multiple of 64, so its padding is the whole's) and the
 * absmax at the whole's absmax of block plo / block (a piece starts at a
 * block boundary: group_partition's alignment is at least the block). */
static int piece_runs(const ferry_engine *e, const eng_param *p, int r, piece_run *run) {
  if (!is_int8(e, r)) {
    size_t es = whole_esize(e, r);
    run[0] = (piece_run){0, p->plo * es, p->pn * es};
    return 1;
  }
  size_t block = e->ocfg.state_block ? e->ocfg.state_block : 256;
  FERRY_ASSERT(p->plo % 64 == 0 && p->plo % block == 0, "%s: piece at %zu", p->name, p->plo);
  size_t codes = p->plo + p->pn == p->n ? codes_bytes(p->n) - p->plo : p->pn;
  run[0] = (piece_run){0, p->plo, codes};
  run[1] = (piece_run){codes_bytes(p->pn), codes_bytes(p->n) + p->plo / block * sizeof(float),
                       blocks_of(e, p->pn) * sizeof(float)};
  return 2;
}

/* Rank 0: a part (roles) laid out with every tensor whole and its bytes
 * holes. */
static int layout_part(ferry_engine *e, const char *path, uint64_t max_shard, unsigned roles) {
  ferry_safetensors_writer *w = NULL;
  int rc = ferry_safetensors_writer_create(path, max_shard, &w);
  if (rc) return ferry_err(&e->err, rc, "checkpoint: %s", ferry_last_error());
  rc = add_whole(e, w, roles);
  if (!rc) rc = st_writer_finish_holes(w);
  if (rc) rc = ferry_err(&e->err, rc, "checkpoint: %s", ferry_safetensors_writer_last_error(w));
  ferry_safetensors_writer_destroy(w);
  return rc;
}

/* n bytes between this rank's tensor (ptr, in the holder's tier) and a
 * file (fd at off, or tensor ti of f): to the file when `out`, else from
 * it. Device bytes go through the holder's bounce buffer. */
static int move_run(ferry_engine *e, holder *h, char *ptr, int out, int fd, uint64_t off,
                    ferry_safetensors *f, size_t ti, uint64_t toff, size_t n, const char *nm) {
  for (size_t at = 0; at < n;) {
    size_t k = h->tier == FERRY_TIER_DEVICE ? (n - at < CKPT_BOUNCE ? n - at : CKPT_BOUNCE) : n;
    char *buf = h->tier == FERRY_TIER_DEVICE ? h->bounce : ptr + at;
    int rc = FERRY_OK;
    if (out && h->tier == FERRY_TIER_DEVICE) {
      rc = ferry_memcpy_async(h->s, buf, ptr + at, k, FERRY_COPY_D2H);
      if (!rc) rc = ferry_stream_synchronize(h->s);
    } else if (!out && h->tier == FERRY_TIER_DEVICE) {
      rc = ferry_stream_synchronize(h->s); /* the bounce buffer is free */
    }
    if (rc) return ferry_err(&e->err, rc, "checkpoint: %s: %s", nm, ferry_device_last_error(e->dev));
    if (out) {
      for (size_t d = 0; d < k;) {
        ssize_t wr = pwrite(fd, buf + d, k - d, (off_t)(off + at + d));
        if (wr < 0 && errno == EINTR) continue;
        if (wr < 0) {
          int err = errno;
          return ferry_err(&e->err, io_status(err), "checkpoint: %s: pwrite at %llu: %s", nm,
                           (unsigned long long)(off + at + d), strerror(err));
        }
        d += (size_t)wr;
      }
    } else {
      rc = ferry_safetensors_read(f, ti, toff + at, buf, k);
      if (rc)
        return ferry_err(&e->err, rc, "checkpoint load: '%s': %s", nm, ferry_safetensors_last_error(f));
      if (h->tier == FERRY_TIER_DEVICE) {
        rc = ferry_memcpy_async(h->s, ptr + at, buf, k, FERRY_COPY_H2D);
        if (rc) return ferry_err(&e->err, rc, "checkpoint load: %s: %s", nm, ferry_device_last_error(e->dev));
      }
    }
    at += k;
  }
  return FERRY_OK;
}

/* Every piece this rank keeps of every tensor of a part (roles), between
 * the engine and the checkpoint's model f (whole tensors): written into its
 * files (out; fds: f's shards opened for writing) or read from them. One
 * group of one family held at a time, in group order. */
static int move_pieces(ferry_engine *e, holder *h, ferry_safetensors *f, unsigned roles, int out,
                       const int *fds) {
  int rc = FERRY_OK;
  for (size_t i = 0; i < e->gt.nparams && !rc; i++) {
    eng_param *p = &e->gt.params[e->gt.by_group[i]];
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc && p->pn; r++) {
      if (!(roles >> r & 1) || !keeps_whole(e, r)) continue;
      char nm[FERRY_MEM_NAME_MAX + 1];
      snprintf(nm, sizeof nm, "%s%s", p->name, group_role_suffix(r));
      ferry_safetensors_tensor t;
      size_t ti;
      if (ferry_safetensors_find(f, nm, &t, &ti))
        return ferry_err(&e->err, FERRY_ECORRUPT, "checkpoint: no tensor '%s'", nm);
      void *ptr;
      size_t bytes;
      rc = holder_get(h, p->id[r], !out, &ptr, &bytes);
      piece_run run[2];
      int nr = rc ? 0 : piece_runs(e, p, r, run);
      for (int k = 0; k < nr && !rc; k++) {
        FERRY_ASSERT(run[k].at + run[k].bytes <= bytes && run[k].whole + run[k].bytes <= t.nbytes,
                     "%s: run %d out of bounds", nm, k);
        rc = move_run(e, h, (char *)ptr + run[k].at, out, out ? fds[t.shard] : -1,
                      t.offset + run[k].whole, f, ti, run[k].whole, run[k].bytes, nm);
      }
    }
  }
  int drc = holder_drop(h);
  return rc ? rc : drc;
}

/* This rank's pieces of a part (roles) into its laid-out model at path,
 * fsynced. */
static int write_pieces(ferry_engine *e, const char *path, unsigned roles) {
  ferry_safetensors *f = NULL;
  int rc = ferry_safetensors_open(path, &f);
  if (rc) return ferry_err(&e->err, rc, "checkpoint: %s", ferry_last_error());
  int ns = ferry_safetensors_shard_count(f);
  int *fds = malloc((size_t)ns * sizeof *fds);
  if (!fds) rc = ferry_err(&e->err, FERRY_ENOMEM, "checkpoint: out of memory");
  for (int s = 0; s < ns && fds; s++) fds[s] = -1;
  for (int s = 0; s < ns && !rc; s++) {
    fds[s] = open(ferry_safetensors_shard_path(f, s), O_WRONLY | O_CLOEXEC);
    if (fds[s] < 0)
      rc = ferry_err(&e->err, io_status(errno), "checkpoint: %s: %s", ferry_safetensors_shard_path(f, s),
                     strerror(errno));
  }
  holder h;
  if (!rc) {
    rc = holder_init(&h, e);
    if (!rc) rc = move_pieces(e, &h, f, roles, 1, fds);
    holder_destroy(&h);
  }
  for (int s = 0; s < ns && fds; s++) {
    if (fds[s] < 0) continue;
    if (!rc && fsync(fds[s]))
      rc = ferry_err(&e->err, io_status(errno), "checkpoint: fsync %s: %s",
                     ferry_safetensors_shard_path(f, s), strerror(errno));
    close(fds[s]);
  }
  free(fds);
  ferry_safetensors_close(f);
  return rc;
}

/* A writer over `path` (a folder when max_shard > 0) filled and finished. */
static int write_model(ferry_engine *e, holder *h, const char *path, uint64_t max_shard,
                       unsigned roles, ferry_dtype param_dt) {
  if (engine_sharded(e) && ((roles & OPTIM_ROLES) || engine_params_sharded(e)))
    return write_whole(e, h, path, max_shard, roles);
  ferry_safetensors_writer *w;
  int rc = ferry_safetensors_writer_create(path, max_shard, &w);
  if (rc) return ferry_err(&e->err, rc, "checkpoint: %s", ferry_last_error());
  rc = write_tensors(e, h, w, roles, param_dt);
  if (!rc) {
    rc = ferry_safetensors_writer_finish(w);
    if (rc) rc = ferry_err(&e->err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  ferry_safetensors_writer_destroy(w);
  return rc;
}

/* Moves the complete folder tmp to target, replacing one already there. */
static int rename_into_place(const char *tmp, const char *target, const char *trash) {
  if (rename(tmp, target) == 0) return 0;
  if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR) return -errno;
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, target, RENAME_EXCHANGE) == 0) {
    rm_tree(tmp); /* holds the old one now */
    return 0;
  }
  if (rename(target, trash)) return -errno;
  if (rename(tmp, target)) {
    int err = errno;
    rename(trash, target);
    return -err;
  }
  rm_tree(trash);
  return 0;
}

static int parent_of(const char *path, char *out, size_t cap) {
  const char *sl = strrchr(path, '/');
  if (!sl) return snprintf(out, cap, ".") < 0 ? FERRY_EOVERFLOW : FERRY_OK;
  if (sl == path) return snprintf(out, cap, "/") < 0 ? FERRY_EOVERFLOW : FERRY_OK;
  int n = snprintf(out, cap, "%.*s", (int)(sl - path), path);
  return n < 0 || (size_t)n >= cap ? FERRY_EOVERFLOW : FERRY_OK;
}

/* ---- save ------------------------------------------------------------------ */

/* The files of one save into the folder tmp (which exists): params/ and
 * optim/ unless `params` or `optim` is 0 (a sharded part: every rank
 * writes its pieces), and user.bin. */
static int save_files(ferry_engine *e, const char *tmp, const void *blob, size_t blob_len,
                      uint64_t max_shard, int params, int optim) {
  holder h;
  int rc = holder_init(&h, e);
  char path[4096];
  if (!rc && params && join(path, sizeof path, tmp, "params"))
    rc = ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if (!rc && params) rc = write_model(e, &h, path, max_shard, 1u << FERRY_ROLE_PARAM, e->dtype);
  if (!rc && optim && join(path, sizeof path, tmp, "optim"))
    rc = ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if (!rc && optim)
    rc = write_model(e, &h, path, max_shard,
                     1u << FERRY_ROLE_MASTER | 1u << FERRY_ROLE_EXP_AVG | 1u << FERRY_ROLE_EXP_AVG_SQ,
                     e->dtype);
  holder_destroy(&h);
  if (rc) return rc;
  int r;
  if (join(path, sizeof path, tmp, "user.bin"))
    return ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if ((r = write_file(path, blob_len ? blob : "", blob_len)))
    return ferry_err(&e->err, io_status(-r), "checkpoint: %s: %s", path, strerror(-r));
  return FERRY_OK;
}

/* The manifest of the complete files in tmp (each file's size and CRC32C,
 * read back), then every folder fsynced. */
static int save_manifest(ferry_engine *e, const char *tmp, size_t blob_len) {
  int rc = FERRY_OK, r;
  char path[4096];
  ckpt_manifest m;
  memset(&m, 0, sizeof m);
  m.version = CKPT_FORMAT_VERSION;
  engine_progress pg;
  engine_progress_get(e, &pg);
  m.step = pg.steps;
  snprintf(m.param_dtype, sizeof m.param_dtype, "%s", ferry_dtype_name(e->dtype));
  snprintf(m.optimizer, sizeof m.optimizer, "%s", optim_names[e->cv->opt_type]);
  m.states = e->nstates;
  snprintf(m.state_dtype, sizeof m.state_dtype, "%s", ferry_dtype_name(e->ocfg.state_dtype));
  m.state_block = e->ocfg.state_block;
  snprintf(m.master_dtype, sizeof m.master_dtype, "%s", e->master_bf16 ? "BF16" : "F32");
  memcpy(&m.loss_scale_bits, &pg.scale, sizeof m.loss_scale_bits);
  m.good_steps = pg.good_steps;
  m.skipped = pg.skipped;
  m.ranks = (uint64_t)e->nranks;
  m.zero_stage = (uint64_t)e->zero_stage;
  m.tensors = e->gt.nparams;
  m.blob_bytes = blob_len;
  size_t cap = 0;
  r = list_files(tmp, "params", &m.files, &m.nfiles, &cap);
  if (!r) r = list_files(tmp, "optim", &m.files, &m.nfiles, &cap);
  if (!r) r = list_files(tmp, "", &m.files, &m.nfiles, &cap);
  if (r) {
    ckpt_manifest_free(&m);
    return ferry_err(&e->err, r == -ENOMEM ? FERRY_ENOMEM : io_status(-r), "checkpoint: %s: %s",
                     tmp, strerror(-r));
  }
  if (m.nfiles) qsort(m.files, m.nfiles, sizeof *m.files, cmp_file);
  char why[512] = "";
  for (size_t i = 0; i < m.nfiles && !rc; i++) {
    if (join(path, sizeof path, tmp, m.files[i].path))
      rc = ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint: path too long");
    else if ((rc = file_crc(path, &m.files[i].bytes, &m.files[i].crc, why, sizeof why)))
      rc = ferry_err(&e->err, rc, "checkpoint: %s", why);
  }
  char *text = NULL;
  size_t len = 0;
  if (!rc) rc = ckpt_manifest_format(&m, &text, &len);
  ckpt_manifest_free(&m);
  if (rc) return rc == FERRY_ENOMEM ? ferry_err(&e->err, rc, "checkpoint: out of memory") : rc;
  if (join(path, sizeof path, tmp, CKPT_MANIFEST_NAME)) {
    free(text);
    return ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint: path too long");
  }
  r = write_file(path, text, len);
  free(text);
  if (r) return ferry_err(&e->err, io_status(-r), "checkpoint: %s: %s", path, strerror(-r));
  /* the folders' entries reach the disk before the rename publishes them */
  static const char *subs[] = {"params", "optim", ""};
  for (int i = 0; i < 3; i++) {
    if (subs[i][0] ? join(path, sizeof path, tmp, subs[i]) : snprintf(path, sizeof path, "%s", tmp) < 0)
      return ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint: path too long");
    if ((r = fsync_path(path)))
      return ferry_err(&e->err, io_status(-r), "checkpoint: fsync %s: %s", path, strerror(-r));
  }
  return FERRY_OK;
}

/* Everything of one save into the folder tmp (which exists). */
static int save_into(ferry_engine *e, const char *tmp, const void *blob, size_t blob_len,
                     uint64_t max_shard) {
  int rc = save_files(e, tmp, blob, blob_len, max_shard, 1, 1);
  return rc ? rc : save_manifest(e, tmp, blob_len);
}

/* Keeps the newest `keep` checkpoints of root: older ones are renamed
 * aside (so a half-removed one never looks like a checkpoint), then removed. */
static void prune(const char *root, int keep) {
  ckpt_entry *list;
  size_t n;
  if (keep <= 0 || list_checkpoints(root, &list, &n)) return;
  for (size_t i = (size_t)keep; i < n; i++) {
    char from[4096], to[4096], trash[128];
    snprintf(trash, sizeof trash, ".trash-%s-%ld", list[i].name, (long)getpid());
    if (join(from, sizeof from, root, list[i].name) || join(to, sizeof to, root, trash)) continue;
    if (rename(from, to) == 0) {
      fsync_path(root);
      rm_tree(to);
    }
  }
  free(list);
}

/* The folders of a save of step `steps` into dir by process pid: the
 * temporary one, the checkpoint, and where a replaced one goes. */
static int save_names(ferry_engine *e, const char *dir, int64_t steps, long pid, char *tmp,
                      char *target, char *trash) {
  char name[64], tname[128];
  snprintf(name, sizeof name, CKPT_PREFIX "%012" PRId64, steps);
  snprintf(tname, sizeof tname, ".tmp-%s-%ld", name, pid);
  if (join(tmp, 4096, dir, tname) || join(target, 4096, dir, name) ||
      snprintf(trash, 4096, "%s/.trash-%s-%ld", dir, name, pid) >= 4096)
    return ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint save: folder name too long");
  return FERRY_OK;
}

/* With DIR locked: the leftovers of killed saves removed, tmp made with
 * its .owner locked (*owner_fd); *made: tmp was made (remove it on failure). */
static int save_begin(ferry_engine *e, const char *dir, const char *tmp, int *owner_fd,
                      int *made) {
  *owner_fd = -1;
  *made = 0;
  remove_leftovers(e, dir);
  if (mkdir(tmp, 0777))
    return ferry_err(&e->err, io_status(errno), "checkpoint save: mkdir %s: %s", tmp, strerror(errno));
  *made = 1;
  char owner[4096];
  if (join(owner, sizeof owner, tmp, CKPT_OWNER_NAME))
    return ferry_err(&e->err, FERRY_EOVERFLOW, "checkpoint save: folder name too long");
  int r = lock_file(owner, NULL);
  if (r < 0)
    return ferry_err(&e->err, io_status(-r), "checkpoint save: cannot make %s: %s", owner,
                     strerror(-r));
  *owner_fd = r;
  return FERRY_OK;
}

/* tmp's .owner (still locked) leaves the folder before it is published,
 * then its lock goes. */
static void drop_owner(const char *tmp, int *owner_fd) {
  char owner[4096];
  if (*owner_fd >= 0 && !join(owner, sizeof owner, tmp, CKPT_OWNER_NAME)) unlink(owner);
  if (*owner_fd >= 0) close(*owner_fd);
  *owner_fd = -1;
}

/* The end of a save's hold on DIR: DIR/.lock removed (still locked),
 * then released. */
static void dir_unlock(const char *dir, int *fd) {
  char path[4096];
  if (*fd >= 0 && !join(path, sizeof path, dir, CKPT_LOCK_NAME)) unlink(path);
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* The complete tmp renamed into target's place, DIR fsynced. */
static int save_publish(ferry_engine *e, const char *dir, const char *tmp, const char *target,
                        const char *trash) {
  int r = rename_into_place(tmp, target, trash);
  if (!r) r = fsync_path(dir);
  if (r)
    return ferry_err(&e->err, io_status(-r), "checkpoint save: rename %s -> %s: %s", tmp, target,
                     strerror(-r));
  return FERRY_OK;
}

/* A save by one process. */
static int save_local(ferry_engine *e, const char *dir, const void *blob, size_t blob_len,
                      const ferry_checkpoint_options *o) {
  char tmp[4096], target[4096], trash[4096];
  engine_progress pg;
  engine_progress_get(e, &pg);
  int lock = -1, owner = -1;
  int rc = save_names(e, dir, pg.steps, (long)getpid(), tmp, target, trash);
  if (!rc) rc = dir_lock(e, dir, &lock);
  if (!rc) {
    int made;
    rc = save_begin(e, dir, tmp, &owner, &made);
    if (!rc) rc = save_into(e, tmp, blob, blob_len, o->max_shard_bytes);
    if (!rc) drop_owner(tmp, &owner);
    if (!rc) rc = save_publish(e, dir, tmp, target, trash);
    if (rc && made) rm_tree(tmp); /* no partial folder stays behind */
    else if (!rc) prune(dir, o->keep);
    drop_owner(tmp, &owner);
  }
  dir_unlock(dir, &lock);
  return rc;
}

/* A save by every rank (a collective on the loop channel), in three phases
 * each closed by an agreement on the ranks' statuses (ranks_agree: a
 * failure on any rank fails the save on every rank): rank 0 makes the
 * temporary folder (named by its pid) and, sharded, lays optim/ (and at
 * stage 3 params/) out; every rank of a sharded engine writes its pieces
 * there while rank 0 writes params/ (stages 0-2), user.bin (its blob) and,
 * at stage 0, optim/ whole; rank 0
 * writes the manifest and renames. On a failure rank 0 removes the
 * temporary folder; nothing earlier is touched. */
static int save_ranks(ferry_engine *e, const char *dir, const void *blob, size_t blob_len,
                      const ferry_checkpoint_options *o) {
  static const char op[] = "checkpoint save";
  int64_t pid = (int64_t)getpid();
  int rc = ferry_comm_broadcast(e->ch_loop, &pid, 1, FERRY_DT_I64, 0, NULL, NULL);
  if (rc) return ferry_err(&e->err, rc, "%s: %s", op, ferry_comm_last_error(e->ch_loop));
  char tmp[4096], target[4096], trash[4096], optim[4096];
  engine_progress pg;
  engine_progress_get(e, &pg);
  int sharded = engine_sharded(e), psharded = engine_params_sharded(e), made = 0;
  char params[4096];
  rc = save_names(e, dir, pg.steps, (long)pid, tmp, target, trash);
  if (!rc && (join(optim, sizeof optim, tmp, "optim") || join(params, sizeof params, tmp, "params")))
    rc = ferry_err(&e->err, FERRY_EOVERFLOW, "%s: path too long", op);
  int lock = -1, owner = -1; /* rank 0's: only it makes, publishes and prunes */
  if (!rc && e->rank == 0) {
    rc = dir_lock(e, dir, &lock);
    if (!rc) rc = save_begin(e, dir, tmp, &owner, &made);
    if (!rc && sharded) rc = layout_part(e, optim, o->max_shard_bytes, OPTIM_ROLES);
    if (!rc && psharded) rc = layout_part(e, params, o->max_shard_bytes, 1u << FERRY_ROLE_PARAM);
  }
  rc = ranks_agree(e, rc, op);
  if (!rc) {
    if (sharded) rc = write_pieces(e, optim, OPTIM_ROLES);
    if (!rc && psharded) rc = write_pieces(e, params, 1u << FERRY_ROLE_PARAM);
    if (!rc && e->rank == 0)
      rc = save_files(e, tmp, blob, blob_len, o->max_shard_bytes, !psharded, !sharded);
    rc = ranks_agree(e, rc, op);
  }
  if (!rc) {
    if (e->rank == 0) {
      rc = save_manifest(e, tmp, blob_len);
      if (!rc) drop_owner(tmp, &owner);
      if (!rc) rc = save_publish(e, dir, tmp, target, trash);
    }
    rc = ranks_agree(e, rc, op);
  }
  if (e->rank == 0 && made) {
    if (rc) rm_tree(tmp); /* (gone already when it was renamed) */
    else prune(dir, o->keep);
  }
  drop_owner(tmp, &owner);
  dir_unlock(dir, &lock);
  return rc;
}

/* A collective save's gathered parts (optim_phase) that this rank has not
 * taken part in (every one on ranks other than 0; the ones rank 0 did not
 * reach when it failed), up to `phases`; rc: this rank's status so far. */
static int other_phases(ferry_engine *e, int phases, int rc) {
  while (e->ckpt_phases < phases) {
    holder h;
    int hrc = holder_init(&h, e);
    int prc = optim_phase(e, &h, NULL);
    holder_destroy(&h);
    if (!rc) rc = hrc ? hrc : prc;
  }
  return rc;
}

int ferry_checkpoint_save(ferry_engine *e, const char *dir, const void *blob, size_t blob_len,
                          const ferry_checkpoint_options *opt) {
  if (!e) return FERRY_EINVAL;
  ferry_checkpoint_options o = opt ? *opt : ferry_checkpoint_options_default();
  if (!o.max_shard_bytes) o.max_shard_bytes = CKPT_DEFAULT_SHARD;
  int rc = FERRY_OK;
  if (!dir || !dir[0]) rc = ferry_err(&e->err, FERRY_EINVAL, "checkpoint save: no folder");
  else if (blob_len && !blob) rc = ferry_err(&e->err, FERRY_EINVAL, "checkpoint save: blob is NULL");
  else if (blob_len > CKPT_MAX_BLOB)
    rc = ferry_err(&e->err, FERRY_EINVAL, "checkpoint save: blob of %zu bytes (at most %llu)",
                   blob_len, (unsigned long long)CKPT_MAX_BLOB);
  else if (o.keep < 0) rc = ferry_err(&e->err, FERRY_EINVAL, "checkpoint save: keep %d", o.keep);
  if (!rc) rc = engine_quiesce(e, "checkpoint save");
  if (e->nranks <= 1) return rc ? rc : save_local(e, dir, blob, blob_len, &o);
  /* with ranks (a collective): a refusal on one rank refuses on all */
  rc = ranks_agree(e, rc, "checkpoint save");
  return rc ? rc : save_ranks(e, dir, blob, blob_len, &o);
}

/* ---- verify ---------------------------------------------------------------- */

/* The checkpoint folder of path: path itself when it holds a manifest,
 * else its newest step-* folder; *step: the N of that folder's name (-1
 * for a checkpoint folder named otherwise). Reads no manifest. */
static int find_folder(const char *path, char *folder, size_t cap, int64_t *step, char *why,
                       size_t wl) {
  char mp[4096];
  struct stat st;
  if (join(mp, sizeof mp, path, CKPT_MANIFEST_NAME)) {
    snprintf(why, wl, "path too long");
    return FERRY_EOVERFLOW;
  }
  int len;
  if (stat(mp, &st) == 0) {
    char name[4096]; /* the last component, trailing slashes dropped */
    size_t nl = strlen(path);
    while (nl > 1 && path[nl - 1] == '/') nl--;
    if (nl >= sizeof name) nl = sizeof name - 1;
    memcpy(name, path, nl);
    name[nl] = '\0';
    const char *base = strrchr(name, '/');
    *step = step_of(base ? base + 1 : name);
    len = snprintf(folder, cap, "%s", path);
  } else {
    ckpt_entry *list;
    size_t n;
    int r = list_checkpoints(path, &list, &n);
    if (r || n == 0) {
      if (!r) free(list);
      snprintf(why, wl, "%.400s: no checkpoint there (no %.300s, no " CKPT_PREFIX "* folder)%.300s%.300s", path,
               CKPT_MANIFEST_NAME, r ? ": " : "", r ? strerror(-r) : "");
      return r && r != -ENOENT ? io_status(-r) : FERRY_ENOENT;
    }
    *step = list[0].step;
    len = snprintf(folder, cap, "%s/%s", path, list[0].name);
    free(list);
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

/* The whole manifest file mp, at most CKPT_MANIFEST_MAX bytes, into a new
 * buffer *text (the caller frees it). */
static int read_manifest(const char *mp, char **text, size_t *len, char *why, size_t wl) {
  struct stat st;
  int fd = open(mp, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    snprintf(why, wl, "%.400s: %.300s", mp, strerror(err));
    return io_status(err);
  }
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > (off_t)CKPT_MANIFEST_MAX) {
    close(fd);
    snprintf(why, wl, "%.400s: not a regular file of at most %u bytes", mp, CKPT_MANIFEST_MAX);
    return FERRY_ECORRUPT;
  }
  size_t n = (size_t)st.st_size;
  char *s = malloc(n ? n : 1);
  size_t got = 0;
  while (s && got < n) {
    ssize_t r = read(fd, s + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (!s || got != n) {
    free(s);
    snprintf(why, wl, "%.400s: %.300s", mp, s ? "short read" : "out of memory");
    return s ? FERRY_EIO : FERRY_ENOMEM;
  }
  *text = s;
  *len = n;
  return FERRY_OK;
}

/* Every file the manifest lists is in folder, a regular file of the
 * listed size and CRC32C. */
static int check_files(const ckpt_manifest *m, const char *folder, char *why, size_t wl) {
  for (size_t i = 0; i < m->nfiles; i++) {
    const ckpt_file *f = &m->files[i];
    char fp[4096];
    struct stat st;
    uint64_t bytes;
    uint32_t crc;
    if (join(fp, sizeof fp, folder, f->path)) {
      snprintf(why, wl, "path too long");
      return FERRY_EOVERFLOW;
    }
    if (lstat(fp, &st) || !S_ISREG(st.st_mode)) {
      snprintf(why, wl, "%.400s: listed in the manifest but missing or not a regular file", fp);
      return FERRY_ECORRUPT;
    }
    if ((uint64_t)st.st_size != f->bytes) {
      snprintf(why, wl, "%.400s: %llu bytes, the manifest says %llu (truncated or replaced)", fp,
               (unsigned long long)st.st_size, (unsigned long long)f->bytes);
      return FERRY_ECORRUPT;
    }
    int rc = file_crc(fp, &bytes, &crc, why, wl);
    if (rc) return rc;
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
             !have_user ? "user.bin" : !have_params ? "params/ file" : "optim/ file");
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

/* Finds the checkpoint folder of path (find_folder), reads its manifest
 * into *m and checks every file it lists; on failure *m is empty. */
static int ckpt_open(const char *path, char *folder, size_t cap, ckpt_manifest *m, int check_crc,
                     char *why, size_t wl) {
  memset(m, 0, sizeof *m);
  char mp[4096];
  int64_t step;
  int rc = find_folder(path, folder, cap, &step, why, wl);
  if (rc) return rc;
  if (join(mp, sizeof mp, folder, CKPT_MANIFEST_NAME)) {
    snprintf(why, wl, "path too long");
    return FERRY_EOVERFLOW;
  }
  char *text;
  size_t len;
  rc = read_manifest(mp, &text, &len, why, wl);
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
  if (rc) ckpt_manifest_free(m);
  return rc;
}

static int listed(const ckpt_manifest *m, const char *folder, const char *path) {
  size_t fl = strlen(folder);
  if (strncmp(path, folder, fl) || path[fl] != '/') return 0;
  for (size_t i = 0; i < m->nfiles; i++)
    if (!strcmp(m->files[i].path, path + fl + 1)) return 1;
  return 0;
}

/* Opens folder/sub as a safetensors model whose every file the manifest
 * lists (and so was CRC-checked). */
static int open_part(const ckpt_manifest *m, const char *folder, const char *sub,
                     ferry_safetensors **out, char *why, size_t wl) {
  char p[4096];
  if (join(p, sizeof p, folder, sub)) {
    snprintf(why, wl, "path too long");
    return FERRY_EOVERFLOW;
  }
  int rc = ferry_safetensors_open(p, out);
  if (rc) {
    snprintf(why, wl, "%.400s", ferry_last_error());
    return rc == FERRY_ENOENT || rc == FERRY_ENOMEM ? (rc == FERRY_ENOMEM ? rc : FERRY_ECORRUPT) : rc;
  }
  for (int i = 0; i < ferry_safetensors_shard_count(*out); i++)
    if (!listed(m, folder, ferry_safetensors_shard_path(*out, i))) {
      snprintf(why, wl, "%.400s: not listed in the manifest", ferry_safetensors_shard_path(*out, i));
      ferry_safetensors_close(*out);
      *out = NULL;
      return FERRY_ECORRUPT;
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
  rc = open_part(&m, folder, "params", &pf, why, sizeof why);
  if (!rc) rc = open_part(&m, folder, "optim", &of, why, sizeof why);
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
    for (size_t i = 0; i < m.nfiles; i++) info->total_bytes += m.files[i].bytes;
    snprintf(info->path, sizeof info->path, "%.1000s", folder);
  }
  ferry_safetensors_close(pf);
  ferry_safetensors_close(of);
  ckpt_manifest_free(&m);
  if (rc) return ferry_err_thread(rc, "checkpoint verify: %s", why);
  return FERRY_OK;
}

/* ---- load ------------------------------------------------------------------ */

static int shape_equal(const ferry_safetensors_tensor *t, int ndim, const int64_t *shape) {
  if (t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d]) return 0;
  return 1;
}

/* Every tensor of the file is one of the engine's with the expected dtype
 * and shape, and every one of the engine's is there. */
static int check_part(ferry_engine *e, ferry_safetensors *f, unsigned roles, const char *what,
                      char *why, size_t wl) {
  size_t want = 0;
  for (size_t i = 0; i < e->gt.nparams; i++) {
    eng_param *p = &e->gt.params[i];
    for (int r = 0; r < FERRY_ROLE_COUNT; r++) {
      int whole = engine_sharded(e) && keeps_whole(e, r); /* pieces here, whole there */
      if (!(roles >> r & 1) || (whole ? 0 : p->id[r] == UINT32_MAX)) continue;
      want++;
      char nm[FERRY_MEM_NAME_MAX + 1];
      snprintf(nm, sizeof nm, "%s%s", p->name, group_role_suffix(r));
      ferry_safetensors_tensor t;
      if (ferry_safetensors_find(f, nm, &t, NULL)) {
        snprintf(why, wl, "%.400s: no tensor '%.300s'", what, nm);
        return FERRY_ECORRUPT;
      }
      ferry_mem_tensor_info ti; /* as registered (compact states: their dtype and bytes) */
      int64_t wshape[FERRY_MEM_MAX_DIMS];
      if (whole) {
        memset(&ti, 0, sizeof ti);
        whole_info(e, p, r, &ti.dtype, &ti.ndim, wshape);
        ti.shape = wshape;
      } else if (ferry_mem_tensor_get(e->mem, p->id[r], &ti)) {
        snprintf(why, wl, "%.400s: tensor '%.300s' is not the engine's", what, nm);
        return FERRY_ECORRUPT;
      }
      if (t.dtype != ti.dtype || !shape_equal(&t, ti.ndim, ti.shape)) {
        snprintf(why, wl, "%.10s: tensor '%.300s' is %.8s with %d dims (first %lld), the engine has %.8s with %d "
                 "(first %lld)", what, nm, ferry_dtype_name(t.dtype) ? ferry_dtype_name(t.dtype) : "?",
                 t.ndim, t.ndim ? (long long)t.shape[0] : 0LL, ferry_dtype_name(ti.dtype), ti.ndim,
                 (long long)ti.shape[0]);
        return FERRY_ECORRUPT;
      }
    }
  }
  if (ferry_safetensors_count(f) != want) {
    snprintf(why, wl, "%.400s: %zu tensors, the engine has %zu", what, ferry_safetensors_count(f), want);
    return FERRY_ECORRUPT;
  }
  return FERRY_OK;
}

/* Reads every tensor of f, in file order, into the engine. */
static int load_part(ferry_engine *e, holder *h, ferry_safetensors *f) {
  for (size_t i = 0; i < ferry_safetensors_count(f); i++) {
    ferry_safetensors_tensor t;
    uint32_t id;
    ferry_safetensors_get(f, i, &t);
    if (ferry_mem_lookup(e->mem, t.name, &id))
      return ferry_err(&e->err, FERRY_ECORRUPT, "checkpoint load: no tensor '%s'", t.name);
    void *ptr;
    size_t bytes;
    int rc = holder_get(h, id, 1, &ptr, &bytes);
    if (rc) return rc;
    if (bytes != t.nbytes)
      return ferry_err(&e->err, FERRY_ECORRUPT, "checkpoint load: '%s' has %llu bytes, expected %zu",
                       t.name, (unsigned long long)t.nbytes, bytes);
    if (h->tier != FERRY_TIER_DEVICE) {
      rc = ferry_safetensors_read(f, i, 0, ptr, bytes);
    } else {
      for (size_t at = 0; at < bytes && !rc; at += CKPT_BOUNCE) {
        size_t n = bytes - at < CKPT_BOUNCE ? bytes - at : CKPT_BOUNCE;
        rc = ferry_stream_synchronize(h->s); /* the bounce buffer is free */
        if (!rc) rc = ferry_safetensors_read(f, i, at, h->bounce, n);
        if (rc) break;
        rc = ferry_memcpy_async(h->s, (char *)ptr + at, h->bounce, n, FERRY_COPY_H2D);
        if (rc) return ferry_err(&e->err, rc, "checkpoint load: %s: %s", t.name, ferry_device_last_error(e->dev));
      }
    }
    if (rc)
      return ferry_err(&e->err, rc, "checkpoint load: '%s': %s", t.name, ferry_safetensors_last_error(f));
  }
  return holder_drop(h);
}

/* The config value of a manifest dtype name ("F32" -> "fp32"). */
static const char *layout_name(const char *dt) {
  return !strcmp(dt, "F32") ? "fp32" : !strcmp(dt, "BF16") ? "bf16" : !strcmp(dt, "I8") ? "int8" : dt;
}

/* The checkpoint m fits the engine: its param dtype, optimizer and state
 * count, param count and (with dynamic loss scaling) a usable scale. */
static int check_fits(const ferry_engine *e, const ckpt_manifest *m, float scale, char *why,
                      size_t wl) {
  if (strcmp(m->param_dtype, ferry_dtype_name(e->dtype))) {
    snprintf(why, wl, "params are %.300s, the engine's precision.params is %.300s", m->param_dtype,
             ferry_dtype_name(e->dtype));
    return FERRY_ECORRUPT;
  }
  if (strcmp(m->optimizer, optim_names[e->cv->opt_type]) || m->states != e->nstates) {
    snprintf(why, wl, "optimizer %.300s with %d state(s), the engine runs %.300s with %d",
             m->optimizer, m->states, optim_names[e->cv->opt_type], e->nstates);
    return FERRY_ECORRUPT;
  }
  /* the optimizer's layout: never converted on load */
  const char *sdt = ferry_dtype_name(e->ocfg.state_dtype), *mdt = e->master_bf16 ? "BF16" : "F32";
  if (strcmp(m->state_dtype, sdt)) {
    snprintf(why, wl, "the optimizer states are %.8s, the engine's optimizer.state_dtype is "
             "\"%.8s\" (a checkpoint is loaded only into the layout it was saved from; set "
             "optimizer.state_dtype = \"%.8s\")",
             m->state_dtype, layout_name(sdt), layout_name(m->state_dtype));
    return FERRY_ECORRUPT;
  }
  if (e->ocfg.state_dtype == FERRY_DT_I8 && m->state_block != e->ocfg.state_block) {
    snprintf(why, wl, "the int8 optimizer states have blocks of %llu, the engine's "
             "optimizer.state_block is %zu (set optimizer.state_block = %llu)",
             (unsigned long long)m->state_block, e->ocfg.state_block,
             (unsigned long long)m->state_block);
    return FERRY_ECORRUPT;
  }
  if (strcmp(m->master_dtype, mdt)) {
    snprintf(why, wl, "the master weights are %.8s, the engine's precision.master is \"%.8s\" "
             "(set precision.master = \"%.8s\")",
             !strcmp(m->master_dtype, "BF16") ? "the bf16 params" : "fp32", layout_name(mdt),
             layout_name(m->master_dtype));
    return FERRY_ECORRUPT;
  }
  if (m->tensors != e->gt.nparams) {
    snprintf(why, wl, "%llu params, the engine registered %zu", (unsigned long long)m->tensors,
             e->gt.nparams);
    return FERRY_ECORRUPT;
  }
  if (e->dynamic_scale && !(scale > 0 && scale < INFINITY)) {
    snprintf(why, wl, "loss scale %g is not a positive finite number", (double)scale);
    return FERRY_ECORRUPT;
  }
  return FERRY_OK;
}

/* Opens folder's params/ and optim/ models (*pf, *of; the caller closes
 * them) and checks each holds exactly the engine's tensors. */
static int open_parts(ferry_engine *e, const ckpt_manifest *m, const char *folder,
                      ferry_safetensors **pf, ferry_safetensors **of, char *why, size_t wl) {
  int rc = open_part(m, folder, "params", pf, why, wl);
  if (!rc) rc = open_part(m, folder, "optim", of, why, wl);
  if (!rc) rc = check_part(e, *pf, 1u << FERRY_ROLE_PARAM, "params", why, wl);
  if (!rc)
    rc = check_part(e, *of,
                    1u << FERRY_ROLE_MASTER | 1u << FERRY_ROLE_EXP_AVG | 1u << FERRY_ROLE_EXP_AVG_SQ,
                    "optim", why, wl);
  return rc;
}

/* folder/user.bin, `bytes` long, into blob. */
static int read_blob(ferry_engine *e, const char *folder, uint64_t bytes, void *blob) {
  char bp[4096];
  int fd = join(bp, sizeof bp, folder, "user.bin") ? -1 : open(bp, O_RDONLY | O_CLOEXEC);
  size_t got = 0;
  while (fd >= 0 && got < bytes) {
    ssize_t r = read(fd, (char *)blob + got, (size_t)bytes - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (fd >= 0) close(fd);
  if (got != bytes) return ferry_err(&e->err, FERRY_EIO, "checkpoint load: %s: cannot read", bp);
  return FERRY_OK;
}

/* Reads of (optimizer states) then pf (params) into the engine's tensors
 * and flushes the memory manager. */
static int load_tensors(ferry_engine *e, ferry_safetensors *pf, ferry_safetensors *of) {
  holder h;
  int rc = holder_init(&h, e);
  if (!rc) rc = engine_sharded(e) ? move_pieces(e, &h, of, OPTIM_ROLES, 0, NULL) : load_part(e, &h, of);
  if (!rc)
    rc = engine_params_sharded(e) ? move_pieces(e, &h, pf, 1u << FERRY_ROLE_PARAM, 0, NULL)
                                  : load_part(e, &h, pf);
  if (!rc) holder_drop(&h);
  holder_destroy(&h);
  if (rc) return rc;
  rc = ferry_mem_flush(e->mem);
  if (rc) rc = ferry_err(&e->err, rc, "checkpoint load: flush: %s", ferry_mem_last_error(e->mem));
  return rc;
}

/* A checkpoint opened and checked against the engine, not loaded yet. */
typedef struct {
  char folder[4096];
  ckpt_manifest m;
  ferry_safetensors *pf, *of;
  float scale;
} ckpt_loading;

static void loading_close(ckpt_loading *L) {
  ferry_safetensors_close(L->pf);
  ferry_safetensors_close(L->of);
  ckpt_manifest_free(&L->m);
  L->pf = L->of = NULL;
}

/* Everything a load checks before it changes anything (check_crc 0: not
 * the files' sizes and CRCs, which another rank checked). */
static int load_check(ferry_engine *e, const char *path, void *blob, size_t blob_cap,
                      size_t *blob_len, int check_crc, ckpt_loading *L) {
  char why[1024] = "";
  memset(L, 0, sizeof *L);
  int rc = ckpt_open(path, L->folder, sizeof L->folder, &L->m, check_crc, why, sizeof why);
  if (rc) return ferry_err(&e->err, rc, "checkpoint load: %s", why);
  memcpy(&L->scale, &L->m.loss_scale_bits, sizeof L->scale);
  rc = check_fits(e, &L->m, L->scale, why, sizeof why);
  if (!rc) rc = open_parts(e, &L->m, L->folder, &L->pf, &L->of, why, sizeof why);
  if (blob_len) *blob_len = (size_t)L->m.blob_bytes;
  if (!rc && blob && blob_cap < L->m.blob_bytes) {
    snprintf(why, sizeof why, "the blob has %llu bytes, the buffer %zu",
             (unsigned long long)L->m.blob_bytes, blob_cap);
    rc = FERRY_EOVERFLOW;
  }
  if (rc) {
    loading_close(L);
    return ferry_err(&e->err, rc, "checkpoint load: %s: %s", L->folder, why);
  }
  return FERRY_OK;
}

/* Everything checked: the engine's state overwritten (the blob, the
 * tensors: a sharded engine's optim pieces read at their offsets). */
static int load_apply(ferry_engine *e, ckpt_loading *L, void *blob) {
  int rc = FERRY_OK;
  if (blob && L->m.blob_bytes) rc = read_blob(e, L->folder, L->m.blob_bytes, blob);
  if (!rc) rc = load_tensors(e, L->pf, L->of);
  if (rc)
    return ferry_err(&e->err, rc, "%s (the engine's state is partly overwritten: load again)",
                     ferry_err_msg(&e->err));
  return FERRY_OK;
}

static void load_restore(ferry_engine *e, const ckpt_loading *L) {
  engine_progress p = {L->m.step, L->scale, (int)L->m.good_steps, L->m.skipped};
  engine_restore(e, &p);
}

#define WHY_BYTES 512 /* of rank 0's verdict sent to the others */

/* A load by every rank (a collective on the loop channel): rank 0 checks
 * the manifest and every file's size and CRC32C and sends its verdict
 * (status and message) to the others; then every rank checks the
 * checkpoint against its engine (headers, shapes, layout, blob size), the
 * ranks agree, and every rank loads (the params whole, a sharded engine's
 * optim pieces at their offsets); the ranks agree again. A refusal on any
 * rank refuses on every rank before anything changes. */
static int load_ranks(ferry_engine *e, const char *path, void *blob, size_t blob_cap,
                      size_t *blob_len) {
  static const char op[] = "checkpoint load";
  ckpt_loading L;
  memset(&L, 0, sizeof L);
  char verdict[WHY_BYTES];
  memset(verdict, 0, sizeof verdict);
  int rc = FERRY_OK;
  if (e->rank == 0) {
    rc = load_check(e, path, blob, blob_cap, blob_len, 1, &L);
    int32_t v = rc;
    memcpy(verdict, &v, sizeof v);
    if (rc) snprintf(verdict + 4, sizeof verdict - 4, "%s", ferry_err_msg(&e->err));
  }
  int crc = ferry_comm_broadcast(e->ch_loop, verdict, sizeof verdict, FERRY_DT_U8, 0, NULL, NULL);
  if (crc) {
    loading_close(&L);
    return ferry_err(&e->err, crc, "%s: rank 0's verdict: %s", op, ferry_comm_last_error(e->ch_loop));
  }
  int32_t v;
  memcpy(&v, verdict, sizeof v);
  verdict[sizeof verdict - 1] = 0;
  if (v) {
    if (e->rank) rc = ferry_err(&e->err, v, "%s (checked by rank 0)", verdict + 4);
    return rc;
  }
  if (e->rank) rc = load_check(e, path, blob, blob_cap, blob_len, 0, &L);
  rc = ranks_agree(e, rc, op);
  if (!rc) rc = load_apply(e, &L, blob);
  rc = ranks_agree(e, rc, op);
  if (!rc) load_restore(e, &L);
  loading_close(&L);
  return rc;
}

int ferry_checkpoint_load(ferry_engine *e, const char *path, void *blob, size_t blob_cap,
                          size_t *blob_len) {
  if (!e) return FERRY_EINVAL;
  int rc = !path || !path[0] ? ferry_err(&e->err, FERRY_EINVAL, "checkpoint load: no path")
                             : engine_quiesce(e, "checkpoint load");
  if (e->nranks > 1) {
    rc = ranks_agree(e, rc, "checkpoint load");
    return rc ? rc : load_ranks(e, path, blob, blob_cap, blob_len);
  }
  if (rc) return rc;
  ckpt_loading L;
  rc = load_check(e, path, blob, blob_cap, blob_len, 1, &L);
  if (rc) return rc;
  rc = load_apply(e, &L, blob);
  if (!rc) load_restore(e, &L);
  loading_close(&L);
  return rc;
}

/* ---- export ---------------------------------------------------------------- */

static int export_local(ferry_engine *e, const char *path, uint64_t max_shard_bytes);

int ferry_export_weights(ferry_engine *e, const char *path, uint64_t max_shard_bytes) {
  if (!e) return FERRY_EINVAL;
  if (!path || !path[0]) return ferry_err(&e->err, FERRY_EINVAL, "export: no path");
  int rc = engine_quiesce(e, "export");
  if (!engine_params_sharded(e)) return rc ? rc : export_local(e, path, max_shard_bytes);
  /* stage 3 (a collective): rank 0 writes the params gathered whole */
  rc = ranks_agree(e, rc, "export");
  if (rc) return rc;
  e->ckpt_phases = 0;
  if (e->rank == 0) rc = export_local(e, path, max_shard_bytes);
  return ranks_root_status(e, other_phases(e, 1, rc), "export");
}

/* The export of this engine's params (alone, any rank at stages 0-2, or
 * rank 0 at stage 3, whose params part gathers the other ranks' pieces). */
static int export_local(ferry_engine *e, const char *path, uint64_t max_shard_bytes) {
  int rc;
  char tmp[4096], trash[4096], parent[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid()) >= (int)sizeof tmp ||
      snprintf(trash, sizeof trash, "%s.trash-%ld", path, (long)getpid()) >= (int)sizeof trash ||
      parent_of(path, parent, sizeof parent))
    return ferry_err(&e->err, FERRY_EOVERFLOW, "export: path too long");
  rm_tree(tmp);
  holder h;
  rc = holder_init(&h, e);
  if (!rc) rc = write_model(e, &h, tmp, max_shard_bytes, 1u << FERRY_ROLE_PARAM, e->dtype);
  holder_destroy(&h);
  int r = 0;
  if (!rc && max_shard_bytes && (r = fsync_path(tmp)))
    rc = ferry_err(&e->err, io_status(-r), "export: fsync %s: %s", tmp, strerror(-r));
  if (!rc) {
    r = rename_into_place(tmp, path, trash);
    if (!r) r = fsync_path(parent);
    if (r) rc = ferry_err(&e->err, io_status(-r), "export: rename %s -> %s: %s", tmp, path, strerror(-r));
  }
  if (rc) rm_tree(tmp);
  return rc;
}
