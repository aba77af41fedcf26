/* tests/offload/test_config.c — the engine configuration: defaults, set and
 * get from C, every kind of bad value refused with key and expectation,
 * unknown keys with a suggestion, file errors with file and line, loads
 * that change nothing when refused, write-then-load round trips, and
 * docs/CONFIG.md listing every key with its default (argv[1]).
 */
#include "ferry.h"
#include "format/config.h"
#include "tests/test.h"

#include <string.h>
#include <unistd.h>

static ferry_config *fresh(void) {
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0 && c);
  return c;
}

static int has(const ferry_config *c, const char *needle) {
  int ok = strstr(ferry_config_last_error(c), needle) != NULL;
  if (!ok) fprintf(stderr, "  message was: %s (wanted '%s')\n", ferry_config_last_error(c), needle);
  return ok;
}

static void test_defaults_and_set(void) {
  ferry_config *c = fresh();
  const ferry_config_values *v = ferry_config_values_get(c);
  EXPECT(v->chunk_size == 64ull << 20);
  EXPECT(v->device == FERRY_DEVICE_AUTO && v->place_params == FERRY_TIER_DEVICE &&
         v->place_grads == FERRY_GRADS_AUTO && v->prec_grads == FERRY_DT_F32);
  EXPECT(v->nvme_queue_depth == 32 && v->nvme_block_size == 1 << 20);
  EXPECT(v->betas[0] == 0.9 && v->betas[1] == 0.999 && v->loss_scale == 0);
  char buf[256];
  EXPECT(ferry_config_set(c, "tiers.gpu.budget", "20G") == 0 && v->gpu_budget == 20ull << 30);
  EXPECT(ferry_config_get(c, "tiers.gpu.budget", buf, sizeof buf) == 0 &&
         !strcmp(buf, "21474836480"));
  EXPECT(ferry_config_set(c, "device", "host") == 0 && v->device == FERRY_DEVICE_HOST);
  EXPECT(ferry_config_set(c, "optimizer.betas", "0.8, 0.95") == 0 && v->betas[1] == 0.95);
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "/a, /b/c") == 0 && v->nvme_npaths == 2 &&
         !strcmp(v->nvme_paths[1], "/b/c"));
  EXPECT(ferry_config_set(c, "precision.loss_scale", "1024") == 0 && v->loss_scale == 1024);
  EXPECT(ferry_config_set(c, "precision.loss_scale", "dynamic") == 0 && v->loss_scale == 0);
  EXPECT(ferry_config_set(c, "log_level", "debug") == 0 && v->log_level == FERRY_LOG_DEBUG);
  EXPECT(v->missing_grad == FERRY_MISSING_GRAD_SKIP); /* torch's behaviour by default */
  EXPECT(ferry_config_set(c, "optimizer.missing_grad", "zero") == 0 &&
         v->missing_grad == FERRY_MISSING_GRAD_ZERO);
  EXPECT(ferry_config_get(c, "optimizer.missing_grad", buf, sizeof buf) == 0 &&
         !strcmp(buf, "zero"));
  /* placement.grads: the tiers, "auto" and "none"; precision.grads */
  EXPECT(ferry_config_set(c, "placement.grads", "none") == 0 &&
         v->place_grads == FERRY_GRADS_NONE);
  EXPECT(ferry_config_get(c, "placement.grads", buf, sizeof buf) == 0 && !strcmp(buf, "none"));
  EXPECT(ferry_config_set(c, "placement.grads", "nvme") == 0 && v->place_grads == FERRY_TIER_NVME);
  EXPECT(ferry_config_set(c, "placement.grads", "auto") == 0 &&
         v->place_grads == FERRY_GRADS_AUTO);
  EXPECT(ferry_config_get(c, "placement.grads", buf, sizeof buf) == 0 && !strcmp(buf, "auto"));
  EXPECT(ferry_config_set(c, "placement.grads", "disk") == FERRY_ECONFIG &&
         has(c, "auto|gpu|host|nvme|none"));
  EXPECT(ferry_config_set(c, "precision.grads", "bf16") == 0 && v->prec_grads == FERRY_DT_BF16);
  EXPECT(ferry_config_get(c, "precision.grads", buf, sizeof buf) == 0 && !strcmp(buf, "bf16"));
  EXPECT(ferry_config_set(c, "precision.grads", "fp16") == FERRY_ECONFIG && has(c, "fp32|bf16"));

  /* refused values name the key, the value and what was expected */
  EXPECT(ferry_config_set(c, "chunk_size", "12Q") == FERRY_ECONFIG && has(c, "chunk_size") &&
         has(c, "12Q") && has(c, "expected a size"));
  EXPECT(ferry_config_set(c, "chunk_size", "100") == FERRY_ECONFIG); /* below 4 KiB */
  /* a size names the limit it passed: not "at least 0 B" over a maximum */
  EXPECT(ferry_config_set(c, "chunk_size", "100") == FERRY_ECONFIG && has(c, "at least 4.00 KiB"));
  EXPECT(ferry_config_set(c, "tiers.host.budget", "1000000T") == FERRY_ECONFIG &&
         has(c, "at most") && !strstr(ferry_config_last_error(c), "at least"));
  EXPECT(ferry_config_set(c, "tiers.nvme.block_size", "2G") == FERRY_ECONFIG &&
         has(c, "at most 1.00 GiB"));
  EXPECT(ferry_config_set(c, "tiers.gpu.budget", "lots") == FERRY_ECONFIG &&
         has(c, "expected a size") && !strstr(ferry_config_last_error(c), "at least 0 B"));
  EXPECT(ferry_config_set(c, "device", "gpu") == FERRY_ECONFIG && has(c, "auto|cuda|host"));
  EXPECT(ferry_config_set(c, "optimizer.missing_grad", "none") == FERRY_ECONFIG &&
         has(c, "skip|zero") && has(c, "optimizer.missing_grad"));
  /* lr = 0 is accepted, as PyTorch accepts it (issue 25 item 7); below 0 is not */
  EXPECT(ferry_config_set(c, "optimizer.lr", "0") == 0 && v->lr == 0);
  EXPECT(ferry_config_set(c, "optimizer.lr", "-1e-4") == FERRY_ECONFIG && has(c, "[0, 1000]"));
  EXPECT(ferry_config_set(c, "optimizer.lr", "1001") == FERRY_ECONFIG && has(c, "optimizer.lr"));
  EXPECT(ferry_config_set(c, "optimizer.lr", "abc") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "optimizer.betas", "0.9") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "optimizer.betas", "0.9, 1.0") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "tiers.nvme.queue_depth", "0") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "tiers.nvme.queue_depth", "8.5") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "tiers.host.pinned", "yes") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "precision.loss_scale", "-2") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "/a,,/b") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "tiers.gpu.budgte", "1G") == FERRY_ECONFIG &&
         has(c, "did you mean 'tiers.gpu.budget'"));
  EXPECT(ferry_config_set(c, "totally_unrelated_thing", "1") == FERRY_ECONFIG &&
         has(c, "unknown config key"));
  EXPECT(v->gpu_budget == 20ull << 30 && v->chunk_size == 64ull << 20); /* unchanged */
  EXPECT(ferry_config_get(c, "nope", buf, sizeof buf) == FERRY_ENOENT);
  ferry_config_destroy(c);
}

