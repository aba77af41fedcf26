/* cli/checkpoint.c — `ferry checkpoint verify|info DIR`: check a checkpoint
 * (ferry_checkpoint_verify: manifest, every file's size and CRC32C, the
 * tensor headers) or print what it holds (format/checkpoint_info.c), as
 * text or JSON, without an engine.
 */
#include "cli/cli.h"

#include "core/untrusted.h"
#include "ferry.h"
#include "format/checkpoint_info.h"

#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry checkpoint verify DIR [--json]\n"
          "       ferry checkpoint info DIR [--json]\n"
          "\n"
          "Checks or describes a checkpoint written by ferry_checkpoint_save or\n"
          "`ferry-gpt train --save`, without an engine, a model or a GPU.\n"
          "\n"
          "DIR is one checkpoint folder (it holds a manifest, e.g. ckpt/step-000000000200),\n"
          "a folder of them, where the newest step-<N> is taken, as a load takes it, or\n"
          "the folder `ferry-gpt train --save DIR` wrote (its checkpoints/), as --resume.\n"
          "\n"
          "verify  reads the whole checkpoint: the manifest (every line and its CRC32C),\n"
          "        every file it lists (present, a regular file, its size, the CRC32C of\n"
          "        every byte), and the safetensors headers of params/ and optim/ against\n"
          "        the tensor count of the manifest. Prints \"ok\" with the step, the\n"
          "        tensors and the bytes read, or names the file and the check that failed.\n"
          "info    prints what the checkpoint holds from its manifest and tensor headers\n"
          "        (no file data is read and no file CRC checked: use verify for that):\n"
          "        format version, step, param dtype, optimizer and its state layout,\n"
          "        ranks and dist.zero_stage (format 3), the loss scaler, the tensor\n"
          "        families (params, master, exp_avg, exp_avg_sq, ... as optim/ holds\n"
          "        them) with count, dtype and size, the caller's blob (user.bin), and\n"
          "        every file with its size and CRC32C.\n"
          "\n"
          "options:\n"
          "  --json      one JSON object on stdout instead of text (sizes in bytes);\n"
          "              a failure also has \"ok\": false and \"error\"\n"
          "  -h, --help  this text (also `ferry help checkpoint`)\n"
          "\n"
          "exit status:\n"
          "  0  verify: the checkpoint is good; info: it was described\n"
          "  1  no checkpoint at DIR, or it is damaged (verify: any check failed; info:\n"
          "     the manifest or a tensor header); the message names the file and why\n"
          "  2  usage error\n"
          "\n"
          "examples:\n"
          "  ferry checkpoint verify runs/ckpt\n"
          "  ferry checkpoint info runs/ckpt/step-000000000200 --json\n");
}

static const char *size_text(uint64_t b, char *buf, size_t len) {
  return ferry_format_size(b, buf, len);
}

static int verify(const char *dir, int json) {
  ferry_checkpoint_info info;
  int rc = ferry_checkpoint_verify(dir, &info);
  char sz[32];
  if (json) {
    json_out j;
    json_begin(&j, stdout);
    json_str(&j, "path", rc ? dir : info.path);
    json_bool(&j, "ok", rc == 0);
    if (rc) {
      json_str(&j, "error", ferry_last_error());
    } else {
      json_int(&j, "step", info.step);
      json_uint(&j, "tensors", info.tensors);
      json_int(&j, "files", info.files);
      json_uint(&j, "total_bytes", info.total_bytes);
      json_uint(&j, "blob_bytes", info.blob_bytes);
    }
    json_end(&j);
  }
  if (rc) {
    char shown[4096]; /* "checkpoint verify: FILE: why", names from files escaped */
    fprintf(stderr, "ferry %s\n", ferry_escape(ferry_last_error(), shown, sizeof shown));
    return 1;
  }
  if (!json)
    printf("%s: ok (step %lld, %llu tensors, %d files, %s verified)\n", info.path,
           (long long)info.step, (unsigned long long)info.tensors, info.files,
           size_text(info.total_bytes, sz, sizeof sz));
  return 0;
}

static void info_json(const ckpt_info *in) {
  const ckpt_manifest *m = &in->m;
  json_out j;
  json_begin(&j, stdout);
  json_str(&j, "path", in->folder);
  json_bool(&j, "ok", 1);
  json_int(&j, "format", m->version);
  json_int(&j, "step", m->step);
  if (m->version >= 3) {
    json_uint(&j, "ranks", m->ranks);
    json_uint(&j, "zero_stage", m->zero_stage);
  }
  json_str(&j, "param_dtype", m->param_dtype);
  json_str(&j, "optimizer", m->optimizer);
  json_int(&j, "states", m->states);
  json_str(&j, "state_dtype", m->state_dtype);
  json_uint(&j, "state_block", m->state_block);
  json_str(&j, "master_dtype", m->master_dtype);
  float scale;
  memcpy(&scale, &m->loss_scale_bits, sizeof scale);
  json_num(&j, "loss_scale", scale);
  json_int(&j, "good_steps", m->good_steps);
  json_int(&j, "skipped_steps", m->skipped);
  json_uint(&j, "tensors", m->tensors);
  json_uint(&j, "blob_bytes", m->blob_bytes);
  json_uint(&j, "total_bytes", in->total_bytes);
  json_open(&j, "families", '[');
  for (int i = 0; i < in->nfamilies; i++) {
    const ckpt_family *f = &in->families[i];
    json_open(&j, NULL, '{');
    json_str(&j, "name", f->name);
    json_uint(&j, "tensors", f->tensors);
    json_str(&j, "dtype", f->tensors ? f->dtype : "");
    json_uint(&j, "bytes", f->bytes);
    json_close(&j, '}');
  }
  json_close(&j, ']');
  json_open(&j, "files", '[');
  for (size_t i = 0; i < m->nfiles; i++) {
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", m->files[i].crc);
    json_open(&j, NULL, '{');
    json_str(&j, "path", m->files[i].path);
    json_uint(&j, "bytes", m->files[i].bytes);
    json_str(&j, "crc32c", crc);
    json_close(&j, '}');
  }
  json_close(&j, ']');
  json_end(&j);
}

