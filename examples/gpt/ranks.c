/* examples/gpt/ranks.c — the ranks of a data-parallel run and the signals
 * they agree on: the communicator, the settings every rank must share (the
 * fingerprint and the run's steps, checkpoints and paths), the mean loss,
 * SIGINT / SIGTERM seen by any rank, the ranks' figures, the other ranks'
 * part of rank 0's --save, a rank's own failure told to the others before
 * the abort, and the fault-injection test hooks.
 */
#include "app.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* SIGINT / SIGTERM: the first sets g_signal (the handler does nothing
 * else that is not async-signal-safe), the run stops at the next step
 * boundary (a checkpoint being written is finished first), destroys its
 * engine and exits 128 + the signal; a second one exits at once. */
atomic_int g_signal; /* lock-free: safe in a handler, on whichever thread */
/* 1 until the set-up is over: a signal then stops the set-up where it is
 * (the seeded init and the engine's initial values poll it, gpt_set_cancel) */
static atomic_int g_in_setup;

static void on_signal(int sig) {
  if (atomic_exchange(&g_signal, sig)) _exit(128 + sig);
  static const char msg[] = "ferry-gpt: interrupted: stopping after this step (a checkpoint "
                            "being written is finished first); again to stop at once\n";
  static const char setup[] = "ferry-gpt: interrupted: stopping the set-up (no step has run); "
                              "again to stop at once\n";
  ssize_t w = atomic_load(&g_in_setup) ? write(STDERR_FILENO, setup, sizeof setup - 1)
                                       : write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
}

static int setup_cancelled(void) { return atomic_load(&g_in_setup) && atomic_load(&g_signal); }

void train_setup_over(void) { atomic_store(&g_in_setup, 0); }

int train_setup_interrupted(train_run *t) {
  int sig = atomic_load(&g_signal);
  if (!sig || !atomic_load(&g_in_setup)) return 0;
  errf("%s during the set-up: stopped before the first step, the engine and its swap files "
       "released\n", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal");
  return 128 + sig;
}

void install_signals(void) {
  atomic_store(&g_in_setup, 1);
  gpt_set_cancel(setup_cancelled);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART; /* I/O in flight goes on; the flag is read between steps */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* Each rank's `count` values of type dt into all, in rank order (a
 * collective). 0, or 1 with the message printed. */
static int train_allgather(train_run *t, const void *mine, void *all, size_t count,
                           ferry_dtype dt, const char *what) {
  size_t *counts = malloc((size_t)t->nranks * sizeof *counts);
  int rc = counts ? 0 : FERRY_ENOMEM;
  for (int r = 0; !rc && r < t->nranks; r++) counts[r] = count;
  if (!rc) rc = ferry_comm_allgather(t->comm, mine, all, counts, dt, NULL, NULL);
  free(counts);
  if (rc)
    errf("%s: %s\n", what, rc == FERRY_ENOMEM ? "out of memory" : ferry_comm_last_error(t->comm));
  return rc ? 1 : 0;
}

/* How many processes the launcher started (mpirun, srun), or 0 when it
 * does not say. */
static int launcher_size(void) {
  static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && atoi(v) > 0) return atoi(v);
  }
  return 0;
}

/* As root, OpenMPI's mpirun refuses to start (and its processes may not
 * start MPI) unless told: the fix, for an MPI failure's message, or "". */
static const char *mpi_root_hint(void) {
  const char *allow = getenv("OMPI_ALLOW_RUN_AS_ROOT");
  const char *confirm = getenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM");
  if (geteuid() != 0 || (allow && !strcmp(allow, "1") && confirm && !strcmp(confirm, "1")))
    return "";
  return " (as root, OpenMPI needs `mpirun --allow-run-as-root`, or "
         "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment)";
}

/* The ranks: a communicator of every process of the job (--comm; auto: MPI
 * when mpirun started the process). One rank trains as before. Several
 * need --engine (the resident providers do not shard); rank 0 alone prints
 * (the others' stdout and notes go to /dev/null), every message on stderr
 * says "rank R: ". The engine config's dist.timeout, when it has one,
 * bounds every wait. Returns 2 for usage every rank refuses alike. */
