/* examples/gpt/args.c — ferry-gpt's arguments: the --help texts of the
 * program, `train` and `sample`, and their option parsing into train_opts
 * and sample_opts (bad usage is refused here, exit 2, naming the option).
 */
#include "app.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const k_train_help =
    "NAME\n"
    "    ferry-gpt train - train or fine-tune a GPT-2 or Llama model\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt train --model PRESET|config.json|DIR --data FILE [--weights FILE|DIR]\n"
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
    "    --model PRESET|FILE|DIR  tiny (GPT-2 style, ~1M params), small (~10M), gpt2 (124M),\n"
    "                          llama-tiny, llama-small, llama-1b (TinyLlama-1.1B's shape),\n"
    "                          llama-2-7b, llama-2-13b, a Hugging Face config.json with\n"
    "                          model_type gpt2 or llama, or a Hugging Face model folder:\n"
    "                          DIR/config.json, its weights when it holds model.safetensors\n"
    "                          (or model.safetensors.index.json + shards) and its\n"
    "                          tokenizer.json; --weights and --tokenizer still win.\n"
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
    "                          rank reads its shard of the masters), and with a\n"
    "                          tokenizer.json its tokenizer files: a folder transformers\n"
    "                          loads as is (AutoModelForCausalLM, AutoTokenizer) and\n"
    "                          --model DIR reads back.\n"
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
    "    --tokenizer PATH      a tokenizer.json, or a folder with tokenizer.json or GPT-2's\n"
    "                          vocab.json + merges.txt (default: bytes, 256 ids).\n"
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
    "                          nvme} (peak optimizer-state and param bytes per tier),\n"
    "                          nvme_file_bytes / nvme_data_bytes (the swap files on disk,\n"
    "                          the chunks' bytes in them) and ranks. Without --engine the engine's keys are 0. With N ranks\n"
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
    "    ferry-gpt train --model small --data docs/FERRY-GPT.md --engine examples/configs/resident.cfg \\\n"
    "        --steps 200 --batch 8 --seq 256 --lr 1e-3 --save out/\n"
    "    # fine-tune a Hugging Face folder (config.json, model.safetensors, tokenizer.json)\n"
    "    ferry-gpt train --model gpt2-folder/ --data /usr/share/common-licenses/GPL-3 --save tuned/\n"
    "    ferry-gpt train --model small --data /usr/share/common-licenses/GPL-3 \\\n"
    "        --engine examples/configs/offload-nvme.cfg --steps 30 --timeline build/gpt.json\n"
    "    # checkpoint every 50 steps; after a crash the same command with --resume goes on\n"
    "    ferry-gpt train --model small --data docs/FERRY-GPT.md --engine examples/configs/resident.cfg \\\n"
    "        --steps 1000 --save out/ --save-every 50 --keep 3\n"
    "    ferry-gpt train --model small --data docs/FERRY-GPT.md --engine examples/configs/resident.cfg \\\n"
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
    "    signal SIG just before each checkpoint save (tests/gpt/signals.py).\n"
    "    FERRY_GPT_TEST_SLOW_CANCEL=S: each time the engine's set-up asks whether it is\n"
    "    cancelled, wait S seconds first (a slow zeroing of the homes; tests/gpt/signals.py).\n";

const char *const k_sample_help =
    "NAME\n"
    "    ferry-gpt sample - generate text from a GPT-2 or Llama model\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt sample --model PRESET|config.json|DIR [--weights FILE|DIR] --prompt TEXT\n"
    "                     [--tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                     [--eos ID] [--seed K] [--tokenizer DIR] [--device cpu|cuda] [--json]\n"
    "\n"
    "DESCRIPTION\n"
    "    Encodes TEXT as the tokenizer's encode does (with the bos / eos its\n"
    "    post-processor puts around a text, as transformers' tokenizer(TEXT)), then appends N tokens, each drawn from the softmax of the model's\n"
    "    last logits divided by T (T = 0: the most likely token), cut to the K most\n"
    "    likely and then to the fewest whose probability reaches P. Each token is\n"
    "    written as it comes; the eos id ends the text. A KV cache keeps every layer's\n"
    "    keys and values, so a token costs one position's work; the context is the\n"
    "    model's max_position_embeddings (when it fills, the cache restarts from the\n"
    "    last half). Prints the prompt and the continuation on stdout, and the tokens\n"
    "    sampled, the elapsed time and tokens/s on stderr.\n"
    "\n"
    "OPTIONS\n"
    "    --model PRESET|FILE|DIR  as for train; the folder train --save wrote gives the\n"
    "                          config, the weights and the tokenizer.\n"
    "    --weights FILE|DIR    safetensors weights (required unless --model DIR holds them:\n"
    "                          random weights say nothing).\n"
    "    --prompt TEXT         the start of the text (default: a newline).\n"
    "    --tokens N            tokens to generate (default 64).\n"
    "    --temperature T       sampling temperature (default 0.8; 0 = greedy).\n"
    "    --top-k K             keep the K most likely tokens (default 0: all).\n"
    "    --top-p P             then the fewest whose probability reaches P (default 1).\n"
    "    --eos ID              stop after token ID (default: the config.json's\n"
    "                          eos_token_id, none for a preset; -1: none).\n"
    "    --seed K              seed of the sampler (default 1).\n"
    "    --tokenizer PATH      a tokenizer.json, or a folder with tokenizer.json or GPT-2's\n"
    "                          vocab.json + merges.txt (see ferry-gpt tokenize --help).\n"
    "    --device cpu|cuda     where the forward runs (default cpu); cuda: fp32 weights\n"
    "                          and KV cache in device memory, the sampler on the CPU.\n"
    "    --json                write no text as it comes; at the end one JSON object:\n"
    "                          prompt_ids (the encoded prompt), ids (the tokens drawn)\n"
    "                          and text (their decoding).\n"
    "    -h, --help            this text.\n"
    "\n"
    "EXIT STATUS\n"
    "    0 on success, 1 on a runtime failure, 2 on bad usage.\n";

