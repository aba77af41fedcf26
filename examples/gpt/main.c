/* examples/gpt/main.c — the ferry-gpt program: `train` (fine-tune or train a
 * GPT-2 / Llama model on a text or token file) and `sample` (generate text).
 * `train --engine CFG` runs on ferry's engine (gpt_engine provider: the
 * config's placement, the engine's optimizer and step); without --engine it
 * runs the pre-engine path (everything resident in host memory, AdamW).
 */
#include "gpt.h"
#include "footprint.h"
#include "blas.h"
#include "gpt_cuda.h" /* the device layout; the model through its module (--device cuda) */

#include "ferry.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *k_train_help =
    "NAME\n"
    "    ferry-gpt train - train or fine-tune a GPT-2 or Llama model\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt train --model PRESET|config.json --data FILE [--weights FILE|DIR]\n"
    "                    [--engine ENGINE.cfg] [--steps N] [--batch B] [--seq S] [--lr LR]\n"
    "                    [--weight-decay WD] [--seed K] [--save DIR] [--checkpoint]\n"
    "                    [--tokenizer DIR] [--threads N] [--device cpu|cuda] [--json]\n"
    "                    [--set KEY=VALUE]... [--timeline FILE]\n"
    "                    [--save-every N [--keep K]] [--resume DIR] [--stats-json FILE]\n"
    "                    [--comm auto|self|mpi] [--data-stream] [--strict-weights]\n"
    "                    [--log-level silent|error|warn|info|debug]\n"
    "    mpirun -np N ferry-gpt train --engine ENGINE.cfg ... (data parallel)\n"
    "\n"
    "DESCRIPTION\n"
    "    Trains a decoder-only transformer with AdamW on next-token prediction. Batches of\n"
    "    B windows of S+1 tokens are drawn from FILE at offsets chosen by a generator seeded\n"
    "    with K, so the same command gives the same losses.\n"
    "\n"
    "    With --engine, every parameter lives in ferry's engine, placed as the config says\n"
    "    (GPU budget, host, NVMe; see examples/configs/), and the engine's optimizer (the\n"
    "    config's optimizer.*, precision.*, clip_grad_norm, grad_accumulation micro-batches\n"
    "    of B sequences per step) does the step. --device cpu: the model computes in fp32\n"
    "    on the CPU over the emulated GPU (device = \"host\"). --device cuda: the CUDA model\n"
    "    computes on the engine's GPU (the config's device is taken as \"cuda\"), reading\n"
    "    the params in their precision where the engine placed them, its activations and\n"
    "    workspace reserved out of tiers.gpu.budget. Without --engine: the pre-engine path,\n"
    "    every weight, gradient and AdamW state in host memory, a plain AdamW in this\n"
    "    example.\n"
    "\n"
    "    One line per step: step, loss, tokens per second, peak bytes per engine tier (gpu,\n"
    "    host, nvme; without --engine: the process's peak RSS as host) and the share of the\n"
    "    step's wall time spent waiting for transfers (stall). At the end: the totals, then\n"
    "    the footprint: \"memory: peak RSS ...; engine peaks gpu P/B, host P/B, nvme P;\n"
    "    optimizer X B/param/step; trainer activations ..., scratch ..., data ...\" (peak RSS\n"
    "    from VmHWM; the engine's tier peaks and budgets; the bytes the optimizer pass reads\n"
    "    and writes per parameter and step; the CPU model's activation buffers, the engine\n"
    "    provider's host scratch and the token ids) and, with --engine, the NVMe bytes read and\n"
    "    written per family (params / grads / optimizer) in all, per step and before step 1.\n"
    "\n"
    "    Data parallel: under `mpirun -np N` (N > 1) the N processes (ranks) train one model\n"
    "    on the engine (--engine is required), which splits the optimizer state and grads\n"
    "    between them as dist.zero_stage says (0 to 3; --set dist.zero_stage=1). --batch is\n"
    "    per rank: rank r takes windows r*B .. r*B+B-1 of each global batch of N*B windows\n"
    "    drawn from the one seeded sampler, so N ranks at --batch B see exactly the windows\n"
    "    of one rank at --batch N*B. Every rank runs the same command (the model, --batch,\n"
    "    --seq, seed, data, tokenizer and engine keys are compared at start; a difference is\n"
    "    refused, naming it). Rank 0 alone prints; the loss printed is the mean of the\n"
    "    ranks' losses (the loss of the global batch), tokens count every rank's, the\n"
    "    peaks and NVMe bytes are rank 0's. A rank that fails ends the job\n"
    "    (MPI_Abort) after its message, prefixed \"rank R: \"; a rank that stops answering\n"
    "    fails the others after dist.timeout seconds (default 300). Checkpoints\n"
    "    (--save-every, --resume) are collectives: every rank saves and loads the same\n"
    "    folder (rank 0 writes it), and a checkpoint resumes on any number of ranks with\n"
    "    the same global batch.\n"
    "\n"
    "OPTIONS\n"
    "    --model PRESET|FILE   tiny (GPT-2 style, ~1M params), small (~10M), gpt2 (124M),\n"
    "                          llama-tiny, llama-small, or a Hugging Face config.json with\n"
    "                          model_type gpt2 or llama.\n"
    "    --weights FILE|DIR    start from these safetensors weights (one file, a folder with\n"
    "                          model.safetensors or a sharded index); Hugging Face names.\n"
    "                          Without it the weights are initialised from --seed.\n"
    "    --log-level LEVEL     the library's messages on stderr (\"ferry: warning: ...\"):\n"
    "                          silent, error, warn, info or debug. Default: the engine\n"
    "                          config's log_level when it says more than silent (its\n"
    "                          default), else warn (buffered I/O fallback, no fallocate,\n"
    "                          pageable fallback, write-back failures).\n"
    "    --strict-weights      refuse --weights holding tensors the model does not use (exit\n"
    "                          1); without it they are named in a warning and ignored (a\n"
    "                          sixth block for a five-block model, lm_head.weight with a tied\n"
    "                          head, a buffer).\n"
    "    --data FILE           training data: text (tokenized), or token ids as uint16\n"
    "                          (.u16, .bin) or uint32 (.u32).\n"
    "    --data-stream         --data may be a pipe or a device (not a regular file): read to\n"
    "                          its end, at most half the machine's memory. Without it such a\n"
    "                          path is refused (--data /dev/zero would never end).\n"
    "    --engine FILE         train on ferry's engine with this configuration (.cfg; keys in\n"
    "                          docs/CONFIG.md). Missing tiers.nvme.paths directories are made.\n"
    "    --set KEY=VALUE       with --engine: override one config key after the file (any\n"
    "                          number of times), e.g. --set tiers.gpu.budget=64M.\n"
    "    --timeline FILE       with --engine: write the engine's timeline (Chrome trace\n"
    "                          JSON) at the end. With N ranks each rank writes its own,\n"
    "                          FILE with .rank<R> before the extension (t.rank0.json, ...).\n"
    "    --steps N             optimizer steps (default 10).\n"
    "    --batch B             sequences per step (default 4).\n"
    "    --seq S               tokens per sequence (default 128, at most the model's\n"
    "                          positions).\n"
    "    --lr LR               AdamW learning rate (default 3e-4; 0 is allowed); betas\n"
    "                          0.9/0.999, eps 1e-8. With --engine: sets optimizer.lr (default:\n"
    "                          the config's). LR and WD are read as doubles (--lr 3e-4 is the\n"
    "                          config's 3e-4); a value that is not a finite number >= 0, or\n"
    "                          outside the config's range, is bad usage (exit 2).\n"
    "    --weight-decay WD     decoupled weight decay on matrices (default 0.1). With\n"
    "                          --engine: sets optimizer.weight_decay, which applies to every\n"
    "                          tensor (default: the config's).\n"
    "    --seed K              seed of the init and the batch sampler (default 1).\n"
    "    --save DIR            write DIR/model.safetensors (fp32, Hugging Face names) and\n"
    "                          DIR/config.json at the end (with N ranks: rank 0 writes, every\n"
    "                          rank reads its shard of the masters).\n"
    "    --save-every N        with --engine and --save DIR: after every N-th step write an\n"
    "                          engine checkpoint into DIR/checkpoints/step-<12 digits>/\n"
    "                          (params, fp32 master weights, optimizer states, step count,\n"
    "                          loss scaler, and this trainer's state: the next step, the\n"
    "                          batch sampler's RNG state and a fingerprint of the run),\n"
    "                          atomically; a killed save leaves the older ones intact.\n"
    "    --keep K              with --save-every: keep the newest K checkpoints (default 2;\n"
    "                          0 = all).\n"
    "    --resume DIR          with --engine: continue from the newest checkpoint of DIR (a\n"
    "                          --save folder, its checkpoints/ folder, or one step-* folder)\n"
    "                          up to --steps in total; the steps that follow equal an\n"
    "                          uninterrupted run bit for bit. Refused, naming each\n"
    "                          difference, when the seed, model, global batch (--batch x\n"
    "                          ranks), --seq, data, tokenizer or an engine key that\n"
    "                          changes the numbers (optimizer.*, precision.*,\n"
    "                          clip_grad_norm, grad_accumulation) differ from the saving\n"
    "                          run; placement, tiers, chunk size, dist.zero_stage and the\n"
    "                          number of ranks may change (a checkpoint of 2 ranks at\n"
    "                          --batch 2 resumes on 1 rank at --batch 4). The weights come\n"
    "                          from the checkpoint (--weights is ignored). Pass\n"
    "                          --save-every again to keep saving.\n"
    "    --checkpoint          activation checkpointing: keep only block inputs and\n"
    "                          recompute each block in the backward pass.\n"
    "    --tokenizer DIR       GPT-2 BPE from DIR/vocab.json and DIR/merges.txt (default:\n"
    "                          bytes, 256 ids).\n"
    "    --threads N           OpenBLAS threads (default: OpenBLAS's choice).\n"
    "    --device cpu|cuda     where the model computes (default cpu). cuda: the CUDA\n"
    "                          kernels (bf16 GEMMs, fp32 accumulation, bf16 activations\n"
    "                          where they are GEMM operands) on GPU 0, all on one stream.\n"
    "                          With --engine: the engine's device is cuda (a config that\n"
    "                          says \"host\" or \"auto\" is overridden, with a note), the\n"
    "                          params stay where the config places them. Without --engine:\n"
    "                          fp32 weights resident on the device; the pre-engine AdamW\n"
    "                          steps on the host (grads down, weights up each step).\n"
    "    --json                one JSON object per step instead of the progress line:\n"
    "                          {\"step\", \"loss\", \"tokens_per_s\", \"peak_bytes\": {\"gpu\",\n"
    "                          \"host\", \"nvme\"}, \"stall_pct\"}, then one with \"final\": true\n"
    "                          and totals (\"steps\" this process ran from \"first_step\";\n"
    "                          with --engine also \"bytes_moved\"). Losses print as %.9g:\n"
    "                          every bit of the fp32 value. The final object also holds\n"
    "                          the --stats-json keys but steps, losses and engine.\n"
    "    --stats-json FILE     at the end write one JSON object to FILE: steps, losses[],\n"
    "                          engine (the config, or null), peak_rss_bytes,\n"
    "                          optim_bytes_per_param (the engine's; null without it),\n"
    "                          activation_bytes, scratch_bytes, data_bytes, resident_bytes,\n"
    "                          tier_peak and budget {gpu, host, nvme}, and\n"
    "                          {params, grads, optimizer} of nvme_read_bytes /\n"
    "                          nvme_write_bytes (the whole run), *_per_step (the mean after\n"
    "                          setup) and nvme_setup_read_bytes / nvme_setup_write_bytes\n"
    "                          (before step 1), optim_peak and params_peak {gpu, host,\n"
    "                          nvme} (peak optimizer-state and param bytes per tier) and\n"
    "                          ranks. Without --engine the engine's keys are 0. With N ranks\n"
    "                          rank 0 writes the file: its own figures, the mean losses, and\n"
    "                          per_rank[] with each rank's optim_peak, params_peak,\n"
    "                          tier_peak, peak_rss_bytes and comm_bytes.\n"
    "    --comm auto|self|mpi  the ranks' communicator (default auto: MPI when an MPI\n"
    "                          launcher started the process, else one rank). self: one\n"
    "                          rank even under mpirun (refused when mpirun started several).\n"
    "    -h, --help            this text.\n"
    "\n"
    "EXAMPLES\n"
    "    ferry-gpt train --model tiny --data /usr/share/common-licenses/GPL-3 --steps 50\n"
    "    ferry-gpt train --model small --data corpus.txt --engine examples/configs/resident.cfg \\\n"
    "        --steps 200 --batch 8 --seq 256 --lr 1e-3 --save out/\n"
    "    ferry-gpt train --model small --data /usr/share/common-licenses/GPL-3 \\\n"
    "        --engine examples/configs/offload-nvme.cfg --steps 30 --timeline build/gpt.json\n"
    "    # checkpoint every 50 steps; after a crash the same command with --resume goes on\n"
    "    ferry-gpt train --model small --data corpus.txt --engine examples/configs/resident.cfg \\\n"
    "        --steps 1000 --save out/ --save-every 50 --keep 3\n"
    "    ferry-gpt train --model small --data corpus.txt --engine examples/configs/resident.cfg \\\n"
    "        --steps 1000 --save out/ --save-every 50 --keep 3 --resume out/\n"
    "\n"
    "EXIT STATUS\n"
    "    0 on success, 1 on a runtime failure (also: no usable GPU for --device cuda, no\n"
    "    checkpoint in --resume DIR, a damaged one, a non-finite loss: the first one ends\n"
    "    the run unless fp16 loss scaling skipped that step, 16 in a row at most; --json\n"
    "    then prints \"loss\": null and an \"error\" field; --data that is not a regular file\n"
    "    without --data-stream; --weights with unused tensors under --strict-weights; an\n"
    "    address-space limit too small to start), 2 on bad usage (also: --resume with\n"
    "    settings other than the checkpoint's, or with --steps below its step; with N ranks: no --engine, --device cuda (not\n"
    "    implemented yet), ranks started with other settings). Under mpirun a rank's\n"
    "    failure ends the job through MPI_Abort with its status (1, or 2 for a --resume\n"
    "    with other settings). SIGINT (Ctrl-C) or SIGTERM: the run stops after the step\n"
    "    in progress (a checkpoint being written is finished first), releases the engine\n"
    "    and its swap files, names the last checkpoint and exits 130 (SIGINT) or 143\n"
    "    (SIGTERM), without --save's final weights; a second signal exits at once. With\n"
    "    ranks every rank stops after the same step.\n"
    "\n"
    "TEST HOOKS\n"
    "    FERRY_GPT_TEST_DIE_AT_STEP=K / FERRY_GPT_TEST_HANG_AT_STEP=K: rank\n"
    "    $FERRY_GPT_TEST_RANK (default 1) kills itself (SIGKILL) / stops answering at the\n"
    "    start of step K (tests/gpt/dist.py); FERRY_GPT_TEST_SIGINT_AT_STEP=K: it raises\n"
    "    SIGINT there. FERRY_GPT_TEST_SIGNAL_IN_SAVE=SIG: raise\n"
    "    signal SIG just before each checkpoint save (tests/gpt/signals.py).\n";