int train_comm(train_run *t) {
  ferry_comm_options co = ferry_comm_options_default();
  co.kind = t->o.comm;
  char v[64];
  if (t->fc && ferry_config_get(t->fc, "dist.timeout", v, sizeof v) == 0) {
    char *e;
    double x = strtod(v, &e);
    if (e != v && x > 0) co.timeout = x;
  }
  /* test hook: $FERRY_GPT_TEST_COMM_FAIL, a message, fails the creation with it */
  const char *fake = getenv("FERRY_GPT_TEST_COMM_FAIL");
  int rc = fake ? 1 : ferry_comm_create(&co, &t->comm);
  if (rc) {
    errf("--comm %s: %s%s\n", ferry_comm_kind_name(co.kind), fake ? fake : ferry_last_error(),
         co.kind != FERRY_COMM_SELF ? mpi_root_hint() : "");
    return 1;
  }
  t->rank = ferry_comm_rank(t->comm);
  t->nranks = ferry_comm_size(t->comm);
  int launched = launcher_size();
  if (t->nranks == 1 && launched > 1) {
    errf("started as one of %d processes (mpirun), but the communicator (--comm %s) has one "
         "rank: %s\n",
         launched, ferry_comm_kind_name(ferry_comm_get_kind(t->comm)),
         ferry_comm_compiled(FERRY_COMM_MPI) ? "use --comm mpi or auto"
                                             : "this build has no MPI (configure with OpenMPI "
                                               "installed: libopenmpi-dev)");
    return 1;
  }
  char desc[256];
  gpt_config_describe(&t->cfg, desc, sizeof desc);
  if (t->rank == 0)
    fprintf(t->info, "ferry-gpt: model %s; %.2fM parameters (%zu)\n", desc,
            t->s.total_numel / 1e6, t->s.total_numel);
  if (t->nranks == 1) return 0;
  snprintf(g_rank_prefix, sizeof g_rank_prefix, "rank %d: ", t->rank);
  train_logger(t); /* the library's messages say the rank too */
  if (t->rank > 0) {
    if (!(t->quiet = fopen("/dev/null", "w"))) {
      errf("/dev/null: %s\n", strerror(errno));
      return 1;
    }
    t->info = t->quiet;
    fflush(stdout);
    if (dup2(fileno(t->quiet), STDOUT_FILENO) < 0) {
      errf("cannot quiet stdout: %s\n", strerror(errno));
      return 1;
    }
  }
  fprintf(t->info, "ferry-gpt: %d ranks (%s), --batch %d per rank: global batch %d\n", t->nranks,
          ferry_comm_kind_name(ferry_comm_get_kind(t->comm)), t->o.batch,
          t->nranks * t->o.batch);
  const char *why = NULL;
  if (!t->o.engine)
    why = "needs --engine (the resident pre-engine path keeps one whole copy per process and "
          "does not shard)";
  else if (t->o.cuda)
    why = "--device cuda: data parallel on GPUs (a GPU per rank, NCCL) is not implemented yet; "
          "the ranks train on the host backend (--device cpu)";
  /* every rank refuses alike (exit 2, no abort) only when they all do */
  int32_t mine = why != NULL, *all = calloc((size_t)t->nranks, sizeof *all);
  if (!all) return errf("out of memory\n"), 1;
  rc = train_allgather(t, &mine, all, 1, FERRY_DT_I32, "comparing the ranks' options");
  int refusing = 0;
  for (int r = 0; !rc && r < t->nranks; r++) refusing += all[r];
  free(all);
  if (rc) return 1;
  if (!why) return refusing ? 2 : 0; /* another rank was started with other options */
  t->agreed = refusing == t->nranks;
  if (t->rank == 0 || !t->agreed)
    errf("%d ranks: %s (try --help)\n", t->nranks, why);
  return 2;
}

/* The settings outside the fingerprint that shape the run's collectives:
 * how many steps, when checkpoints are written and kept, and the folders
 * the ranks write to or read from together. A rank with other steps or
 * checkpoints would wait in a collective no other rank joins. */
enum { RUN_STEPS, RUN_SAVE_EVERY, RUN_KEEP, RUN_NUM };
enum { RUN_SAVE, RUN_RESUME, RUN_WEIGHTS, RUN_PATHS };
typedef struct {
  int64_t num[RUN_NUM];
  char path[RUN_PATHS][4096]; /* "" when not given */
} run_shape;
static const char *const k_run_num[RUN_NUM] = {"--steps", "--save-every", "--keep"};
static const char *const k_run_path[RUN_PATHS] = {"--save", "--resume", "--weights"};

