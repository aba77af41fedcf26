/* offload/checkpoint_export.c — ferry_export_weights: the engine's params
 * as a plain safetensors model (one file, or a folder of shards), written
 * beside the target and renamed into place. At ZeRO stage 3 the export is
 * a collective: rank 0 writes the params gathered whole from every rank.
 */
#include "offload/checkpoint_common.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The gathered parts (ckpt_optim_phase) that this rank has not taken part
 * in (every one on ranks other than 0; the ones rank 0 did not reach when
 * it failed), up to `phases`; rc: this rank's status so far. */
static int other_phases(ckpt_ctx *c, int phases, int rc) {
  while (c->phases < phases) {
    ckpt_holder h;
    int hrc = ckpt_holder_init(&h, c);
    int prc = ckpt_optim_phase(c, &h, NULL);
    ckpt_holder_destroy(&h);
    if (!rc) rc = hrc ? hrc : prc;
  }
  return rc;
}

static int parent_of(const char *path, char *out, size_t cap) {
  const char *sl = strrchr(path, '/');
  if (!sl) return snprintf(out, cap, ".") < 0 ? FERRY_EOVERFLOW : FERRY_OK;
  if (sl == path) return snprintf(out, cap, "/") < 0 ? FERRY_EOVERFLOW : FERRY_OK;
  int n = snprintf(out, cap, "%.*s", (int)(sl - path), path);
  return n < 0 || (size_t)n >= cap ? FERRY_EOVERFLOW : FERRY_OK;
}

/* The export of this engine's params (alone, any rank at stages 0-2, or
 * rank 0 at stage 3, whose params part gathers the other ranks' pieces). */
static int export_local(ckpt_ctx *c, const char *path, uint64_t max_shard_bytes) {
  int rc;
  char tmp[4096], trash[4096], parent[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid()) >= (int)sizeof tmp ||
      snprintf(trash, sizeof trash, "%s.trash-%ld", path, (long)getpid()) >= (int)sizeof trash ||
      parent_of(path, parent, sizeof parent))
    return ferry_err(c->f.err, FERRY_EOVERFLOW, "export: path too long");
  ckpt_rm_tree(tmp);
  ckpt_holder h;
  rc = ckpt_holder_init(&h, c);
  if (!rc) rc = ckpt_write_model(c, &h, tmp, max_shard_bytes, 1u << FERRY_ROLE_PARAM, c->f.dtype);
  ckpt_holder_destroy(&h);
  int r = 0;
  if (!rc && max_shard_bytes && (r = ckpt_fsync(tmp)))
    rc = ferry_err(c->f.err, ckpt_io_status(-r), "export: fsync %s: %s", tmp, strerror(-r));
  if (!rc) {
    r = ckpt_rename_into_place(tmp, path, trash);
    if (!r) r = ckpt_fsync(parent);
    if (r)
      rc = ferry_err(c->f.err, ckpt_io_status(-r), "export: rename %s -> %s: %s", tmp, path,
                     strerror(-r));
  }
  if (rc) ckpt_rm_tree(tmp);
  return rc;
}

int ferry_export_weights(ferry_engine *e, const char *path, uint64_t max_shard_bytes) {
  if (!e) return FERRY_EINVAL;
  ckpt_ctx cx, *c = &cx;
  ckpt_ctx_init(c, e);
  if (!path || !path[0]) return ferry_err(c->f.err, FERRY_EINVAL, "export: no path");
  int rc = engine_quiesce(e, "export");
  if (!c->f.params_sharded) return rc ? rc : export_local(c, path, max_shard_bytes);
  /* stage 3 (a collective): rank 0 writes the params gathered whole */
  rc = ranks_agree(e, rc, "export");
  if (rc) return rc;
  if (c->f.rank == 0) rc = export_local(c, path, max_shard_bytes);
  return ranks_root_status(e, other_phases(c, 1, rc), "export");
}