static const char *k_sample_help =
    "NAME\n"
    "    ferry-gpt sample - generate text from a GPT-2 or Llama model\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt sample --model PRESET|config.json --weights FILE|DIR --prompt TEXT\n"
    "                     [--tokens N] [--temperature T] [--seed K] [--tokenizer DIR]\n"
    "\n"
    "DESCRIPTION\n"
    "    Encodes TEXT, then appends N tokens, each drawn from the softmax of the model's\n"
    "    last logits divided by T (T = 0: the most likely token). The context is the last\n"
    "    positions the model supports (at most 256). Prints the prompt and the continuation.\n"
    "\n"
    "OPTIONS\n"
    "    --model PRESET|FILE   as for train; use the config.json written by train --save.\n"
    "    --weights FILE|DIR    safetensors weights (required: random weights say nothing).\n"
    "    --prompt TEXT         the start of the text (default: a newline).\n"
    "    --tokens N            tokens to generate (default 64).\n"
    "    --temperature T       sampling temperature (default 0.8; 0 = greedy).\n"
    "    --seed K              seed of the sampler (default 1).\n"
    "    --tokenizer DIR       GPT-2 BPE from DIR/vocab.json and DIR/merges.txt.\n"
    "    -h, --help            this text.\n"
    "\n"
    "EXIT STATUS\n"
    "    0 on success, 1 on a runtime failure, 2 on bad usage.\n";

static const char *k_main_help =
    "NAME\n"
    "    ferry-gpt - train and sample GPT-2 / Llama models with ferry\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt train  --model ... --data FILE [options]\n"
    "    ferry-gpt sample --model ... --weights DIR --prompt TEXT [options]\n"
    "    ferry-gpt help [train|sample]\n"
    "\n"
    "DESCRIPTION\n"
    "    The example trainer of ferry: one decoder-only transformer covering GPT-2\n"
    "    (LayerNorm, GELU, learned positions, tied embeddings) and Llama (RMSNorm, rotary\n"
    "    positions, SwiGLU, grouped-query attention), weights in safetensors with Hugging\n"
    "    Face names. `ferry-gpt COMMAND --help` describes each command.\n";

/* SIGINT / SIGTERM: the first sets g_signal (the handler does nothing
 * else that is not async-signal-safe), the run stops at the next step
 * boundary (a checkpoint being written is finished first), destroys its
 * engine and exits 128 + the signal; a second one exits at once. */
static atomic_int g_signal; /* lock-free: safe in a handler, on whichever thread */

static void on_signal(int sig) {
  if (atomic_exchange(&g_signal, sig)) _exit(128 + sig);
  static const char msg[] = "ferry-gpt: interrupted: stopping after this step (a checkpoint "
                            "being written is finished first); again to stop at once\n";
  ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
}

static void install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART; /* I/O in flight goes on; the flag is read between steps */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* "rank R: " before every message on stderr once the run has several ranks
 * (set once the communicator exists). */
static char g_rank_prefix[32];

/* An error message on stderr: "[rank R: ]ferry-gpt: ...", one write, so the
 * lines of several ranks do not interleave. */
__attribute__((format(printf, 1, 2))) static void errf(const char *fmt, ...) {
  char b[4096];
  int at = snprintf(b, sizeof b, "%sferry-gpt: ", g_rank_prefix);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b + at, sizeof b - (size_t)at, fmt, ap);
  va_end(ap);
  fputs(b, stderr);
}

static void die_usage(const char *msg) {
  errf("%s (try --help)\n", msg);
  exit(2);
}

static int parse_int(const char *s, const char *opt, long lo, long hi) {
  char *e;
  errno = 0;
  long v = strtol(s, &e, 10);
  if (errno || *e || v < lo || v > hi) {
    errf("%s wants an integer in [%ld, %ld], not '%s'\n", opt, lo, hi, s);
    exit(2);
  }
  return (int)v;
}

/* A hyper-parameter: a finite number >= 0 read as a double (strtod, the
 * whole argument), so that --lr 3e-4 is the value a config's 3e-4 is.
 * Anything else is bad usage naming the value. */
static double parse_double(const char *s, const char *opt) {
  char *e;
  errno = 0;
  double v = strtod(s, &e);
  if (e == s || *e || errno == ERANGE || !isfinite(v) || v < 0) {
    errf("%s wants a finite number >= 0, not '%s'\n", opt, s);
    exit(2);
  }
  return v;
}

static void load_model_config(const char *model, gpt_config *cfg) {
  char err[512];
  if (gpt_config_preset(model, cfg) == 0) return;
  struct stat st;
  if (stat(model, &st) != 0) {
    errf("--model '%s' is neither a preset (tiny, small, gpt2, llama-tiny, "
         "llama-small) nor a file\n",
         model);
    exit(2);
  }
  char path[4096];
  if (S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%.4000s/config.json", model);
  else snprintf(path, sizeof path, "%.4000s", model);
  if (gpt_config_load_json(path, cfg, err, sizeof err)) {
    errf("%s\n", err);
    exit(1);
  }
}

static gpt_tokenizer *load_tokenizer(const char *dir) {
  gpt_tokenizer *t;
  if (!dir) {
    if (gpt_tokenizer_bytes(&t)) exit(1);
    return t;
  }
  char v[4096], m[4096], err[512];
  snprintf(v, sizeof v, "%.4000s/vocab.json", dir);
  snprintf(m, sizeof m, "%.4000s/merges.txt", dir);
  if (gpt_tokenizer_bpe(v, m, &t, err, sizeof err)) {
    errf("tokenizer: %s\n", err);
    exit(1);
  }
  return t;
}

static int write_config_json(const char *path, const gpt_config *c) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  if (c->family == GPT_GPT2)
    fprintf(f, "{\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n  \"n_embd\": %d,\n"
            "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": %d,\n  \"n_positions\": %d,\n"
            "  \"layer_norm_epsilon\": %g,\n  \"activation_function\": \"gelu_new\",\n"
            "  \"tie_word_embeddings\": true\n}\n",
            c->vocab, c->d_model, c->n_layer, c->n_head, c->d_ff, c->max_seq, (double)c->norm_eps);
  else
    fprintf(f, "{\n  \"model_type\": \"llama\",\n  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %g,\n  \"rope_theta\": %g,\n"
            "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": %s\n}\n",
            c->vocab, c->d_model, c->n_layer, c->n_head, c->n_kv_head, c->d_ff, c->max_seq,
            (double)c->norm_eps, (double)c->rope_theta, c->tied ? "true" : "false");
  return fclose(f);
}

