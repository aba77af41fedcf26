/* offload/checkpoint_tensors.c — the tensors of a checkpoint part
 * (params/ or optim/) between the engine and safetensors files: streamed
 * out one group at a time as the engine keeps them, and a sharded engine's
 * pieces gathered whole, laid out, written and read at their offsets.
 * Used by the save, the load and the export.
 */
#include "offload/checkpoint_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The tensors of `roles` (bit per role) as this process keeps them, added
 * to a writer with the metadata. */
static int add_tensors(ckpt_ctx *c, ferry_safetensors_writer *w, unsigned roles,
                       ferry_dtype param_dt) {
  int rc = ferry_safetensors_writer_metadata(w, "format", "pt");
  engine_param_iter it = engine_params(c->e, 1);
  for (const engine_param_view *p; !rc && (p = engine_params_next(&it));) {
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc; r++) {
      if (!(roles >> r & 1) || p->id[r] == UINT32_MAX) continue;
      char nm[FERRY_MEM_NAME_MAX + 1];
      ckpt_tensor_name(nm, p, r);
      /* as registered: compact states as they are (bf16, or int8 codes and
       * absmax as one U8 tensor of bytes) */
      ferry_mem_tensor_info ti;
      rc = ferry_mem_tensor_get(c->f.mem, p->id[r], &ti);
      if (rc)
        return ferry_err(c->f.err, rc, "checkpoint: %s: %s", nm, ferry_mem_last_error(c->f.mem));
      rc = ferry_safetensors_writer_add(w, nm, r == FERRY_ROLE_PARAM ? param_dt : ti.dtype, ti.ndim,
                                        ti.shape);
    }
  }
  return rc ? ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w)) : FERRY_OK;
}

/* Streams tensors into a writer: `roles` selects which (bit per role). */
static int write_tensors(ckpt_ctx *c, ckpt_holder *h, ferry_safetensors_writer *w, unsigned roles,
                         ferry_dtype param_dt) {
  int rc = add_tensors(c, w, roles, param_dt);
  if (rc) return rc;
  /* A zero-byte write lays the files out now (their headers are written),
   * so a failure there (ENOSPC) keeps its status; any other answer is the
   * name check, which the loop below passes. */
  rc = ferry_safetensors_writer_write(w, "", NULL, 0);
  if (rc && rc != FERRY_ESTATE)
    return ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w));
  rc = FERRY_OK;
  const char *nm;
  while ((nm = ferry_safetensors_writer_next(w))) {
    uint32_t id;
    if (ferry_mem_lookup(c->f.mem, nm, &id))
      return ferry_err(c->f.err, FERRY_ESTATE, "checkpoint: no tensor '%s'", nm);
    void *ptr;
    size_t bytes;
    rc = ckpt_holder_get(h, id, 0, &ptr, &bytes);
    if (rc) return rc;
    if (h->tier != FERRY_TIER_DEVICE) {
      rc = ferry_safetensors_writer_write(w, nm, ptr, bytes);
    } else {
      for (size_t at = 0; at < bytes && !rc; at += CKPT_BOUNCE) {
        size_t n = bytes - at < CKPT_BOUNCE ? bytes - at : CKPT_BOUNCE;
        rc = ferry_memcpy_async(h->s, h->bounce, (char *)ptr + at, n, FERRY_COPY_D2H);
        if (!rc) rc = ferry_stream_synchronize(h->s);
        if (rc)
          return ferry_err(c->f.err, rc, "checkpoint: %s: %s", nm,
                           ferry_device_last_error(c->f.dev));
        rc = ferry_safetensors_writer_write(w, nm, h->bounce, n);
      }
    }
    if (rc) return ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  return ckpt_holder_drop(h);
}

/* ---- sharded engines (ZeRO stage >= 1 with ranks) -------------------------
 * The checkpoint of a sharded engine has the files and layout of one a
 * single rank writes: every master and state whole (and at stage 3 every
 * param), so it loads on any number of ranks. Rank 0 lays the files of a
 * sharded part out (headers, every tensor's bytes a hole,
 * st_writer_finish_holes); then every rank writes its pieces into them at
 * their offsets (pwrite), and each rank loads only its pieces (reads at
 * the same offsets). The export at stage 3 gathers the params whole on
 * rank 0 instead (ckpt_optim_phase). */

