/* offload/checkpoint_common.c — what the checkpoint files share
 * (checkpoint_common.h): the context of one call onto the engine and the
 * holder of one group's tensors. Files and folders are format/'s
 * (checkpoint_files.c).
 */
#include "offload/checkpoint_common.h"
#include "core/crc32c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *optim_names[] = {"adamw", "adam", "adagrad", "lamb", "sgd", "lion"};

void ckpt_ctx_init(ckpt_ctx *c, ferry_engine *e) {
  memset(c, 0, sizeof *c);
  c->e = e;
  engine_walk_facts(e, &c->f);
}

const char *ckpt_optimizer_name(ferry_optim_type t) { return optim_names[t]; }

void ckpt_tensor_name(char *nm, const engine_param_view *p, int r) {
  snprintf(nm, FERRY_MEM_NAME_MAX + 1, "%s%s", p->name, engine_role_suffix(r));
}

/* ---- the engine's tensors ------------------------------------------------ */

static int family_tier(const ckpt_ctx *c, int family) {
  int home = family == FERRY_FAMILY_PARAMS ? c->f.param_home : c->f.optim_home;
  return home == FERRY_TIER_DEVICE ? FERRY_TIER_DEVICE : FERRY_TIER_HOST;
}

int ckpt_holder_init(ckpt_holder *h, ckpt_ctx *c) {
  memset(h, 0, sizeof *h);
  h->c = c;
  int rc = ferry_stream_create(c->f.dev, &h->s);
  if (rc)
    return ferry_err(c->f.err, rc, "checkpoint: stream: %s", ferry_device_last_error(c->f.dev));
  h->bounce = malloc(CKPT_BOUNCE);
  if (!h->bounce) return ferry_err(c->f.err, FERRY_ENOMEM, "checkpoint: out of memory");
  return FERRY_OK;
}

int ckpt_holder_drop(ckpt_holder *h) {
  if (!h->held) return FERRY_OK;
  ckpt_ctx *c = h->c;
  int rc = FERRY_OK;
  if (h->tier == FERRY_TIER_DEVICE) rc = ferry_stream_synchronize(h->s);
  int home = h->family == FERRY_FAMILY_PARAMS ? c->f.param_home : c->f.optim_home;
  if (!rc && h->writing && home == FERRY_TIER_NVME)
    rc = ferry_mem_writeback(c->f.mem, h->group, h->family, h->tier);
  int r2 = ferry_mem_release(c->f.mem, h->group, h->family, h->tier,
                             h->tier == FERRY_TIER_DEVICE ? h->s : NULL);
  h->held = 0;
  if (!rc) rc = r2;
  if (rc)
    return ferry_err(c->f.err, rc, "checkpoint: group %u (%s): %s", h->group,
                     ferry_family_name(h->family), ferry_mem_last_error(c->f.mem));
  return FERRY_OK;
}

void ckpt_holder_destroy(ckpt_holder *h) {
  ckpt_holder_drop(h);
  if (h->s) ferry_stream_destroy(h->s);
  free(h->bounce);
}

int ckpt_holder_get(ckpt_holder *h, uint32_t id, int writing, void **ptr, size_t *bytes) {
  ckpt_ctx *c = h->c;
  ferry_mem_tensor_info ti;
  int rc = ferry_mem_tensor_get(c->f.mem, id, &ti);
  if (rc)
    return ferry_err(c->f.err, rc, "checkpoint: tensor %u: %s", id, ferry_mem_last_error(c->f.mem));
  int tier = family_tier(c, ti.family);
  if (!h->held || h->group != ti.group || h->family != ti.family || h->writing != writing) {
    rc = ckpt_holder_drop(h);
    if (rc) return rc;
    rc = ferry_mem_fetch(c->f.mem, ti.group, ti.family, tier,
                         tier == FERRY_TIER_DEVICE ? h->s : NULL, FERRY_MEM_NOTRACE);
    if (rc)
      return ferry_err(c->f.err, rc, "checkpoint: fetching group %u (%s): %s", ti.group,
                       ferry_family_name(ti.family), ferry_mem_last_error(c->f.mem));
    h->held = 1;
    h->group = ti.group;
    h->family = ti.family;
    h->tier = tier;
    h->writing = writing;
    if (writing) {
      rc = ferry_mem_mark_dirty(c->f.mem, ti.group, ti.family, tier,
                                tier == FERRY_TIER_DEVICE ? h->s : NULL);
      if (rc)
        return ferry_err(c->f.err, rc, "checkpoint: group %u (%s): %s", ti.group,
                         ferry_family_name(ti.family), ferry_mem_last_error(c->f.mem));
    }
  }
  rc = ferry_mem_tensor_ptr(c->f.mem, id, tier, ptr);
  if (rc)
    return ferry_err(c->f.err, rc, "checkpoint: %s: %s", ti.name, ferry_mem_last_error(c->f.mem));
  *bytes = ti.bytes;
  return FERRY_OK;
}

/* Streams tensors into a writer: `roles` selects which (bit per role). */