static void run_shape_of(const train_run *t, run_shape *r) {
  memset(r, 0, sizeof *r);
  r->num[RUN_STEPS] = t->o.steps;
  r->num[RUN_SAVE_EVERY] = t->o.save_every;
  r->num[RUN_KEEP] = t->o.keep;
  const char *p[RUN_PATHS] = {t->o.save, t->o.resume, t->o.weights};
  for (int k = 0; k < RUN_PATHS; k++)
    snprintf(r->path[k], sizeof r->path[k], "%s", p[k] ? p[k] : "");
}

/* Appends "WHAT: rank 0 A, rank R B" for each run setting that differs;
 * the number of differences (after `diffs` already in list). */
static int run_shape_compare(const run_shape *a, const run_shape *b, const char *bn, int diffs,
                             char *list, size_t cap) {
  for (int k = 0; k < RUN_NUM + RUN_PATHS; k++) {
    char va[1100], vb[1100];
    if (k < RUN_NUM) {
      if (a->num[k] == b->num[k]) continue;
      snprintf(va, sizeof va, "%lld", (long long)a->num[k]);
      snprintf(vb, sizeof vb, "%lld", (long long)b->num[k]);
    } else {
      const char *x = a->path[k - RUN_NUM], *y = b->path[k - RUN_NUM];
      if (!strcmp(x, y)) continue;
      snprintf(va, sizeof va, x[0] ? "'%.1000s'" : "(not given)", x);
      snprintf(vb, sizeof vb, y[0] ? "'%.1000s'" : "(not given)", y);
    }
    size_t at = strlen(list);
    if (at + 1 < cap)
      snprintf(list + at, cap - at, "%s%s: rank 0 %.1100s, %s %.1100s", diffs ? "; " : "",
               k < RUN_NUM ? k_run_num[k] : k_run_path[k - RUN_NUM], va, bn, vb);
    diffs++;
  }
  return diffs;
}

/* Every rank was started with rank 0's settings (model, --batch, --seq,
 * seed, data, tokenizer, the engine keys that change the numbers; --steps,
 * --save-every, --keep and the --save, --resume and --weights paths): each
 * rank names what differs from rank 0's; all refuse alike (usage, 2). */
int train_same_settings(train_run *t) {
  if (t->nranks < 2) return 0;
  static gpt_resume_state r0;
  static run_shape s0, sm;
  r0 = t->rs;
  run_shape_of(t, &sm);
  s0 = sm;
  int rc = ferry_comm_broadcast(t->comm, &r0, sizeof r0, FERRY_DT_U8, 0, NULL, NULL);
  if (!rc) rc = ferry_comm_broadcast(t->comm, &s0, sizeof s0, FERRY_DT_U8, 0, NULL, NULL);
  char list[3072] = "", mine[32];
  snprintf(mine, sizeof mine, "rank %d", t->rank);
  if (rc) {
    errf("comparing the ranks' settings: %s\n", ferry_comm_last_error(t->comm));
    return 1;
  }
  int32_t diffs = gpt_resume_compare(&r0, "rank 0", &t->rs, mine, list, sizeof list);
  diffs = run_shape_compare(&s0, &sm, mine, diffs, list, sizeof list);
  int32_t *all = calloc((size_t)t->nranks, sizeof *all);
  if (!all) return errf("out of memory\n"), 1;
  rc = train_allgather(t, &diffs, all, 1, FERRY_DT_I32, "comparing the ranks' settings");
  int bad = 0;
  for (int r = 0; !rc && r < t->nranks; r++) bad += all[r] > 0;
  free(all);
  if (rc) return 1;
  if (!bad) return 0;
  t->agreed = 1;
  if (diffs)
    errf("this rank was started with settings other than rank 0's (%d difference%s): %s\n", diffs,
         diffs > 1 ? "s" : "", list);
  if (t->rank == 0)
    errf("refused: %d rank%s started with settings other than rank 0's (each names them); "
         "every rank runs the same command\n",
         bad, bad > 1 ? "s were" : " was");
  return 2;
}

/* The step's loss over every rank: the mean of the ranks' mean losses, in
 * rank order (the same on every rank, and the loss of the whole global
 * batch up to rounding, the ranks' shares being equal). */
