/* bench/bench_all.c — `ferry bench all`: runs bench io (read, write), adam
 * (fp32 grads + bf16 copy, fp16 grads), copy (H2D, D2H) and compute (the
 * GEMMs of a model's step) through their entry points, with their --json
 * output captured and parsed, shows progress on stderr and writes the
 * profile that `ferry plan --profile` reads (the format is plan/profile.c's;
 * the file is read back with its parser). Also the writer other benchmarks
 * put their keys into a profile with (bench/profile_out.h).
 */
#include "bench/args.h"
#include "bench/bench.h"
#include "bench/profile_out.h"
#include "format/json_writer.h"
#include "core/core.h"
#include "core/file.h"
#include "core/json.h"
#include "core/outfile.h"
#include "plan/plan.h"

#include "ferry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int (*bench_fn)(int, char **);

static void usage(FILE *f) {
  fprintf(f, "usage: ferry bench all --path DIR [--quick] [--profile-out FILE] [--json]\n"
             "                       [--device auto|host|cuda] [--size SIZE] [--params N]\n"
             "                       [--threads N] [--copy-size SIZE] [--model M]\n"
             "\n"
             "Measures this machine for the planner and writes a profile that\n"
             "`ferry plan --profile FILE` reads. It runs, in order, each through its own\n"
             "entry point (each validates its result before it times):\n"
             "\n"
             "  1. ferry bench io --mode read  --bs 1M --qd 32 --size SIZE --path DIR\n"
             "  2. ferry bench io --mode write --bs 1M --qd 32 --size SIZE --path DIR\n"
             "                    --overwrite (timed rewriting, as the swap files are)\n"
             "  3. ferry bench adam --optimizer adamw --grad fp32 --param-copy bf16\n"
             "                      --params N --threads N --steps 5\n"
             "  4. ferry bench adam --optimizer adamw --grad fp16 --params N --threads N\n"
             "                      --steps 5\n"
             "  5. ferry bench copy --device KIND --size COPY-SIZE --iters 5\n"
             "                      (H2D, D2H, and both at once)\n"
             "  6. ferry bench compute --device KIND --model M --seq SEQ --iters N\n"
             "                      (SEQ 1024 and N 3; 128 and 1 with --quick)\n"
             "\n"
             "and writes these profile keys (GB/s = 1e9 bytes per second):\n"
             "\n"
             "  nvme_read_gbps      1.'s gb_per_s\n"
             "  nvme_write_gbps     2.'s gb_per_s\n"
             "  cpu_optimizer_gbps  3.'s gb_per_s: the bytes per param the planner's CPU\n"
             "                      optimizer term counts (fp32 grad in, master and states\n"
             "                      read and written, 16-bit param out); 4. is reported\n"
             "  h2d_gbps, d2h_gbps  5.'s h2d and d2h gb_per_s, on the backend chosen by\n"
             "                      --device (on the host backend these are memcpy between\n"
             "                      host buffers, not a PCIe link; the file says so)\n"
             "  device_tflops,      6.'s rate over the GEMMs of one training step of M\n"
             "  device_tflops_fp32  (cuda: bf16 and fp32 cuBLAS; host: OpenBLAS sgemm, both\n"
             "                      keys, the CPU model computes in fp32)\n"
             "\n"
             "device_mem_gbps is not measured (there is no device memory benchmark yet):\n"
             "it is left out of the file, whose \"sources\" say so, and `ferry plan` lists\n"
             "it among its assumed defaults.\n"
             "A benchmark that fails leaves its keys out the same way; the profile is\n"
             "still written and the exit status is 1.\n"
             "\n"
             "options:\n"
             "  --path DIR          folder for the I/O benchmark's file (required); put it on\n"
             "                      the drive the NVMe tier will use\n"
             "  --quick             smaller runs for a smoke test: I/O 256M, 16M params,\n"
             "                      3 steps, copies of 64M, 3 iterations, GEMMs at seq 128\n"
             "  --profile-out FILE  where to write the profile (default ferry-profile.json\n"
             "                      in the current directory); written whole, then renamed\n"
             "  --device KIND       backend of the copy benchmark (default auto: cuda when a\n"
             "                      GPU is present, else host)\n"
             "  --size SIZE         I/O file size (default 1G, 256M with --quick)\n"
             "  --params N          optimizer parameters (default 64M, 16M with --quick)\n"
             "  --threads N         optimizer threads (default: the machine's thread count)\n"
             "  --copy-size SIZE    bytes per copy (default 256M, 64M with --quick)\n"
             "  --model M           the model whose GEMMs 6. times (default gpt2; a preset\n"
             "                      or a config.json, as ferry plan --model)\n"
             "  --json              stdout: every sub-benchmark's JSON objects as they\n"
             "                      print them, then one object with keys bench (\"all\"),\n"
             "                      profile, path, device, quick, seconds, the measured\n"
             "                      profile keys, assumed[] and failed[]\n"
             "  -h, --help          this text\n"
             "\n"
             "Progress goes to stderr: one line redrawn in place when stderr is a terminal,\n"
             "a plain line per step otherwise. Sizes take k/M/G suffixes (powers of 1024).\n"
             "\n"
             "exit status: 0 every benchmark passed and the profile was written; 1 a\n"
             "benchmark failed (its keys are left out) or the profile could not be written;\n"
             "2 bad usage.\n"
             "\n"
             "example:\n"
             "  ferry bench all --path /mnt/nvme/ferry --profile-out box.json\n"
             "  ferry plan --model llama-2-13b --gpu-mem 24G --host-mem 128G --nvme 2T \\\n"
             "             --profile box.json\n");
}

