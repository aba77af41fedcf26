/* examples/gpt/app.h — what the files of the ferry-gpt program share: the
 * options of `train` and `sample`, one `train` run's state and totals, the
 * message helpers, and each file's entry points. The model, its providers
 * and the data are gpt.h's; this header is the program around them.
 *
 *   main.c          main(): the command dispatch
 *   args.c          option parsing and the --help texts
 *   blas_threads.c  OpenBLAS's threads under an address-space limit
 *   train_setup.c   a train run up to its first step (and freeing it)
 *   train.c         the training loop, checkpoints, --save
 *   ranks.c         the ranks (MPI) and the signals every rank agrees on
 *   output.c        messages, progress lines, JSON, the closing summary
 *   sample.c        `sample`
 *   tokenizer_cli.c `tokenize`
 */
#ifndef FERRY_GPT_APP_H
#define FERRY_GPT_APP_H

#include "footprint.h"
#include "gpt.h"
#include "gpt_cuda.h" /* the device layout; the model through its module (--device cuda) */

#include "ferry.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

/* Every size ferry-gpt prints is binary, as the engine's messages are. */
#define MiB 1048576.0
#define GiB 1073741824.0

enum { MAX_SETS = 32 };

/* Everything `train` is told. A new flag is a field here, an entry in
 * k_train_opts and a case in parse_train. */
typedef struct {
  const char *model, *weights, *data, *engine, *save, *tokdir, *timeline, *resume, *stats_json;
  int steps, batch, seq, json, ckpt, threads, cuda;
  int data_stream; /* --data-stream: --data may be a pipe or device, read to its end */
  int strict_weights; /* --strict-weights: tensors of --weights the model does not use refused */
  int log_level;      /* --log-level: FERRY_LOG_*, or -1 (the config's, else warnings) */
  int save_every, keep, keep_given; /* checkpoints: every N steps into save/checkpoints */
  double lr, wd; /* doubles, as the engine config holds them */
  int lr_given, wd_given;
  const char *lr_text, *wd_text; /* as given, for messages */
  uint64_t seed;
  const char *set[MAX_SETS]; /* --set KEY=VALUE, in order */
  int nset;
  ferry_comm_kind comm; /* --comm: the ranks' communicator (AUTO: MPI under mpirun) */
} train_opts;

/* One `train` run: what it holds from the engine config to the last step.
 * Every step below returns 0 or the exit code; train_free frees whatever is
 * held, wherever the run stopped (the sanitizer builds check that refusals
 * leak nothing). */
typedef struct {
  train_opts o;
  FILE *info;           /* progress notes: stderr under --json, else stdout */
  int seq;              /* --seq, or the model's default */
  int micro, start;     /* micro-batches per step; the first step to run */
  ferry_config *fc;     /* --engine's config, until the engine is made */
  gpt_config cfg;
  gpt_tokenizer *tok;
  gpt_schema s;
  gpt_data d;
  gpt_resident r;       /* pre-engine: weights and grads in host memory */
  gpt_adamw opt;        /* pre-engine: the AdamW state */
  gpt_engine *ge;       /* --engine */
  gpt_provider p;
  gpt_model *m;         /* the CPU model */
  const gpt_cuda_api *cu; /* --device cuda: the CUDA model's module, opened */
  gpt_cuda_model *cm;   /* --device cuda */
  gpt_cuda_resident cr; /* --device cuda without --engine: weights and grads on the device */
  int pinned;           /* ... and r's host arrays page-locked for its copies */
  int init_on_device;   /* ... and the seeded init runs there (a large model) */
  gpt_provider cp;      /* the provider the CUDA model reads: the engine's or cr's */
  gpt_resume_state rs;  /* this run's fingerprint; saved with each checkpoint */
  char ck_folder[4096]; /* --resume: the checkpoint found */
  char ck_dir[4200];    /* --save-every: where checkpoints go */
  int64_t ck_step;
  ferry_comm *comm;     /* the ranks (every run has one; SELF alone) */
  int rank, nranks;     /* this rank, and how many train together */
  int agreed;           /* the error that ends the run is every rank's (usage): no abort */
  int skipped;          /* --engine: the last step was skipped (inf/NaN grads) */
  int backed_off;       /* ... and the dynamic (fp16) loss scale went down with it */
  int nonfinite_run;    /* steps in a row with a non-finite loss that loss scaling skipped */
  int stop_signal;      /* a signal any rank received by the end of the last step (ranks agree) */
  uint64_t *rank_figs;  /* nranks > 1: each rank's figures (GPT_RANK_FIGS), at the end */
  FILE *quiet;          /* ranks > 0: /dev/null, where their progress goes */
  char err[1024];
} train_run;