/* Every size ferry-gpt prints is binary, as the engine's messages are. */
#define MiB 1048576.0
#define GiB 1073741824.0

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { O_MODEL = 256, O_WEIGHTS, O_DATA, O_ENGINE, O_STEPS, O_BATCH, O_SEQ, O_LR, O_WD, O_SEED,
       O_SAVE, O_JSON, O_CKPT, O_TOK, O_THREADS, O_PROMPT, O_TOKENS, O_TEMP, O_DEVICE, O_SET,
       O_TIMELINE, O_SAVE_EVERY, O_KEEP, O_RESUME, O_STATS_JSON, O_COMM, O_DATA_STREAM, O_STRICT_WEIGHTS, O_LOG_LEVEL };

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

static const struct option k_train_opts[] = {
    {"model", 1, 0, O_MODEL},     {"weights", 1, 0, O_WEIGHTS},   {"data", 1, 0, O_DATA},
    {"engine", 1, 0, O_ENGINE},   {"steps", 1, 0, O_STEPS},       {"batch", 1, 0, O_BATCH},
    {"seq", 1, 0, O_SEQ},         {"lr", 1, 0, O_LR},             {"weight-decay", 1, 0, O_WD},
    {"seed", 1, 0, O_SEED},       {"save", 1, 0, O_SAVE},         {"json", 0, 0, O_JSON},
    {"checkpoint", 0, 0, O_CKPT}, {"tokenizer", 1, 0, O_TOK},     {"threads", 1, 0, O_THREADS},
    {"device", 1, 0, O_DEVICE},   {"set", 1, 0, O_SET},           {"timeline", 1, 0, O_TIMELINE},
    {"save-every", 1, 0, O_SAVE_EVERY}, {"keep", 1, 0, O_KEEP}, {"resume", 1, 0, O_RESUME},
    {"stats-json", 1, 0, O_STATS_JSON}, {"comm", 1, 0, O_COMM},
    {"data-stream", 0, 0, O_DATA_STREAM}, {"strict-weights", 0, 0, O_STRICT_WEIGHTS},
    {"log-level", 1, 0, O_LOG_LEVEL},
    {"help", 0, 0, 'h'},          {0, 0, 0, 0}};

/* FERRY_LOG_* of a log_level word (the engine config's spelling), or -1. */
static int log_level_of(const char *w) {
  static const char *names[] = {"silent", "error", "warn", "info", "debug"};
  for (int i = 0; i < 5; i++)
    if (!strcmp(w, names[i])) return i;
  return -1;
}

/* The library's messages (warnings: buffered I/O, no fallocate, pageable
 * fallback, write-back failures) on stderr, one write per line, after the
 * prefix `user` ("rank R: " once there are ranks: handed over through
 * ferry_log_set, whose lock orders it before any thread reads it). Called
 * from any of ferry's threads. */
static void gpt_log(void *user, int level, const char *message) {
  static const char *names[] = {"", "error", "warning", "info", "debug"};
  char b[1400];
  snprintf(b, sizeof b, "%sferry: %s: %s\n", (const char *)user,
           names[level >= 1 && level <= 4 ? level : 4], message);
  fputs(b, stderr);
}

/* 0: parsed; 1: --help printed. Bad usage exits 2. */
static int parse_train(int argc, char **argv, train_opts *o) {
  memset(o, 0, sizeof *o);
  o->steps = 10;
  o->batch = 4;
  o->lr = 3e-4;
  o->wd = 0.1;
  o->seed = 1;
  o->keep = 2;
  o->log_level = -1;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", k_train_opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; break;
    case O_WEIGHTS: o->weights = optarg; break;
    case O_DATA: o->data = optarg; break;
    case O_ENGINE: o->engine = optarg; break;
    case O_STEPS: o->steps = parse_int(optarg, "--steps", 0, 100000000); break;
    case O_BATCH: o->batch = parse_int(optarg, "--batch", 1, 65536); break;
    case O_SEQ: o->seq = parse_int(optarg, "--seq", 1, 1 << 20); break;
    case O_LR: o->lr = parse_double(optarg, "--lr"), o->lr_given = 1, o->lr_text = optarg; break;
    case O_WD: o->wd = parse_double(optarg, "--weight-decay"), o->wd_given = 1, o->wd_text = optarg; break;
    case O_SEED: o->seed = (uint64_t)parse_int(optarg, "--seed", 0, 2147483647); break;
    case O_SAVE: o->save = optarg; break;
    case O_JSON: o->json = 1; break;
    case O_CKPT: o->ckpt = 1; break;
    case O_TOK: o->tokdir = optarg; break;
    case O_THREADS: o->threads = parse_int(optarg, "--threads", 1, 1024); break;
    case O_DEVICE:
      if (!strcmp(optarg, "cuda")) o->cuda = 1;
      else if (strcmp(optarg, "cpu")) die_usage("--device is cpu or cuda");
      break;
    case O_SET:
      if (!strchr(optarg, '=')) die_usage("--set wants KEY=VALUE");
      if (o->nset == MAX_SETS) die_usage("too many --set");
      o->set[o->nset++] = optarg;
      break;
    case O_TIMELINE: o->timeline = optarg; break;
    case O_SAVE_EVERY: o->save_every = parse_int(optarg, "--save-every", 1, 100000000); break;
    case O_KEEP: o->keep = parse_int(optarg, "--keep", 0, 1000000), o->keep_given = 1; break;
    case O_RESUME: o->resume = optarg; break;
    case O_STATS_JSON: o->stats_json = optarg; break;
    case O_DATA_STREAM: o->data_stream = 1; break;
    case O_STRICT_WEIGHTS: o->strict_weights = 1; break;
    case O_LOG_LEVEL:
      if ((o->log_level = log_level_of(optarg)) < 0)
        errf("--log-level is silent, error, warn, info or debug, not '%s'\n", optarg), exit(2);
      break;
    case O_COMM:
      if (!strcmp(optarg, "auto")) o->comm = FERRY_COMM_AUTO;
      else if (!strcmp(optarg, "self")) o->comm = FERRY_COMM_SELF;
      else if (!strcmp(optarg, "mpi")) o->comm = FERRY_COMM_MPI;
      else die_usage("--comm is auto, self or mpi");
      break;
    case 'h': fputs(k_train_help, stdout); return 1;
    default: die_usage("bad option for train");
    }
  }
  if (optind < argc) die_usage("unexpected argument");
  if (!o->model) die_usage("train needs --model");
  if (!o->data) die_usage("train needs --data");
  if (!o->engine && (o->nset || o->timeline)) die_usage("--set and --timeline need --engine");
  if (!o->engine && (o->save_every || o->resume))
    die_usage("--save-every and --resume need --engine (checkpoints hold the engine's state: "
              "params, master weights, optimizer states)");
  if (o->save_every && !o->save)
    die_usage("--save-every needs --save DIR (checkpoints go to DIR/" GPT_RESUME_SUBDIR ")");
  if (o->keep_given && !o->save_every) die_usage("--keep needs --save-every");
  if (o->resume && !o->resume[0]) die_usage("--resume wants a folder");
  if (o->strict_weights && !o->weights) die_usage("--strict-weights needs --weights");
  return 0;
}