/* --set values in the config grammar (issue 25 item 8): a bracketed list
 * is a list, not a path named `["/mnt/x"]`; garbage is refused naming the
 * key and the value; empty paths are refused; the bare forms still work. */
static void test_set_grammar(void) {
  ferry_config *c = fresh();
  const ferry_config_values *v = ferry_config_values_get(c);
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "[\"/mnt/x\"]") == 0 && v->nvme_npaths == 1 &&
         !strcmp(v->nvme_paths[0], "/mnt/x"));
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", " [\"/a\", \"/b c\"]") == 0 &&
         v->nvme_npaths == 2 && !strcmp(v->nvme_paths[1], "/b c"));
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "(\"/p\")") == 0 && v->nvme_npaths == 1 &&
         !strcmp(v->nvme_paths[0], "/p"));
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "\"/q\"") == 0 && v->nvme_npaths == 1 &&
         !strcmp(v->nvme_paths[0], "/q"));
  const char *garbage[] = {"[\"", "[\"/a\"", "[\"/a\"]; x = 1", "[1, 2]", "/x\"]", "[\"/a\"]\n@include \"/etc\""};
  for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
    EXPECT(ferry_config_set(c, "tiers.nvme.paths", garbage[i]) == FERRY_ECONFIG &&
           has(c, "tiers.nvme.paths") && has(c, "is invalid"));
    EXPECT(v->nvme_npaths == 1 && !strcmp(v->nvme_paths[0], "/q")); /* unchanged */
  }
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "[\"") == FERRY_ECONFIG && has(c, "'[\"'"));
  /* empty paths: "" and [""] refused; [] (or nothing) is no NVMe tier */
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "\"\"") == FERRY_ECONFIG && has(c, "empty"));
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "[\"/a\", \"\"]") == FERRY_ECONFIG &&
         has(c, "element 1") && has(c, "empty"));
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "[]") == 0 && v->nvme_npaths == 0);
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "/a, /b") == 0 && v->nvme_npaths == 2);
  EXPECT(ferry_config_set(c, "tiers.nvme.paths", "") == 0 && v->nvme_npaths == 0);
  /* other kinds: lists, quoted strings, numbers, booleans */
  EXPECT(ferry_config_set(c, "optimizer.betas", "[0.8, 0.95]") == 0 && v->betas[0] == 0.8 &&
         v->betas[1] == 0.95);
  EXPECT(ferry_config_set(c, "optimizer.betas", "[0.8]") == FERRY_ECONFIG &&
         has(c, "optimizer.betas"));
  EXPECT(ferry_config_set(c, "device", "\"host\"") == 0 && v->device == FERRY_DEVICE_HOST);
  EXPECT(ferry_config_set(c, "device", "[\"cuda\"]") == FERRY_ECONFIG && has(c, "not a list") &&
         v->device == FERRY_DEVICE_HOST);
  EXPECT(ferry_config_set(c, "chunk_size", "\"8M\"") == 0 && v->chunk_size == 8 << 20);
  EXPECT(ferry_config_set(c, "optimizer.lr", "\"3e-4\"") == 0 && v->lr == 3e-4);
  EXPECT(ferry_config_set(c, "timeline", "\"t \\\"q\\\".json\"") == 0 &&
         !strcmp(v->timeline, "t \"q\".json"));
  EXPECT(ferry_config_set(c, "tiers.nvme.queue_depth", "\"8\"") == 0 && v->nvme_queue_depth == 8);
  /* a file's [""] is refused too (it used to read as no paths at all) */
  EXPECT(ferry_config_load_string(c, "tiers: { nvme: { paths = [\"\"]; }; };\n", "e.cfg") ==
             FERRY_ECONFIG && has(c, "e.cfg:1") && has(c, "empty"));
  ferry_config_destroy(c);
}

