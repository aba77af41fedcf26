/* cli/config.c — `ferry config`: check an engine config file (and print the
 * effective values), list every key, or write a complete config.
 */
#include "cli/cli.h"

#include "core/untrusted.h"
#include "ferry.h"

#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry config check FILE [--set KEY=VALUE]...\n"
          "       ferry config keys [--markdown]\n"
          "       ferry config write FILE [--set KEY=VALUE]...\n"
          "\n"
          "check   loads FILE as the engine would, refuses it with file, line, key and\n"
          "        what was expected, or prints every key's effective value\n"
          "keys    lists every key with its type, default and meaning\n"
          "write   writes a complete config (defaults, then --set values) to FILE\n"
          "--set   applies KEY=VALUE after the file, e.g. --set tiers.gpu.budget=20G;\n"
          "        VALUE is bare text (64M, 3e-4, host, true, /a, /b) or the file's grammar:\n"
          "        a list [\"/mnt/a\", \"/mnt/b\"] or a quoted string \"text\"\n"
          "\n"
          "check exits 0 when the file and the --set values are valid, 1 when they are\n"
          "not (naming file, line, key and value), 2 on a usage error.\n");
}

static int print_all(const ferry_config *c) {
  for (int i = 0; i < ferry_config_key_count(); i++) {
    const char *name;
    char v[2048], shown[4 * sizeof v]; /* a path from the file may hold control bytes */
    ferry_config_key_info(i, &name, NULL, NULL, NULL);
    ferry_config_get(c, name, v, sizeof v);
    printf("%-30s %s\n", name, ferry_escape(v, shown, sizeof shown));
  }
  return 0;
}

/* What the engine would refuse at create for want of a path: a placement
 * on nvme with tiers.nvme.paths empty (the values alone are each valid). */
static int check_paths(const ferry_config *c, const char *file) {
  static const char *const homes[] = {"placement.params", "placement.grads", "placement.optimizer"};
  char paths[64], home[32];
  if (ferry_config_get(c, "tiers.nvme.paths", paths, sizeof paths) == 0 && paths[0]) return 0;
  for (size_t i = 0; i < sizeof homes / sizeof homes[0]; i++) {
    if (ferry_config_get(c, homes[i], home, sizeof home) || strcmp(home, "nvme")) continue;
    fprintf(stderr,
            "ferry config: %s: %s = \"nvme\" but tiers.nvme.paths is empty (name the swap "
            "directories, e.g. tiers.nvme.paths = [\"/mnt/nvme0/ferry\"])\n",
            file, homes[i]);
    return 1;
  }
  return 0;
}

static int apply_sets(ferry_config *c, int argc, char **argv, int from) {
  for (int i = from; i < argc; i++) {
    if (strcmp(argv[i], "--set") || i + 1 >= argc) {
      fprintf(stderr, "ferry config: unexpected argument '%s'\n", argv[i]);
      return 2;
    }
    char kv[4096];
    snprintf(kv, sizeof kv, "%s", argv[++i]);
    char *eq = strchr(kv, '=');
    if (!eq) {
      fprintf(stderr, "ferry config: --set wants KEY=VALUE, got '%s'\n", kv);
      return 2;
    }
    *eq = '\0';
    if (ferry_config_set(c, kv, eq + 1)) {
      fprintf(stderr, "ferry config: %s\n", ferry_config_last_error(c));
      return 1;
    }
  }
  return 0;
}

int cli_config(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "keys")) {
    int md = argc > 2 && !strcmp(argv[2], "--markdown");
    if (md) printf("| key | type | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < ferry_config_key_count(); i++) {
      const char *name, *type, *def, *desc;
      ferry_config_key_info(i, &name, &type, &def, &desc);
      char t[256];
      size_t o = 0;
      for (const char *p = type; *p && o + 4 < sizeof t; p++) { /* '|' would split the table */
        if (*p == '|') {
          memcpy(t + o, " / ", 3);
          o += 3;
        } else {
          t[o++] = *p;
        }
      }
      t[o] = '\0';
      if (md) printf("| `%s` | %s | `%s` | %s |\n", name, t, def, desc);
      else printf("%-30s %-24s default %-12s %s\n", name, type, def[0] ? def : "\"\"", desc);
    }
    return 0;
  }
  int check = !strcmp(argv[1], "check"), write = !strcmp(argv[1], "write");
  if (!check && !write) {
    fprintf(stderr, "ferry config: unknown subcommand '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
  }
  if (argc < 3) {
    fprintf(stderr, "ferry config %s: needs a FILE\n", argv[1]);
    return 2;
  }
  ferry_config *c = NULL;
  if (ferry_config_create(&c)) {
    fprintf(stderr, "ferry config: %s\n", ferry_last_error());
    return 1;
  }
  int rc = 0;
  if (check && ferry_config_load_file(c, argv[2])) {
    fprintf(stderr, "ferry config: %s\n", ferry_config_last_error(c));
    rc = 1;
  }
  if (!rc) rc = apply_sets(c, argc, argv, 3);
  if (!rc && check) rc = check_paths(c, argv[2]);
  if (!rc && check) {
    printf("%s: ok\n", argv[2]);
    print_all(c);
  }
  if (!rc && write && ferry_config_write_file(c, argv[2])) {
    fprintf(stderr, "ferry config: %s\n", ferry_config_last_error(c));
    rc = 1;
  }
  ferry_config_destroy(c);
  return rc;
}
