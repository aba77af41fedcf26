/* offload/checkpoint_load.c — ferry_checkpoint_load: opens a checkpoint
 * with format/'s checks (ckpt_open: its manifest and every file's size and
 * CRC32C), checks it against the engine before it changes anything, then reads the blob
 * and the tensors and restores the step counter and the loss scale. With
 * ranks a load is a collective: rank 0 checks the files, every rank its
 * engine, and every rank reads its own pieces.
 */
#include "offload/checkpoint_common.h"
#include "core/untrusted.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- load ------------------------------------------------------------------ */

static int shape_equal(const ferry_safetensors_tensor *t, int ndim, const int64_t *shape) {
  if (t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d]) return 0;
  return 1;
}

/* Every tensor of the file is one of the engine's with the expected dtype
 * and shape, and every one of the engine's is there. */
static int check_part(ckpt_ctx *c, ferry_safetensors *f, unsigned roles, const char *what,
                      char *why, size_t wl) {
  size_t want = 0;
  engine_param_iter it = engine_params(c->e, 0);
  for (const engine_param_view *p; (p = engine_params_next(&it));) {
    for (int r = 0; r < FERRY_ROLE_COUNT; r++) {
      int whole = c->f.sharded && ckpt_keeps_whole(c, r); /* pieces here, whole there */
      if (!(roles >> r & 1) || (whole ? 0 : p->id[r] == UINT32_MAX)) continue;
      want++;
      char nm[FERRY_MEM_NAME_MAX + 1];
      ckpt_tensor_name(nm, p, r);
      ferry_safetensors_tensor t;
      if (ferry_safetensors_find(f, nm, &t, NULL)) {
        snprintf(why, wl, "%.400s: no tensor '%.300s'", what, nm);
        return FERRY_ECORRUPT;
      }
      ferry_mem_tensor_info ti; /* as registered (compact states: their dtype and bytes) */
      int64_t wshape[FERRY_MEM_MAX_DIMS];
      if (whole) {
        memset(&ti, 0, sizeof ti);
        ckpt_whole_info(c, p, r, &ti.dtype, &ti.ndim, wshape);
        ti.shape = wshape;
      } else if (ferry_mem_tensor_get(c->f.mem, p->id[r], &ti)) {
        snprintf(why, wl, "%.400s: tensor '%.300s' is not the engine's", what, nm);
        return FERRY_ECORRUPT;
      }
      if (t.dtype != ti.dtype || !shape_equal(&t, ti.ndim, ti.shape)) {
        snprintf(
            why, wl,
            "%.10s: tensor '%.300s' is %.8s with %d dims (first %lld), the engine has %.8s with %d "
            "(first %lld)",
            what, nm, ferry_dtype_name(t.dtype) ? ferry_dtype_name(t.dtype) : "?", t.ndim,
            t.ndim ? (long long)t.shape[0] : 0LL, ferry_dtype_name(ti.dtype), ti.ndim,
            (long long)ti.shape[0]);
        return FERRY_ECORRUPT;
      }
    }
  }
  if (ferry_safetensors_count(f) != want) {
    snprintf(why, wl, "%.400s: %zu tensors, the engine has %zu", what, ferry_safetensors_count(f),
             want);
    return FERRY_ECORRUPT;
  }
  return FERRY_OK;
}

/* Reads every tensor of f, in file order, into the engine. */
static int load_part(ckpt_ctx *c, ckpt_holder *h, ferry_safetensors *f) {
  char shown[FERRY_ERR_MAX]; /* a name from the file, escaped (core/untrusted.h) */
  for (size_t i = 0; i < ferry_safetensors_count(f); i++) {
    ferry_safetensors_tensor t;
    uint32_t id;
    ferry_safetensors_get(f, i, &t);
    if (ferry_mem_lookup(c->f.mem, t.name, &id))
      return ferry_err(c->f.err, FERRY_ECORRUPT, "checkpoint load: no tensor '%s'",
                       ferry_escape(t.name, shown, sizeof shown));
    void *ptr;
    size_t bytes;
    int rc = ckpt_holder_get(h, id, 1, &ptr, &bytes);
    if (rc) return rc;
    if (bytes != t.nbytes)
      return ferry_err(
          c->f.err, FERRY_ECORRUPT, "checkpoint load: '%s' has %llu bytes, expected %zu",
          ferry_escape(t.name, shown, sizeof shown), (unsigned long long)t.nbytes, bytes);
    if (h->tier != FERRY_TIER_DEVICE) {
      rc = ferry_safetensors_read(f, i, 0, ptr, bytes);
    } else {
      for (size_t at = 0; at < bytes && !rc; at += CKPT_BOUNCE) {
        size_t n = bytes - at < CKPT_BOUNCE ? bytes - at : CKPT_BOUNCE;
        rc = ferry_stream_synchronize(h->s); /* the bounce buffer is free */
        if (!rc) rc = ferry_safetensors_read(f, i, at, h->bounce, n);
        if (rc) break;
        rc = ferry_memcpy_async(h->s, (char *)ptr + at, h->bounce, n, FERRY_COPY_H2D);
        if (rc)
          return ferry_err(c->f.err, rc, "checkpoint load: %s: %s",
                           ferry_escape(t.name, shown, sizeof shown),
                           ferry_device_last_error(c->f.dev));
      }
    }
    if (rc)
      return ferry_err(c->f.err, rc, "checkpoint load: '%s': %s",
                       ferry_escape(t.name, shown, sizeof shown), ferry_safetensors_last_error(f));
  }
  return ckpt_holder_drop(h);
}

