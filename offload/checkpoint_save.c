/* offload/checkpoint_save.c — ferry_checkpoint_save: one save of the
 * engine into DIR/step-N (params/, optim/, user.bin, the manifest), made in
 * a temporary folder and renamed into place, with one writer per DIR (a
 * lock), the leftovers of killed saves removed and the oldest checkpoints
 * pruned. With ranks a save is a collective in three agreed phases.
 */
#include "offload/checkpoint_common.h"
#include "core/untrusted.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

ferry_checkpoint_options ferry_checkpoint_options_default(void) {
  ferry_checkpoint_options o;
  memset(&o, 0, sizeof o);
  o.keep = 3;
  o.max_shard_bytes = CKPT_DEFAULT_SHARD;
  return o;
}

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

/* ---- one writer per DIR ---------------------------------------------------
 *
 * A save holds flock(LOCK_EX) on DIR/.lock (holding its pid) from before
 * it makes its temporary folder until pruning is done, so two savers
 * never interleave: the second gets FERRY_EBUSY. Its temporary folder
 * holds .owner (the pid, locked for the save's life): a leftover is
 * removed only when that lock can be taken, i.e. its owner is dead. */
#define CKPT_LOCK_NAME  ".lock"
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
static int dir_lock(ckpt_ctx *c, const char *dir, int *fd) {
  *fd = -1;
  if (mkdir(dir, 0777) && errno != EEXIST)
    return ferry_err(c->f.err, ckpt_io_status(errno), "checkpoint save: mkdir %s: %s", dir,
                     strerror(errno));
  char path[4096];
  if (ckpt_join(path, sizeof path, dir, CKPT_LOCK_NAME))
    return ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint save: folder name too long");
  long holder = 0;
  int r = lock_file(path, &holder);
  if (r == -EWOULDBLOCK) {
    char who[64] = "another process";
    if (holder > 0) snprintf(who, sizeof who, "process %ld", holder);
    return ferry_err(c->f.err, FERRY_EBUSY,
                     "checkpoint save: %s is being written by %s (it holds the lock on %s); one "
                     "writer per checkpoint folder",
                     dir, who, path);
  }
  if (r < 0)
    return ferry_err(c->f.err, ckpt_io_status(-r), "checkpoint save: cannot lock %s: %s", path,
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
  if (!ckpt_join(owner, sizeof owner, path, CKPT_OWNER_NAME)) {
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
static void remove_leftovers(ckpt_ctx *c, const char *root) {
  DIR *d = opendir(root);
  if (!d) return;
  struct dirent *de;
  char path[4096];
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, ".tmp-", 5) && strncmp(de->d_name, ".trash-", 7)) continue;
    if (ckpt_join(path, sizeof path, root, de->d_name)) continue;
    if (leftover_live(path, de->d_name)) {
      ferry_logf(c->f.log, FERRY_LOG_WARN,
                 "checkpoint save: %s belongs to a save that is still running; left alone", path);
      continue;
    }
    ckpt_rm_tree(path);
    ferry_logf(c->f.log, FERRY_LOG_INFO,
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
  if (sub[0] ? ckpt_join(dir, sizeof dir, folder, sub)
             : snprintf(dir, sizeof dir, "%s", folder) < 0)
    return -ENAMETOOLONG;
  DIR *d = opendir(dir);
  if (!d) return -errno;
  struct dirent *de;
  int r = 0;
  while (!r && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[4096];
    struct stat st;
    if (ckpt_join(p, sizeof p, dir, de->d_name) || lstat(p, &st)) continue;
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
    if (len < 0 || (size_t)len >= sizeof f->path)
      r = -ENAMETOOLONG;
    else
      (*n)++;
  }
  closedir(d);
  return r;
}

/* ---- save ------------------------------------------------------------------ */

/* The files of one save into the folder tmp (which exists): params/ and
 * optim/ unless `params` or `optim` is 0 (a sharded part: every rank
 * writes its pieces), and user.bin. */
static int save_files(ckpt_ctx *c, const char *tmp, const void *blob, size_t blob_len,
                      uint64_t max_shard, int params, int optim) {
  ckpt_holder h;
  int rc = ckpt_holder_init(&h, c);
  char path[4096];
  if (!rc && params && ckpt_join(path, sizeof path, tmp, "params"))
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if (!rc && params)
    rc = ckpt_write_model(c, &h, path, max_shard, 1u << FERRY_ROLE_PARAM, c->f.dtype);
  if (!rc && optim && ckpt_join(path, sizeof path, tmp, "optim"))
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if (!rc && optim) rc = ckpt_write_model(c, &h, path, max_shard, OPTIM_ROLES, c->f.dtype);
  ckpt_holder_destroy(&h);
  if (rc) return rc;
  int r;
  if (ckpt_join(path, sizeof path, tmp, "user.bin"))
    return ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if ((r = write_file(path, blob_len ? blob : "", blob_len)))
    return ferry_err(c->f.err, ckpt_io_status(-r), "checkpoint: %s: %s", path, strerror(-r));
  return FERRY_OK;
}

/* What a save writes besides the tensors, made and checked before any
 * file is: the manifest's scalars and the params whose own step count is
 * not the step (m, its files still to list), and the bytes of their lines
 * (the file CKPT_STEPS_NAME, none when 0). */
typedef struct {
  ckpt_manifest m;
  uint64_t steps_len;
} save_plan;

static void plan_free(save_plan *p) {
  ckpt_manifest_free(&p->m);
  memset(p, 0, sizeof *p);
}

/* The params whose own step count is not the engine's `steps` (they got
 * no gradient in some step), in registration order, into m (their names
 * the engine's); a status. A name the manifest cannot carry (a byte
 * outside printable ASCII) is refused. */
static int param_steps(ckpt_ctx *c, int64_t steps, ckpt_manifest *m) {
  size_t cap = 0;
  engine_param_iter it = engine_params(c->e, 0);
  for (const engine_param_view *p; (p = engine_params_next(&it));) {
    if (p->steps == steps) continue;
    size_t len = strlen(p->name);
    for (size_t k = 0; k < len; k++)
      if (p->name[k] < 0x20 || p->name[k] > 0x7e) len = CKPT_NAME_MAX + 1;
    if (len == 0 || len > CKPT_NAME_MAX) {
      char esc[160];
      return ferry_err(c->f.err, FERRY_EINVAL,
                       "checkpoint: param '%s' has its own step count, and its name cannot be "
                       "written in the manifest (printable ASCII, 1 to %d bytes); nothing was "
                       "written", ferry_escape(p->name, esc, sizeof esc), CKPT_NAME_MAX);
    }
    if (m->nsteps == cap) {
      size_t nc = cap ? 2 * cap : 64;
      ckpt_param_step *ns = realloc(m->steps, nc * sizeof *ns);
      if (!ns) return ferry_err(c->f.err, FERRY_ENOMEM, "checkpoint: out of memory");
      m->steps = ns;
      cap = nc;
    }
    m->steps[m->nsteps++] =
        (ckpt_param_step){.index = p->index, .steps = p->steps, .name = p->name};
  }
  m->steps_listed = m->nsteps;
  return FERRY_OK;
}

/* The save's plan (save_plan) from the engine, with every limit of the
 * format checked, so a save that cannot be written is refused before its
 * first file. */
static int save_plan_make(ckpt_ctx *c, size_t blob_len, uint64_t max_shard, save_plan *p) {
  memset(p, 0, sizeof *p);
  ckpt_manifest *m = &p->m;
  m->version = CKPT_FORMAT_VERSION;
  engine_progress pg;
  engine_progress_get(c->e, &pg);
  m->step = pg.steps;
  snprintf(m->param_dtype, sizeof m->param_dtype, "%s", ferry_dtype_name(c->f.dtype));
  snprintf(m->optimizer, sizeof m->optimizer, "%s", ckpt_optimizer_name(c->f.opt_type));
  m->states = c->f.nstates;
  snprintf(m->state_dtype, sizeof m->state_dtype, "%s", ferry_dtype_name(c->f.ocfg.state_dtype));
  m->state_block = c->f.ocfg.state_block;
  snprintf(m->master_dtype, sizeof m->master_dtype, "%s", c->f.master_bf16 ? "BF16" : "F32");
  memcpy(&m->loss_scale_bits, &pg.scale, sizeof m->loss_scale_bits);
  m->good_steps = pg.good_steps;
  m->skipped = pg.skipped;
  m->ranks = (uint64_t)c->f.nranks;
  m->zero_stage = (uint64_t)c->f.zero_stage;
  m->tensors = c->f.nparams;
  m->blob_bytes = blob_len;
  int rc = param_steps(c, pg.steps, m);
  p->steps_len = rc ? 0 : ckpt_param_steps_bytes(m);
  if (!rc && p->steps_len > ckpt_param_steps_limit(m))
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW,
                   "checkpoint: %zu params have their own step count; their list would take "
                   "%llu bytes, more than the %llu a checkpoint may hold; nothing was written",
                   m->nsteps, (unsigned long long)p->steps_len,
                   (unsigned long long)ckpt_param_steps_limit(m));
  uint64_t pf = 0, of = 0;
  if (!rc) rc = ckpt_part_files(c, max_shard, 1u << FERRY_ROLE_PARAM, &pf);
  if (!rc) rc = ckpt_part_files(c, max_shard, OPTIM_ROLES, &of);
  uint64_t files = pf + of + 1 + (p->steps_len > 0); /* user.bin, param_steps */
  if (!rc && files > CKPT_MAX_FILES)
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW,
                   "checkpoint: at max_shard_bytes %llu the checkpoint takes %llu files "
                   "(params %llu, optimizer %llu), more than %d; nothing was written (raise "
                   "max_shard_bytes)", (unsigned long long)max_shard, (unsigned long long)files,
                   (unsigned long long)pf, (unsigned long long)of, CKPT_MAX_FILES);
  if (rc) plan_free(p);
  return rc;
}

