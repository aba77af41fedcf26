/* examples/gpt/train.c — `train`: the steps in order (the micro-batches'
 * forward and backward on the CPU or CUDA model, the optimizer step, the
 * loss, a checkpoint when due), then the closing report and --save.
 */
#include "app.h"
#include "core/file.h"
#include "core/outfile.h"
#include "core/untrusted.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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
  tt->startup = gpt_seconds_since_launch();
  fprintf(t->info, "ferry-gpt: start-up %.2f s (from the launch to the first step)\n", tt->startup);
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

/* --save DIR/config.json: the model as Hugging Face names its keys,
 * replacing the old file whole (core/outfile.h). */
static int write_config_json(const char *path, const gpt_config *c, const char *model, char *why,
                             size_t wl) {
  ferry_outfile o;
  if (ferry_outfile_open(&o, path, why, wl)) return -1;
  FILE *f = o.f;
  /* the token ids of the config.json --model named, carried over */
  static const char *const ids[] = {"bos_token_id", "eos_token_id"};
  fputs("{\n", f);
  for (int i = 0; i < 2; i++) {
    int id = gpt_config_token_id(model, ids[i]);
    if (id >= 0) fprintf(f, "  \"%s\": %d,\n", ids[i], id);
  }
  if (c->family == GPT_GPT2)
    fprintf(f, "  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"torch_dtype\": \"float32\",\n"
            "  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n  \"n_embd\": %d,\n"
            "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": %d,\n  \"n_positions\": %d,\n"
            "  \"layer_norm_epsilon\": %g,\n  \"activation_function\": \"gelu_new\",\n"
            "  \"tie_word_embeddings\": true\n}\n",
            c->vocab, c->d_model, c->n_layer, c->n_head, c->d_ff, c->max_seq, (double)c->norm_eps);
  else
    fprintf(f, "  \"architectures\": [\"LlamaForCausalLM\"],\n  \"torch_dtype\": \"float32\",\n"
            "  \"model_type\": \"llama\",\n  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %g,\n  \"rope_theta\": %g,\n"
            "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": %s\n}\n",
            c->vocab, c->d_model, c->n_layer, c->n_head, c->n_kv_head, c->d_ff, c->max_seq,
            (double)c->norm_eps, (double)c->rope_theta, c->tied ? "true" : "false");
  return ferry_outfile_commit(&o, why, wl) ? -1 : 0;
}

/* One tokenizer file into DIR/name, whole (core/outfile.h): from `from` (a
 * file the user named) or from folder/name. 0, or -1 with why set. */
static int copy_tokenizer_file(const char *from, const char *folder, const char *name,
                               const char *dir, char *why, size_t wl) {
  char *text, path[4200];
  size_t len;
  if (from ? ferry_read_file(from, FERRY_MAX_TOKENIZER, &text, &len, why, wl)
           : ferry_read_below(folder, name, FERRY_MAX_TOKENIZER, &text, &len, why, wl))
    return -1;
  snprintf(path, sizeof path, "%.4000s/%s", dir, name);
  ferry_outfile o;
  int bad = ferry_outfile_open(&o, path, why, wl) != 0;
  if (!bad && fwrite(text, 1, len, o.f) != len) {
    ferry_outfile_abort(&o);
    snprintf(why, wl, "%.900s: cannot write", path);
    bad = 1;
  }
  if (!bad) bad = ferry_outfile_commit(&o, why, wl) != 0;
  free(text);
  return bad ? -1 : 0;
}

/* --save DIR with a tokenizer (--tokenizer FILE, or a folder): its files
 * copied into DIR, a tokenizer.json or else GPT-2's vocab.json and
 * merges.txt, with the tokenizer_config.json and special_tokens_map.json
 * beside them; without a tokenizer_config.json, one naming the class
 * transformers' AutoTokenizer reads those files with
 * (PreTrainedTokenizerFast for tokenizer.json, GPT2Tokenizer for the pair). */
static int save_tokenizer(const train_run *t, const char *dir, char *why, size_t wl) {
  const char *tok = t->o.tokdir, *cls = "PreTrainedTokenizerFast";
  struct stat st;
  char folder[4096], file[4200];
  if (!tok || stat(tok, &st)) return 0; /* bytes: no file to copy */
  if (S_ISDIR(st.st_mode)) {
    snprintf(folder, sizeof folder, "%.4000s", tok);
    snprintf(file, sizeof file, "%.4000s/tokenizer.json", tok);
    if (!stat(file, &st)) {
      if (copy_tokenizer_file(NULL, folder, "tokenizer.json", dir, why, wl)) return -1;
    } else { /* GPT-2's pair, which the run read */
      if (copy_tokenizer_file(NULL, folder, "vocab.json", dir, why, wl) ||
          copy_tokenizer_file(NULL, folder, "merges.txt", dir, why, wl))
        return -1;
      cls = "GPT2Tokenizer";
    }
  } else {
    const char *slash = strrchr(tok, '/');
    snprintf(folder, sizeof folder, "%.*s", slash ? (int)(slash - tok) + 1 : 1, slash ? tok : ".");
    if (copy_tokenizer_file(tok, NULL, "tokenizer.json", dir, why, wl)) return -1;
  }
  static const char *const beside[] = {"special_tokens_map.json", "tokenizer_config.json"};
  int have_config = 0;
  for (int i = 0; i < 2; i++) {
    snprintf(file, sizeof file, "%.4000s/%s", folder, beside[i]);
    if (stat(file, &st)) continue;
    if (copy_tokenizer_file(NULL, folder, beside[i], dir, why, wl)) return -1;
    have_config = i == 1;
  }
  if (have_config) return 0;
  snprintf(file, sizeof file, "%.4000s/tokenizer_config.json", dir);
  ferry_outfile o;
  if (ferry_outfile_open(&o, file, why, wl)) return -1;
  fprintf(o.f, "{\n  \"tokenizer_class\": \"%s\"\n}\n", cls);
  return ferry_outfile_commit(&o, why, wl) ? -1 : 0;
}

/* --save DIR: the weights (fp32 safetensors, from the engine or host
 * memory), config.json and the tokenizer's files. */
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
  if (write_config_json(path, &t->cfg, t->o.model, t->err, sizeof t->err)) {
    errf("--save: %s\n", t->err);
    return 1;
  }
  if (save_tokenizer(t, dir, t->err, sizeof t->err)) {
    errf("--save: the tokenizer: %s\n", t->err);
    return 1;
  }
  fprintf(t->info, "ferry-gpt: saved %s (model safetensors + config.json%s)\n", dir,
          t->o.tokdir ? " + the tokenizer's files" : "");
  return 0;
}

int cmd_train(int argc, char **argv) {
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
  train_setup_over();
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
  if (rc && t.nranks > 1 && !t.agreed) train_fail_alone(&t, rc);
  free(tt.losses);
  train_free(&t);
  if (t.comm) ferry_comm_destroy(t.comm);
  if (t.quiet) fclose(t.quiet);
  return rc;
}