/* The config value of a manifest dtype name ("F32" -> "fp32"). */
static const char *layout_name(const char *dt) {
  return !strcmp(dt, "F32")    ? "fp32"
         : !strcmp(dt, "BF16") ? "bf16"
         : !strcmp(dt, "I8")   ? "int8"
                               : dt;
}

/* The checkpoint m fits the engine: its param dtype, optimizer and state
 * count, param count and (with dynamic loss scaling) a usable scale. */
static int check_fits(const ckpt_ctx *c, const ckpt_manifest *m, float scale, char *why,
                      size_t wl) {
  if (strcmp(m->param_dtype, ferry_dtype_name(c->f.dtype))) {
    snprintf(why, wl, "params are %.300s, the engine's precision.params is %.300s", m->param_dtype,
             ferry_dtype_name(c->f.dtype));
    return FERRY_ECORRUPT;
  }
  if (strcmp(m->optimizer, ckpt_optimizer_name(c->f.opt_type)) || m->states != c->f.nstates) {
    snprintf(why, wl, "optimizer %.300s with %d state(s), the engine runs %.300s with %d",
             m->optimizer, m->states, ckpt_optimizer_name(c->f.opt_type), c->f.nstates);
    return FERRY_ECORRUPT;
  }
  /* the optimizer's layout: never converted on load */
  const char *sdt = ferry_dtype_name(c->f.ocfg.state_dtype),
             *mdt = c->f.master_bf16 ? "BF16" : "F32";
  if (strcmp(m->state_dtype, sdt)) {
    snprintf(why, wl,
             "the optimizer states are %.8s, the engine's optimizer.state_dtype is "
             "\"%.8s\" (a checkpoint is loaded only into the layout it was saved from; set "
             "optimizer.state_dtype = \"%.8s\")",
             m->state_dtype, layout_name(sdt), layout_name(m->state_dtype));
    return FERRY_ECORRUPT;
  }
  if (c->f.ocfg.state_dtype == FERRY_DT_I8 && m->state_block != c->f.ocfg.state_block) {
    snprintf(why, wl,
             "the int8 optimizer states have blocks of %llu, the engine's "
             "optimizer.state_block is %zu (set optimizer.state_block = %llu)",
             (unsigned long long)m->state_block, c->f.ocfg.state_block,
             (unsigned long long)m->state_block);
    return FERRY_ECORRUPT;
  }
  if (strcmp(m->master_dtype, mdt)) {
    snprintf(why, wl,
             "the master weights are %.8s, the engine's precision.master is \"%.8s\" "
             "(set precision.master = \"%.8s\")",
             !strcmp(m->master_dtype, "BF16") ? "the bf16 params" : "fp32", layout_name(mdt),
             layout_name(m->master_dtype));
    return FERRY_ECORRUPT;
  }
  if (m->tensors != c->f.nparams) {
    snprintf(why, wl, "%llu params, the engine registered %zu", (unsigned long long)m->tensors,
             c->f.nparams);
    return FERRY_ECORRUPT;
  }
  if (c->f.dynamic_scale && !(scale > 0 && scale < INFINITY)) {
    snprintf(why, wl, "loss scale %g is not a positive finite number", (double)scale);
    return FERRY_ECORRUPT;
  }
  return FERRY_OK;
}

/* Opens folder's params/ and optim/ models (*pf, *of; the caller closes
 * them) and checks each holds exactly the engine's tensors. */