/* The file CKPT_STEPS_NAME of m into tmp; a status. */
static int write_steps(ckpt_ctx *c, const char *tmp, const ckpt_manifest *m) {
  char path[4096], *text;
  size_t len;
  if (ckpt_join(path, sizeof path, tmp, CKPT_STEPS_NAME))
    return ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if (ckpt_param_steps_format(m, &text, &len))
    return ferry_err(c->f.err, FERRY_ENOMEM, "checkpoint: out of memory");
  int r = write_file(path, text, len);
  free(text);
  if (r) return ferry_err(c->f.err, ckpt_io_status(-r), "checkpoint: %s: %s", path, strerror(-r));
  return FERRY_OK;
}

/* The plan's manifest for the complete files in tmp (each file's size and
 * CRC32C, read back; the file of step counts written first), then every
 * folder fsynced. */
static int save_manifest(ckpt_ctx *c, const char *tmp, save_plan *plan) {
  int rc = FERRY_OK, r;
  char path[4096];
  ckpt_manifest *mp = &plan->m, m = *mp; /* (m's files are this save's alone) */
  m.files = NULL;
  m.nfiles = 0;
  if (plan->steps_len && (r = write_steps(c, tmp, mp))) return r;
  size_t cap = 0;
  r = list_files(tmp, "params", &m.files, &m.nfiles, &cap);
  if (!r) r = list_files(tmp, "optim", &m.files, &m.nfiles, &cap);
  if (!r) r = list_files(tmp, "", &m.files, &m.nfiles, &cap);
  if (r) {
    free(m.files);
    return ferry_err(c->f.err, r == -ENOMEM ? FERRY_ENOMEM : ckpt_io_status(-r),
                     "checkpoint: %s: %s", tmp, strerror(-r));
  }
  if (m.nfiles > CKPT_MAX_FILES)
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW,
                   "checkpoint: the checkpoint would hold %zu files, more than %d (raise "
                   "max_shard_bytes)", m.nfiles, CKPT_MAX_FILES);
  if (!rc && m.nfiles) qsort(m.files, m.nfiles, sizeof *m.files, cmp_file);
  char why[512] = "";
  for (size_t i = 0; i < m.nfiles && !rc; i++) {
    if (ckpt_join(path, sizeof path, tmp, m.files[i].path))
      rc = ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: path too long");
    else if ((rc = ckpt_file_crc(path, &m.files[i].bytes, &m.files[i].crc, why, sizeof why)))
      rc = ferry_err(c->f.err, rc, "checkpoint: %s", why);
  }
  char *text = NULL;
  size_t len = 0;
  if (!rc && (rc = ckpt_manifest_format(&m, &text, &len)))
    rc = ferry_err(c->f.err, rc, "checkpoint: out of memory");
  free(m.files);
  if (!rc && len > CKPT_MANIFEST_MAX)
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: the manifest would take %zu bytes, "
                   "more than %u", len, CKPT_MANIFEST_MAX);
  if (!rc && ckpt_join(path, sizeof path, tmp, CKPT_MANIFEST_NAME))
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: path too long");
  if (!rc && (r = write_file(path, text, len)))
    rc = ferry_err(c->f.err, ckpt_io_status(-r), "checkpoint: %s: %s", path, strerror(-r));
  free(text);
  if (rc) return rc;
  /* the folders' entries reach the disk before the rename publishes them */
  static const char *subs[] = {"params", "optim", ""};
  for (int i = 0; i < 3; i++) {
    if (subs[i][0] ? ckpt_join(path, sizeof path, tmp, subs[i])
                   : snprintf(path, sizeof path, "%s", tmp) < 0)
      return ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint: path too long");
    if ((r = ckpt_fsync(path)))
      return ferry_err(c->f.err, ckpt_io_status(-r), "checkpoint: fsync %s: %s", path,
                       strerror(-r));
  }
  return FERRY_OK;
}