/* mkdir -p; 0 when the directory exists at the end. */
static int make_dirs(const char *path) {
  char b[4096];
  if (snprintf(b, sizeof b, "%s", path) >= (int)sizeof b) return -1;
  for (char *q = b + 1; *q; q++) {
    if (*q != '/') continue;
    *q = '\0';
    if (mkdir(b, 0777) && errno != EEXIST) return -1;
    *q = '/';
  }
  if (mkdir(b, 0777) && errno != EEXIST) return -1;
  struct stat st;
  return stat(b, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* --device cuda --engine: the engine's device is cuda whatever the config
 * says ("host", "auto"), and its host pool is pinned (the cuda backend
 * refuses a pageable one: its copies would be synchronous), each with a
 * note when that changes the config. */
static int engine_device_cuda(ferry_config *fc, const char *file, FILE *info) {
  char dev[32] = "", pin[16] = "";
  ferry_config_get(fc, "device", dev, sizeof dev);
  ferry_config_get(fc, "tiers.host.pinned", pin, sizeof pin);
  if (strcmp(pin, "true")) {
    fprintf(info, "ferry-gpt: note: --device cuda: tiers.host.pinned = true (%s says %s)\n",
            file, pin);
    if (ferry_config_set(fc, "tiers.host.pinned", "true")) return -1;
  }
  if (!strcmp(dev, "cuda")) return 0;
  fprintf(info, "ferry-gpt: note: --device cuda: the engine's device is cuda (%s says "
          "device = \"%s\")\n", file, dev);
  return ferry_config_set(fc, "device", "cuda");
}

/* The engine configuration: the file, then --lr / --weight-decay when
 * given, then each --set; --device cuda makes the device cuda; the NVMe
 * directories made when missing. *usage: 1 when the refusal is of a flag's
 * value (bad usage, exit 2). */
static ferry_config *engine_config(const train_opts *o, FILE *info, int *usage) {
  ferry_config *fc;
  if (ferry_config_create(&fc)) {
    errf("%s\n", ferry_last_error());
    return NULL;
  }
  if (ferry_config_load_file(fc, o->engine)) {
    errf("%s\n", ferry_config_last_error(fc));
    goto fail;
  }
  char v[4096];
  if (o->lr_given) {
    snprintf(v, sizeof v, "%.17g", o->lr); /* every bit of the double */
    if (ferry_config_set(fc, "optimizer.lr", v)) goto bad_flag;
  }
  if (o->wd_given) {
    snprintf(v, sizeof v, "%.17g", o->wd);
    if (ferry_config_set(fc, "optimizer.weight_decay", v)) goto bad_flag;
  }
  for (int i = 0; i < o->nset; i++) {
    char key[256];
    const char *eq = strchr(o->set[i], '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - o->set[i]), o->set[i]);
    if (ferry_config_set(fc, key, eq + 1)) goto bad_set;
  }
  if (o->cuda && engine_device_cuda(fc, o->engine, info)) goto bad_set;
  if (ferry_config_get(fc, "tiers.nvme.paths", v, sizeof v) == 0 && v[0]) {
    for (char *p = v, *next; p && *p; p = next) {
      next = strchr(p, ',');
      if (next) *next++ = '\0';
      while (*p == ' ') p++;
      struct stat st;
      if (stat(p, &st) == 0) continue;
      if (make_dirs(p)) {
        errf("cannot create the NVMe swap directory '%s' "
             "(tiers.nvme.paths in %s): %s\n",
             p, o->engine, strerror(errno));
        goto fail;
      }
      fprintf(info, "ferry-gpt: created the NVMe swap directory %s (tiers.nvme.paths)\n", p);
    }
  }
  return fc;
bad_flag: /* --lr / --weight-decay out of the config's range: bad usage */
  errf("%s (from the command line: --lr %s, --weight-decay %s)\n", ferry_config_last_error(fc),
       o->lr_given ? o->lr_text : "not given", o->wd_given ? o->wd_text : "not given");
  *usage = 1;
  goto fail;
bad_set:
  errf("%s\n", ferry_config_last_error(fc));
fail:
  ferry_config_destroy(fc);
  return NULL;
}

static void describe_engine(const ferry_config *fc, const gpt_schema *s, FILE *info) {
  static const char *keys[] = {"device",          "precision.params",    "placement.params",
                               "placement.grads", "placement.optimizer", "tiers.gpu.budget",
                               "optimizer.lr",    "grad_accumulation"};
  fprintf(info, "ferry-gpt: engine:");
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    char v[256];
    if (ferry_config_get(fc, keys[i], v, sizeof v) == 0) fprintf(info, " %s=%s", keys[i], v);
  }
  char prec[16] = "bf16";
  ferry_config_get(fc, "precision.params", prec, sizeof prec);
  int pb = strcmp(prec, "fp32") ? 2 : 4;
  /* param + fp32 grad + fp32 master, exp_avg, exp_avg_sq */
  fprintf(info, "\nferry-gpt: model states %.1f MiB (%d bytes/param)\n",
          (double)s->total_numel * (pb + 16) / MiB, pb + 16);
}

static void json_peaks(const uint64_t *peak) {
  printf("\"peak_bytes\": {\"gpu\": %llu, \"host\": %llu, \"nvme\": %llu}",
         (unsigned long long)peak[0], (unsigned long long)peak[1], (unsigned long long)peak[2]);
}

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
} train_totals;

static void train_free(train_run *t) {
  gpt_model_free(t->m);
  /* the resident weights (cudaFree waits for the device), then the model
   * (it waits for its stream, the engine's with --engine), then the engine */
  if (t->cu) {
    if (t->cr.schema) t->cu->resident_free(&t->cr);
    t->cu->model_free(t->cm);
    if (t->pinned) t->cu->host_unregister(t->r.weights), t->cu->host_unregister(t->r.grads);
  }
  gpt_engine_free(t->ge);
  if (t->fc) ferry_config_destroy(t->fc);
  gpt_adamw_free(&t->opt);
  gpt_resident_free(&t->r);
  gpt_data_free(&t->d);
  gpt_tokenizer_free(t->tok);
  gpt_schema_free(&t->s);
  free(t->rank_figs);
}

/* The process's mapped bytes now (VmSize), or 0 when unknown. */
static uint64_t vm_size_bytes(void) {
  int found;
  return gpt_proc_status_kb("VmSize", &found) * 1024;
}

/* One small GEMM large enough for OpenBLAS to run it on its threads: each
 * thread maps its GEMM buffer now, not in the middle of a step. */
static void blas_warm_up(void) {
  enum { W = 128 };
  static float a[W * W], b[W * W], c[W * W];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, W, W, W, 1.0f, a, W, b, W, 0.0f, c, W);
}

/* Under an address-space limit (ulimit -v, RLIMIT_AS) OpenBLAS cannot map
 * a GEMM buffer (about 128 MiB a thread here) and then retries forever at
 * 100% CPU instead of failing. So with a limit its buffers are mapped at
 * start, one thread first to measure what one takes, then as many threads
 * as fit beside a reserve for the model (a note when fewer than asked);
 * too little room even for one is refused, naming the limit (exit 1).
 * Without a limit: nothing. */
static int train_address_space(const train_run *t) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return 0;
  const uint64_t reserve = 16ull << 20, first = 160ull << 20; /* beside them; one buffer */
  uint64_t lim = (uint64_t)rl.rlim_cur, used = vm_size_bytes();
  if (!used) return 0;
  if (used + first + reserve > lim) {
    errf("out of address space: ulimit -v (RLIMIT_AS) is %.1f MiB and %.1f MiB is mapped at "
         "start; OpenBLAS needs about %.0f MiB more for one thread's buffers, and the model "
         "its own: raise ulimit -v\n",
         lim / MiB, used / MiB, first / MiB);
    return 1;
  }
  int want = openblas_get_num_threads();
  openblas_set_num_threads(1);
  blas_warm_up();
  uint64_t after = vm_size_bytes(), each = after > used ? after - used : 0;
  if (each < (8ull << 20)) each = first; /* not measured: assume */
  int fit = 1;
  while (fit < want && after + (uint64_t)fit * each + reserve <= lim) fit++;
  openblas_set_num_threads(fit);
  if (fit > 1) blas_warm_up();
  const char *fitted = getenv("FERRY_GPT_BLAS_FITTED"); /* set by fit_blas_threads */
  if (fit < want || fitted)
    fprintf(t->info, "ferry-gpt: note: ulimit -v is %.1f MiB: OpenBLAS runs %d thread%s%s%s "
            "(each maps about %.0f MiB of buffers)\n", lim / MiB, fit, fit > 1 ? "s" : "",
            fitted ? " of the cores' " : "", fitted ? fitted : "", each / MiB);
  return 0;
}

/* --threads, where notes go, and for --device cuda the CUDA model's module
 * (only then: a CPU run maps no cuBLAS) and whether it can run (with
 * --engine the engine's device creation says so, with the runtime's own
 * message). */
static int train_check_device(train_run *t) {
  if (t->o.threads) openblas_set_num_threads(t->o.threads);
  t->info = t->o.json ? stderr : stdout;
  if (train_address_space(t)) return 1;
  if (!t->o.cuda) return 0;
  char why[2048];
  if (gpt_cuda_load(&t->cu, why, sizeof why)) {
    errf("--device cuda: cannot load the CUDA model: %s\n", why);
    return 1;
  }
  if (!t->o.engine && t->cu->available(why, sizeof why)) {
    errf("--device cuda: %s\n", why);
    return 1;
  }
  return 0;
}

/* The logger at --log-level, else the engine config's log_level when it
 * says more than "silent" (its default), else warnings. */
static void train_logger(const train_run *t) {
  int level = t->o.log_level;
  char v[32];
  if (level < 0 && t->fc && ferry_config_get(t->fc, "log_level", v, sizeof v) == 0)
    level = log_level_of(v);
  if (level <= FERRY_LOG_SILENT && t->o.log_level < 0) level = FERRY_LOG_WARN;
  ferry_log_set(gpt_log, (void *)(g_rank_prefix[0] ? g_rank_prefix : ""), level);
}

/* --weights: the tensors the model does not use are named (a warning), or
 * with --strict-weights refused; they are never loaded either way. */
static int train_check_unused(train_run *t) {
  char list[1024];
  int n = gpt_weights_unused(&t->s, t->o.weights, list, sizeof list, t->err, sizeof t->err);
  if (n < 0) {
    errf("%s\n", t->err);
    return 1;
  }
  if (n == 0) return 0;
  errf("%s: --weights %s holds %d tensor%s the model does not use: %s%s\n",
       t->o.strict_weights ? "refused (--strict-weights)" : "warning", t->o.weights, n,
       n > 1 ? "s" : "", list,
       t->o.strict_weights ? "" : " (ignored; --strict-weights refuses them)");
  return t->o.strict_weights;
}