static void test_file_errors(void) {
  ferry_config *c = fresh();
  const ferry_config_values *v = ferry_config_values_get(c);
  const char *good = "device = \"host\";\n"
                     "chunk_size = \"8M\";\n"
                     "tiers: {\n"
                     "  gpu: { budget = \"512M\"; };\n"
                     "  nvme: { paths = [\"/tmp/a\", \"/tmp/b\"]; queue_depth = 8; };\n"
                     "};\n"
                     "placement: { params = \"host\"; optimizer = \"nvme\"; };\n"
                     "optimizer: { type = \"adam\"; lr = 3e-4; betas = [0.9, 0.95]; };\n"
                     "clip_grad_norm = 1;\n"
                     "grad_accumulation = 4;\n";
  EXPECT(ferry_config_load_string(c, good, "good.cfg") == 0);
  EXPECT(v->device == FERRY_DEVICE_HOST && v->chunk_size == 8 << 20 && v->gpu_budget == 512 << 20);
  EXPECT(v->nvme_npaths == 2 && v->nvme_queue_depth == 8 && v->place_optimizer == FERRY_TIER_NVME);
  EXPECT(v->opt_type == FERRY_OPTIM_ADAM && v->lr == 3e-4 && v->betas[1] == 0.95 && v->clip_grad_norm == 1.0);
  EXPECT(v->grad_accumulation == 4);

  struct {
    const char *text, *want1, *want2;
  } bad[] = {
      {"device = \"host\";\ntiers: { gpu: { budgte = \"1G\"; }; };\n", "bad.cfg:2",
       "did you mean 'tiers.gpu.budget'"},
      {"chunk_size = \"64X\";\n", "bad.cfg:1", "expected a size"},
      {"\n\noptimizer: { lr = \"fast\"; };\n", "bad.cfg:3", "not a string"},
      {"optimizer: { betas = 0.9; };\n", "betas", "[ ... ]"},
      {"tiers: { nvme: { paths = [1, 2]; }; };\n", "element 0", "a string"},
      {"tiers: { host: { pinned = 1; }; };\n", "pinned", "true or false"},
      {"device = host;\n", "bad.cfg:1", "syntax error"},
      {"placement = \"gpu\";\n", "'placement' is a group, not a value", "placement: { ... }"},
      {"grad_accumulation = 0;\n", "grad_accumulation", "an integer in [1"},
      {"device = [\"host\"];\n", "device", "not a list"},
      {"optimizer: { typo = 1; };\n", "unknown key 'optimizer.typo'", "did you mean"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = ferry_config_load_string(c, bad[i].text, "bad.cfg");
    EXPECT(rc == FERRY_ECONFIG);
    EXPECT(has(c, bad[i].want1));
    EXPECT(has(c, bad[i].want2));
  }
  /* wording (issue 25 item 15): a group given a value says so and suggests
   * no unrelated key; libconfig's "syntax error" is said once; a
   * suggestion only when it is close */
  struct {
    const char *text, *want, *never;
  } words[] = {
      {"tiers = \"foo\";\n", "'tiers' is a group, not a value; expected tiers: { ... }",
       "did you mean"},
      {"device = host;\n", "bad.cfg:1: syntax error (", "syntax error: syntax error"},
      {"zzz = 3;\n", "unknown key 'zzz'", "did you mean"},
      {"foo: { a = 1; };\n", "unknown key 'foo'", "did you mean"},
      {"tiers: { gpus: { budget = \"1G\"; }; };\n", "did you mean 'tiers.gpu'?", "optimizer"},
      {"eps = 1e-8;\n", "did you mean 'optimizer.eps'?", "placement"},
  };
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
    EXPECT(ferry_config_load_string(c, words[i].text, "bad.cfg") == FERRY_ECONFIG);
    EXPECT(has(c, words[i].want));
    if (strstr(ferry_config_last_error(c), words[i].never))
      fprintf(stderr, "  message '%s' has '%s'\n", ferry_config_last_error(c), words[i].never);
    EXPECT(strstr(ferry_config_last_error(c), words[i].never) == NULL);
  }
  EXPECT(ferry_config_set(c, "tiers", "1") == FERRY_ECONFIG && has(c, "is a group"));
  EXPECT(ferry_config_set(c, "zzz", "1") == FERRY_ECONFIG && !strstr(ferry_config_last_error(c), "did you mean"));
  /* a refused load changed nothing, even keys set before the bad line */
  EXPECT(ferry_config_load_string(c, "chunk_size = \"16M\";\nbogus = 1;\n", "x.cfg") ==
         FERRY_ECONFIG);
  EXPECT(v->chunk_size == 8 << 20);
  EXPECT(ferry_config_load_file(c, "/nonexistent/ferry.cfg") == FERRY_ENOENT &&
         has(c, "/nonexistent/ferry.cfg"));
  ferry_config_destroy(c);
}