/* Everything of one save into the folder tmp (which exists). */
static int save_into(ckpt_ctx *c, const char *tmp, const void *blob, size_t blob_len,
                     uint64_t max_shard, save_plan *plan) {
  int rc = save_files(c, tmp, blob, blob_len, max_shard, 1, 1);
  return rc ? rc : save_manifest(c, tmp, plan);
}

/* Keeps the newest `keep` checkpoints of root: older ones are renamed
 * aside (so a half-removed one never looks like a checkpoint), then removed. */
static void prune(const char *root, int keep) {
  ckpt_entry *list;
  size_t n;
  if (keep <= 0 || ckpt_list(root, &list, &n)) return;
  for (size_t i = (size_t)keep; i < n; i++) {
    char from[4096], to[4096], trash[128];
    snprintf(trash, sizeof trash, ".trash-%s-%ld", list[i].name, (long)getpid());
    if (ckpt_join(from, sizeof from, root, list[i].name) || ckpt_join(to, sizeof to, root, trash))
      continue;
    if (rename(from, to) == 0) {
      ckpt_fsync(root);
      ckpt_rm_tree(to);
    }
  }
  free(list);
}

/* The folders of a save of step `steps` into dir by process pid: the
 * temporary one, the checkpoint, and where a replaced one goes. */