/* The engine config, the model's shape, the tokenizer and the data. */
static int train_load(train_run *t) {
  if (t->o.engine) {
    int usage = 0;
    if (!(t->fc = engine_config(&t->o, t->info, &usage))) return usage ? 2 : 1;
    train_logger(t);
  } else {
    fprintf(t->info, "ferry-gpt: note: no --engine: pre-engine path (all parameters resident in "
            "host memory, plain AdamW)\n");
  }
  load_model_config(t->o.model, &t->cfg);
  t->seq = t->o.seq;
  if (!t->seq) t->seq = t->cfg.max_seq < 128 ? t->cfg.max_seq : 128;
  if (t->seq > t->cfg.max_seq) {
    errf("--seq %d is more than the model's %d positions\n", t->seq, t->cfg.max_seq);
    return 2;
  }
  t->tok = load_tokenizer(t->o.tokdir);
  if (gpt_tokenizer_vocab(t->tok) > t->cfg.vocab) {
    errf("the tokenizer has %d ids but the model only %d\n", gpt_tokenizer_vocab(t->tok),
         t->cfg.vocab);
    return 1;
  }
  if (gpt_schema_build(&t->cfg, &t->s)) {
    errf("cannot build the model\n");
    return 1;
  }
  if (t->o.weights && !t->o.resume && train_check_unused(t)) return 1;
  if (gpt_data_load_ex(&t->d, t->o.data, t->tok, t->cfg.vocab, t->o.seed,
                       t->o.data_stream ? GPT_DATA_STREAM : 0, t->err, sizeof t->err)) {
    errf("%s\n", t->err);
    return 1;
  }
  if (t->d.n < (size_t)t->seq + 1) {
    errf("%s holds %zu tokens, fewer than --seq + 1 = %d\n", t->o.data, t->d.n, t->seq + 1);
    return 1;
  }
  return 0;
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

/* The ranks: a communicator of every process of the job (--comm; auto: MPI
 * when mpirun started the process). One rank trains as before. Several
 * need --engine (the resident providers do not shard); rank 0 alone prints
 * (the others' stdout and notes go to /dev/null), every message on stderr
 * says "rank R: ". The engine config's dist.timeout, when it has one,
 * bounds every wait. Returns 2 for usage every rank refuses alike. */
static int train_comm(train_run *t) {
  ferry_comm_options co = ferry_comm_options_default();
  co.kind = t->o.comm;
  char v[64];
  if (t->fc && ferry_config_get(t->fc, "dist.timeout", v, sizeof v) == 0) {
    char *e;
    double x = strtod(v, &e);
    if (e != v && x > 0) co.timeout = x;
  }
  int rc = ferry_comm_create(&co, &t->comm);
  if (rc) {
    errf("--comm %s: %s\n", ferry_comm_kind_name(co.kind), ferry_last_error());
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

/* Every rank was started with rank 0's settings (model, --batch, --seq,
 * seed, data, tokenizer, the engine keys that change the numbers): each
 * rank names what differs from rank 0's; all refuse alike (usage, 2). */
static int train_same_settings(train_run *t) {
  if (t->nranks < 2) return 0;
  static gpt_resume_state r0;
  r0 = t->rs;
  int rc = ferry_comm_broadcast(t->comm, &r0, sizeof r0, FERRY_DT_U8, 0, NULL, NULL);
  char list[3072] = "", mine[32];
  snprintf(mine, sizeof mine, "rank %d", t->rank);
  if (rc) {
    errf("comparing the ranks' settings: %s\n", ferry_comm_last_error(t->comm));
    return 1;
  }
  int32_t diffs = gpt_resume_compare(&r0, "rank 0", &t->rs, mine, list, sizeof list);
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

/* --resume, before the engine is built: find the checkpoint and check its
 * trainer state, so settings that differ are named before any tensor is
 * read. */
static int train_resume_find(train_run *t) {
  if (gpt_resume_find(t->o.resume, t->ck_folder, sizeof t->ck_folder, &t->ck_step, t->err,
                      sizeof t->err)) {
    errf("--resume: %s\n", t->err);
    return 1;
  }
  if (t->o.steps < t->ck_step) { /* every rank sees the same folder: refused alike */
    t->agreed = 1;
    errf("--resume %s: the checkpoint is at step %lld, past --steps %d: nothing to resume "
         "(--steps is the total, checkpointed steps included; pass --steps %lld or more)\n",
         t->ck_folder, (long long)t->ck_step, t->o.steps, (long long)t->ck_step + 1);
    return 2;
  }
  static unsigned char peek[sizeof(gpt_resume_state)];
  size_t plen;
  int crc = gpt_resume_peek(t->ck_folder, peek, sizeof peek, &plen);
  if (crc) { /* checked before it is read: damage is named as damage */
    errf("--resume %s: %s%s\n", t->ck_folder, ferry_last_error(),
         crc == FERRY_ECORRUPT ? " (the checkpoint is corrupt: resume from an older one, "
                                 "or check the disk)" : "");
    return 1;
  }
  if ((crc = gpt_resume_check(peek, plen, &t->rs, NULL, t->err, sizeof t->err))) {
    /* other settings on the command line: bad usage; a foreign blob: runtime */
    errf("--resume %s: %s\n", t->ck_folder, t->err);
    return crc == -2 ? 2 : 1;
  }
  if (t->o.weights)
    fprintf(t->info, "ferry-gpt: note: --resume: the weights come from the checkpoint, not "
            "--weights %s\n", t->o.weights);
  return 0;
}

/* --resume, once the engine is built: load the checkpoint into it and take
 * the next step and the sampler's state from its trainer state. */
static int train_resume_load(train_run *t) {
  static unsigned char blob[sizeof(gpt_resume_state)];
  size_t blen = 0;
  gpt_resume_state got;
  int lrc = gpt_engine_load(t->ge, t->ck_folder, blob, sizeof blob, &blen, t->err, sizeof t->err);
  if (lrc == FERRY_EOVERFLOW) {
    errf("--resume %s: its trainer state (user.bin) is %zu bytes, not "
         "the %zu of a ferry-gpt resume state: not a checkpoint of ferry-gpt train\n",
         t->ck_folder, blen, sizeof blob);
    return 1;
  }
  if (lrc) {
    errf("--resume %s: %s\n", t->ck_folder, t->err);
    return 1;
  }
  int crc = gpt_resume_check(blob, blen, &t->rs, &got, t->err, sizeof t->err);
  if (crc) {
    errf("--resume %s: %s\n", t->ck_folder, t->err);
    return crc == -2 ? 2 : 1;
  }
  if (got.next_step != t->ck_step + 1) {
    errf("--resume %s: the folder is step %lld but its trainer state "
         "continues at step %lld: not a checkpoint of ferry-gpt train\n",
         t->ck_folder, (long long)t->ck_step, (long long)got.next_step);
    return 1;
  }
  if (got.next_step > 100000001) {
    errf("--resume %s: step %lld is past the largest --steps\n", t->ck_folder,
         (long long)t->ck_step);
    return 1;
  }
  t->start = (int)got.next_step;
  t->d.rng = got.data_rng;
  if (t->start <= t->o.steps)
    fprintf(t->info, "ferry-gpt: resumed %s: %lld steps done, continuing at step %d of %d\n",
            t->ck_folder, (long long)t->ck_step, t->start, t->o.steps);
  else
    fprintf(t->info, "ferry-gpt: nothing to do: the checkpoint is at step %lld = --steps %d; "
            "no step runs (--save still writes its weights)\n", (long long)t->ck_step,
            t->o.steps);
  return 0;
}

static gpt_run_config run_config(const train_run *t) {
  gpt_run_config rc = {.batch = t->o.batch, .seq = t->seq, .checkpoint = t->o.ckpt};
  return rc;
}

/* --engine: the run's fingerprint, the engine (weights from --weights, the
 * seed or the checkpoint; --device cuda: in stream mode, with the CUDA
 * model's device block reserved) and its provider. */
static int train_setup_engine(train_run *t) {
  describe_engine(t->fc, &t->s, t->info);
  /* the global batch: a checkpoint resumes on another number of ranks that
   * keeps it (2 ranks at --batch 2, 1 rank at --batch 4) */
  if (gpt_resume_fingerprint(&t->rs, &t->cfg, t->o.batch * t->nranks, t->seq, t->o.seed,
                             t->o.data, &t->d,
                             t->tok, t->fc, t->err, sizeof t->err)) {
    errf("%s\n", t->err);
    return 1;
  }
  int rc = train_same_settings(t);
  if (rc) return rc;
  if (t->o.save_every)
    snprintf(t->ck_dir, sizeof t->ck_dir, "%.4000s/" GPT_RESUME_SUBDIR, t->o.save);
  if (t->o.resume && (rc = train_resume_find(t))) return rc;
  gpt_weights_src *src;
  if (gpt_weights_src_open(&t->s, t->o.resume ? NULL : t->o.weights, t->o.seed, &src, t->err,
                           sizeof t->err)) {
    errf("%s\n", t->err);
    return 1;
  }
  gpt_engine_options eo = {GPT_ENGINE_SYNC, 0, t->nranks > 1 ? t->comm : NULL};
  if (t->o.cuda) { /* the CUDA model's block is reserved with the engine's grad slots */
    gpt_cuda_layout_t lay;
    gpt_run_config run = run_config(t);
    eo.mode = GPT_ENGINE_STREAM;
    eo.model_bytes = gpt_cuda_layout(&t->s, &run, gpt_engine_config_dtype(t->fc), &lay);
  }
  rc = gpt_engine_create(&t->s, t->fc, NULL, src, &eo, &t->ge, t->err, sizeof t->err);
  gpt_weights_src_close(src);
  ferry_config_destroy(t->fc);
  t->fc = NULL;
  if (rc) {
    errf("engine (%s): %s\n", t->o.engine, t->err);
    return 1;
  }
  t->p = gpt_engine_provider(t->ge);
  t->micro = gpt_engine_micro_batches(t->ge);
  return t->o.resume ? train_resume_load(t) : 0;
}

/* Without --engine: weights, grads and AdamW state in host memory. */
static int train_setup_resident(train_run *t) {
  if (gpt_resident_init(&t->r, &t->s) ||
      gpt_adamw_init(&t->opt, t->s.total_numel, (float)t->o.lr, (float)t->o.wd)) {
    errf("out of memory for %zu parameters\n", t->s.total_numel);
    return 1;
  }
  t->p = gpt_resident_provider(&t->r);
  if (t->o.weights) {
    if (gpt_weights_load(&t->s, &t->p, t->o.weights, t->err, sizeof t->err)) {
      errf("%s\n", t->err);
      return 1;
    }
  } else {
    gpt_weights_init(&t->s, &t->p, t->o.seed);
  }
  return 0;
}

/* --device cuda: the CUDA model. With --engine in the engine's reserved
 * block, on the provider's stream; without, on its own block and stream,
 * over fp32 weights resident on the device (uploaded from r). */
static int train_make_cuda(train_run *t) {
  gpt_run_config rc = run_config(t);
  if (t->ge) {
    gpt_cuda_mem mem = {NULL, 0, NULL, FERRY_DT_NONE};
    gpt_engine_model_memory(t->ge, &mem.base, &mem.bytes);
    if (ferry_stream_native(gpt_engine_stream(t->ge), &mem.stream) || !mem.stream) {
      errf("--device cuda: the engine's stream has no CUDA stream (is "
           "its device cuda?)\n");
      return 1;
    }
    mem.wdt = gpt_engine_dtype(t->ge);
    t->cp = t->p;
    if (t->cu->model_create(&t->s, &rc, &mem, &t->cm, t->err, sizeof t->err)) {
      errf("--device cuda: %s\n", t->err);
      return 1;
    }
    return 0;
  }
  if (t->cu->model_create(&t->s, &rc, NULL, &t->cm, t->err, sizeof t->err)) {
    errf("--device cuda: %s\n", t->err);
    return 1;
  }
  size_t hb = t->s.total_numel * sizeof(float);
  t->pinned = !t->cu->host_register(t->r.weights, hb);
  if (t->pinned && t->cu->host_register(t->r.grads, hb)) {
    t->cu->host_unregister(t->r.weights);
    t->pinned = 0;
  }
  if (!t->pinned)
    fprintf(t->info, "ferry-gpt: note: --device cuda: cannot page-lock the host weights and "
            "grads; their copies each step are synchronous\n");
  if (t->cu->resident_init(&t->cr, &t->s, t->cu->model_stream(t->cm)) ||
      t->cu->resident_upload(&t->cr, t->r.weights)) {
    errf("--device cuda: out of device memory for the weights (%s)\n", t->cr.err);
    return 1;
  }
  t->cp = t->cu->resident_provider(&t->cr);
  return 0;
}

/* The model (CPU, or the CUDA one), then the line that sizes the run. */
static int train_make_model(train_run *t) {
  gpt_run_config rc = run_config(t);
  if (t->o.cuda && train_make_cuda(t)) return 1;
  if (!t->o.cuda && gpt_model_create(&t->s, &rc, &t->m)) {
    errf("out of memory for activations (batch %d, seq %d)\n", t->o.batch, t->seq);
    return 1;
  }
  double act = 0;
  const char *where = "host";
  if (t->cm) act = t->cu->model_bytes(t->cm) / MiB, where = "device";
  if (t->m) act = gpt_model_activation_bytes(t->m) / MiB;
  if (t->ge)
    fprintf(t->info, "ferry-gpt: %zu tokens of data, batch %d x seq %d x %d micro-batches, %d "
            "steps; %s: %.1f MiB of activations and workspace, %.1f MiB of fp32 grad scratch\n",
            t->d.n, t->o.batch, t->seq, t->micro, t->o.steps, where, act,
            gpt_engine_scratch_bytes(t->ge) / MiB);
  else
    fprintf(t->info, "ferry-gpt: %zu tokens of data, batch %d x seq %d, %d steps, lr %g; host: "
            "%.1f MiB of weights+grads+AdamW; %s: %.1f MiB of activations\n",
            t->d.n, t->o.batch, t->seq, t->o.steps, (double)t->o.lr, 16.0 * t->s.total_numel / MiB,
            where, act);
  return 0;
}

/* The engine's optimizer step; 0, or 1 with the engine's message printed. */
static int train_engine_step(train_run *t, int st) {
  ferry_step_info si;
  float scale = ferry_loss_scale(gpt_engine_handle(t->ge));
  int rc = gpt_engine_step(t->ge, &si);
  t->skipped = rc == 0 && si.skipped;
  t->backed_off = t->skipped && si.loss_scale < scale;
  if (rc == 0) return 0;
  errf("step %d: %s%s\n", st, ferry_engine_last_error(gpt_engine_handle(t->ge)),
       rc == FERRY_ETIMEDOUT ? " (FERRY_ETIMEDOUT: another rank did not answer within "
                               "dist.timeout)"
       : rc == FERRY_ECORRUPT ? "\nferry-gpt: the engine's swap data failed its CRC check (the "
                                "file on the NVMe tier was damaged, or the disk returned other "
                                "bytes): rerun, or continue from the last checkpoint with "
                                "--resume; check the disk if it happens again"
                              : "");
  return 1;
}

/* One step on the CUDA model: its micro-batches' forward and backward
 * enqueued, then the engine's step (or, pre-engine: grads down, AdamW on
 * the host, weights up), then the loss: one event wait, long passed. */
static int train_step_cuda(train_run *t, int st, int32_t *x, int32_t *y, float *loss) {
  for (int k = 0; k < t->micro; k++) {
    gpt_data_batch_rank(&t->d, t->o.batch, t->seq, t->rank, t->nranks, x, y);
    if (t->cp.zero_grad(t->cp.ctx) || t->cu->model_forward(t->cm, &t->cp, x, y) ||
        t->cu->model_backward(t->cm, &t->cp)) {
      errf("step %d: %s\n", st, t->cu->model_last_error(t->cm));
      return 1;
    }
  }
  if (t->ge) {
    if (train_engine_step(t, st)) return 1;
  } else {
    if (t->cu->resident_download_grads(&t->cr, t->r.grads)) {
      errf("step %d: %s\n", st, t->cr.err);
      return 1;
    }
    gpt_adamw_step(&t->opt, &t->r);
    if (t->cu->resident_upload(&t->cr, t->r.weights)) {
      errf("step %d: %s\n", st, t->cr.err);
      return 1;
    }
  }
  if (t->cu->model_loss(t->cm, loss)) {
    errf("step %d: %s\n", st, t->cu->model_last_error(t->cm));
    return 1;
  }
  return 0;
}

/* One step on the CPU model: its micro-batches' forward and backward, then
 * the engine's step or the pre-engine AdamW. *loss: the micro-batches' mean. */
static int train_step_cpu(train_run *t, int st, int32_t *x, int32_t *y, float *loss) {
  double sum = 0;
  for (int k = 0; k < t->micro; k++) {
    float l;
    gpt_data_batch_rank(&t->d, t->o.batch, t->seq, t->rank, t->nranks, x, y);
    if (t->p.zero_grad(t->p.ctx) || gpt_model_forward(t->m, &t->p, x, y, &l) ||
        gpt_model_backward(t->m, &t->p)) {
      errf("step %d: %s\n", st, gpt_model_last_error(t->m));
      return 1;
    }
    sum += l;
  }
  *loss = (float)(sum / t->micro);
  if (t->ge) return train_engine_step(t, st);
  gpt_adamw_step(&t->opt, &t->r);
  return 0;
}

/* Peak bytes per tier (gpu, host, nvme): with --engine its tiers (and *fs
 * its stats), else the process's peak RSS as host. */
static void train_peaks(const train_run *t, ferry_stats *fs, uint64_t peak[3]) {
  peak[0] = 0, peak[1] = gpt_peak_rss_bytes(), peak[2] = 0;
  if (!t->ge) return;
  ferry_engine_get_stats(gpt_engine_handle(t->ge), fs);
  for (int i = 0; i < 3; i++) peak[i] = fs->tier_peak[i];
}

/* The step's NVMe bytes per family and direction (JSON keys); the totals
 * so far become the next step's start. */
static void json_step_nvme(train_totals *tt) {
  uint64_t rd[FERRY_FAMILIES], wr[FERRY_FAMILIES];
  for (int k = 0; k < FERRY_FAMILIES; k++) {
    rd[k] = tt->fs.nvme_read_bytes[k] - tt->nvme_rd[k];
    wr[k] = tt->fs.nvme_write_bytes[k] - tt->nvme_wr[k];
    tt->nvme_rd[k] = tt->fs.nvme_read_bytes[k];
    tt->nvme_wr[k] = tt->fs.nvme_write_bytes[k];
  }
  printf(", ");
  gpt_footprint_json_families(stdout, "nvme_read_bytes", rd);
  printf(", ");
  gpt_footprint_json_families(stdout, "nvme_write_bytes", wr);
}

/* v as JSON: `fmt` when finite, else null (JSON has no NaN or infinity). */
static void json_number(FILE *f, double v, const char *fmt) {
  if (isfinite(v)) fprintf(f, fmt, v);
  else fputs("null", f);
}

/* The step's line: JSON or the progress line (why: the error that ends the
 * run at this step, JSON's "error" field; the caller prints it on stderr). *stall0: the engine's stall
 * seconds so far, advanced to now. */
static void train_report_step(const train_run *t, train_totals *tt, int st, float loss, double dt,
                              double *stall0, const char *why) {
  double tps = tt->tok_step / dt, stall = 0;
  uint64_t peak[3];
  train_peaks(t, &tt->fs, peak);
  if (t->ge) {
    stall = 100.0 * (tt->fs.stall_seconds - *stall0) / dt;
    *stall0 = tt->fs.stall_seconds;
  }
  if (t->o.json) {
    printf("{\"step\": %d, \"loss\": ", st);
    json_number(stdout, loss, "%.9g");
    printf(", \"tokens_per_s\": %.1f, ", tps);
    json_peaks(peak);
    printf(", \"stall_pct\": %.1f", stall);
    if (t->ge) json_step_nvme(tt);
    if (t->skipped) printf(", \"skipped\": true");
    if (why) {
      printf(", \"error\": ");
      gpt_json_string(stdout, why);
    }
    printf("}\n");
  } else {
    printf("step %5d/%d  loss %.4f  %8.0f tok/s  gpu %.3f GiB  host %.3f GiB  nvme %.3f GiB  "
           "stall %.1f%%\n",
           st, t->o.steps, loss, tps, peak[0] / GiB, peak[1] / GiB, peak[2] / GiB, stall);
    if (t->skipped)
      printf("step %5d: skipped by the engine (inf/NaN grads); the loss scale is now %g\n", st,
             (double)ferry_loss_scale(gpt_engine_handle(t->ge)));
  }
  fflush(stdout);
}

/* --save-every: after step st, an engine checkpoint with the trainer state. */
static int train_checkpoint(train_run *t, int st) {
  /* between steps: the engine holds step st, the sampler is at step st + 1 */
  t->rs.next_step = st + 1;
  t->rs.data_rng = t->d.rng;
  double t1 = now_s();
  const char *hook = getenv("FERRY_GPT_TEST_SIGNAL_IN_SAVE"); /* tests/gpt/signals.py */
  if (hook && atoi(hook) > 0) raise(atoi(hook));
  if (gpt_engine_save(t->ge, t->ck_dir, &t->rs, sizeof t->rs, t->o.keep, t->err, sizeof t->err)) {
    errf("step %d: checkpoint into %s: %s\n", st, t->ck_dir, t->err);
    return 1;
  }
  fprintf(t->info, "ferry-gpt: checkpoint %s/step-%012d (%.2f s)\n", t->ck_dir, st, now_s() - t1);
  return 0;
}

/* The step's loss over every rank: the mean of the ranks' mean losses, in
 * rank order (the same on every rank, and the loss of the whole global
 * batch up to rounding, the ranks' shares being equal). */
static int train_mean_loss(train_run *t, int st, float *loss) {
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
static int train_interrupted(train_run *t, int st) {
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

/* Test hooks (tests/gpt/dist_faults.cmake): at the start of step
 * $FERRY_GPT_TEST_DIE_AT_STEP rank $FERRY_GPT_TEST_RANK (default 1) kills
 * itself (SIGKILL); at $FERRY_GPT_TEST_HANG_AT_STEP it stops answering
 * (sleeps until killed); at $FERRY_GPT_TEST_SIGINT_AT_STEP it raises SIGINT
 * (tests/gpt/dist.py's signal case: every rank stops after that step). */
static void train_test_fault(const train_run *t, int st) {
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
  if (hang && atoi(hang) == st) {
    errf("test hook: this rank hangs at step %d (FERRY_GPT_TEST_HANG_AT_STEP)\n", st);
    for (;;) pause();
  }
}

/* Steps in a row that fp16 loss scaling may skip with a non-finite loss
 * before the run stops (each halves the scale). */
#define GPT_NONFINITE_SKIPS 16
#define GPT_STR2(x) #x
#define GPT_STR(x) GPT_STR2(x)

/* Steps start..--steps, each reported, checkpointed when due; the first
 * non-finite loss ends the run (exit 1) unless loss scaling skipped it. */
static int train_steps(train_run *t, train_totals *tt) {
  int batch = t->o.batch, seq = t->seq, steps = t->o.steps, start = t->start;
  int32_t *x = malloc((size_t)batch * seq * sizeof *x);
  int32_t *y = malloc((size_t)batch * seq * sizeof *y);
  memset(tt, 0, sizeof *tt);
  tt->first = NAN, tt->last = NAN;
  tt->tok_step = (long long)batch * seq * t->micro * t->nranks; /* every rank's */
  tt->ran = steps >= start ? steps - start + 1 : 0;
  if (t->ge) {
    ferry_engine_get_stats(gpt_engine_handle(t->ge), &tt->fs0);
    memcpy(tt->nvme_rd, tt->fs0.nvme_read_bytes, sizeof tt->nvme_rd);
    memcpy(tt->nvme_wr, tt->fs0.nvme_write_bytes, sizeof tt->nvme_wr);
  }
  if (t->o.stats_json && !(tt->losses = calloc((size_t)tt->ran + 1, sizeof *tt->losses))) {
    errf("out of memory\n");
    free(x), free(y);
    return 1;
  }
  double stall0 = 0;
  int status = 0;
  if (atomic_load(&g_signal) && t->nranks == 1) status = train_interrupted(t, start - 1); /* during setup */
  for (int st = start; st <= steps && !status; st++) {
    double t0 = now_s();
    float loss = 0;
    train_test_fault(t, st);
    if (t->o.cuda) status = train_step_cuda(t, st, x, y, &loss);
    else status = train_step_cpu(t, st, x, y, &loss);
    if (!status) status = train_mean_loss(t, st, &loss);
    if (status) break;
    double dt = now_s() - t0;
    tt->t_all += dt;
    if (st == start) tt->first = loss;
    tt->last = loss;
    if (tt->losses) tt->losses[st - start] = loss;
    char why[320] = "";
    /* a non-finite loss ends the run, unless dynamic (fp16) loss scaling
     * skipped the step and backed its scale off (an overflow it recovers
     * from), at most GPT_NONFINITE_SKIPS steps in a row */
    int tolerated = t->skipped && t->backed_off && t->nonfinite_run < GPT_NONFINITE_SKIPS;
    t->nonfinite_run = isfinite(loss) ? 0 : t->nonfinite_run + 1;
    if (!isfinite(loss) && !tolerated) {
      /* the mean of the ranks' losses: every rank stops here alike */
      snprintf(why, sizeof why, "step %d: the loss is %s (not finite)%s: the weights, the data "
               "or the swap data are damaged, or the learning rate is too high; stopping", st,
               isnan(loss) ? "NaN" : "infinite",
               t->skipped && t->backed_off ? " after " GPT_STR(GPT_NONFINITE_SKIPS)
                                             " steps in a row that fp16 loss scaling skipped"
                                           : "");
      t->agreed = 1;
      status = 1;
    }
    train_report_step(t, tt, st, loss, dt, &stall0, why[0] ? why : NULL);
    if (status) {
      errf("%s (no checkpoint is written after it)\n", why);
      break;
    }
    if (t->ge && t->o.save_every && st % t->o.save_every == 0) status = train_checkpoint(t, st);
    if (!status) status = train_interrupted(t, st);
  }
  free(x), free(y);
  return status;
}

/* The run's footprint once its steps are done (tt->fs: the engine's stats
 * after the last step). */
static void train_footprint(const train_run *t, const train_totals *tt, gpt_footprint *f) {
  memset(f, 0, sizeof *f);
  f->params = (uint64_t)t->s.total_numel;
  f->peak_rss = gpt_peak_rss_bytes();
  if (t->m) f->activation_bytes = gpt_model_activation_bytes(t->m);
  /* sync mode (the CPU model): host scratch; stream mode: device memory */
  if (t->ge && !t->o.cuda) f->scratch_bytes = gpt_engine_scratch_bytes(t->ge);
  f->data_bytes = t->d.n * sizeof *t->d.tokens;
  if (!t->ge) f->resident_bytes = 16 * (uint64_t)t->s.total_numel; /* w, g, m, v in fp32 */
  if (t->ge) {
    gpt_footprint_engine(f, &tt->fs);
    memcpy(f->setup_read, tt->fs0.nvme_read_bytes, sizeof f->setup_read);
    memcpy(f->setup_write, tt->fs0.nvme_write_bytes, sizeof f->setup_write);
  }
  f->steps = tt->ran;
  f->losses = tt->losses;
  f->nranks = t->nranks;
  f->rank_figs = t->rank_figs;
}

/* Several ranks: each rank's optimizer-state and tier peaks, peak RSS and
 * bytes sent, gathered on every rank (a collective) for rank 0's report. */
static int train_gather_ranks(train_run *t) {
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

/* --stats-json FILE: the footprint, the steps and their losses. */
static int train_write_stats(const train_run *t, const gpt_footprint *f) {
  char err[512];
  if (!t->o.stats_json || t->rank > 0) return 0; /* rank 0's file holds every rank's peaks */
  if (gpt_footprint_write(f, t->o.engine, t->o.stats_json, err, sizeof err)) {
    errf("--stats-json %s\n", err);
    return 1;
  }
  return 0;
}

/* The closing lines: totals, peaks, stalls and (--engine) bytes moved, then
 * the footprint (JSON keys, or the memory and nvme lines). */
static void train_report_totals(const train_run *t, train_totals *tt, gpt_footprint *f) {
  int ran = tt->ran, start = t->start;
  double tps = tt->t_all > 0 ? (double)ran * tt->tok_step / tt->t_all : 0;
  uint64_t peak[3];
  double stall = 0;
  train_peaks(t, &tt->fs, peak);
  if (t->ge) stall = tt->t_all > 0 ? 100.0 * tt->fs.stall_seconds / tt->t_all : 0;
  const ferry_stats *fs = &tt->fs;
  train_footprint(t, tt, f);
  if (t->o.json) {
    printf("{\"final\": true, \"steps\": %d, \"first_step\": %d, \"tokens\": %lld, "
           "\"seconds\": %.3f, \"tokens_per_s\": %.1f, \"first_loss\": ",
           ran, start, (long long)ran * tt->tok_step, tt->t_all, tps);
    json_number(stdout, ran ? tt->first : 0.0, "%.6f");
    printf(", \"last_loss\": ");
    json_number(stdout, ran ? tt->last : 0.0, "%.6f");
    printf(", ");
    json_peaks(peak);
    printf(", \"stall_pct\": %.1f, \"rss_bytes\": %llu", stall,
           (unsigned long long)f->peak_rss);
    if (t->ge)
      printf(", \"bytes_moved\": {\"h2d\": %llu, \"d2h\": %llu, \"host_to_nvme\": %llu, "
             "\"nvme_to_host\": %llu}, \"engine\": \"%s\", ",
             (unsigned long long)fs->bytes_h2d, (unsigned long long)fs->bytes_d2h,
             (unsigned long long)fs->bytes_host_to_nvme,
             (unsigned long long)fs->bytes_nvme_to_host, t->o.engine);
    else
      printf(", \"engine\": \"pre-engine (resident)\", ");
    gpt_footprint_json(f, stdout);
    printf("}\n");
  } else {
    if (ran)
      printf("done: %d steps (%d..%d), %lld tokens in %.2f s, %.0f tok/s, loss %.4f -> %.4f\n",
             ran, start, t->o.steps, (long long)ran * tt->tok_step, tt->t_all, tps, tt->first,
             tt->last);
    else
      printf("done: no step to run (the run was already at step %d = --steps)\n", start - 1);
    if (t->ge)
      printf("peaks: gpu %.1f MiB, host %.1f MiB, nvme %.1f MiB (engine tiers); process RSS "
             "%.1f MiB; stalled %.1f%% of the time; moved h2d %.1f MiB, d2h %.1f MiB, "
             "host->nvme %.1f MiB, nvme->host %.1f MiB\n",
             peak[0] / MiB, peak[1] / MiB, peak[2] / MiB, f->peak_rss / MiB, stall,
             fs->bytes_h2d / MiB, fs->bytes_d2h / MiB, fs->bytes_host_to_nvme / MiB,
             fs->bytes_nvme_to_host / MiB);
    else
      printf("peak host %.1f MiB (process RSS)\n", f->peak_rss / MiB);
  }
  gpt_footprint_print(f, t->info);
  fflush(stdout);
}

/* --timeline: the engine's Chrome trace. */
static int train_write_timeline(const train_run *t) {
  if (!t->ge || !t->o.timeline) return 0;
  char path[4200];
  const char *p = t->o.timeline;
  if (t->nranks > 1) { /* one file per rank: a.json -> a.rank<R>.json */
    const char *slash = strrchr(p, '/'), *dot = strrchr(p, '.');
    if (!dot || (slash && dot < slash) || dot == (slash ? slash + 1 : p)) dot = p + strlen(p);
    snprintf(path, sizeof path, "%.*s.rank%d%.100s", (int)(dot - p) > 4000 ? 4000 : (int)(dot - p),
             p, t->rank, dot);
    p = path;
  }
  if (ferry_engine_write_timeline(gpt_engine_handle(t->ge), p)) {
    errf("--timeline %s: %s\n", p, ferry_engine_last_error(gpt_engine_handle(t->ge)));
    return 1;
  }
  fprintf(t->info, "ferry-gpt: wrote the timeline %s%s (Chrome trace JSON: chrome://tracing or "
          "https://ui.perfetto.dev)\n", p, t->nranks > 1 ? " and one per other rank" : "");
  return 0;
}

/* --save DIR: the weights (fp32 safetensors, from the engine or host
 * memory) and config.json. */
/* --save with ranks: rank 0's reader. Sharded masters make
 * ferry_param_read a collective, so rank 0 first tells the other ranks
 * which tensor it reads next (a broadcast of its index). */
static int read_for_ranks(void *user, int i, float *dst) {
  train_run *t = user;
  int32_t idx = i;
  if (ferry_comm_broadcast(t->comm, &idx, 1, FERRY_DT_I32, 0, NULL, NULL)) return -1;
  return gpt_engine_read(t->ge, i, dst);
}

/* --save with ranks, ranks > 0: read each tensor rank 0 names, in its order,
 * until it says -1 (done). */
static int train_save_follow(train_run *t) {
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

static int train_save(train_run *t) {
  const char *dir = t->o.save;
  if (!dir) return 0;
  if (t->nranks > 1 && t->rank > 0) return train_save_follow(t); /* rank 0 writes */
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    errf("--save %s: %s\n", dir, strerror(errno));
    return 1;
  }
  int bad;
  if (t->nranks > 1) {
    bad = gpt_weights_save_with(&t->s, read_for_ranks, t, dir, 2ull << 30, t->err, sizeof t->err);
    int32_t done = -1; /* the other ranks stop reading */
    if (!bad && ferry_comm_broadcast(t->comm, &done, 1, FERRY_DT_I32, 0, NULL, NULL))
      bad = 1, snprintf(t->err, sizeof t->err, "--save: %s", ferry_comm_last_error(t->comm));
  } else if (t->ge) {
    bad = gpt_weights_save_with(&t->s, gpt_engine_read, t->ge, dir, 2ull << 30, t->err,
                                sizeof t->err);
  } else {
    bad = gpt_weights_save(&t->s, &t->p, dir, 2ull << 30, t->err, sizeof t->err);
  }
  if (bad) {
    errf("%s\n", t->err);
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%.4000s/config.json", dir);
  if (write_config_json(path, &t->cfg)) {
    errf("cannot write %s\n", path);
    return 1;
  }
  fprintf(t->info, "ferry-gpt: saved %s (model safetensors + config.json)\n", dir);
  return 0;
}

static int cmd_train(int argc, char **argv) {
  train_run t;
  memset(&t, 0, sizeof t);
  if (parse_train(argc, argv, &t.o)) return 0;
  t.micro = 1, t.start = 1, t.nranks = 1;
  train_logger(&t); /* before anything that logs; the engine config may change its level */
  install_signals();
  int rc = train_check_device(&t);
  if (!rc) rc = train_load(&t);
  if (!rc) rc = train_comm(&t);
  if (!rc) rc = t.fc ? train_setup_engine(&t) : train_setup_resident(&t);
  if (!rc) rc = train_make_model(&t);
  train_totals tt;
  memset(&tt, 0, sizeof tt);
  if (!rc) rc = train_steps(&t, &tt);
  if (!rc) rc = train_gather_ranks(&t);
  if (!rc) {
    gpt_footprint f;
    train_report_totals(&t, &tt, &f);
    int bad_stats = train_write_stats(&t, &f);
    int bad_timeline = train_write_timeline(&t);
    int bad_save = train_save(&t);
    rc = bad_stats || bad_timeline || bad_save;
  }
  /* a rank that fails alone ends the job, so that no other rank waits for
   * it (an error every rank reached alike, a refusal of usage, does not) */
  if (rc && t.nranks > 1 && !t.agreed) {
    fflush(stdout);
    ferry_comm_abort(t.comm, rc);
  }
  free(tt.losses);
  train_free(&t);
  if (t.comm) ferry_comm_destroy(t.comm);
  if (t.quiet) fclose(t.quiet);
  return rc;
}

/* Everything `sample` is told (--threads is applied as it is read). */
typedef struct {
  const char *model, *weights, *prompt, *tokdir;
  int ntok;
  float temp;
  uint64_t seed;
} sample_opts;

/* 0: parsed; 1: --help printed. Bad usage exits 2. */
static int parse_sample(int argc, char **argv, sample_opts *o) {
  static const struct option opts[] = {
      {"model", 1, 0, O_MODEL}, {"weights", 1, 0, O_WEIGHTS}, {"prompt", 1, 0, O_PROMPT},
      {"tokens", 1, 0, O_TOKENS}, {"temperature", 1, 0, O_TEMP}, {"seed", 1, 0, O_SEED},
      {"tokenizer", 1, 0, O_TOK}, {"threads", 1, 0, O_THREADS}, {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (sample_opts){.prompt = "\n", .ntok = 64, .temp = 0.8f, .seed = 1};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; break;
    case O_WEIGHTS: o->weights = optarg; break;
    case O_PROMPT: o->prompt = optarg; break;
    case O_TOKENS: o->ntok = parse_int(optarg, "--tokens", 0, 1000000); break;
    case O_TEMP: o->temp = (float)parse_double(optarg, "--temperature"); break;
    case O_SEED: o->seed = (uint64_t)parse_int(optarg, "--seed", 0, 2147483647); break;
    case O_TOK: o->tokdir = optarg; break;
    case O_THREADS: openblas_set_num_threads(parse_int(optarg, "--threads", 1, 1024)); break;
    case 'h': fputs(k_sample_help, stdout); return 1;
    default: die_usage("bad option for sample");
    }
  }
  if (optind < argc) die_usage("unexpected argument");
  if (!o->model) die_usage("sample needs --model");
  if (!o->weights) die_usage("sample needs --weights");
  return 0;
}

/* The next token from the logits lg of V ids: the most likely one at
 * temperature 0, else one drawn from softmax(lg / temp) (pr: V floats of
 * scratch). */
static int sample_pick(const float *lg, int V, float temp, float *pr, uint64_t *rng) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (lg[v] > lg[best]) best = v;
  int next = best;
  if (temp > 0) {
    double sum = 0;
    for (int v = 0; v < V; v++) sum += pr[v] = expf((lg[v] - lg[best]) / temp);
    double u = (double)(gpt_rand(rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (next = 0; next < V - 1; next++)
      if ((acc += pr[next]) > u) break;
  }
  return next;
}

/* Writes o->ntok sampled tokens after the prompt's `n` ids (ids grows). */
static int sample_generate(const sample_opts *o, const gpt_config *cfg, gpt_tokenizer *tok,
                           gpt_model *m, gpt_provider *p, int T, int32_t **ids, size_t *n,
                           size_t *cap) {
  int32_t *win = calloc((size_t)T, sizeof *win);
  float *pr = malloc((size_t)cfg->vocab * sizeof *pr);
  int rc = win && pr ? 0 : 1;
  if (rc) errf("out of memory\n");
  uint64_t rng = o->seed;
  int V = gpt_tokenizer_vocab(tok) < cfg->vocab ? gpt_tokenizer_vocab(tok) : cfg->vocab;
  for (int k = 0; k < o->ntok && !rc; k++) {
    size_t len = *n < (size_t)T ? *n : (size_t)T;
    memset(win, 0, (size_t)T * sizeof *win);
    memcpy(win, *ids + *n - len, len * sizeof *win); /* causal: padding after len is never seen */
    if (gpt_model_forward(m, p, win, NULL, NULL)) {
      errf("%s\n", gpt_model_last_error(m));
      rc = 1;
      break;
    }
    const float *lg = gpt_model_logits(m) + (len - 1) * (size_t)cfg->vocab;
    int next = sample_pick(lg, V, o->temp, pr, &rng);
    if (*n == *cap) {
      size_t nc = *cap ? *cap * 2 : 64;
      int32_t *ni = realloc(*ids, nc * sizeof *ni);
      if (!ni) {
        errf("out of memory\n");
        rc = 1;
        break;
      }
      *ids = ni;
      *cap = nc;
    }
    (*ids)[(*n)++] = next;
    char b[64];
    size_t bl = gpt_tokenizer_decode(tok, next, b, sizeof b);
    fwrite(b, 1, bl, stdout);
    fflush(stdout);
  }
  free(win);
  free(pr);
  return rc;
}

static int cmd_sample(int argc, char **argv) {
  sample_opts o;
  if (parse_sample(argc, argv, &o)) return 0;
  gpt_config cfg;
  load_model_config(o.model, &cfg);
  gpt_tokenizer *tok = load_tokenizer(o.tokdir);
  gpt_schema s = {0};
  gpt_resident r = {0};
  gpt_model *m = NULL;
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  char err[1024];
  int rc = 1; /* every exit below goes through `out`, which frees what is held */
  if (gpt_schema_build(&cfg, &s) || gpt_resident_init(&r, &s)) goto out;
  gpt_provider p = gpt_resident_provider(&r);
  if (gpt_weights_load(&s, &p, o.weights, err, sizeof err)) {
    errf("%s\n", err);
    goto out;
  }
  int T = cfg.max_seq < 256 ? cfg.max_seq : 256;
  gpt_run_config run = {.batch = 1, .seq = T};
  if (gpt_model_create(&s, &run, &m)) goto out;
  if (gpt_tokenizer_encode(tok, o.prompt, strlen(o.prompt), &ids, &n, &cap) || n == 0) {
    errf("the prompt encodes to no tokens\n");
    goto out;
  }
  fputs(o.prompt, stdout);
  rc = sample_generate(&o, &cfg, tok, m, &p, T, &ids, &n, &cap);
  if (!rc) printf("\n");
out:
  free(ids);
  gpt_model_free(m);
  gpt_resident_free(&r);
  gpt_tokenizer_free(tok);
  gpt_schema_free(&s);
  return rc;
}

/* OpenBLAS's worker threads each map a GEMM buffer (about 128 MiB) as
 * they start, when the library loads, and retry forever at 100% CPU when an
 * address-space limit (ulimit -v) refuses it. So under a limit that cannot
 * hold one per core beside 512 MiB for the rest, and with no thread count
 * of the user's in the environment, ferry-gpt runs itself again at once
 * (gpt_blas_start, blas.c: 1 returned) with OPENBLAS_NUM_THREADS set to
 * what fits (at least 1: no workers). */
static int fit_blas_threads(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return 0;
  if (getenv("OPENBLAS_NUM_THREADS") || getenv("GOTO_NUM_THREADS") || getenv("OMP_NUM_THREADS"))
    return 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const uint64_t per = 136ull << 20, keep = 512ull << 20;
  uint64_t lim = (uint64_t)rl.rlim_cur;
  long fit = lim > keep ? (long)((lim - keep) / per) : 0;
  if (fit < 1) fit = 1;
  if (cores < 1 || fit >= cores) return 0;
  char v[32], c[32];
  snprintf(v, sizeof v, "%ld", fit);
  snprintf(c, sizeof c, "%ld", cores);
  return !setenv("OPENBLAS_NUM_THREADS", v, 1) && !setenv("FERRY_GPT_BLAS_FITTED", c, 1);
}

int main(int argc, char **argv) {
  gpt_blas_start(argv, fit_blas_threads()); /* OpenBLAS's threads and kernel: one restart */
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    fputs(k_main_help, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "help")) {
    if (argc > 2 && !strcmp(argv[2], "train")) fputs(k_train_help, stdout);
    else if (argc > 2 && !strcmp(argv[2], "sample")) fputs(k_sample_help, stdout);
    else fputs(k_main_help, stdout);
    return 0;
  }
  if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
  if (!strcmp(argv[1], "sample")) return cmd_sample(argc - 1, argv + 1);
  errf("unknown command '%s' (train, sample, help)\n", argv[1]);
  return 2;
}