/* ---- running a benchmark with its output captured ------------------------- */

typedef struct {
  char *out, *err; /* NUL-terminated */
  int rc;
} captured;

static char *slurp(FILE *f) {
  long n = ftell(f);
  char *s = malloc(n > 0 ? (size_t)n + 1 : 1);
  if (!s) return NULL;
  rewind(f);
  size_t got = n > 0 ? fread(s, 1, (size_t)n, f) : 0;
  s[got] = '\0';
  return s;
}

/* Runs fn with fds 1 and 2 pointed at temporary files: its JSON is parsed
 * here, and its messages are replayed after the progress line is cleared. */
static int run_captured(bench_fn fn, int argc, char **argv, captured *c) {
  memset(c, 0, sizeof *c);
  FILE *fo = tmpfile(), *fe = tmpfile();
  int so = -1, se = -1;
  if (!fo || !fe) goto fail;
  fflush(stdout);
  fflush(stderr);
  so = dup(1), se = dup(2);
  if (so < 0 || se < 0 || dup2(fileno(fo), 1) < 0 || dup2(fileno(fe), 2) < 0) goto fail;
  c->rc = fn(argc, argv);
  fflush(stdout);
  fflush(stderr);
  dup2(so, 1);
  dup2(se, 2);
  close(so);
  close(se);
  fflush(fo);
  fflush(fe);
  fseek(fo, 0, SEEK_END);
  fseek(fe, 0, SEEK_END);
  c->out = slurp(fo);
  c->err = slurp(fe);
  fclose(fo);
  fclose(fe);
  return c->out && c->err ? 0 : -1;
fail:
  if (so >= 0) dup2(so, 1), close(so);
  if (se >= 0) dup2(se, 2), close(se);
  if (fo) fclose(fo);
  if (fe) fclose(fe);
  return -1;
}

/* The object on the line of out whose "bench" is `bench` and, when key is
 * given, whose `key` equals `val`; NULL when none. The caller frees it. */
static ferry_json_value *find_result(const char *out, const char *bench, const char *key,
                                     const char *val) {
  for (const char *l = out; *l;) {
    const char *e = strchr(l, '\n');
    size_t n = e ? (size_t)(e - l) : strlen(l);
    ferry_json_value *v = NULL;
    char why[128];
    if (n && !ferry_json_parse(l, n, &v, why, sizeof why)) {
      const ferry_json_value *b = ferry_json_get(v, "bench"),
                             *k = key ? ferry_json_get(v, key) : NULL;
      if (b && b->type == FERRY_JSON_STR && !strcmp(b->str, bench) &&
          (!key || (k && k->type == FERRY_JSON_STR && !strcmp(k->str, val))))
        return v;
    }
    ferry_json_free(v);
    l += n + (e != NULL);
  }
  return NULL;
}

static double num(const ferry_json_value *o, const char *key) {
  const ferry_json_value *v = o ? ferry_json_get(o, key) : NULL;
  return v && v->type == FERRY_JSON_NUM ? v->num : 0;
}

static const char *str(const ferry_json_value *o, const char *key, const char *dflt) {
  const ferry_json_value *v = o ? ferry_json_get(o, key) : NULL;
  return v && v->type == FERRY_JSON_STR ? v->str : dflt;
}

/* ---- progress on stderr ------------------------------------------------------ */

typedef struct {
  int tty, drawn;
  double t0;
} progress;

static void progress_clear(progress *p) {
  if (p->tty && p->drawn) fputs("\r\033[K", stderr);
  p->drawn = 0;
}