static int save_names(ckpt_ctx *c, const char *dir, int64_t steps, long pid, char *tmp,
                      char *target, char *trash) {
  char name[64], tname[128];
  snprintf(name, sizeof name, CKPT_PREFIX "%012" PRId64, steps);
  snprintf(tname, sizeof tname, ".tmp-%s-%ld", name, pid);
  if (ckpt_join(tmp, 4096, dir, tname) || ckpt_join(target, 4096, dir, name) ||
      snprintf(trash, 4096, "%s/.trash-%s-%ld", dir, name, pid) >= 4096)
    return ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint save: folder name too long");
  return FERRY_OK;
}

/* With DIR locked: the leftovers of killed saves removed, tmp made with
 * its .owner locked (*owner_fd); *made: tmp was made (remove it on failure). */
static int save_begin(ckpt_ctx *c, const char *dir, const char *tmp, int *owner_fd, int *made) {
  *owner_fd = -1;
  *made = 0;
  remove_leftovers(c, dir);
  if (mkdir(tmp, 0777))
    return ferry_err(c->f.err, ckpt_io_status(errno), "checkpoint save: mkdir %s: %s", tmp,
                     strerror(errno));
  *made = 1;
  char owner[4096];
  if (ckpt_join(owner, sizeof owner, tmp, CKPT_OWNER_NAME))
    return ferry_err(c->f.err, FERRY_EOVERFLOW, "checkpoint save: folder name too long");
  int r = lock_file(owner, NULL);
  if (r < 0)
    return ferry_err(c->f.err, ckpt_io_status(-r), "checkpoint save: cannot make %s: %s", owner,
                     strerror(-r));
  *owner_fd = r;
  return FERRY_OK;
}