/* A sharded engine keeps role r of its params in pieces, written whole:
 * the master and states (stage >= 1) and the params (stage 3). */
int ckpt_keeps_whole(const ckpt_ctx *c, int r) {
  if (r == FERRY_ROLE_PARAM) return c->f.params_sharded;
  if (r == FERRY_ROLE_GRAD) return 0;
  return r == FERRY_ROLE_MASTER ? !c->f.master_bf16 : c->f.nstates >= r - FERRY_ROLE_MASTER;
}

/* Bytes per element of role r's whole tensor (not int8 states). */
static size_t whole_esize(const ckpt_ctx *c, int r) {
  return r == FERRY_ROLE_PARAM    ? c->f.esize
         : r == FERRY_ROLE_MASTER ? 4
                                  : ferry_dtype_size(c->f.ocfg.state_dtype);
}

/* Role r of p whole, as one rank keeps it: dtype and shape. */
void ckpt_whole_info(const ckpt_ctx *c, const engine_param_view *p, int r, ferry_dtype *dt,
                     int *ndim, int64_t *shape) {
  *ndim = p->ndim;
  memcpy(shape, p->shape, (size_t)p->ndim * sizeof *shape);
  *dt = r == FERRY_ROLE_PARAM    ? c->f.dtype
        : r == FERRY_ROLE_MASTER ? (ferry_dtype)FERRY_DT_F32
                                 : (ferry_dtype)c->f.ocfg.state_dtype;
  if (*dt == FERRY_DT_I8) { /* codes and absmax as bytes */
    *dt = FERRY_DT_U8;
    *ndim = 1;
    shape[0] = (int64_t)ferry_optimizer_state_bytes(&c->f.ocfg, p->n);
  }
}

/* int8 states of n elements: codes padded to 64 bytes, then one fp32
 * absmax per block (ferry_optimizer_state_bytes). A piece starts at a
 * block boundary, so its blocks are the whole tensor's. */
static size_t codes_bytes(size_t n) { return (n + 63) / 64 * 64; }
static size_t blocks_of(const ckpt_ctx *c, size_t n) {
  size_t b = c->f.ocfg.state_block ? c->f.ocfg.state_block : 256;
  return (n + b - 1) / b;
}
static int is_int8(const ckpt_ctx *c, int r) {
  return r >= FERRY_ROLE_EXP_AVG && c->f.ocfg.state_dtype == FERRY_DT_I8;
}

/* This rank's piece of role r of p into host memory `mine` (nothing when
 * it has none). */
static int piece_out(ckpt_ctx *c, ckpt_holder *h, const engine_param_view *p, int r, char *mine) {
  if (!p->pn) return FERRY_OK;
  void *ptr;
  size_t bytes;
  int rc = ckpt_holder_get(h, p->id[r], 0, &ptr, &bytes);
  if (rc) return rc;
  if (h->tier != FERRY_TIER_DEVICE) {
    memcpy(mine, ptr, bytes);
    return FERRY_OK;
  }
  rc = ferry_memcpy_async(h->s, mine, ptr, bytes, FERRY_COPY_D2H);
  if (!rc) rc = ferry_stream_synchronize(h->s);
  return rc ? ferry_err(c->f.err, rc, "checkpoint: %s", ferry_device_last_error(c->f.dev))
            : FERRY_OK;
}

/* Role r of p whole into `full` on every rank (a collective): every rank's
 * piece gathered in rank order (int8: the codes, then the absmax). */