static void progress_show(progress *p, int done, int total, const char *what) {
  double t = ferry_now() - p->t0;
  if (!p->tty) {
    fprintf(stderr, "ferry bench all: [%d/%d] %s (%.1f s)\n", done < total ? done + 1 : done, total,
            what, t);
    return;
  }
  char bar[21];
  int fill = total ? done * 20 / total : 20;
  for (int i = 0; i < 20; i++)
    bar[i] = i < fill ? '#' : '.';
  bar[20] = '\0';
  fprintf(stderr, "\r\033[Kferry bench all [%s] %d/%d %5.1f s  %s", bar, done, total, t, what);
  fflush(stderr);
  p->drawn = 1;
}

/* ---- the steps ------------------------------------------------------------------ */

enum { ST_IO_READ, ST_IO_WRITE, ST_ADAM_F32, ST_ADAM_F16, ST_COPY, ST_COMPUTE, NSTEPS };

typedef struct {
  const char *path, *device, *profile, *model;
  char size[32], params[32], threads[16], copy_size[32];
  int quick, json, steps, iters;
} options;

typedef struct {
  int ok;
  char what[192];   /* progress text */
  char line[512];   /* one-line summary for the text output */
  char source[512]; /* the profile's "sources" note */
  double gbps[3];   /* io: gb_per_s; adam: gb_per_s; copy: h2d, d2h, bidirectional;
                       compute: tflops, tflops_fp32 */
  char device[128];
} step_result;

/* The argv of step s's benchmark, with room for its --steps and --iters
 * values. */
typedef struct {
  char steps[16], iters[16];
  char *argv[16];
} step_args;

static void step_argv(int s, const options *o, step_args *sa) {
  snprintf(sa->steps, sizeof sa->steps, "%d", o->steps);
  snprintf(sa->iters, sizeof sa->iters, "%d", o->iters);
  const char *mode = s == ST_IO_READ ? "read" : "write";
  /* writes are timed rewriting blocks (--overwrite), as the swap files are
   * rewritten every step (bench/README.md, "The NVMe figures") */
  const char *ow = s == ST_IO_WRITE ? "--overwrite" : NULL;
  const char *io[] = {"io",     "--mode", mode,   "--bs",   "1M", "--qd", "32",
                      "--size", o->size,  "--path", o->path, "--json", ow, NULL};
  const char *adam32[] = {"adam",         "--optimizer", "adamw",    "--grad",  "fp32",
                          "--param-copy", "bf16",        "--params", o->params, "--threads",
                          o->threads,     "--steps",     sa->steps,  "--json",  NULL};
  const char *adam16[] = {"adam",     "--optimizer", "adamw",     "--grad",   "fp16",
                          "--params", o->params,     "--threads", o->threads, "--steps",
                          sa->steps,  "--json",      NULL};
  const char *copy[] = {"copy",    "--device", o->device, "--size", o->copy_size,
                        "--iters", sa->iters,  "--json",  NULL};
  const char *compute[] = {"compute", "--device", o->device, "--model", o->model, "--seq",
                           o->quick ? "128" : "1024", "--iters", o->quick ? "1" : "3", "--json",
                           NULL};
  const char *const *w = s <= ST_IO_WRITE   ? io
                         : s == ST_ADAM_F32 ? adam32
                         : s == ST_ADAM_F16 ? adam16
                         : s == ST_COPY     ? copy
                                            : compute;
  int n = 0; /* the benchmarks take char **, and leave the words as they are */
  while ((sa->argv[n] = (char *)w[n]))
    n++;
}

static int nargs(char **a) {
  int n = 0;
  while (a[n])
    n++;
  return n;
}

/* Step s's progress text, in r->what. */
static void step_what(int s, const options *o, step_result *r) {
  const char *mode = s == ST_IO_READ ? "read" : "write";
  const char *grad = s == ST_ADAM_F32 ? "fp32" : "fp16";
  if (s <= ST_IO_WRITE)
    snprintf(r->what, sizeof r->what, "io %s: %s, bs 1M, qd 32 on %s", mode, o->size, o->path);
  else if (s == ST_COPY)
    snprintf(r->what, sizeof r->what, "copy: H2D, D2H of %s on --device %s", o->copy_size,
             o->device);
  else if (s == ST_COMPUTE)
    snprintf(r->what, sizeof r->what, "compute: the GEMMs of a %s step on --device %s", o->model,
             o->device);
  else
    snprintf(r->what, sizeof r->what, "adam: adamw, %s grads%s, %s params, %s threads", grad,
             s == ST_ADAM_F32 ? " + bf16 param copy" : "", o->params, o->threads);
}