/* tmp's .owner (still locked) leaves the folder before it is published,
 * then its lock goes. */
static void drop_owner(const char *tmp, int *owner_fd) {
  char owner[4096];
  if (*owner_fd >= 0 && !ckpt_join(owner, sizeof owner, tmp, CKPT_OWNER_NAME)) unlink(owner);
  if (*owner_fd >= 0) close(*owner_fd);
  *owner_fd = -1;
}

/* The end of a save's hold on DIR: DIR/.lock removed (still locked),
 * then released. */
static void dir_unlock(const char *dir, int *fd) {
  char path[4096];
  if (*fd >= 0 && !ckpt_join(path, sizeof path, dir, CKPT_LOCK_NAME)) unlink(path);
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* The complete tmp renamed into target's place, DIR fsynced. */
static int save_publish(ckpt_ctx *c, const char *dir, const char *tmp, const char *target,
                        const char *trash) {
  int r = ckpt_rename_into_place(tmp, target, trash);
  if (!r) r = ckpt_fsync(dir);
  if (r)
    return ferry_err(c->f.err, ckpt_io_status(-r), "checkpoint save: rename %s -> %s: %s", tmp,
                     target, strerror(-r));
  return FERRY_OK;
}

/* A save by one process. */
static int save_local(ckpt_ctx *c, const char *dir, const void *blob, size_t blob_len,
                      const ferry_checkpoint_options *o) {
  char tmp[4096], target[4096], trash[4096];
  engine_progress pg;
  engine_progress_get(c->e, &pg);
  int lock = -1, owner = -1;
  save_plan plan;
  memset(&plan, 0, sizeof plan);
  int rc = save_names(c, dir, pg.steps, (long)getpid(), tmp, target, trash);
  if (!rc) rc = save_plan_make(c, blob_len, o->max_shard_bytes, &plan); /* before any file */
  if (!rc) rc = dir_lock(c, dir, &lock);
  if (!rc) {
    int made;
    rc = save_begin(c, dir, tmp, &owner, &made);
    if (!rc) rc = save_into(c, tmp, blob, blob_len, o->max_shard_bytes, &plan);
    if (!rc) drop_owner(tmp, &owner);
    if (!rc) rc = save_publish(c, dir, tmp, target, trash);
    if (rc && made)
      ckpt_rm_tree(tmp); /* no partial folder stays behind */
    else if (!rc)
      prune(dir, o->keep);
    drop_owner(tmp, &owner);
  }
  dir_unlock(dir, &lock);
  plan_free(&plan);
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
static int save_ranks(ckpt_ctx *c, const char *dir, const void *blob, size_t blob_len,
                      const ferry_checkpoint_options *o) {
  static const char op[] = "checkpoint save";
  int64_t pid = (int64_t)getpid();
  int rc = ferry_comm_broadcast(c->f.ch, &pid, 1, FERRY_DT_I64, 0, NULL, NULL);
  if (rc) return ferry_err(c->f.err, rc, "%s: %s", op, ferry_comm_last_error(c->f.ch));
  char tmp[4096], target[4096], trash[4096], optim[4096];
  engine_progress pg;
  engine_progress_get(c->e, &pg);
  int sharded = c->f.sharded, psharded = c->f.params_sharded, made = 0;
  char params[4096];
  rc = save_names(c, dir, pg.steps, (long)pid, tmp, target, trash);
  if (!rc && (ckpt_join(optim, sizeof optim, tmp, "optim") ||
              ckpt_join(params, sizeof params, tmp, "params")))
    rc = ferry_err(c->f.err, FERRY_EOVERFLOW, "%s: path too long", op);
  int lock = -1, owner = -1; /* rank 0's: only it makes, publishes and prunes */
  save_plan plan;
  memset(&plan, 0, sizeof plan);
  if (!rc && c->f.rank == 0) {
    rc = save_plan_make(c, blob_len, o->max_shard_bytes, &plan);
    if (!rc) rc = dir_lock(c, dir, &lock);
    if (!rc) rc = save_begin(c, dir, tmp, &owner, &made);
    if (!rc && sharded) rc = ckpt_layout_part(c, optim, o->max_shard_bytes, OPTIM_ROLES);
    if (!rc && psharded)
      rc = ckpt_layout_part(c, params, o->max_shard_bytes, 1u << FERRY_ROLE_PARAM);
  }
  rc = ranks_agree(c->e, rc, op);
  if (!rc) {
    if (sharded) rc = ckpt_write_pieces(c, optim, OPTIM_ROLES);
    if (!rc && psharded) rc = ckpt_write_pieces(c, params, 1u << FERRY_ROLE_PARAM);
    if (!rc && c->f.rank == 0)
      rc = save_files(c, tmp, blob, blob_len, o->max_shard_bytes, !psharded, !sharded);
    rc = ranks_agree(c->e, rc, op);
  }
  if (!rc) {
    if (c->f.rank == 0) {
      rc = save_manifest(c, tmp, &plan);
      if (!rc) drop_owner(tmp, &owner);
      if (!rc) rc = save_publish(c, dir, tmp, target, trash);
    }
    rc = ranks_agree(c->e, rc, op);
  }
  if (c->f.rank == 0 && made) {
    if (rc)
      ckpt_rm_tree(tmp); /* (gone already when it was renamed) */
    else
      prune(dir, o->keep);
  }
  drop_owner(tmp, &owner);
  dir_unlock(dir, &lock);
  plan_free(&plan);
  return rc;
}

int ferry_checkpoint_save(ferry_engine *e, const char *dir, const void *blob, size_t blob_len,
                          const ferry_checkpoint_options *opt) {
  if (!e) return FERRY_EINVAL;
  ckpt_ctx cx, *c = &cx;
  ckpt_ctx_init(c, e);
  ferry_checkpoint_options o = opt ? *opt : ferry_checkpoint_options_default();
  if (!o.max_shard_bytes) o.max_shard_bytes = CKPT_DEFAULT_SHARD;
  int rc = FERRY_OK;
  if (!dir || !dir[0])
    rc = ferry_err(c->f.err, FERRY_EINVAL, "checkpoint save: no folder");
  else if (blob_len && !blob)
    rc = ferry_err(c->f.err, FERRY_EINVAL, "checkpoint save: blob is NULL");
  else if (blob_len > CKPT_MAX_BLOB)
    rc = ferry_err(c->f.err, FERRY_EINVAL, "checkpoint save: blob of %zu bytes (at most %llu)",
                   blob_len, (unsigned long long)CKPT_MAX_BLOB);
  else if (o.keep < 0)
    rc = ferry_err(c->f.err, FERRY_EINVAL, "checkpoint save: keep %d", o.keep);
  if (!rc) rc = engine_quiesce(e, "checkpoint save");
  if (c->f.nranks <= 1) return rc ? rc : save_local(c, dir, blob, blob_len, &o);
  /* with ranks (a collective): a refusal on one rank refuses on all */
  rc = ranks_agree(e, rc, "checkpoint save");
  return rc ? rc : save_ranks(c, dir, blob, blob_len, &o);
}