/* What the steps add up to, for the closing lines. */
typedef struct {
  double t_all, first, last; /* seconds in steps; the first and last loss */
  int ran;                   /* steps this process runs */
  long long tok_step;        /* tokens per step (of every rank) */
  ferry_stats fs;            /* --engine: the engine's stats */
  ferry_stats fs0;           /* ... before the first step */
  uint64_t nvme_rd[FERRY_FAMILIES], nvme_wr[FERRY_FAMILIES]; /* ... after the last step */
  float *losses;             /* --stats-json: each step's loss */
  double startup;            /* seconds from the launch to the first step */
} train_totals;

/* Everything `sample` is told (--threads is applied as it is read). */
typedef struct {
  const char *model, *weights, *prompt, *tokdir;
  int ntok;
  float temp, top_p;
  int top_k;
  int eos; /* the id that ends the text: -1 none, -2 the config.json's eos_token_id */
  int cuda; /* --device cuda */
  int json; /* --json: no streamed text; one object with the ids at the end */
  uint64_t seed;
} sample_opts;

/* main.c's commands */
int cmd_train(int argc, char **argv);  /* train.c */
int cmd_sample(int argc, char **argv); /* sample.c */
int cmd_tokenize(int argc, char **argv); /* tokenizer_cli.c */
extern const char *const k_tokenize_help;

/* args.c: 0 parsed, 1 --help printed; bad usage exits 2 */
extern const char *const k_train_help, *const k_sample_help, *const k_main_help;
int parse_train(int argc, char **argv, train_opts *o);
int parse_sample(int argc, char **argv, sample_opts *o);
int log_level_of(const char *w); /* FERRY_LOG_* of a log_level word, or -1 */

/* blas_threads.c */
int fit_blas_threads(void); /* at start: 1 when the program must run again (blas.c) */
int train_address_space(const train_run *t);

/* train_setup.c: each returns 0 or the exit code */
void load_model_config(const char *model, gpt_config *cfg); /* exits on failure */
gpt_tokenizer *load_tokenizer(const char *dir);               /* exits on failure */
/* --model DIR (a Hugging Face folder): DIR stands for *weights when it holds
 * model.safetensors or its index, and for *tokdir when it holds
 * tokenizer.json or vocab.json + merges.txt, each only where the option was
 * not given. */
void model_dir_defaults(const char *model, const char **weights, const char **tokdir);
void train_logger(const train_run *t);
int train_check_device(train_run *t);
int train_load(train_run *t);
int train_setup_engine(train_run *t);
int train_setup_resident(train_run *t);
int train_make_model(train_run *t);
void train_free(train_run *t);

/* ranks.c: each returns 0 or the exit code */
extern atomic_int g_signal; /* the first SIGINT / SIGTERM received, else 0 */
void install_signals(void);  /* also starts the set-up: a signal stops it */
void train_setup_over(void); /* the first step is next: a signal waits for a step boundary */
/* A signal stopped the set-up: its message, 128 + the signal; else 0. */
int train_setup_interrupted(train_run *t);
int train_comm(train_run *t);
int train_same_settings(train_run *t);
void train_test_fault(const train_run *t, int st);
int train_mean_loss(train_run *t, int st, float *loss);
int train_interrupted(train_run *t, int st);
int train_gather_ranks(train_run *t);
int read_for_ranks(void *user, int i, float *dst);
int train_save_follow(train_run *t);
/* This rank failed alone: the other ranks told why, then the job ended. */
_Noreturn void train_fail_alone(train_run *t, int rc);

/* output.c */
extern char g_rank_prefix[32]; /* "rank R: " once there are several ranks */
extern char g_last_err[1024];  /* errf's last message (its first line), for the other ranks */
__attribute__((format(printf, 1, 2))) void errf(const char *fmt, ...);
void gpt_log(void *user, int level, const char *message);
/* The engine's config keys; after finalize, the model states: each family's
 * bytes in its home tier (ferry_stats), their sum and bytes per param. */
void describe_engine(const ferry_config *fc, FILE *info);
void describe_model_states(ferry_engine *e, size_t numel, FILE *info);
void train_report_step(const train_run *t, train_totals *tt, int st, float loss, double dt,
                       double *stall0, const char *why);
void train_report_totals(const train_run *t, train_totals *tt, gpt_footprint *f);
int train_write_stats(const train_run *t, const gpt_footprint *f);
int train_write_timeline(const train_run *t);

#endif