static void test_roundtrip(void) {
  ferry_config *a = fresh(), *b = fresh();
  EXPECT(ferry_config_set(a, "tiers.nvme.paths", "/mnt/n0, /mnt/n1") == 0);
  EXPECT(ferry_config_set(a, "optimizer.lr", "0.000123") == 0);
  EXPECT(ferry_config_set(a, "precision.loss_scale", "512") == 0);
  EXPECT(ferry_config_set(a, "timeline", "trace \"x\".json") == 0);
  EXPECT(ferry_config_set(a, "tiers.host.budget", "96G") == 0);
  char path[] = "/tmp/ferry-cfg-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  EXPECT(ferry_config_write_file(a, path) == 0);
  int rc = ferry_config_load_file(b, path);
  if (rc) fprintf(stderr, "  reload: %s\n", ferry_config_last_error(b));
  EXPECT(rc == 0);
  for (int i = 0; i < ferry_config_key_count(); i++) {
    const char *name;
    char x[2048], y[2048];
    ferry_config_key_info(i, &name, NULL, NULL, NULL);
    ferry_config_get(a, name, x, sizeof x);
    ferry_config_get(b, name, y, sizeof y);
    if (strcmp(x, y)) fprintf(stderr, "  key %s: '%s' != '%s'\n", name, x, y);
    EXPECT(strcmp(x, y) == 0);
  }
  unlink(path);
  ferry_config_destroy(a);
  ferry_config_destroy(b);
}

static void test_doc(const char *doc) {
  FILE *f = fopen(doc, "r");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", doc);
    test_failures++;
    return;
  }
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  for (int i = 0; i < ferry_config_key_count(); i++) {
    const char *name, *def;
    ferry_config_key_info(i, &name, NULL, &def, NULL);
    char row[512];
    snprintf(row, sizeof row, "| `%s` |", name);
    const char *at = strstr(text, row);
    if (!at) fprintf(stderr, "  docs/CONFIG.md lacks key %s\n", name);
    EXPECT(at != NULL);
    if (at) {
      char d[300];
      snprintf(d, sizeof d, "`%s`", def);
      const char *eol = strchr(at, '\n');
      const char *hit = strstr(at + strlen(row), d);
      if (!hit || (eol && hit > eol)) fprintf(stderr, "  key %s: default %s not in its row\n", name, d);
      EXPECT(hit && (!eol || hit < eol));
    }
  }
}

int main(int argc, char **argv) {
  test_defaults_and_set();
  test_set_grammar();
  test_file_errors();
  test_roundtrip();
  if (argc > 1) test_doc(argv[1]);
  return test_finish("test_config");
}