static int gather_whole(ckpt_ctx *c, const engine_param_view *p, int r, const char *mine,
                        char *full, size_t *counts) {
  size_t off;
  int rc;
  if (is_int8(c, r)) {
    for (int k = 0; k < c->f.nranks; k++)
      counts[k] = engine_param_piece(c->e, p, k, &off);
    rc = ferry_comm_allgather(c->f.ch, mine, full, counts, FERRY_DT_U8, NULL, NULL);
    memset(full + p->n, 0, codes_bytes(p->n) - p->n);
    for (int k = 0; !rc && k < c->f.nranks; k++)
      counts[k] = blocks_of(c, engine_param_piece(c->e, p, k, &off)) * sizeof(float);
    if (!rc)
      rc = ferry_comm_allgather(c->f.ch, mine + codes_bytes(p->pn), full + codes_bytes(p->n),
                                counts, FERRY_DT_U8, NULL, NULL);
  } else {
    size_t es = whole_esize(c, r);
    for (int k = 0; k < c->f.nranks; k++)
      counts[k] = engine_param_piece(c->e, p, k, &off) * es;
    rc = ferry_comm_allgather(c->f.ch, mine, full, counts, FERRY_DT_U8, NULL, NULL);
  }
  if (rc)
    return ferry_err(c->f.err, rc, "checkpoint: gathering %s%s: %s", p->name, engine_role_suffix(r),
                     ferry_comm_last_error(c->f.ch));
  return FERRY_OK;
}

/* Bytes of the largest whole optim tensor. */
static size_t largest_whole(const ckpt_ctx *c) {
  size_t m = 0;
  engine_param_iter it = engine_params(c->e, 0);
  for (const engine_param_view *p; (p = engine_params_next(&it));) {
    size_t n = p->n, b = 4 * n, sb = ferry_optimizer_state_bytes(&c->f.ocfg, n);
    if (b > m) m = b;
    if (sb > m) m = sb;
  }
  return m;
}

/* A part gathered whole (write_whole: the params of a stage-3 export), on
 * every rank (a collective): rank 0 names each tensor its writer `w` asks
 * for next (a broadcast; -1 ends it, also when rank 0 has no writer or
 * failed), every rank gives its piece, rank 0 writes the whole. Returns
 * this rank's status. */
int ckpt_optim_phase(ckpt_ctx *c, ckpt_holder *h, ferry_safetensors_writer *w) {
  c->phases++;
  size_t big = largest_whole(c);
  char *mine = malloc(big + 64), *full = malloc(big + 64);
  size_t *counts = calloc((size_t)c->f.nranks, sizeof *counts);
  int rc = mine && full && counts ? FERRY_OK
                                  : ferry_err(c->f.err, FERRY_ENOMEM, "checkpoint: out of memory");
  int wrc = rc; /* rank 0: the writer's first failure */
  engine_param_view pv;
  for (;;) {
    int32_t msg[2] = {-1, -1};
    const char *nm = c->f.rank == 0 && w && !wrc ? ferry_safetensors_writer_next(w) : NULL;
    for (size_t i = 0; nm && i < c->f.nparams && msg[0] < 0; i++) {
      engine_param_at(c->e, i, &pv);
      for (int r = 0; r < FERRY_ROLE_COUNT && msg[0] < 0; r++) {
        char t[FERRY_MEM_NAME_MAX + 1];
        ckpt_tensor_name(t, &pv, r);
        if (ckpt_keeps_whole(c, r) && !strcmp(t, nm)) msg[0] = (int32_t)i, msg[1] = r;
      }
    }
    if (nm && msg[0] < 0) wrc = ferry_err(c->f.err, FERRY_ESTATE, "checkpoint: no tensor '%s'", nm);
    int crc = ferry_comm_broadcast(c->f.ch, msg, 2, FERRY_DT_I32, 0, NULL, NULL);
    if (crc) {
      rc = ferry_err(c->f.err, crc, "checkpoint: %s", ferry_comm_last_error(c->f.ch));
      break;
    }
    if (msg[0] < 0) break;
    const engine_param_view *p = &pv;
    engine_param_at(c->e, (size_t)msg[0], &pv);
    int prc = mine ? piece_out(c, h, p, msg[1], mine) : FERRY_ENOMEM;
    if (prc && !rc) rc = prc; /* still takes part in the gather */
    crc = gather_whole(c, p, msg[1], mine ? mine : "", full ? full : mine, counts);
    if (crc) {
      rc = crc;
      break;
    }
    if (c->f.rank == 0 && !wrc) {
      ferry_dtype dt;
      int nd;
      int64_t shape[FERRY_MEM_MAX_DIMS];
      ckpt_whole_info(c, p, msg[1], &dt, &nd, shape);
      size_t bytes = ferry_dtype_size(dt);
      for (int d = 0; d < nd; d++)
        bytes *= (size_t)shape[d];
      wrc = ferry_safetensors_writer_write(w, nm, full, bytes);
      if (wrc) wrc = ferry_err(c->f.err, wrc, "%s", ferry_safetensors_writer_last_error(w));
    }
  }
  free(mine);
  free(full);
  free(counts);
  int drc = ckpt_holder_drop(h);
  if (!rc) rc = wrc;
  return rc ? rc : drc;
}