/* What an io step printed: gb_per_s, its summary line and source note. */
static void take_io(int s, const options *o, const char *out, step_result *r) {
  const char *mode = s == ST_IO_READ ? "read" : "write";
  ferry_json_value *v = find_result(out, "io", "mode", mode);
  r->gbps[0] = num(v, "gb_per_s");
  const ferry_json_value *od = v ? ferry_json_get(v, "o_direct") : NULL;
  int direct = od && od->type == FERRY_JSON_BOOL && od->b;
  char sz[32];
  ferry_format_size((uint64_t)num(v, "bytes"), sz, sizeof sz);
  snprintf(r->line, sizeof r->line, "io %-5s  %s, bs 1M, qd 32, %s: %.3f GB/s, p99 %.0f us", mode,
           sz, direct ? "O_DIRECT" : "buffered", r->gbps[0], num(v, "p99_us"));
  snprintf(r->source, sizeof r->source,
           "ferry bench io --mode %s --bs 1M --qd 32 --size %s --path %s%s: %s, one pass%s", mode,
           o->size, o->path, s == ST_IO_WRITE ? " --overwrite" : "",
           direct ? "O_DIRECT" : "buffered (no O_DIRECT here)",
           direct ? "" : "; the page cache may have served it, not the drive");
  r->ok = v != NULL;
  ferry_json_free(v);
}

/* What the copy step printed: the three directions' gb_per_s, the device. */
static void take_copy(const options *o, const char *out, step_result *r) {
  ferry_json_value *v[3] = {find_result(out, "copy", "direction", "h2d"),
                            find_result(out, "copy", "direction", "d2h"),
                            find_result(out, "copy", "direction", "bidirectional")};
  for (int d = 0; d < 3; d++)
    r->gbps[d] = num(v[d], "gb_per_s");
  const char *dev = str(v[0], "device", "?");
  snprintf(r->device, sizeof r->device, "%s", dev);
  int host = strstr(dev, "host") != NULL;
  snprintf(r->line, sizeof r->line,
           "copy       %s, %s per copy: h2d %.2f GB/s, d2h %.2f GB/s, both at once %.2f GB/s", dev,
           o->copy_size, r->gbps[0], r->gbps[1], r->gbps[2]);
  snprintf(r->source, sizeof r->source,
           "ferry bench copy --device %s --size %s --iters %d: %s, median%s", o->device,
           o->copy_size, o->iters, dev,
           host ? "; host backend: a memcpy between host buffers, not a PCIe link" : "");
  r->ok = v[0] && v[1];
  for (int d = 0; d < 3; d++)
    ferry_json_free(v[d]);
}

/* What the compute step printed: the step's rates, its device. */
static void take_compute(const options *o, const char *out, step_result *r) {
  ferry_json_value *v = find_result(out, "compute", "result", "step");
  r->gbps[0] = num(v, "tflops");
  r->gbps[1] = num(v, "tflops_fp32");
  const char *dev = str(v, "device", "?");
  int host = !strncmp(dev, "host", 4);
  snprintf(r->line, sizeof r->line, "compute    %s, %s GEMMs of a step (%.0f tokens): %.4g "
           "TFLOP/s%s, fp32 %.4g TFLOP/s", dev, o->model, num(v, "tokens"), r->gbps[0],
           host ? " (fp32)" : " bf16", r->gbps[1]);
  snprintf(r->source, sizeof r->source,
           "ferry bench compute --device %s --model %s --seq %s --iters %s: %s, the step's GEMM "
           "FLOPs over their time%s", o->device, o->model, o->quick ? "128" : "1024",
           o->quick ? "1" : "3", dev,
           host ? "; the host computes in fp32" : "");
  r->ok = v != NULL;
  ferry_json_free(v);
}

/* What an adam step printed: gb_per_s, its summary line and source note. */
static void take_adam(int s, const options *o, const char *out, step_result *r) {
  const char *grad = s == ST_ADAM_F32 ? "fp32" : "fp16";
  ferry_json_value *v = find_result(out, "adam", NULL, NULL);
  r->gbps[0] = num(v, "gb_per_s");
  snprintf(r->line, sizeof r->line,
           "adam %s  adamw, %s grads%s, %.0f params, %.0f threads (%s): %.2f GB/s, "
           "%.3f Gparam/s, %.0f B/param",
           grad, grad, s == ST_ADAM_F32 ? " + bf16 copy" : "", num(v, "params"), num(v, "threads"),
           str(v, "simd", "?"), r->gbps[0], num(v, "params_per_s") / 1e9,
           num(v, "bytes_per_param"));
  snprintf(r->source, sizeof r->source,
           "ferry bench adam --optimizer adamw --grad %s%s --params %s --threads %s --steps %d: "
           "%.0f B/param, median step",
           grad, s == ST_ADAM_F32 ? " --param-copy bf16" : "", o->params, o->threads, o->steps,
           num(v, "bytes_per_param"));
  r->ok = v != NULL;
  ferry_json_free(v);
}

/* Runs step s's benchmark with its output captured, replays its messages,
 * passes its JSON on with --json and takes its figures into r (r->ok: it
 * passed and printed usable figures). */
