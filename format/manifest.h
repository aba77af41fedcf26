/* format/manifest.h — checkpoints inside the library (the public calls
 * are in include/ferry.h): the manifest of a checkpoint folder and its file
 * of per-param step counts, their writers and their strict readers
 * (checkpoint_manifest.c, no engine needed, so tests and the fuzz target
 * use them alone).
 */
#ifndef FERRY_FORMAT_MANIFEST_H
#define FERRY_FORMAT_MANIFEST_H

#include "core/core.h"

#define CKPT_FORMAT_VERSION 5 /* read; version 5 has the line "param_steps <n>" (n
                                 params' own step count differs from the step) and
                                 their n lines in the file CKPT_STEPS_NAME; it is
                                 written only then, else version 3. Still read:
                                 version 4 (those lines in the manifest itself),
                                 version 2 (no ranks lines: one rank) and version 1
                                 (no optimizer layout lines either: fp32 states and
                                 master) */
#define CKPT_MANIFEST_NAME "manifest"
#define CKPT_MANIFEST_MAX (1u << 20)  /* bytes of a manifest (CKPT_MAX_FILES file lines
                                         of at most 231 bytes and the rest fit) */
#define CKPT_MAX_FILES 4096
#define CKPT_PATH_MAX 200             /* bytes of a file path inside a checkpoint */
#define CKPT_NAME_MAX 255             /* bytes of a param's name (memory/'s limit) */
#define CKPT_STEPS_NAME "param_steps" /* version 5: the per-param step counts */
#define CKPT_STEP_LINE_MAX 320        /* bytes of one "param_step" line (at most 308) */
#define CKPT_STEPS_MAX (1ull << 30)   /* bytes of the file CKPT_STEPS_NAME: 3.3 million
                                         lines with the longest names */
#define CKPT_MAX_BLOB (1ull << 30)    /* bytes of the caller's blob */
#define CKPT_MAX_FILE_BYTES (1ull << 50)

typedef struct {
  char path[CKPT_PATH_MAX + 1]; /* relative to the checkpoint folder */
  uint64_t bytes;
  uint32_t crc;                 /* CRC32C of the whole file */
} ckpt_file;

/* A param whose own optimizer step count is not the checkpoint's step (it
 * got no gradient in some steps): its index in registration order when
 * saved and its name, which a load goes by (tensors are matched by name, so
 * a model that registers its params in another order loads too). */
typedef struct {
  uint64_t index;
  int64_t steps;                 /* <= the checkpoint's step */
  const char *name;              /* printable ASCII, 1 to CKPT_NAME_MAX bytes; the parser
                                    points it into the manifest's `names` */
} ckpt_param_step;

/* Everything a manifest holds, in the order its lines come. */
typedef struct {
  int version;
  int64_t step;              /* optimizer steps taken */
  char param_dtype[8];       /* "F32", "F16", "BF16" */
  char optimizer[16];        /* "adamw", ... */
  int states;                /* optimizer states per element: 0, 1, 2 */
  char state_dtype[8];       /* "F32", "BF16", "I8" (version 1: "F32") */
  uint64_t state_block;      /* int8 states' absmax block (version 1: 256) */
  char master_dtype[8];      /* "F32", or "BF16": no master, the params are it */
  uint64_t ranks;            /* ranks that saved it (versions 1 and 2: 1); for information:
                                a checkpoint loads on any number of ranks */
  uint64_t zero_stage;       /* their dist.zero_stage (versions 1 and 2: 0); information */
  uint32_t loss_scale_bits;  /* the dynamic loss scale (float bits) */
  int64_t good_steps;        /* loss scaler: steps since the last overflow or growth */
  int64_t skipped;           /* loss scaler: steps skipped */
  uint64_t tensors;          /* params registered */
  uint64_t blob_bytes;       /* the caller's blob (file user.bin) */
  size_t nfiles;
  ckpt_file *files;          /* nfiles, malloc'd, paths sorted and unique */
  uint64_t steps_listed;     /* versions 4 and 5: params whose count is not `step` (the
                                others' is); before them none */
  size_t nsteps;             /* those in `steps`: version 4 steps_listed; version 5 0 until
                                ckpt_param_steps_parse read the file */
  ckpt_param_step *steps;    /* nsteps, malloc'd, indices increasing, each < tensors */
  char *names;               /* the parser's pool of the steps' names, malloc'd */
} ckpt_manifest;

/* Parses a manifest. check_crc 0 skips only the final CRC comparison (the
 * fuzz target reaches the rest that way). On failure: FERRY_ECORRUPT (or
 * FERRY_ENOMEM) with the line and what is wrong in why; *out is left
 * empty. */
int ckpt_manifest_parse(const char *text, size_t len, int check_crc, ckpt_manifest *out,
                        char *why, size_t why_len);
/* Formats a manifest (ending with its crc32c line) into a malloc'd buffer:
 * version 5 with a line "param_steps <steps_listed>" when steps_listed,
 * else version 3. */
int ckpt_manifest_format(const ckpt_manifest *m, char **text, size_t *len);
/* The bytes a version 5 manifest m allows its file CKPT_STEPS_NAME: at
 * most CKPT_STEP_LINE_MAX a line and CKPT_STEPS_MAX in all. */
uint64_t ckpt_param_steps_limit(const ckpt_manifest *m);
/* Version 5: the file CKPT_STEPS_NAME (text, len), exactly
 * m->steps_listed lines "param_step <index> <steps> <name>" checked as a
 * version 4 manifest's, into m->steps; refused (FERRY_ECORRUPT, the line
 * and the reason in why) above ckpt_param_steps_limit before a line is
 * read. */
int ckpt_param_steps_parse(const char *text, size_t len, ckpt_manifest *m, char *why,
                           size_t why_len);
/* The bytes of m->steps' lines (the file CKPT_STEPS_NAME), formatted. */
uint64_t ckpt_param_steps_bytes(const ckpt_manifest *m);
/* m->steps' lines, the file CKPT_STEPS_NAME, into a malloc'd buffer. */
int ckpt_param_steps_format(const ckpt_manifest *m, char **text, size_t *len);
void ckpt_manifest_free(ckpt_manifest *m);

#endif