/* Every tensor of a part (roles) whole into w, after its metadata. */
static int add_whole(ckpt_ctx *c, ferry_safetensors_writer *w, unsigned roles) {
  int rc = ferry_safetensors_writer_metadata(w, "format", "pt");
  engine_param_iter it = engine_params(c->e, 1);
  for (const engine_param_view *p; !rc && (p = engine_params_next(&it));) {
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc; r++) {
      if (!(roles >> r & 1) || !ckpt_keeps_whole(c, r)) continue;
      char nm[FERRY_MEM_NAME_MAX + 1];
      ferry_dtype dt;
      int nd;
      int64_t shape[FERRY_MEM_MAX_DIMS];
      ckpt_tensor_name(nm, p, r);
      ckpt_whole_info(c, p, r, &dt, &nd, shape);
      rc = ferry_safetensors_writer_add(w, nm, dt, nd, shape);
    }
  }
  return rc;
}

/* Rank 0's part (roles) of a sharded save: every tensor whole. */
static int write_whole(ckpt_ctx *c, ckpt_holder *h, const char *path, uint64_t max_shard,
                       unsigned roles) {
  ferry_safetensors_writer *w = NULL;
  int rc = ferry_safetensors_writer_create(path, max_shard, &w);
  if (rc) rc = ferry_err(c->f.err, rc, "checkpoint: %s", ferry_last_error());
  if (!rc) rc = add_whole(c, w, roles);
  if (w && rc) rc = ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w));
  if (!rc) { /* lays the files out now (see write_tensors) */
    rc = ferry_safetensors_writer_write(w, "", NULL, 0);
    if (rc == FERRY_ESTATE)
      rc = FERRY_OK;
    else if (rc)
      rc = ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  int prc = ckpt_optim_phase(c, h, rc ? NULL : w); /* the others wait for it */
  if (!rc) rc = prc;
  if (!rc) {
    rc = ferry_safetensors_writer_finish(w);
    if (rc) rc = ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  ferry_safetensors_writer_destroy(w);
  return rc;
}

/* A run of bytes of this rank's tensor (at `at`) and where it lies in the
 * whole tensor of the checkpoint (`whole`). */
typedef struct {
  size_t at, whole, bytes;
} piece_run;

/* The runs of this rank's piece [plo, plo + pn) of role r of p; the runs of
 * all ranks tile the whole tensor. fp32 and bf16: one run at plo. int8:
 * the codes at plo (the last piece also covers the whole tensor's code
 * padding: plo is a multiple of 64, so its padding is the whole's) and the
 * absmax at the whole's absmax of block plo / block (a piece starts at a
 * block boundary: group_partition's alignment is at least the block). */
static int piece_runs(const ckpt_ctx *c, const engine_param_view *p, int r, piece_run *run) {
  if (!is_int8(c, r)) {
    size_t es = whole_esize(c, r);
    run[0] = (piece_run){0, p->plo * es, p->pn * es};
    return 1;
  }
  size_t block = c->f.ocfg.state_block ? c->f.ocfg.state_block : 256;
  FERRY_ASSERT(p->plo % 64 == 0 && p->plo % block == 0, "%s: piece at %zu", p->name, p->plo);
  size_t codes = p->plo + p->pn == p->n ? codes_bytes(p->n) - p->plo : p->pn;
  run[0] = (piece_run){0, p->plo, codes};
  run[1] = (piece_run){codes_bytes(p->pn), codes_bytes(p->n) + p->plo / block * sizeof(float),
                       blocks_of(c, p->pn) * sizeof(float)};
  return 2;
}

/* Rank 0: a part (roles) laid out with every tensor whole and its bytes
 * holes. */
int ckpt_layout_part(ckpt_ctx *c, const char *path, uint64_t max_shard, unsigned roles) {
  ferry_safetensors_writer *w = NULL;
  int rc = ferry_safetensors_writer_create(path, max_shard, &w);
  if (rc) return ferry_err(c->f.err, rc, "checkpoint: %s", ferry_last_error());
  rc = add_whole(c, w, roles);
  if (!rc) rc = st_writer_finish_holes(w);
  if (rc) rc = ferry_err(c->f.err, rc, "checkpoint: %s", ferry_safetensors_writer_last_error(w));
  ferry_safetensors_writer_destroy(w);
  return rc;
}

/* n bytes between this rank's tensor (ptr, in the holder's tier) and a
 * file (fd at off, or tensor ti of f): to the file when `out`, else from
 * it. Device bytes go through the holder's bounce buffer. */
static int move_run(ckpt_ctx *c, ckpt_holder *h, char *ptr, int out, int fd, uint64_t off,
                    ferry_safetensors *f, size_t ti, uint64_t toff, size_t n, const char *nm) {
  for (size_t at = 0; at < n;) {
    size_t k = h->tier == FERRY_TIER_DEVICE ? (n - at < CKPT_BOUNCE ? n - at : CKPT_BOUNCE) : n;
    char *buf = h->tier == FERRY_TIER_DEVICE ? h->bounce : ptr + at;
    int rc = FERRY_OK;
    if (out && h->tier == FERRY_TIER_DEVICE) {
      rc = ferry_memcpy_async(h->s, buf, ptr + at, k, FERRY_COPY_D2H);
      if (!rc) rc = ferry_stream_synchronize(h->s);
    } else if (!out && h->tier == FERRY_TIER_DEVICE) {
      rc = ferry_stream_synchronize(h->s); /* the bounce buffer is free */
    }
    if (rc)
      return ferry_err(c->f.err, rc, "checkpoint: %s: %s", nm, ferry_device_last_error(c->f.dev));
    if (out) {
      for (size_t d = 0; d < k;) {
        ssize_t wr = pwrite(fd, buf + d, k - d, (off_t)(off + at + d));
        if (wr < 0 && errno == EINTR) continue;
        if (wr < 0) {
          int err = errno;
          return ferry_err(c->f.err, ckpt_io_status(err), "checkpoint: %s: pwrite at %llu: %s", nm,
                           (unsigned long long)(off + at + d), strerror(err));
        }
        d += (size_t)wr;
      }
    } else {
      rc = ferry_safetensors_read(f, ti, toff + at, buf, k);
      if (rc)
        return ferry_err(c->f.err, rc, "checkpoint load: '%s': %s", nm,
                         ferry_safetensors_last_error(f));
      if (h->tier == FERRY_TIER_DEVICE) {
        rc = ferry_memcpy_async(h->s, ptr + at, buf, k, FERRY_COPY_H2D);
        if (rc)
          return ferry_err(c->f.err, rc, "checkpoint load: %s: %s", nm,
                           ferry_device_last_error(c->f.dev));
      }
    }
    at += k;
  }
  return FERRY_OK;
}

/* Every piece this rank keeps of every tensor of a part (roles), between
 * the engine and the checkpoint's model f (whole tensors): written into its
 * files (out; fds: f's shards opened for writing) or read from them. One
 * group of one family held at a time, in group order. */
int ckpt_move_pieces(ckpt_ctx *c, ckpt_holder *h, ferry_safetensors *f, unsigned roles, int out,
                     const int *fds) {
  int rc = FERRY_OK;
  engine_param_iter it = engine_params(c->e, 1);
  for (const engine_param_view *p; !rc && (p = engine_params_next(&it));) {
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc && p->pn; r++) {
      if (!(roles >> r & 1) || !ckpt_keeps_whole(c, r)) continue;
      char nm[FERRY_MEM_NAME_MAX + 1];
      ckpt_tensor_name(nm, p, r);
      ferry_safetensors_tensor t;
      size_t ti;
      if (ferry_safetensors_find(f, nm, &t, &ti))
        return ferry_err(c->f.err, FERRY_ECORRUPT, "checkpoint: no tensor '%s'", nm);
      void *ptr;
      size_t bytes;
      rc = ckpt_holder_get(h, p->id[r], !out, &ptr, &bytes);
      piece_run run[2];
      int nr = rc ? 0 : piece_runs(c, p, r, run);
      for (int k = 0; k < nr && !rc; k++) {
        FERRY_ASSERT(run[k].at + run[k].bytes <= bytes && run[k].whole + run[k].bytes <= t.nbytes,
                     "%s: run %d out of bounds", nm, k);
        rc = move_run(c, h, (char *)ptr + run[k].at, out, out ? fds[t.shard] : -1,
                      t.offset + run[k].whole, f, ti, run[k].whole, run[k].bytes, nm);
      }
    }
  }
  int drc = ckpt_holder_drop(h);
  return rc ? rc : drc;
}