static void run_step(int s, const options *o, progress *pg, step_result *r) {
  step_args sa;
  step_argv(s, o, &sa);
  char **argv = sa.argv;
  bench_fn fn = s <= ST_IO_WRITE  ? ferry_bench_io_main
                : s == ST_COPY    ? ferry_bench_copy_main
                : s == ST_COMPUTE ? ferry_bench_compute_main
                                  : ferry_bench_adam_main;
  memset(r, 0, sizeof *r);
  step_what(s, o, r);
  progress_show(pg, s, NSTEPS, r->what);
  if (!fn) {
    progress_clear(pg);
    fprintf(stderr, "ferry bench all: ferry bench %s is not in this build\n", argv[0]);
    return;
  }
  captured c;
  int crc = run_captured(fn, nargs(argv), argv, &c);
  progress_clear(pg);
  if (crc) {
    fprintf(stderr, "ferry bench all: cannot capture the output of ferry bench %s: %s\n", argv[0],
            "tmpfile or dup failed");
    free(c.out);
    free(c.err);
    return;
  }
  fputs(c.err, stderr);
  if (c.rc) {
    fprintf(stderr, "ferry bench all: ferry bench %s exited with %d; its keys are left out\n",
            argv[0], c.rc);
    goto out;
  }
  if (o->json) fputs(c.out, stdout);
  if (s <= ST_IO_WRITE)
    take_io(s, o, c.out, r);
  else if (s == ST_COPY)
    take_copy(o, c.out, r);
  else if (s == ST_COMPUTE)
    take_compute(o, c.out, r);
  else
    take_adam(s, o, c.out, r);
  for (int d = 0; d < 3; d++)
    if (!(r->gbps[d] > 0 && r->gbps[d] <= 1e7) && (s == ST_COPY || s == ST_COMPUTE ? d < 2 : d == 0))
      r->ok = 0;
  if (!r->ok)
    fprintf(stderr,
            "ferry bench all: ferry bench %s printed no usable result; its keys are "
            "left out\n",
            argv[0]);
out:
  free(c.out);
  free(c.err);
}

/* ---- the profile ------------------------------------------------------------ */

typedef struct {
  unsigned bit;
  double v;
  const char *source;
} pkey;

static void machine_text(char *buf, size_t len, const char *device) {
  char host[64] = "?", ram[32];
  if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  ferry_host_info hi;
  if (ferry_host_get_info(&hi) == FERRY_OK)
    snprintf(buf, len, "%s: %s, %d threads, %s RAM; device %s", host, hi.cpu_model, hi.threads,
             ferry_format_size(hi.ram_bytes, ram, sizeof ram), device);
  else
    snprintf(buf, len, "%s; device %s", host, device);
}

/* Writes FILE whole (core/outfile.h: beside it, then renamed over it),
 * then reads it back with the planner's parser: what plan will see is what
 * was meant. */
static int write_profile(const char *path, const pkey *k, int nk, const char *machine,
                         const char *const *notes, const unsigned *note_bits, int nnotes, char *why,
                         size_t wl) {
  ferry_outfile o;
  if (ferry_outfile_open(&o, path, why, wl)) return -1;
  FILE *f = o.f;
  char created[32];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
  fprintf(f, "{\n  \"format\": \"ferry-profile\",\n  \"version\": 1,\n  \"machine\": ");
  json_string_raw(f, machine);
  fprintf(f, ",\n  \"created\": \"%s\",\n  \"ferry_version\": ", created);
  json_string_raw(f, ferry_version());
  for (int i = 0; i < nk; i++)
    fprintf(f, ",\n  \"%s\": %.6g", ferry_plan_bandwidth_key(k[i].bit), k[i].v);
  fprintf(f, ",\n  \"sources\": {");
  int first = 1;
  for (int i = 0; i < nk; i++, first = 0) {
    fprintf(f, "%s\n    \"%s\": ", first ? "" : ",", ferry_plan_bandwidth_key(k[i].bit));
    json_string_raw(f, k[i].source);
  }
  for (int i = 0; i < nnotes; i++, first = 0) {
    fprintf(f, "%s\n    \"%s\": ", first ? "" : ",", ferry_plan_bandwidth_key(note_bits[i]));
    json_string_raw(f, notes[i]);
  }
  fprintf(f, "\n  }\n}\n");
  if (ferry_outfile_commit(&o, why, wl)) return -1;
  ferry_plan_bandwidth bw = ferry_plan_bandwidth_default();
  char pwhy[512];
  if (ferry_plan_profile_load(path, &bw, pwhy, sizeof pwhy)) {
    snprintf(why, wl, "ferry plan would refuse it: %s", pwhy);
    return -1;
  }
  unsigned want = 0;
  for (int i = 0; i < nk; i++)
    want |= k[i].bit;
  if ((bw.measured & want) != want) {
    snprintf(why, wl, "read back, it lacks measured keys (0x%x of 0x%x)", bw.measured, want);
    return -1;
  }
  return 0;
}