int train_mean_loss(train_run *t, int st, float *loss) {
  t->stop_signal = atomic_load(&g_signal);
  if (t->nranks < 2) return 0;
  /* with each rank's loss its signal, so that every rank stops after the
   * same step (their collectives stay matched) */
  double mine[2] = {*loss, (double)t->stop_signal}, *all = malloc((size_t)t->nranks * sizeof mine);
  char what[64];
  snprintf(what, sizeof what, "step %d: the ranks' losses", st);
  if (!all) return errf("out of memory\n"), 1;
  int rc = train_allgather(t, mine, all, 2, FERRY_DT_F64, what);
  double sum = 0;
  for (int r = 0; !rc && r < t->nranks; r++) {
    sum += all[2 * r];
    if (all[2 * r + 1] != 0 && !t->stop_signal) t->stop_signal = (int)all[2 * r + 1];
  }
  free(all);
  if (!rc) *loss = (float)(sum / t->nranks);
  return rc;
}

/* After step st: 0 to go on, or 128 + the signal when SIGINT / SIGTERM
 * reached this rank or any other by the end of the step. */
int train_interrupted(train_run *t, int st) {
  int sig = t->nranks > 1 ? t->stop_signal : atomic_load(&g_signal);
  if (!sig) return 0;
  t->agreed = 1; /* every rank stops after the same step */
  char ck[4400] = "";
  if (t->o.save_every && st >= t->o.save_every)
    snprintf(ck, sizeof ck, "; the last checkpoint is %s/step-%012d (continue with --resume %s)",
             t->ck_dir, st - st % t->o.save_every, t->o.save);
  else if (t->o.resume)
    snprintf(ck, sizeof ck, "; continue with --resume %s", t->o.resume);
  errf("%s after step %d: stopped, the engine and its swap files released%s\n",
       sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal", st, ck);
  return 128 + sig;
}

/* The EIO hook: every swap file this process holds (anonymous: its
 * /proc/self/fd link ends " (deleted)"; kept: named ferry-*.swap) cut to 0
 * bytes, so that the engine's next read of it ends early (EIO). How many. */
static int truncate_swap_files(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d))) {
    char link[64], to[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%.20s", de->d_name);
    ssize_t len = readlink(link, to, sizeof to - 1);
    if (len <= 0) continue;
    to[len] = '\0';
    int anon = strstr(to, "/#") && strstr(to, " (deleted)");
    if ((anon || (strstr(to, "/ferry-") && strstr(to, ".swap"))) &&
        ftruncate(atoi(de->d_name), 0) == 0)
      n++;
  }
  if (d) closedir(d);
  return n;
}

/* Test hooks (tests/gpt/dist.py): at the start of step
 * $FERRY_GPT_TEST_DIE_AT_STEP rank $FERRY_GPT_TEST_RANK (default 1) kills
 * itself (SIGKILL); at $FERRY_GPT_TEST_HANG_AT_STEP it stops answering
 * (sleeps until killed); at $FERRY_GPT_TEST_SIGINT_AT_STEP it raises SIGINT
 * (tests/gpt/dist.py's signal case: every rank stops after that step); at
 * $FERRY_GPT_TEST_EIO_AT_STEP its swap files are cut and its file writes
 * refused (the fail-alone case: an I/O error in this rank alone). */
void train_test_fault(const train_run *t, int st) {
  const char *r = getenv("FERRY_GPT_TEST_RANK");
  if (t->rank != (r ? atoi(r) : 1)) return;
  const char *die = getenv("FERRY_GPT_TEST_DIE_AT_STEP");
  const char *hang = getenv("FERRY_GPT_TEST_HANG_AT_STEP");
  const char *sig = getenv("FERRY_GPT_TEST_SIGINT_AT_STEP");
  if (sig && atoi(sig) == st) raise(SIGINT); /* as Ctrl-C: this rank alone */
  if (die && atoi(die) == st) {
    errf("test hook: killing this rank at step %d (FERRY_GPT_TEST_DIE_AT_STEP)\n", st);
    raise(SIGKILL);
  }
  const char *eio = getenv("FERRY_GPT_TEST_EIO_AT_STEP");
  if (eio && atoi(eio) == st) {
    /* writes past the end fail too (EFBIG, SIGXFSZ ignored) */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {0, 0};
    setrlimit(RLIMIT_FSIZE, &rl);
    int n = truncate_swap_files();
    errf("test hook: %d swap file%s of this rank cut to 0 bytes at step %d, its next reads "
         "fail (FERRY_GPT_TEST_EIO_AT_STEP)\n", n, n == 1 ? "" : "s", st);
  }
  if (hang && atoi(hang) == st) {
    errf("test hook: this rank hangs at step %d (FERRY_GPT_TEST_HANG_AT_STEP)\n", st);
    for (;;) pause();
  }
}