const char *const k_main_help =
    "NAME\n"
    "    ferry-gpt - train and sample GPT-2 / Llama models with ferry\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt train  --model ... --data FILE [options]\n"
    "    ferry-gpt sample --model DIR --prompt TEXT [options]\n"
    "    ferry-gpt tokenize [--tokenizer PATH] [--decode] < TEXT\n"
    "    ferry-gpt help [train|sample|tokenize]\n"
    "\n"
    "DESCRIPTION\n"
    "    The example trainer of ferry: one decoder-only transformer covering GPT-2\n"
    "    (LayerNorm, GELU, learned positions, tied embeddings) and Llama (RMSNorm, rotary\n"
    "    positions, SwiGLU, grouped-query attention), weights in safetensors with Hugging\n"
    "    Face names. `ferry-gpt COMMAND --help` describes each command.\n";

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

enum { O_MODEL = 256, O_WEIGHTS, O_DATA, O_ENGINE, O_STEPS, O_BATCH, O_SEQ, O_LR, O_WD, O_SEED,
       O_SAVE, O_JSON, O_CKPT, O_TOK, O_THREADS, O_PROMPT, O_TOKENS, O_TEMP, O_DEVICE, O_SET,
       O_TIMELINE, O_SAVE_EVERY, O_KEEP, O_RESUME, O_STATS_JSON, O_COMM, O_DATA_STREAM, O_STRICT_WEIGHTS, O_LOG_LEVEL,
       O_TOP_K, O_TOP_P, O_EOS };

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
int log_level_of(const char *w) {
  static const char *names[] = {"silent", "error", "warn", "info", "debug"};
  for (int i = 0; i < 5; i++)
    if (!strcmp(w, names[i])) return i;
  return -1;
}

/* 0: parsed; 1: --help printed. Bad usage exits 2. */
int parse_train(int argc, char **argv, train_opts *o) {
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
  model_dir_defaults(o->model, &o->weights, &o->tokdir);
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

/* 0: parsed; 1: --help printed. Bad usage exits 2. */
int parse_sample(int argc, char **argv, sample_opts *o) {
  static const struct option opts[] = {
      {"model", 1, 0, O_MODEL}, {"weights", 1, 0, O_WEIGHTS}, {"prompt", 1, 0, O_PROMPT},
      {"tokens", 1, 0, O_TOKENS}, {"temperature", 1, 0, O_TEMP}, {"seed", 1, 0, O_SEED},
      {"tokenizer", 1, 0, O_TOK}, {"threads", 1, 0, O_THREADS}, {"help", 0, 0, 'h'},
      {"top-k", 1, 0, O_TOP_K}, {"top-p", 1, 0, O_TOP_P}, {"eos", 1, 0, O_EOS},
      {"device", 1, 0, O_DEVICE}, {"json", 0, 0, O_JSON},
      {0, 0, 0, 0}};
  *o = (sample_opts){.prompt = "\n", .ntok = 64, .temp = 0.8f, .top_p = 1, .eos = -2, .seed = 1};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; break;
    case O_WEIGHTS: o->weights = optarg; break;
    case O_PROMPT: o->prompt = optarg; break;
    case O_TOKENS: o->ntok = parse_int(optarg, "--tokens", 0, 1000000); break;
    case O_TEMP: o->temp = (float)parse_double(optarg, "--temperature"); break;
    case O_TOP_K: o->top_k = parse_int(optarg, "--top-k", 0, 1 << 30); break;
    case O_TOP_P: o->top_p = (float)parse_double(optarg, "--top-p"); break;
    case O_EOS: o->eos = parse_int(optarg, "--eos", -1, 1 << 30); break;
    case O_DEVICE:
      if (!strcmp(optarg, "cuda")) o->cuda = 1;
      else if (strcmp(optarg, "cpu")) die_usage("--device is cpu or cuda");
      break;
    case O_SEED: o->seed = (uint64_t)parse_int(optarg, "--seed", 0, 2147483647); break;
    case O_TOK: o->tokdir = optarg; break;
    case O_JSON: o->json = 1; break;
    case O_THREADS: openblas_set_num_threads(parse_int(optarg, "--threads", 1, 1024)); break;
    case 'h': fputs(k_sample_help, stdout); return 1;
    default: die_usage("bad option for sample");
    }
  }
  if (optind < argc) die_usage("unexpected argument");
  if (!o->model) die_usage("sample needs --model");
  model_dir_defaults(o->model, &o->weights, &o->tokdir);
  if (!o->weights) die_usage("sample needs --weights (or --model DIR holding model.safetensors)");
  if (!(o->temp >= 0)) die_usage("--temperature must be 0 or more");
  if (!(o->top_p > 0 && o->top_p <= 1)) die_usage("--top-p must be in (0, 1]");
  return 0;
}
