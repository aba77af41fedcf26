/* examples/gpt/main.c — the ferry-gpt program: `train` (fine-tune or train a
 * GPT-2 / Llama model on a text or token file) and `sample` (generate text).
 * `train --engine CFG` runs on ferry's engine (gpt_engine provider: the
 * config's placement, the engine's optimizer and step); without --engine it
 * runs the pre-engine path (everything resident in host memory, AdamW).
 */
#include "gpt.h"
#ifdef GPT_HAVE_CUDA
#include "gpt_cuda.h"
#endif

#include "ferry.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

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
    "                    [--save-every N [--keep K]] [--resume DIR]\n"
    "\n"
    "DESCRIPTION\n"
    "    Trains a decoder-only transformer with AdamW on next-token prediction. Batches of\n"
    "    B windows of S+1 tokens are drawn from FILE at offsets chosen by a generator seeded\n"
    "    with K, so the same command gives the same losses.\n"
    "\n"
    "    With --engine, every parameter lives in ferry's engine, placed as the config says\n"
    "    (GPU budget, host, NVMe; see examples/configs/), and the engine's optimizer (the\n"
    "    config's optimizer.*, precision.*, clip_grad_norm, grad_accumulation micro-batches\n"
    "    of B sequences per step) does the step. The model computes in fp32 on the CPU over\n"
    "    the emulated GPU (device = \"host\"). Without --engine: the pre-engine path, every\n"
    "    weight, gradient and AdamW state in host memory, a plain AdamW in this example.\n"
    "\n"
    "    One line per step: step, loss, tokens per second, peak bytes per engine tier (gpu,\n"
    "    host, nvme; without --engine: the process's peak RSS as host) and the share of the\n"
    "    step's wall time spent waiting for transfers (stall).\n"
    "\n"
    "OPTIONS\n"
    "    --model PRESET|FILE   tiny (GPT-2 style, ~1M params), small (~10M), gpt2 (124M),\n"
    "                          llama-tiny, llama-small, or a Hugging Face config.json with\n"
    "                          model_type gpt2 or llama.\n"
    "    --weights FILE|DIR    start from these safetensors weights (one file, a folder with\n"
    "                          model.safetensors or a sharded index); Hugging Face names.\n"
    "                          Without it the weights are initialised from --seed.\n"
    "    --data FILE           training data: text (tokenized), or token ids as uint16\n"
    "                          (.u16, .bin) or uint32 (.u32).\n"
    "    --engine FILE         train on ferry's engine with this configuration (.cfg; keys in\n"
    "                          docs/CONFIG.md). Missing tiers.nvme.paths directories are made.\n"
    "    --set KEY=VALUE       with --engine: override one config key after the file (any\n"
    "                          number of times), e.g. --set tiers.gpu.budget=64M.\n"
    "    --timeline FILE       with --engine: write the engine's timeline (Chrome trace\n"
    "                          JSON) at the end.\n"
    "    --steps N             optimizer steps (default 10).\n"
    "    --batch B             sequences per step (default 4).\n"
    "    --seq S               tokens per sequence (default 128, at most the model's\n"
    "                          positions).\n"
    "    --lr LR               AdamW learning rate (default 3e-4); betas 0.9/0.999, eps 1e-8.\n"
    "                          With --engine: sets optimizer.lr (default: the config's).\n"
    "    --weight-decay WD     decoupled weight decay on matrices (default 0.1). With\n"
    "                          --engine: sets optimizer.weight_decay, which applies to every\n"
    "                          tensor (default: the config's).\n"
    "    --seed K              seed of the init and the batch sampler (default 1).\n"
    "    --save DIR            write DIR/model.safetensors (fp32, Hugging Face names) and\n"
    "                          DIR/config.json at the end.\n"
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
    "                          difference, when the seed, model, --batch, --seq, data,\n"
    "                          tokenizer or an engine key that changes the numbers\n"
    "                          (optimizer.*, precision.*, clip_grad_norm, grad_accumulation)\n"
    "                          differ from the saving run; placement, tiers and chunk size\n"
    "                          may change. The weights come from the checkpoint (--weights\n"
    "                          is ignored). Pass --save-every again to keep saving.\n"
    "    --checkpoint          activation checkpointing: keep only block inputs and\n"
    "                          recompute each block in the backward pass.\n"
    "    --tokenizer DIR       GPT-2 BPE from DIR/vocab.json and DIR/merges.txt (default:\n"
    "                          bytes, 256 ids).\n"
    "    --threads N           OpenBLAS threads (default: OpenBLAS's choice).\n"
    "    --device cpu|cuda     where the model computes (default cpu). cuda: the CUDA\n"
    "                          kernels (bf16 GEMMs, fp32 accumulation) on GPU 0 with the\n"
    "                          weights resident on the device; the pre-engine AdamW still\n"
    "                          steps on the host (grads down, weights up each step).\n"
    "    --json                one JSON object per step instead of the progress line:\n"
    "                          {\"step\", \"loss\", \"tokens_per_s\", \"peak_bytes\": {\"gpu\",\n"
    "                          \"host\", \"nvme\"}, \"stall_pct\"}, then one with \"final\": true\n"
    "                          and totals (\"steps\" this process ran from \"first_step\";\n"
    "                          with --engine also \"bytes_moved\"). Losses print as %.9g:\n"
    "                          every bit of the fp32 value.\n"
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
    "    0 on success, 1 on a runtime failure (also: no checkpoint in --resume DIR, a damaged\n"
    "    one), 2 on bad usage (also: --resume with settings other than the checkpoint's).\n";

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