static int open_parts(ckpt_ctx *c, const ckpt_manifest *m, const char *folder,
                      ferry_safetensors **pf, ferry_safetensors **of, char *why, size_t wl) {
  int rc = ckpt_open_part(m, folder, "params", pf, why, wl);
  if (!rc) rc = ckpt_open_part(m, folder, "optim", of, why, wl);
  if (!rc) rc = check_part(c, *pf, 1u << FERRY_ROLE_PARAM, "params", why, wl);
  if (!rc)
    rc = check_part(
        c, *of, 1u << FERRY_ROLE_MASTER | 1u << FERRY_ROLE_EXP_AVG | 1u << FERRY_ROLE_EXP_AVG_SQ,
        "optim", why, wl);
  return rc;
}

/* folder/user.bin, `bytes` long, into blob. */
static int read_blob(ckpt_ctx *c, const char *folder, uint64_t bytes, void *blob) {
  char bp[4096], why[1024];
  int fd = -1, rc = ckpt_join(bp, sizeof bp, folder, "user.bin");
  /* no link, no FIFO: a regular file of at most bytes */
  if (!rc && (rc = ferry_open_untrusted(folder, "user.bin", bytes, &fd, NULL, why, sizeof why)))
    return ferry_err(c->f.err, rc == FERRY_EIO || rc == FERRY_EPERM ? rc : FERRY_ECORRUPT,
                     "checkpoint load: %s", why);
  size_t got = 0;
  while (fd >= 0 && got < bytes) {
    ssize_t r = read(fd, (char *)blob + got, (size_t)bytes - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (fd >= 0) close(fd);
  if (got != bytes) return ferry_err(c->f.err, FERRY_EIO, "checkpoint load: %s: cannot read", bp);
  return FERRY_OK;
}

/* Reads of (optimizer states) then pf (params) into the engine's tensors
 * and flushes the memory manager. */
static int load_tensors(ckpt_ctx *c, ferry_safetensors *pf, ferry_safetensors *of) {
  ckpt_holder h;
  int rc = ckpt_holder_init(&h, c);
  if (!rc)
    rc = c->f.sharded ? ckpt_move_pieces(c, &h, of, OPTIM_ROLES, 0, NULL) : load_part(c, &h, of);
  if (!rc)
    rc = c->f.params_sharded ? ckpt_move_pieces(c, &h, pf, 1u << FERRY_ROLE_PARAM, 0, NULL)
                             : load_part(c, &h, pf);
  if (!rc) ckpt_holder_drop(&h);
  ckpt_holder_destroy(&h);
  if (rc) return rc;
  rc = ferry_mem_flush(c->f.mem);
  if (rc)
    rc = ferry_err(c->f.err, rc, "checkpoint load: flush: %s", ferry_mem_last_error(c->f.mem));
  return rc;
}

/* A checkpoint opened and checked against the engine, not loaded yet. */
typedef struct {
  char folder[4096];
  ckpt_manifest m;
  ferry_safetensors *pf, *of;
  float scale;
} ckpt_loading;

static void loading_close(ckpt_loading *L) {
  ferry_safetensors_close(L->pf);
  ferry_safetensors_close(L->of);
  ckpt_manifest_free(&L->m);
  L->pf = L->of = NULL;
}

/* Everything a load checks before it changes anything (check_crc 0: not
 * the files' sizes and CRCs, which another rank checked). */
static int load_check(ckpt_ctx *c, const char *path, void *blob, size_t blob_cap, size_t *blob_len,
                      int check_crc, ckpt_loading *L) {
  char why[1024] = "";
  memset(L, 0, sizeof *L);
  int rc = ckpt_open(path, L->folder, sizeof L->folder, &L->m, check_crc, why, sizeof why);
  if (rc) return ferry_err(c->f.err, rc, "checkpoint load: %s", why);
  memcpy(&L->scale, &L->m.loss_scale_bits, sizeof L->scale);
  rc = check_fits(c, &L->m, L->scale, why, sizeof why);
  /* by name: the engine's index (the manifest's reader refused a name
   * listed twice: each param at most once) */
  for (size_t i = 0; !rc && i < L->m.nsteps; i++) {
    ckpt_param_step *ps = &L->m.steps[i];
    size_t at;
    char esc[160];
    if (engine_param_index(c->e, ps->name, (size_t)ps->index, &at)) {
      snprintf(why, sizeof why, "manifest: param_step %llu names '%s', which the engine has not "
               "registered", (unsigned long long)ps->index, ferry_escape(ps->name, esc, sizeof esc));
      rc = FERRY_ECORRUPT;
    } else {
      ps->index = at;
    }
  }
  if (!rc) rc = open_parts(c, &L->m, L->folder, &L->pf, &L->of, why, sizeof why);
  if (blob_len) *blob_len = (size_t)L->m.blob_bytes;
  if (!rc && blob && blob_cap < L->m.blob_bytes) {
    snprintf(why, sizeof why, "the blob has %llu bytes, the buffer %zu",
             (unsigned long long)L->m.blob_bytes, blob_cap);
    rc = FERRY_EOVERFLOW;
  }
  if (rc) {
    loading_close(L);
    return ferry_err(c->f.err, rc, "checkpoint load: %s: %s", L->folder, why);
  }
  return FERRY_OK;
}

/* Everything checked: the engine's state overwritten (the blob, the
 * tensors: a sharded engine's optim pieces read at their offsets). */
static int load_apply(ckpt_ctx *c, ckpt_loading *L, void *blob) {
  int rc = FERRY_OK;
  if (blob && L->m.blob_bytes) rc = read_blob(c, L->folder, L->m.blob_bytes, blob);
  if (!rc) rc = load_tensors(c, L->pf, L->of);
  if (rc)
    return ferry_err(c->f.err, rc, "%s (the engine's state is partly overwritten: load again)",
                     ferry_err_msg(c->f.err));
  return FERRY_OK;
}

static void load_restore(ckpt_ctx *c, const ckpt_loading *L) {
  engine_progress p = {L->m.step, L->scale, (int)L->m.good_steps, L->m.skipped};
  engine_restore(c->e, &p);
  for (size_t i = 0; i < L->m.nsteps; i++) /* params left out of some steps */
    engine_param_set_steps(c->e, (size_t)L->m.steps[i].index, L->m.steps[i].steps);
}

#define WHY_BYTES 512 /* of rank 0's verdict sent to the others */

/* A load by every rank (a collective on the loop channel): rank 0 checks
 * the manifest and every file's size and CRC32C and sends its verdict
 * (status and message) to the others; then every rank checks the
 * checkpoint against its engine (headers, shapes, layout, blob size), the
 * ranks agree, and every rank loads (the params whole, a sharded engine's
 * optim pieces at their offsets); the ranks agree again. A refusal on any
 * rank refuses on every rank before anything changes. */
static int load_ranks(ckpt_ctx *c, const char *path, void *blob, size_t blob_cap,
                      size_t *blob_len) {
  static const char op[] = "checkpoint load";
  ckpt_loading L;
  memset(&L, 0, sizeof L);
  char verdict[WHY_BYTES];
  memset(verdict, 0, sizeof verdict);
  int rc = FERRY_OK;
  if (c->f.rank == 0) {
    rc = load_check(c, path, blob, blob_cap, blob_len, 1, &L);
    int32_t v = rc;
    memcpy(verdict, &v, sizeof v);
    if (rc) snprintf(verdict + 4, sizeof verdict - 4, "%s", ferry_err_msg(c->f.err));
  }
  int crc = ferry_comm_broadcast(c->f.ch, verdict, sizeof verdict, FERRY_DT_U8, 0, NULL, NULL);
  if (crc) {
    loading_close(&L);
    return ferry_err(c->f.err, crc, "%s: rank 0's verdict: %s", op, ferry_comm_last_error(c->f.ch));
  }
  int32_t v;
  memcpy(&v, verdict, sizeof v);
  verdict[sizeof verdict - 1] = 0;
  if (v) {
    if (c->f.rank) rc = ferry_err(c->f.err, v, "%s (checked by rank 0)", verdict + 4);
    return rc;
  }
  if (c->f.rank) rc = load_check(c, path, blob, blob_cap, blob_len, 0, &L);
  rc = ranks_agree(c->e, rc, op);
  if (!rc) rc = load_apply(c, &L, blob);
  rc = ranks_agree(c->e, rc, op);
  if (!rc) load_restore(c, &L);
  loading_close(&L);
  return rc;
}

int ferry_checkpoint_load(ferry_engine *e, const char *path, void *blob, size_t blob_cap,
                          size_t *blob_len) {
  if (!e) return FERRY_EINVAL;
  ckpt_ctx cx, *c = &cx;
  ckpt_ctx_init(c, e);
  int rc = !path || !path[0] ? ferry_err(c->f.err, FERRY_EINVAL, "checkpoint load: no path")
                             : engine_quiesce(e, "checkpoint load");
  if (c->f.nranks > 1) {
    rc = ranks_agree(e, rc, "checkpoint load");
    return rc ? rc : load_ranks(c, path, blob, blob_cap, blob_len);
  }
  if (rc) return rc;
  ckpt_loading L;
  rc = load_check(c, path, blob, blob_cap, blob_len, 1, &L);
  if (rc) return rc;
  rc = load_apply(c, &L, blob);
  if (!rc) load_restore(c, &L);
  loading_close(&L);
  return rc;
}