/* This rank's pieces of a part (roles) into its laid-out model at path,
 * fsynced. */
int ckpt_write_pieces(ckpt_ctx *c, const char *path, unsigned roles) {
  ferry_safetensors *f = NULL;
  int rc = ferry_safetensors_open(path, &f);
  if (rc) return ferry_err(c->f.err, rc, "checkpoint: %s", ferry_last_error());
  int ns = ferry_safetensors_shard_count(f);
  int *fds = malloc((size_t)ns * sizeof *fds);
  if (!fds) rc = ferry_err(c->f.err, FERRY_ENOMEM, "checkpoint: out of memory");
  for (int s = 0; s < ns && fds; s++)
    fds[s] = -1;
  for (int s = 0; s < ns && !rc; s++) {
    fds[s] = open(ferry_safetensors_shard_path(f, s), O_WRONLY | O_CLOEXEC);
    if (fds[s] < 0)
      rc = ferry_err(c->f.err, ckpt_io_status(errno), "checkpoint: %s: %s",
                     ferry_safetensors_shard_path(f, s), strerror(errno));
  }
  ckpt_holder h;
  if (!rc) {
    rc = ckpt_holder_init(&h, c);
    if (!rc) rc = ckpt_move_pieces(c, &h, f, roles, 1, fds);
    ckpt_holder_destroy(&h);
  }
  for (int s = 0; s < ns && fds; s++) {
    if (fds[s] < 0) continue;
    if (!rc && fsync(fds[s]))
      rc = ferry_err(c->f.err, ckpt_io_status(errno), "checkpoint: fsync %s: %s",
                     ferry_safetensors_shard_path(f, s), strerror(errno));
    close(fds[s]);
  }
  free(fds);
  ferry_safetensors_close(f);
  return rc;
}