int bench_profile_update(const char *path, const unsigned *bits, const double *vals,
                         const char *const *sources, int n, const char *machine, char *why,
                         size_t wl) {
  pkey k[8];
  int nk = 0;
  ferry_plan_bandwidth old = ferry_plan_bandwidth_default();
  ferry_json_value *root = NULL;
  char *text = NULL, pwhy[512];
  size_t len;
  int rc = ferry_read_file(path, 1u << 20, &text, &len, pwhy, sizeof pwhy);
  if (rc && rc != FERRY_ENOENT) {
    snprintf(why, wl, "%s", pwhy);
    return -1;
  }
  if (!rc && (ferry_plan_profile_parse(text, len, path, &old, pwhy, sizeof pwhy) ||
              ferry_json_parse(text, len, &root, pwhy, sizeof pwhy))) {
    snprintf(why, wl, "it exists and is not a profile this ferry reads: %s", pwhy);
    free(text);
    ferry_json_free(root);
    return -1;
  }
  free(text);
  unsigned given = 0;
  for (int i = 0; i < n; i++) given |= bits[i];
  const ferry_json_value *src = root ? ferry_json_get(root, "sources") : NULL;
  for (unsigned b = 1; b <= FERRY_PLAN_BW_DEVMEM && nk < 8; b <<= 1) {
    if (!(old.measured & b) || (given & b)) continue;
    const ferry_json_value *s = src ? ferry_json_get(src, ferry_plan_bandwidth_key(b)) : NULL;
    k[nk++] = (pkey){b, ferry_plan_bandwidth_value(&old, b),
                     s && s->type == FERRY_JSON_STR ? s->str : "kept from the earlier profile"};
  }
  for (int i = 0; i < n && nk < 8; i++) k[nk++] = (pkey){bits[i], vals[i], sources[i]};
  rc = write_profile(path, k, nk, machine, NULL, NULL, 0, why, wl);
  ferry_json_free(root);
  return rc;
}

/* ---- the command ---------------------------------------------------------------- */

static int size_arg(const char *v, char *dst, size_t len, uint64_t min) {
  uint64_t x;
  if (ferry_parse_size(v, &x) || x < min) return -1;
  snprintf(dst, len, "%s", v);
  return 0;
}

/* The values as given (NULL: not given), checked and defaulted by
 * settle_args. */
typedef struct {
  const char *size, *params, *threads, *copy_size;
} raw_args;

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage). */
static int parse_args(options *o, raw_args *raw, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  memset(raw, 0, sizeof *raw);
  o->device = "auto";
  o->profile = "ferry-profile.json";
  o->model = "gpt2";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json"))
      o->json = 1;
    else if (!strcmp(a, "--quick"))
      o->quick = 1;
    else if (!strcmp(a, "--path") && v)
      o->path = argv[++i];
    else if (!strcmp(a, "--profile-out") && v)
      o->profile = argv[++i];
    else if (!strcmp(a, "--device") && v)
      o->device = argv[++i];
    else if (!strcmp(a, "--size") && v)
      raw->size = argv[++i];
    else if (!strcmp(a, "--params") && v)
      raw->params = argv[++i];
    else if (!strcmp(a, "--threads") && v)
      raw->threads = argv[++i];
    else if (!strcmp(a, "--copy-size") && v)
      raw->copy_size = argv[++i];
    else if (!strcmp(a, "--model") && v)
      o->model = argv[++i];
    else {
      fprintf(stderr, "ferry bench all: unknown or incomplete option '%s' (see --help)\n", a);
      return 2;
    }
  }
  return -1;
}

/* --threads, or the machine's thread count, into o->threads: -1 to go on,
 * or 2 (said on stderr). */
static int settle_threads(options *o, const char *threads) {
  if (threads) {
    long long t;
    if (bench_arg_int("ferry bench all", "--threads", threads, 1, bench_max_threads(),
                      BENCH_THREADS_WHY, &t))
      return 2;
    snprintf(o->threads, sizeof o->threads, "%lld", t);
  } else {
    ferry_host_info hi;
    int n = ferry_host_get_info(&hi) == FERRY_OK && hi.threads > 0 ? hi.threads : 0;
    snprintf(o->threads, sizeof o->threads, "%d", n); /* 0: the optimizer's one per core */
  }
  return -1;
}

/* Checks the options and fills in the defaults (--quick's smaller ones):
 * -1 to go on, or 2 (said on stderr). */