static void die_usage(const char *msg) {
  fprintf(stderr, "ferry-gpt: %s (try --help)\n", msg);
  exit(2);
}

static int parse_int(const char *s, const char *opt, long lo, long hi) {
  char *e;
  errno = 0;
  long v = strtol(s, &e, 10);
  if (errno || *e || v < lo || v > hi) {
    fprintf(stderr, "ferry-gpt: %s wants an integer in [%ld, %ld], not '%s'\n", opt, lo, hi, s);
    exit(2);
  }
  return (int)v;
}

static float parse_float(const char *s, const char *opt) {
  char *e;
  float v = strtof(s, &e);
  if (*e || !isfinite(v) || v < 0) {
    fprintf(stderr, "ferry-gpt: %s wants a non-negative number, not '%s'\n", opt, s);
    exit(2);
  }
  return v;
}

static void load_model_config(const char *model, gpt_config *cfg) {
  char err[512];
  if (gpt_config_preset(model, cfg) == 0) return;
  struct stat st;
  if (stat(model, &st) != 0) {
    fprintf(stderr, "ferry-gpt: --model '%s' is neither a preset (tiny, small, gpt2, llama-tiny, "
            "llama-small) nor a file\n", model);
    exit(2);
  }
  char path[4096];
  if (S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%.4000s/config.json", model);
  else snprintf(path, sizeof path, "%.4000s", model);
  if (gpt_config_load_json(path, cfg, err, sizeof err)) {
    fprintf(stderr, "ferry-gpt: %s\n", err);
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
    fprintf(stderr, "ferry-gpt: tokenizer: %s\n", err);
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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t peak_rss(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)ru.ru_maxrss * 1024;
}

enum { O_MODEL = 256, O_WEIGHTS, O_DATA, O_ENGINE, O_STEPS, O_BATCH, O_SEQ, O_LR, O_WD, O_SEED,
       O_SAVE, O_JSON, O_CKPT, O_TOK, O_THREADS, O_PROMPT, O_TOKENS, O_TEMP, O_DEVICE, O_SET,
       O_TIMELINE, O_SAVE_EVERY, O_KEEP, O_RESUME };

enum { MAX_SETS = 32 };

/* Everything `train` is told. A new flag is a field here, an entry in
 * k_train_opts and a case in parse_train. */
typedef struct {
  const char *model, *weights, *data, *engine, *save, *tokdir, *timeline, *resume;
  int steps, batch, seq, json, ckpt, threads, cuda;
  int save_every, keep, keep_given; /* checkpoints: every N steps into save/checkpoints */
  float lr, wd;
  int lr_given, wd_given;
  uint64_t seed;
  const char *set[MAX_SETS]; /* --set KEY=VALUE, in order */
  int nset;
} train_opts;

static const struct option k_train_opts[] = {
    {"model", 1, 0, O_MODEL},     {"weights", 1, 0, O_WEIGHTS},   {"data", 1, 0, O_DATA},
    {"engine", 1, 0, O_ENGINE},   {"steps", 1, 0, O_STEPS},       {"batch", 1, 0, O_BATCH},
    {"seq", 1, 0, O_SEQ},         {"lr", 1, 0, O_LR},             {"weight-decay", 1, 0, O_WD},
    {"seed", 1, 0, O_SEED},       {"save", 1, 0, O_SAVE},         {"json", 0, 0, O_JSON},
    {"checkpoint", 0, 0, O_CKPT}, {"tokenizer", 1, 0, O_TOK},     {"threads", 1, 0, O_THREADS},
    {"device", 1, 0, O_DEVICE},   {"set", 1, 0, O_SET},           {"timeline", 1, 0, O_TIMELINE},
    {"save-every", 1, 0, O_SAVE_EVERY}, {"keep", 1, 0, O_KEEP}, {"resume", 1, 0, O_RESUME},
    {"help", 0, 0, 'h'},          {0, 0, 0, 0}};

/* 0: parsed; 1: --help printed. Bad usage exits 2. */
static int parse_train(int argc, char **argv, train_opts *o) {
  memset(o, 0, sizeof *o);
  o->steps = 10;
  o->batch = 4;
  o->lr = 3e-4f;
  o->wd = 0.1f;
  o->seed = 1;
  o->keep = 2;
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
    case O_LR: o->lr = parse_float(optarg, "--lr"), o->lr_given = 1; break;
    case O_WD: o->wd = parse_float(optarg, "--weight-decay"), o->wd_given = 1; break;
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
  if (o->engine && o->cuda)
    die_usage("--device cuda runs the pre-engine path only (no --engine yet)");
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

/* The engine configuration: the file, then --lr / --weight-decay when
 * given, then each --set; the NVMe directories made when missing. */
static ferry_config *engine_config(const train_opts *o, FILE *info) {
  ferry_config *fc;
  if (ferry_config_create(&fc)) {
    fprintf(stderr, "ferry-gpt: %s\n", ferry_last_error());
    return NULL;
  }
  if (ferry_config_load_file(fc, o->engine)) {
    fprintf(stderr, "ferry-gpt: %s\n", ferry_config_last_error(fc));
    goto fail;
  }
  char v[4096];
  if (o->lr_given) {
    snprintf(v, sizeof v, "%.9g", (double)o->lr);
    if (ferry_config_set(fc, "optimizer.lr", v)) goto bad_set;
  }
  if (o->wd_given) {
    snprintf(v, sizeof v, "%.9g", (double)o->wd);
    if (ferry_config_set(fc, "optimizer.weight_decay", v)) goto bad_set;
  }
  for (int i = 0; i < o->nset; i++) {
    char key[256];
    const char *eq = strchr(o->set[i], '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - o->set[i]), o->set[i]);
    if (ferry_config_set(fc, key, eq + 1)) goto bad_set;
  }
  if (ferry_config_get(fc, "tiers.nvme.paths", v, sizeof v) == 0 && v[0]) {
    for (char *p = v, *next; p && *p; p = next) {
      next = strchr(p, ',');
      if (next) *next++ = '\0';
      while (*p == ' ') p++;
      struct stat st;
      if (stat(p, &st) == 0) continue;
      if (make_dirs(p)) {
        fprintf(stderr, "ferry-gpt: cannot create the NVMe swap directory '%s' "
                "(tiers.nvme.paths in %s): %s\n", p, o->engine, strerror(errno));
        goto fail;
      }
      fprintf(info, "ferry-gpt: created the NVMe swap directory %s (tiers.nvme.paths)\n", p);
    }
  }
  return fc;
bad_set:
  fprintf(stderr, "ferry-gpt: %s\n", ferry_config_last_error(fc));
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
  fprintf(info, "\nferry-gpt: model states %.1f MB (%d bytes/param)\n",
          (double)s->total_numel * (pb + 16) / 1e6, pb + 16);
}

static void json_peaks(const uint64_t *peak) {
  printf("\"peak_bytes\": {\"gpu\": %llu, \"host\": %llu, \"nvme\": %llu}",
         (unsigned long long)peak[0], (unsigned long long)peak[1], (unsigned long long)peak[2]);
}

/* An early exit of train after the data is loaded: frees what is held
 * (the sanitizer builds check that refusals leak nothing). */
static int train_bail(int code, ferry_config *fc, gpt_engine *ge, gpt_data *d, gpt_tokenizer *tok,
                      gpt_schema *s) {
  if (ge) gpt_engine_free(ge);
  if (fc) ferry_config_destroy(fc);
  gpt_data_free(d);
  gpt_tokenizer_free(tok);
  gpt_schema_free(s);
  return code;
}

static int cmd_train(int argc, char **argv) {
  train_opts o;
  if (parse_train(argc, argv, &o)) return 0;
  int steps = o.steps, batch = o.batch, seq = o.seq, json = o.json, cuda = o.cuda;
  if (o.threads) openblas_set_num_threads(o.threads);
  FILE *info = json ? stderr : stdout;
#ifdef GPT_HAVE_CUDA
  char why[256];
  if (cuda && gpt_cuda_available(why, sizeof why)) {
    fprintf(stderr, "ferry-gpt: --device cuda: %s\n", why);
    return 1;
  }
#else
  if (cuda) {
    fprintf(stderr, "ferry-gpt: --device cuda: this build has no CUDA (configure with nvcc on "
            "PATH)\n");
    return 1;
  }
#endif

  ferry_config *fc = NULL;
  if (o.engine) {
    if (!(fc = engine_config(&o, info))) return 1;
  } else {
    fprintf(info, "ferry-gpt: note: no --engine: pre-engine path (all parameters resident in "
            "host memory, plain AdamW)\n");
  }

  gpt_config cfg;
  load_model_config(o.model, &cfg);
  if (!seq) seq = cfg.max_seq < 128 ? cfg.max_seq : 128;
  if (seq > cfg.max_seq) {
    fprintf(stderr, "ferry-gpt: --seq %d is more than the model's %d positions\n", seq, cfg.max_seq);
    return 2;
  }
  gpt_tokenizer *tok = load_tokenizer(o.tokdir);
  if (gpt_tokenizer_vocab(tok) > cfg.vocab) {
    fprintf(stderr, "ferry-gpt: the tokenizer has %d ids but the model only %d\n",
            gpt_tokenizer_vocab(tok), cfg.vocab);
    return 1;
  }
  char err[1024], desc[256];
  gpt_schema s;
  if (gpt_schema_build(&cfg, &s)) {
    fprintf(stderr, "ferry-gpt: cannot build the model\n");
    return 1;
  }
  gpt_config_describe(&cfg, desc, sizeof desc);
  fprintf(info, "ferry-gpt: model %s; %.2fM parameters\n", desc, s.total_numel / 1e6);
  gpt_data d;
  if (gpt_data_load(&d, o.data, tok, cfg.vocab, o.seed, err, sizeof err)) {
    fprintf(stderr, "ferry-gpt: %s\n", err);
    return 1;
  }
  if (d.n < (size_t)seq + 1) {
    fprintf(stderr, "ferry-gpt: %s holds %zu tokens, fewer than --seq + 1 = %d\n", o.data, d.n,
            seq + 1);
    return 1;
  }
  gpt_resident r = {0};
  gpt_adamw opt = {0};
  gpt_engine *ge = NULL;
  gpt_provider p;
  int micro = 1, start = 1;
  gpt_resume_state rs; /* this run's fingerprint; saved with each checkpoint */
  char ck_folder[4096] = "", ck_dir[4200] = "";
  int64_t ck_step = 0;
  if (fc) {
    describe_engine(fc, &s, info);
    if (gpt_resume_fingerprint(&rs, &cfg, batch, seq, o.seed, o.data, &d, tok, fc, err,
                               sizeof err)) {
      fprintf(stderr, "ferry-gpt: %s\n", err);
      return train_bail(1, fc, ge, &d, tok, &s);
    }
    if (o.save_every) snprintf(ck_dir, sizeof ck_dir, "%.4000s/" GPT_RESUME_SUBDIR, o.save);
    if (o.resume) {
      /* find the checkpoint and check its trainer state before building the
       * engine: settings that differ are named before any tensor is read */
      if (gpt_resume_find(o.resume, ck_folder, sizeof ck_folder, &ck_step, err, sizeof err)) {
        fprintf(stderr, "ferry-gpt: --resume: %s\n", err);
        return train_bail(1, fc, ge, &d, tok, &s);
      }
      static unsigned char peek[sizeof(gpt_resume_state)];
      size_t plen;
      int crc;
      if (gpt_resume_peek(ck_folder, peek, sizeof peek, &plen) == 0 &&
          (crc = gpt_resume_check(peek, plen, &rs, NULL, err, sizeof err))) {
        /* other settings on the command line: bad usage; a foreign blob: runtime */
        fprintf(stderr, "ferry-gpt: --resume %s: %s\n", ck_folder, err);
        return train_bail(crc == -2 ? 2 : 1, fc, ge, &d, tok, &s);
      }
      if (o.weights)
        fprintf(info, "ferry-gpt: note: --resume: the weights come from the checkpoint, not "
                "--weights %s\n", o.weights);
    }
    gpt_weights_src *src;
    if (gpt_weights_src_open(&s, o.resume ? NULL : o.weights, o.seed, &src, err, sizeof err)) {
      fprintf(stderr, "ferry-gpt: %s\n", err);
      return train_bail(1, fc, ge, &d, tok, &s);
    }
    int rc = gpt_engine_create(&s, fc, NULL, src, &ge, err, sizeof err);
    gpt_weights_src_close(src);
    ferry_config_destroy(fc);
    fc = NULL;
    if (rc) {
      fprintf(stderr, "ferry-gpt: engine (%s): %s\n", o.engine, err);
      return train_bail(1, fc, ge, &d, tok, &s);
    }
    p = gpt_engine_provider(ge);
    micro = gpt_engine_micro_batches(ge);
    if (o.resume) {
      static unsigned char blob[sizeof(gpt_resume_state)];
      size_t blen = 0;
      gpt_resume_state got;
      int lrc = gpt_engine_load(ge, ck_folder, blob, sizeof blob, &blen, err, sizeof err);
      if (lrc == FERRY_EOVERFLOW) {
        fprintf(stderr, "ferry-gpt: --resume %s: its trainer state (user.bin) is %zu bytes, not "
                "the %zu of a ferry-gpt resume state: not a checkpoint of ferry-gpt train\n",
                ck_folder, blen, sizeof blob);
        return train_bail(1, fc, ge, &d, tok, &s);
      }
      if (lrc) {
        fprintf(stderr, "ferry-gpt: --resume %s: %s\n", ck_folder, err);
        return train_bail(1, fc, ge, &d, tok, &s);
      }
      int crc = gpt_resume_check(blob, blen, &rs, &got, err, sizeof err);
      if (crc) {
        fprintf(stderr, "ferry-gpt: --resume %s: %s\n", ck_folder, err);
        return train_bail(crc == -2 ? 2 : 1, fc, ge, &d, tok, &s);
      }
      if (got.next_step != ck_step + 1) {
        fprintf(stderr, "ferry-gpt: --resume %s: the folder is step %lld but its trainer state "
                "continues at step %lld: not a checkpoint of ferry-gpt train\n", ck_folder,
                (long long)ck_step, (long long)got.next_step);
        return train_bail(1, fc, ge, &d, tok, &s);
      }
      if (got.next_step > 100000001) {
        fprintf(stderr, "ferry-gpt: --resume %s: step %lld is past the largest --steps\n",
                ck_folder, (long long)ck_step);
        return train_bail(1, fc, ge, &d, tok, &s);
      }
      start = (int)got.next_step;
      d.rng = got.data_rng;
      fprintf(info, "ferry-gpt: resumed %s: %lld steps done, continuing at step %d of %d\n",
              ck_folder, (long long)ck_step, start, steps);
      if (start > steps)
        fprintf(info, "ferry-gpt: note: the checkpoint is at step %lld, --steps is %d: no step "
                "to run\n", (long long)ck_step, steps);
    }
  } else {
    if (gpt_resident_init(&r, &s) || gpt_adamw_init(&opt, s.total_numel, o.lr, o.wd)) {
      fprintf(stderr, "ferry-gpt: out of memory for %zu parameters\n", s.total_numel);
      return 1;
    }
    p = gpt_resident_provider(&r);
    if (o.weights) {
      if (gpt_weights_load(&s, &p, o.weights, err, sizeof err)) {
        fprintf(stderr, "ferry-gpt: %s\n", err);
        return 1;
      }
    } else {
      gpt_weights_init(&s, &p, o.seed);
    }
  }
  gpt_run_config rc = {.batch = batch, .seq = seq, .checkpoint = o.ckpt};
  gpt_model *m = NULL;
#ifdef GPT_HAVE_CUDA
  gpt_cuda_model *cm = NULL;
  gpt_cuda_resident cr;
  gpt_provider cp;
  if (cuda) {
    if (gpt_cuda_resident_init(&cr, &s) || gpt_cuda_resident_upload(&cr, r.weights) ||
        gpt_cuda_model_create(&s, &rc, &cm)) {
      fprintf(stderr, "ferry-gpt: --device cuda: out of device memory or CUDA failure\n");
      return 1;
    }
    cp = gpt_cuda_resident_provider(&cr);
  }
#endif
  if (!cuda && gpt_model_create(&s, &rc, &m)) {
    fprintf(stderr, "ferry-gpt: out of memory for activations (batch %d, seq %d)\n", batch, seq);
    return 1;
  }
  if (ge)
    fprintf(info, "ferry-gpt: %zu tokens of data, batch %d x seq %d x %d micro-batches, %d steps; "
            "host: %.1f MB of activations, %.1f MB of fp32 scratch\n",
            d.n, batch, seq, micro, steps, gpt_model_activation_bytes(m) / 1e6,
            gpt_engine_scratch_bytes(ge) / 1e6);
  else
    fprintf(info, "ferry-gpt: %zu tokens of data, batch %d x seq %d, %d steps, lr %g; host: "
            "%.1f MB of weights+grads+AdamW, %.1f MB of activations\n",
            d.n, batch, seq, steps, (double)o.lr, 16.0 * s.total_numel / 1e6,
            m ? gpt_model_activation_bytes(m) / 1e6 : 0.0);
  int32_t *x = malloc((size_t)batch * seq * sizeof *x), *y = malloc((size_t)batch * seq * sizeof *y);
  double t_all = 0, first = NAN, last = NAN, stall0 = 0;
  long long tok_step = (long long)batch * seq * micro;
  ferry_stats fs;
  memset(&fs, 0, sizeof fs);
  int status = 0;
  int ran = steps >= start ? steps - start + 1 : 0; /* steps this process runs */
  for (int st = start; st <= steps && !status; st++) {
    double t0 = now_s();
    float loss = 0;
#ifdef GPT_HAVE_CUDA
    if (cuda) {
      /* pre-engine: grads to the host, AdamW there, weights back up */
      gpt_data_batch(&d, batch, seq, x, y);
      if (cp.zero_grad(cp.ctx) || gpt_cuda_model_forward(cm, &cp, x, y, &loss) ||
          gpt_cuda_model_backward(cm, &cp) || gpt_cuda_resident_download_grads(&cr, r.grads)) {
        fprintf(stderr, "ferry-gpt: step %d: %s\n", st, gpt_cuda_model_last_error(cm));
        return 1;
      }
      gpt_adamw_step(&opt, &r);
      if (gpt_cuda_resident_upload(&cr, r.weights)) {
        fprintf(stderr, "ferry-gpt: step %d: upload failed\n", st);
        return 1;
      }
    } else
#endif
    {
      double sum = 0;
      for (int k = 0; k < micro && !status; k++) {
        float l;
        gpt_data_batch(&d, batch, seq, x, y);
        if (p.zero_grad(p.ctx) || gpt_model_forward(m, &p, x, y, &l) ||
            gpt_model_backward(m, &p)) {
          fprintf(stderr, "ferry-gpt: step %d: %s\n", st, gpt_model_last_error(m));
          status = 1;
        }
        sum += l;
      }
      loss = (float)(sum / micro);
      if (status) break;
      if (ge) {
        ferry_step_info si;
        if (gpt_engine_step(ge, &si)) {
          fprintf(stderr, "ferry-gpt: step %d: %s\n", st,
                  ferry_engine_last_error(gpt_engine_handle(ge)));
          status = 1;
          break;
        }
      } else {
        gpt_adamw_step(&opt, &r);
      }
    }
    double dt = now_s() - t0;
    t_all += dt;
    if (st == start) first = loss;
    last = loss;
    double tps = tok_step / dt, stall = 0;
    uint64_t peak[3] = {0, peak_rss(), 0};
    if (ge) {
      ferry_engine_get_stats(gpt_engine_handle(ge), &fs);
      for (int t = 0; t < 3; t++) peak[t] = fs.tier_peak[t];
      stall = 100.0 * (fs.stall_seconds - stall0) / dt;
      stall0 = fs.stall_seconds;
    }
    if (json) {
      printf("{\"step\": %d, \"loss\": %.9g, \"tokens_per_s\": %.1f, ", st, loss, tps);
      json_peaks(peak);
      printf(", \"stall_pct\": %.1f}\n", stall);
    } else {
      printf("step %5d/%d  loss %.4f  %8.0f tok/s  gpu %.3f GB  host %.3f GB  nvme %.3f GB  "
             "stall %.1f%%\n",
             st, steps, loss, tps, peak[0] / 1e9, peak[1] / 1e9, peak[2] / 1e9, stall);
    }
    fflush(stdout);
    if (ge && o.save_every && st % o.save_every == 0) {
      /* between steps: the engine holds step st, the sampler is at step st + 1 */
      rs.next_step = st + 1;
      rs.data_rng = d.rng;
      double t1 = now_s();
      if (gpt_engine_save(ge, ck_dir, &rs, sizeof rs, o.keep, err, sizeof err)) {
        fprintf(stderr, "ferry-gpt: step %d: checkpoint into %s: %s\n", st, ck_dir, err);
        status = 1;
        break;
      }
      fprintf(info, "ferry-gpt: checkpoint %s/step-%012d (%.2f s)\n", ck_dir, st, now_s() - t1);
    }
  }
  if (status) goto out;
  double tps = t_all > 0 ? (double)ran * tok_step / t_all : 0;
  uint64_t peak[3] = {0, peak_rss(), 0};
  double stall = 0;
  if (ge) {
    ferry_engine_get_stats(gpt_engine_handle(ge), &fs);
    for (int t = 0; t < 3; t++) peak[t] = fs.tier_peak[t];
    stall = t_all > 0 ? 100.0 * fs.stall_seconds / t_all : 0;
  }
  if (json) {
    printf("{\"final\": true, \"steps\": %d, \"first_step\": %d, \"tokens\": %lld, "
           "\"seconds\": %.3f, \"tokens_per_s\": %.1f, \"first_loss\": %.6f, "
           "\"last_loss\": %.6f, ",
           ran, start, (long long)ran * tok_step, t_all, tps, ran ? first : 0.0,
           ran ? last : 0.0);
    json_peaks(peak);
    printf(", \"stall_pct\": %.1f, \"rss_bytes\": %llu", stall, (unsigned long long)peak_rss());
    if (ge)
      printf(", \"bytes_moved\": {\"h2d\": %llu, \"d2h\": %llu, \"host_to_nvme\": %llu, "
             "\"nvme_to_host\": %llu}, \"engine\": \"%s\"}\n",
             (unsigned long long)fs.bytes_h2d, (unsigned long long)fs.bytes_d2h,
             (unsigned long long)fs.bytes_host_to_nvme, (unsigned long long)fs.bytes_nvme_to_host,
             o.engine);
    else
      printf(", \"engine\": \"pre-engine (resident)\"}\n");
  } else {
    printf("done: %d steps (%d..%d), %lld tokens in %.2f s, %.0f tok/s, loss %.4f -> %.4f\n",
           ran, start, steps, (long long)ran * tok_step, t_all, tps, ran ? first : 0.0,
           ran ? last : 0.0);
    if (ge)
      printf("peaks: gpu %.1f MB, host %.1f MB, nvme %.1f MB (engine tiers); process RSS %.1f "
             "MB; stalled %.1f%% of the time; moved h2d %.1f MB, d2h %.1f MB, host->nvme %.1f "
             "MB, nvme->host %.1f MB\n",
             peak[0] / 1e6, peak[1] / 1e6, peak[2] / 1e6, peak_rss() / 1e6, stall,
             fs.bytes_h2d / 1e6, fs.bytes_d2h / 1e6, fs.bytes_host_to_nvme / 1e6,
             fs.bytes_nvme_to_host / 1e6);
    else
      printf("peak host %.2f GB (process RSS)\n", peak_rss() / 1e9);
  }
  if (ge && o.timeline) {
    if (ferry_engine_write_timeline(gpt_engine_handle(ge), o.timeline)) {
      fprintf(stderr, "ferry-gpt: --timeline %s: %s\n", o.timeline,
              ferry_engine_last_error(gpt_engine_handle(ge)));
      status = 1;
    } else {
      fprintf(info, "ferry-gpt: wrote the timeline %s (Chrome trace JSON: chrome://tracing or "
              "https://ui.perfetto.dev)\n", o.timeline);
    }
  }
  if (o.save) {
    char path[4096];
    int bad = 0;
    if (mkdir(o.save, 0777) != 0 && errno != EEXIST) {
      fprintf(stderr, "ferry-gpt: --save %s: %s\n", o.save, strerror(errno));
      bad = 1;
    } else if (ge ? gpt_weights_save_with(&s, gpt_engine_read, ge, o.save, 2ull << 30, err,
                                          sizeof err)
                  : gpt_weights_save(&s, &p, o.save, 2ull << 30, err, sizeof err)) {
      fprintf(stderr, "ferry-gpt: %s\n", err);
      bad = 1;
    } else {
      snprintf(path, sizeof path, "%.4000s/config.json", o.save);
      if (write_config_json(path, &cfg)) {
        fprintf(stderr, "ferry-gpt: cannot write %s\n", path);
        bad = 1;
      } else {
        fprintf(info, "ferry-gpt: saved %s (model safetensors + config.json)\n", o.save);
      }
    }
    if (bad) status = 1;
  }
out:
  free(x), free(y);
  gpt_model_free(m);
#ifdef GPT_HAVE_CUDA
  if (cuda) {
    gpt_cuda_model_free(cm);
    gpt_cuda_resident_free(&cr);
  }
#endif
  gpt_engine_free(ge);
  gpt_adamw_free(&opt);
  gpt_resident_free(&r);
  gpt_data_free(&d);
  gpt_tokenizer_free(tok);
  gpt_schema_free(&s);
  return status;
}

static int cmd_sample(int argc, char **argv) {
  static const struct option opts[] = {
      {"model", 1, 0, O_MODEL}, {"weights", 1, 0, O_WEIGHTS}, {"prompt", 1, 0, O_PROMPT},
      {"tokens", 1, 0, O_TOKENS}, {"temperature", 1, 0, O_TEMP}, {"seed", 1, 0, O_SEED},
      {"tokenizer", 1, 0, O_TOK}, {"threads", 1, 0, O_THREADS}, {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  const char *model = NULL, *weights = NULL, *prompt = "\n", *tokdir = NULL;
  int ntok = 64, c;
  float temp = 0.8f;
  uint64_t seed = 1;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: model = optarg; break;
    case O_WEIGHTS: weights = optarg; break;
    case O_PROMPT: prompt = optarg; break;
    case O_TOKENS: ntok = parse_int(optarg, "--tokens", 0, 1000000); break;
    case O_TEMP: temp = parse_float(optarg, "--temperature"); break;
    case O_SEED: seed = (uint64_t)parse_int(optarg, "--seed", 0, 2147483647); break;
    case O_TOK: tokdir = optarg; break;
    case O_THREADS: openblas_set_num_threads(parse_int(optarg, "--threads", 1, 1024)); break;
    case 'h': fputs(k_sample_help, stdout); return 0;
    default: die_usage("bad option for sample");
    }
  }
  if (optind < argc) die_usage("unexpected argument");
  if (!model) die_usage("sample needs --model");
  if (!weights) die_usage("sample needs --weights");
  gpt_config cfg;
  load_model_config(model, &cfg);
  gpt_tokenizer *tok = load_tokenizer(tokdir);
  gpt_schema s;
  char err[1024];
  if (gpt_schema_build(&cfg, &s)) return 1;
  gpt_resident r;
  if (gpt_resident_init(&r, &s)) return 1;
  gpt_provider p = gpt_resident_provider(&r);
  if (gpt_weights_load(&s, &p, weights, err, sizeof err)) {
    fprintf(stderr, "ferry-gpt: %s\n", err);
    return 1;
  }
  int T = cfg.max_seq < 256 ? cfg.max_seq : 256;
  gpt_run_config rc = {.batch = 1, .seq = T};
  gpt_model *m;
  if (gpt_model_create(&s, &rc, &m)) return 1;
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  if (gpt_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n, &cap) || n == 0) {
    fprintf(stderr, "ferry-gpt: the prompt encodes to no tokens\n");
    return 1;
  }
  fputs(prompt, stdout);
  int32_t *win = calloc((size_t)T, sizeof *win);
  float *pr = malloc((size_t)cfg.vocab * sizeof *pr);
  uint64_t rng = seed;
  for (int k = 0; k < ntok; k++) {
    size_t len = n < (size_t)T ? n : (size_t)T;
    memset(win, 0, (size_t)T * sizeof *win);
    memcpy(win, ids + n - len, len * sizeof *win); /* causal: padding after len is never seen */
    if (gpt_model_forward(m, &p, win, NULL, NULL)) {
      fprintf(stderr, "ferry-gpt: %s\n", gpt_model_last_error(m));
      return 1;
    }
    const float *lg = gpt_model_logits(m) + (len - 1) * (size_t)cfg.vocab;
    int V = gpt_tokenizer_vocab(tok) < cfg.vocab ? gpt_tokenizer_vocab(tok) : cfg.vocab, best = 0;
    for (int v = 1; v < V; v++)
      if (lg[v] > lg[best]) best = v;
    int next = best;
    if (temp > 0) {
      double sum = 0;
      for (int v = 0; v < V; v++) sum += pr[v] = expf((lg[v] - lg[best]) / temp);
      double u = (double)(gpt_rand(&rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
      for (next = 0; next < V - 1; next++)
        if ((acc += pr[next]) > u) break;
    }
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      ids = realloc(ids, cap * sizeof *ids);
    }
    ids[n++] = next;
    char b[64];
    size_t bl = gpt_tokenizer_decode(tok, next, b, sizeof b);
    fwrite(b, 1, bl, stdout);
    fflush(stdout);
  }
  printf("\n");
  free(win), free(pr), free(ids);
  gpt_model_free(m);
  gpt_resident_free(&r);
  gpt_tokenizer_free(tok);
  gpt_schema_free(&s);
  return 0;
}

int main(int argc, char **argv) {
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
  fprintf(stderr, "ferry-gpt: unknown command '%s' (train, sample, help)\n", argv[1]);
  return 2;
}