/* Several ranks: each rank's optimizer-state and tier peaks, peak RSS and
 * bytes sent, gathered on every rank (a collective) for rank 0's report. */
int train_gather_ranks(train_run *t) {
  if (t->nranks < 2) return 0;
  uint64_t mine[GPT_RANK_FIGS] = {0};
  ferry_stats fs;
  ferry_engine_get_stats(gpt_engine_handle(t->ge), &fs);
  for (int k = 0; k < FERRY_TIERS; k++) {
    mine[GPT_RANK_OPTIM + k] = fs.peak[k][FERRY_FAMILY_OPTIM];
    mine[GPT_RANK_TIER + k] = fs.tier_peak[k];
    mine[GPT_RANK_PARAMS + k] = fs.peak[k][FERRY_FAMILY_PARAMS];
  }
  mine[GPT_RANK_RSS] = gpt_peak_rss_bytes();
  mine[GPT_RANK_COMM] = fs.comm_bytes;
  if (!(t->rank_figs = calloc((size_t)t->nranks * GPT_RANK_FIGS, sizeof *t->rank_figs)))
    return errf("out of memory\n"), 1;
  return train_allgather(t, mine, t->rank_figs, GPT_RANK_FIGS, FERRY_DT_U64,
                         "gathering the ranks' figures");
}

/* --save with ranks: rank 0's reader. Sharded masters make
 * ferry_param_read a collective, so rank 0 first tells the other ranks
 * which tensor it reads next (a broadcast of its index). */
int read_for_ranks(void *user, int i, float *dst) {
  train_run *t = user;
  int32_t idx = i;
  if (ferry_comm_broadcast(t->comm, &idx, 1, FERRY_DT_I32, 0, NULL, NULL)) return -1;
  return gpt_engine_read(t->ge, i, dst);
}

/* --save with ranks, ranks > 0: read each tensor rank 0 names, in its order,
 * until it says -1 (done). */
int train_save_follow(train_run *t) {
  size_t most = 1;
  for (int i = 0; i < t->s.n_params; i++)
    if (t->s.params[i].numel > most) most = t->s.params[i].numel;
  float *buf = malloc(most * sizeof *buf);
  if (!buf) return errf("--save: out of memory\n"), 1;
  int rc = 0;
  for (;;) {
    int32_t idx = -1;
    if (ferry_comm_broadcast(t->comm, &idx, 1, FERRY_DT_I32, 0, NULL, NULL)) {
      errf("--save: %s\n", ferry_comm_last_error(t->comm));
      rc = 1;
      break;
    }
    if (idx < 0) break;
    if (idx >= t->s.n_params || gpt_engine_read(t->ge, idx, buf)) {
      errf("--save: reading '%s': %s\n", idx < t->s.n_params ? t->s.params[idx].name : "?",
           ferry_engine_last_error(gpt_engine_handle(t->ge)));
      rc = 1;
      break;
    }
  }
  free(buf);
  return rc;
}

/* This rank failed alone (an I/O error, a failed update): every other
 * rank's waits fail at once naming this rank and errf's last message, the
 * cause (ferry_comm_fail), then the job ends (MPI_Abort). Test hook:
 * $FERRY_GPT_TEST_LINGER=S makes rank $FERRY_GPT_TEST_RANK (default 1) wait
 * S seconds before the abort,
 * as under a launcher slow to end the job: the others must end it first. */
_Noreturn void train_fail_alone(train_run *t, int rc) {
  fflush(stdout);
  /* the job ends now: the launcher's SIGTERM ends this rank at once (it
   * is no request to stop after a step) */
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  if (ferry_comm_fail(t->comm, g_last_err))
    errf("telling the other ranks: %s\n", ferry_comm_last_error(t->comm));
  const char *linger = getenv("FERRY_GPT_TEST_LINGER"), *r = getenv("FERRY_GPT_TEST_RANK");
  if (linger && atoi(linger) > 0 && t->rank == (r ? atoi(r) : 1)) sleep((unsigned)atoi(linger));
  ferry_comm_abort(t->comm, rc);
  exit(rc); /* ferry_comm_abort does not return */
}