static int settle_args(options *o, const raw_args *raw) {
  if (!o->path) {
    fprintf(stderr, "ferry bench all: --path DIR is required (a folder on the drive to measure; "
                    "see --help)\n");
    return 2;
  }
  struct stat st;
  if (stat(o->path, &st) || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "ferry bench all: --path %s is not a folder\n", o->path);
    return 2;
  }
  if (strcmp(o->device, "auto") && strcmp(o->device, "host") && strcmp(o->device, "cuda")) {
    fprintf(stderr, "ferry bench all: --device must be auto, host or cuda, not '%s'\n", o->device);
    return 2;
  }
  const char *size = raw->size, *params = raw->params, *copy_size = raw->copy_size;
  if (size_arg(size ? size : o->quick ? "256M" : "1G", o->size, sizeof o->size, 1u << 20)) {
    fprintf(stderr, "ferry bench all: --size '%s' is not a size of at least 1M\n", size);
    return 2;
  }
  if (size_arg(params ? params : o->quick ? "16M" : "64M", o->params, sizeof o->params, 1)) {
    fprintf(stderr, "ferry bench all: --params '%s' is not a count such as 64M\n", params);
    return 2;
  }
  if (size_arg(copy_size  ? copy_size
               : o->quick ? "64M"
                          : "256M",
               o->copy_size, sizeof o->copy_size, 1)) {
    fprintf(stderr, "ferry bench all: --copy-size '%s' is not a size such as 256M\n", copy_size);
    return 2;
  }
  int ex = settle_threads(o, raw->threads);
  if (ex >= 0) return ex;
  o->steps = o->quick ? 3 : 5;
  o->iters = o->quick ? 3 : 5;
  return -1;
}

/* Runs every step with progress on stderr (and, without --json, each
 * step's summary line on stdout); returns the seconds they took. */
static double run_steps(const options *o, step_result r[NSTEPS]) {
  progress pg = {isatty(2), 0, ferry_now()};
  for (int s = 0; s < NSTEPS; s++) {
    run_step(s, o, &pg, &r[s]);
    if (!o->json && r[s].ok) {
      printf("%s\n", r[s].line);
      fflush(stdout);
    }
  }
  double total = ferry_now() - pg.t0;
  progress_show(&pg, NSTEPS, NSTEPS, "done");
  if (pg.tty) fputc('\n', stderr);
  pg.drawn = 0;
  return total;
}

/* What goes into the profile: the measured keys, and a note for each key
 * this command cannot measure or whose benchmark failed. */
typedef struct {
  pkey k[7];
  int nk;
  char optsrc[1200];
  char notebuf[8][400];
  const char *notes[8];
  unsigned note_bits[8];
  int nnotes;
} profile_content;

static void profile_keys(const step_result r[NSTEPS], profile_content *p) {
  pkey *k = p->k;
  int nk = 0;
  if (r[ST_COPY].ok) {
    k[nk++] = (pkey){FERRY_PLAN_BW_H2D, r[ST_COPY].gbps[0], r[ST_COPY].source};
    k[nk++] = (pkey){FERRY_PLAN_BW_D2H, r[ST_COPY].gbps[1], r[ST_COPY].source};
  }
  if (r[ST_IO_READ].ok)
    k[nk++] = (pkey){FERRY_PLAN_BW_NVME_READ, r[ST_IO_READ].gbps[0], r[ST_IO_READ].source};
  if (r[ST_IO_WRITE].ok)
    k[nk++] = (pkey){FERRY_PLAN_BW_NVME_WRITE, r[ST_IO_WRITE].gbps[0], r[ST_IO_WRITE].source};
  if (r[ST_ADAM_F32].ok) {
    if (r[ST_ADAM_F16].ok)
      snprintf(p->optsrc, sizeof p->optsrc, "%s; with fp16 grads and no copy (%s) %.3g GB/s",
               r[ST_ADAM_F32].source, r[ST_ADAM_F16].source, r[ST_ADAM_F16].gbps[0]);
    else
      snprintf(p->optsrc, sizeof p->optsrc, "%s", r[ST_ADAM_F32].source);
    k[nk++] = (pkey){FERRY_PLAN_BW_CPU_OPT, r[ST_ADAM_F32].gbps[0], p->optsrc};
  }
  if (r[ST_COMPUTE].ok) {
    k[nk++] = (pkey){FERRY_PLAN_BW_TFLOPS, r[ST_COMPUTE].gbps[0], r[ST_COMPUTE].source};
    k[nk++] = (pkey){FERRY_PLAN_BW_TFLOPS32, r[ST_COMPUTE].gbps[1], r[ST_COMPUTE].source};
  }
  p->nk = nk;
}

