/* offload/checkpoint_common.h — what the checkpoint files share: the
 * context of one call (ckpt_ctx: the engine's facts through engine_walk.h),
 * the holder that keeps one group of one family's
 * tensors in reach (checkpoint_common.c), and the tensors of a checkpoint
 * part between the engine and safetensors files (checkpoint_tensors.c).
 * Its users: checkpoint_save.c, checkpoint_load.c, checkpoint_export.c.
 */
#ifndef FERRY_OFFLOAD_CHECKPOINT_COMMON_H
#define FERRY_OFFLOAD_CHECKPOINT_COMMON_H

#include "format/checkpoint_files.h"
#include "format/manifest.h"
#include "offload/engine_walk.h"
#include "format/safetensors.h"

#define CKPT_BOUNCE        (4u << 20) /* device <-> host copies go through this */
#define CKPT_DEFAULT_SHARD (4ull << 30)
#define OPTIM_ROLES                                                                                \
  (1u << FERRY_ROLE_MASTER | 1u << FERRY_ROLE_EXP_AVG | 1u << FERRY_ROLE_EXP_AVG_SQ)

/* One checkpoint call on an engine. */
typedef struct {
  ferry_engine *e; /* for the engine's calls (engine_walk.h) */
  engine_facts f;  /* its layout and handles */
  int phases;      /* the gathered parts (ckpt_optim_phase) this rank took part in */
} ckpt_ctx;
void ckpt_ctx_init(ckpt_ctx *c, ferry_engine *e);
/* The manifest's name of optimizer.type ("adamw", ...). */
const char *ckpt_optimizer_name(ferry_optim_type t);
/* Role r's tensor of p: the param's name and the role's suffix (nm holds
 * FERRY_MEM_NAME_MAX + 1 bytes). */
void ckpt_tensor_name(char *nm, const engine_param_view *p, int r);

/* ---- the engine's tensors (checkpoint_common.c) ---- */

/* One group of one family held at a time, in the tier the bytes are read
 * or written in; device bytes go through a host bounce buffer. */
typedef struct {
  ckpt_ctx *c;
  ferry_stream *s;
  char *bounce;
  int held, writing;
  uint32_t group;
  int family, tier;
} ckpt_holder;
int ckpt_holder_init(ckpt_holder *h, ckpt_ctx *c);
int ckpt_holder_drop(ckpt_holder *h);
void ckpt_holder_destroy(ckpt_holder *h);
/* Holds the group of tensor `id`; *ptr: its bytes in the holder's tier. */
int ckpt_holder_get(ckpt_holder *h, uint32_t id, int writing, void **ptr, size_t *bytes);

/* ---- a checkpoint part's tensors (checkpoint_tensors.c) ---- */

/* A sharded engine keeps role r of its params in pieces, written whole. */
int ckpt_keeps_whole(const ckpt_ctx *c, int r);
/* Role r of p whole, as one rank keeps it: dtype and shape. */
void ckpt_whole_info(const ckpt_ctx *c, const engine_param_view *p, int r, ferry_dtype *dt,
                     int *ndim, int64_t *shape);
/* A writer over `path` (a folder when max_shard > 0) filled with the
 * tensors of `roles` and finished (a sharded part: gathered whole). */
int ckpt_write_model(ckpt_ctx *c, ckpt_holder *h, const char *path, uint64_t max_shard,
                     unsigned roles, ferry_dtype param_dt);
/* The gathered part of a sharded export on every rank (a collective);
 * w: rank 0's writer, NULL elsewhere. */
int ckpt_optim_phase(ckpt_ctx *c, ckpt_holder *h, ferry_safetensors_writer *w);
/* Rank 0: a part (roles) laid out with every tensor whole and its bytes
 * holes. */
int ckpt_layout_part(ckpt_ctx *c, const char *path, uint64_t max_shard, unsigned roles);
/* How many files the save writes of the part (roles) at max_shard bytes a
 * shard (ckpt_write_model, or ckpt_layout_part when sharded): the writer's
 * own layout of the tensors it will be given, nothing written. */
int ckpt_part_files(ckpt_ctx *c, uint64_t max_shard, unsigned roles, uint64_t *files);
/* This rank's pieces of a part (roles) into its laid-out model at path,
 * fsynced. */
int ckpt_write_pieces(ckpt_ctx *c, const char *path, unsigned roles);
/* Every piece this rank keeps of a part (roles), between the engine and
 * the checkpoint's model f: written (out; fds: f's shards) or read. */
int ckpt_move_pieces(ckpt_ctx *c, ckpt_holder *h, ferry_safetensors *f, unsigned roles, int out,
                     const int *fds);

#endif
