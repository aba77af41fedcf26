/* tests/gpt/fixture_model.h — one family of tests/fixtures/gpt/ loaded for a
 * test: its config.json, the schema built from it, a resident (host)
 * provider with its model.safetensors loaded. A failure ends the test,
 * naming it. Header only: each test that includes it gets its own copy.
 */
#ifndef FERRY_TESTS_GPT_FIXTURE_MODEL_H
#define FERRY_TESTS_GPT_FIXTURE_MODEL_H

#include "gpt.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
  gpt_config cfg;
  gpt_schema s;
  gpt_resident r;
  gpt_provider p; /* over r: the struct stays where it was loaded */
} fixture_model;

/* dir/family/config.json and dir/family/model.safetensors into *m. */
static void fixture_model_load(fixture_model *m, const char *dir, const char *family) {
  char path[1024], err[512];
  snprintf(path, sizeof path, "%s/%s/config.json", dir, family);
  if (gpt_config_load_json(path, &m->cfg, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  if (gpt_schema_build(&m->cfg, &m->s) || gpt_resident_init(&m->r, &m->s)) {
    fprintf(stderr, "%s: cannot build the schema or its resident provider\n", path);
    exit(1);
  }
  m->p = gpt_resident_provider(&m->r);
  snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, family);
  if (gpt_weights_load(&m->s, &m->p, path, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
}

static void fixture_model_free(fixture_model *m) {
  gpt_resident_free(&m->r);
  gpt_schema_free(&m->s);
}

#endif /* FERRY_TESTS_GPT_FIXTURE_MODEL_H */