/* A sharded engine writes the part (roles) with every tensor whole. */
static int part_whole(const ckpt_ctx *c, unsigned roles) {
  return c->f.sharded && ((roles & OPTIM_ROLES) || c->f.params_sharded);
}

int ckpt_part_files(ckpt_ctx *c, uint64_t max_shard, unsigned roles, uint64_t *files) {
  ferry_safetensors_writer *w;
  int rc = ferry_safetensors_writer_create("(count)", max_shard, &w);
  if (rc) return ferry_err(c->f.err, rc, "checkpoint: %s", ferry_last_error());
  if (part_whole(c, roles)) {
    rc = add_whole(c, w, roles);
    if (rc) rc = ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w));
  } else {
    rc = add_tensors(c, w, roles, c->f.dtype);
  }
  if (!rc) rc = st_writer_file_count(w, files);
  ferry_safetensors_writer_destroy(w);
  return rc;
}

/* A writer over `path` (a folder when max_shard > 0) filled and finished. */
int ckpt_write_model(ckpt_ctx *c, ckpt_holder *h, const char *path, uint64_t max_shard,
                     unsigned roles, ferry_dtype param_dt) {
  if (part_whole(c, roles)) return write_whole(c, h, path, max_shard, roles);
  ferry_safetensors_writer *w;
  int rc = ferry_safetensors_writer_create(path, max_shard, &w);
  if (rc) return ferry_err(c->f.err, rc, "checkpoint: %s", ferry_last_error());
  rc = write_tensors(c, h, w, roles, param_dt);
  if (!rc) {
    rc = ferry_safetensors_writer_finish(w);
    if (rc) rc = ferry_err(c->f.err, rc, "%s", ferry_safetensors_writer_last_error(w));
  }
  ferry_safetensors_writer_destroy(w);
  return rc;
}
