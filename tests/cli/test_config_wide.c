/* tests/cli/test_config_wide.c — config text with integers beyond 32 bits,
 * through the public API (ferry_config_load_string, as Python's
 * ferry.Config(text) loads): libconfig 1.5 keeps the low 32 bits of an
 * integer written without an L suffix, so such a number is refused naming
 * the line and the number (and in ferry_config_set's grammar values, the
 * key); with the suffix, or quoted, it is read whole.
 * Strings and comments that hold long digit runs are not numbers.
 */
#include "ferry.h"
#include "tests/test.h"

#include <string.h>

static ferry_config *c;

static int load(const char *text) { return ferry_config_load_string(c, text, "wide.cfg"); }

static int value_is(const char *key, const char *want) {
  char buf[64];
  if (ferry_config_get(c, key, buf, sizeof buf)) return 0;
  if (strcmp(buf, want)) fprintf(stderr, "  %s is %s, wanted %s\n", key, buf, want);
  return !strcmp(buf, want);
}

int main(void) {
  REQUIRE(ferry_config_create(&c) == FERRY_OK);
  /* 4 GiB + 4 KiB: it was read as 4096, and 32 GiB in bytes as 0 */
  EXPECT_EQ_INT(load("# a comment\nchunk_size = 4294971392;\n"), FERRY_ECONFIG);
  const char *e = ferry_config_last_error(c);
  printf("refused: %s\n", e);
  EXPECT(strstr(e, "wide.cfg:2") && strstr(e, "4294971392L"));
  EXPECT(value_is("chunk_size", "67108864")); /* nothing changed */
  EXPECT_EQ_INT(load("tiers: { host: { budget = 34359738368; }; };\n"), FERRY_ECONFIG);
  EXPECT_EQ_INT(load("grad_accumulation = 0x100000002;\n"), FERRY_ECONFIG);
  EXPECT(strstr(ferry_config_last_error(c), "0x100000002"));
  EXPECT_EQ_INT(load("tiers: { nvme: { queue_depth = -4294967264; }; };\n"), FERRY_ECONFIG);
  /* read whole: the L suffix, a quoted size; 32-bit values as before */
  EXPECT_EQ_INT(load("chunk_size = 4294971392L;\n"), FERRY_OK);
  EXPECT(value_is("chunk_size", "4294971392"));
  EXPECT_EQ_INT(load("tiers: { host: { budget = \"32G\"; }; };\n"), FERRY_OK);
  EXPECT(value_is("tiers.host.budget", "34359738368"));
  EXPECT_EQ_INT(load("chunk_size = 2147483647; optimizer: { lr = 12345678901.5e-20; eps = 1e-30; };\n"),
                FERRY_OK);
  EXPECT(value_is("chunk_size", "2147483647"));
  /* the file's grammar in ferry_config_set (a list): the same */
  EXPECT_EQ_INT(ferry_config_set(c, "optimizer.betas", "(0.9, 4294967296)"), FERRY_ECONFIG);
  EXPECT(strstr(ferry_config_last_error(c), "optimizer.betas") &&
         strstr(ferry_config_last_error(c), "4294967296L"));
  EXPECT_EQ_INT(ferry_config_set(c, "optimizer.betas", "(0.9, 0.99)"), FERRY_OK);
  /* digits in strings, comments and names are not numbers */
  EXPECT_EQ_INT(load("/* 99999999999 */ tiers: { nvme: { paths = [\"/mnt/d99999999999\"]; }; };"
                     " // 88888888888\n"),
                FERRY_OK);
  ferry_config_destroy(c);
  return test_finish("cli.config.wide");
}