static void info_text(const ckpt_info *in) {
  const ckpt_manifest *m = &in->m;
  char a[32], b[32];
  float scale;
  memcpy(&scale, &m->loss_scale_bits, sizeof scale);
  printf("checkpoint   %s\n", in->folder);
  printf("format       %d\n", m->version);
  printf("step         %lld\n", (long long)m->step);
  if (m->version >= 3)
    printf("ranks        %llu (dist.zero_stage %llu)\n", (unsigned long long)m->ranks,
           (unsigned long long)m->zero_stage);
  printf("params       %llu tensors, %s\n", (unsigned long long)m->tensors, m->param_dtype);
  printf("optimizer    %s, %d state%s per element in %s", m->optimizer, m->states,
         m->states == 1 ? "" : "s", m->state_dtype);
  if (!strcmp(m->state_dtype, "I8")) printf(" (blocks of %llu)", (unsigned long long)m->state_block);
  printf(", master %s\n", strcmp(m->master_dtype, "BF16") ? m->master_dtype
                                                          : "none (the bf16 params are the master)");
  printf("loss scale   %g (%lld good steps, %lld skipped)\n", (double)scale,
         (long long)m->good_steps, (long long)m->skipped);
  printf("blob         %s (user.bin)\n", size_text(m->blob_bytes, a, sizeof a));
  printf("families     %-12s %8s  %-6s %12s\n", "name", "tensors", "dtype", "size");
  for (int i = 0; i < in->nfamilies; i++) {
    const ckpt_family *f = &in->families[i];
    char name[sizeof f->name * 4]; /* from tensor names: control characters escaped */
    printf("             %-12s %8llu  %-6s %12s\n", ferry_escape(f->name, name, sizeof name),
           (unsigned long long)f->tensors,
           f->tensors ? f->dtype : "-", size_text(f->bytes, a, sizeof a));
  }
  printf("files        %zu, %s in all (checked by `ferry checkpoint verify`)\n", m->nfiles,
         size_text(in->total_bytes, b, sizeof b));
  for (size_t i = 0; i < m->nfiles; i++)
    printf("             %-40s %12s  crc32c %08x\n", m->files[i].path,
           size_text(m->files[i].bytes, a, sizeof a), m->files[i].crc);
}

static int info(const char *dir, int json) {
  ckpt_info in;
  char why[1024];
  int rc = ckpt_info_read(dir, &in, why, sizeof why);
  if (rc) {
    if (json) {
      json_out j;
      json_begin(&j, stdout);
      json_str(&j, "path", dir);
      json_bool(&j, "ok", 0);
      json_str(&j, "error", why);
      json_end(&j);
    }
    char shown[4096];
    fprintf(stderr, "ferry checkpoint info: %s\n", ferry_escape(why, shown, sizeof shown));
    return 1;
  }
  if (json) info_json(&in);
  else info_text(&in);
  ckpt_info_free(&in);
  return 0;
}

int cli_checkpoint(int argc, char **argv) {
  int json = 0;
  const char *sub = NULL, *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      json = 1;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ferry checkpoint: unknown option '%s' (see ferry checkpoint --help)\n",
              argv[i]);
      return 2;
    } else if (!sub) {
      sub = argv[i];
    } else if (!dir) {
      dir = argv[i];
    } else {
      fprintf(stderr, "ferry checkpoint: unexpected argument '%s' (one DIR)\n", argv[i]);
      return 2;
    }
  }
  if (!sub) {
    usage(stderr);
    return 2;
  }
  if (strcmp(sub, "verify") && strcmp(sub, "info")) {
    fprintf(stderr, "ferry checkpoint: unknown subcommand '%s' (expected verify or info)\n", sub);
    return 2;
  }
  if (!dir || !dir[0]) {
    fprintf(stderr, "ferry checkpoint %s: needs a DIR (a checkpoint folder or a folder of them)\n",
            sub);
    return 2;
  }
  /* a `ferry-gpt --save DIR` folder, as --resume takes it: its checkpoints/ */
  char saved[4096];
  struct stat st;
  if ((size_t)snprintf(saved, sizeof saved, "%s/checkpoints", dir) < sizeof saved &&
      !stat(saved, &st) && S_ISDIR(st.st_mode)) {
    char man[4200];
    snprintf(man, sizeof man, "%s/manifest", dir);
    if (stat(man, &st)) dir = saved;
  }
  return !strcmp(sub, "verify") ? verify(dir, json) : info(dir, json);
}