static void profile_notes(profile_content *p) {
  static const unsigned all_bits[] = {FERRY_PLAN_BW_H2D,       FERRY_PLAN_BW_D2H,
                                      FERRY_PLAN_BW_NVME_READ, FERRY_PLAN_BW_NVME_WRITE,
                                      FERRY_PLAN_BW_CPU_OPT,   FERRY_PLAN_BW_TFLOPS,
                                      FERRY_PLAN_BW_TFLOPS32,  FERRY_PLAN_BW_DEVMEM};
  ferry_plan_bandwidth def = ferry_plan_bandwidth_default();
  unsigned have = 0;
  for (int i = 0; i < p->nk; i++)
    have |= p->k[i].bit;
  p->nnotes = 0;
  for (int i = 0; i < 8; i++) {
    unsigned b = all_bits[i];
    if (have & b) continue;
    int n = p->nnotes++;
    snprintf(p->notebuf[n], sizeof p->notebuf[n],
             "not measured: %s; ferry plan assumes its default %g (%s)",
             b == FERRY_PLAN_BW_DEVMEM ? "ferry bench all has no device memory benchmark yet"
                                       : "its benchmark failed in this run",
             ferry_plan_bandwidth_value(&def, b), ferry_plan_bandwidth_source(b));
    p->notes[n] = p->notebuf[n];
    p->note_bits[n] = b;
  }
}

/* The last stdout line with --json: what was measured, assumed and failed. */
static void summary_json(const options *o, const step_result r[NSTEPS], const profile_content *p,
                         int werr, double total) {
  json_out j;
  json_begin(&j, stdout);
  json_str(&j, "bench", "all");
  if (werr)
    json_null(&j, "profile");
  else
    json_str(&j, "profile", o->profile);
  json_str(&j, "path", o->path);
  if (r[ST_COPY].ok)
    json_str(&j, "device", r[ST_COPY].device);
  else
    json_null(&j, "device");
  json_bool(&j, "quick", o->quick);
  json_num(&j, "seconds", total);
  for (int i = 0; i < p->nk; i++)
    json_num(&j, ferry_plan_bandwidth_key(p->k[i].bit), p->k[i].v);
  json_open(&j, "assumed", '[');
  for (int i = 0; i < p->nnotes; i++)
    json_str(&j, NULL, ferry_plan_bandwidth_key(p->note_bits[i]));
  json_close(&j, ']');
  json_open(&j, "failed", '[');
  static const char *const names[] = {"io read", "io write", "adam fp32", "adam fp16", "copy",
                                      "compute"};
  for (int s = 0; s < NSTEPS; s++)
    if (!r[s].ok) json_str(&j, NULL, names[s]);
  json_close(&j, ']');
  json_end(&j);
}

static void summary_text(const options *o, const step_result r[NSTEPS], const profile_content *p,
                         int werr, double total, int failed) {
  printf("\n");
  if (!werr) printf("profile    %s (use: ferry plan --profile %s ...)\n", o->profile, o->profile);
  for (int i = 0; i < p->nk; i++)
    printf("  measured %-20s %10.4g %s\n", ferry_plan_bandwidth_key(p->k[i].bit), p->k[i].v,
           p->k[i].bit & (FERRY_PLAN_BW_TFLOPS | FERRY_PLAN_BW_TFLOPS32) ? "TFLOP/s" : "GB/s");
  for (int i = 0; i < p->nnotes; i++)
    printf("  assumed  %-20s %s\n", ferry_plan_bandwidth_key(p->note_bits[i]), p->notes[i]);
  if (r[ST_COPY].ok && strstr(r[ST_COPY].device, "host"))
    printf("  note     h2d/d2h were measured on the host backend (memcpy, not a PCIe link); "
           "on a GPU machine run this again there\n");
  printf("%d of %d benchmarks passed in %.1f s\n", NSTEPS - failed, NSTEPS, total);
}

int ferry_bench_all_main(int argc, char **argv) {
  options o;
  raw_args raw;
  int ex = parse_args(&o, &raw, argc, argv);
  if (ex < 0) ex = settle_args(&o, &raw);
  if (ex >= 0) return ex;

  step_result r[NSTEPS];
  double total = run_steps(&o, r);
  int failed = 0;
  for (int s = 0; s < NSTEPS; s++)
    failed += !r[s].ok;

  profile_content p;
  profile_keys(r, &p);
  profile_notes(&p);
  char machine[400], why[700];
  machine_text(machine, sizeof machine, r[ST_COPY].ok ? r[ST_COPY].device : "(copy failed)");
  int werr =
      write_profile(o.profile, p.k, p.nk, machine, p.notes, p.note_bits, p.nnotes, why, sizeof why);
  if (werr) fprintf(stderr, "ferry bench all: profile %s: %s\n", o.profile, why);

  if (o.json)
    summary_json(&o, r, &p, werr, total);
  else
    summary_text(&o, r, &p, werr, total, failed);
  return failed || werr ? 1 : 0;
}
