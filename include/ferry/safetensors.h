/* ferry/safetensors.h — safetensors files: reader and writer.
 * Part of the public API: include ferry.h, which includes this file. */
#ifndef FERRY_API_SAFETENSORS_H
#define FERRY_API_SAFETENSORS_H

#ifndef FERRY_H
#error "include ferry.h, not ferry/safetensors.h"
#endif

/* ------------------------------------------------------------------------ */
/* safetensors files (offload/)                                              */

/* Hugging Face's safetensors format: an 8-byte little-endian header length,
 * a JSON header naming each tensor's dtype, shape and byte range, then the
 * raw little-endian data. The reader parses and checks the whole header at
 * open (a hostile file is refused with FERRY_ECORRUPT and the reason, never
 * read out of bounds) and then streams tensor bytes with pread into the
 * caller's buffer, so a big model never has to be in RAM whole. Sharded
 * models (model.safetensors.index.json and its weight_map) open as one. */

/* A tensor's dtype is a ferry_dtype (every safetensors dtype has one, named
 * as safetensors spells it: ferry_dtype_name). */

#define FERRY_SAFETENSORS_MAX_DIMS 8

typedef struct {
  const char *name;    /* valid while the file is open */
  ferry_dtype dtype;
  int ndim;            /* 0 for a scalar */
  int64_t shape[FERRY_SAFETENSORS_MAX_DIMS];
  uint64_t numel;
  uint64_t nbytes;     /* numel * element size */
  int shard;           /* which file of a sharded model (0 when one file) */
  uint64_t offset;     /* absolute byte offset of the data in that file */
} ferry_safetensors_tensor;

/* Deprecated since 0.2, removed in 0.3: the safetensors names of before
 * ferry_dtype. */
typedef ferry_dtype ferry_st_dtype FERRY_DEPRECATED("ferry_dtype");
typedef ferry_safetensors_tensor ferry_st_tensor FERRY_DEPRECATED("ferry_safetensors_tensor");
#define FERRY_ST_MAX_DIMS FERRY_SAFETENSORS_MAX_DIMS
#define FERRY_ST_BOOL FERRY_DT_BOOL
#define FERRY_ST_U8 FERRY_DT_U8
#define FERRY_ST_I8 FERRY_DT_I8
#define FERRY_ST_F8_E5M2 FERRY_DT_F8_E5M2
#define FERRY_ST_F8_E4M3 FERRY_DT_F8_E4M3
#define FERRY_ST_I16 FERRY_DT_I16
#define FERRY_ST_U16 FERRY_DT_U16
#define FERRY_ST_F16 FERRY_DT_F16
#define FERRY_ST_BF16 FERRY_DT_BF16
#define FERRY_ST_I32 FERRY_DT_I32
#define FERRY_ST_U32 FERRY_DT_U32
#define FERRY_ST_F32 FERRY_DT_F32
#define FERRY_ST_F64 FERRY_DT_F64
#define FERRY_ST_I64 FERRY_DT_I64
#define FERRY_ST_U64 FERRY_DT_U64
FERRY_API FERRY_DEPRECATED("ferry_dtype_name") const char *ferry_st_dtype_name(ferry_dtype dtype);
FERRY_API FERRY_DEPRECATED("ferry_dtype_size") size_t ferry_st_dtype_size(ferry_dtype dtype);

typedef struct ferry_safetensors ferry_safetensors;

/* Opens a file, or a model: a directory holding model.safetensors or
 * model.safetensors.index.json, or an index .json file itself (every shard
 * it names is opened and checked; the weight_map must match the shards'
 * tensors exactly). On failure *out is NULL and ferry_last_error() says
 * why: FERRY_ENOENT, FERRY_EIO, FERRY_ECORRUPT (with the tensor or field
 * and what is wrong), FERRY_ENOMEM. */
FERRY_API int ferry_safetensors_open(const char *path, ferry_safetensors **out);
/* The same over a caller's buffer holding a whole file (kept, not copied:
 * it must outlive the handle). For tests and fuzzing. */
FERRY_API int ferry_safetensors_open_memory(const void *data, size_t len, ferry_safetensors **out);
FERRY_API void ferry_safetensors_close(ferry_safetensors *f);
FERRY_API const char *ferry_safetensors_last_error(const ferry_safetensors *f);

/* Tensors in file order (shard, then data offset). */
FERRY_API size_t ferry_safetensors_count(const ferry_safetensors *f);
FERRY_API int ferry_safetensors_get(const ferry_safetensors *f, size_t i, ferry_safetensors_tensor *out);
/* By name; FERRY_ENOENT when absent. `index` (may be NULL) gets i. */
FERRY_API int ferry_safetensors_find(const ferry_safetensors *f, const char *name,
                                     ferry_safetensors_tensor *out, size_t *index);
/* Copies `bytes` bytes of tensor i starting `offset` bytes into its data.
 * A range past the tensor is FERRY_EINVAL; a file that shrank since open is
 * FERRY_ECORRUPT; a failed read FERRY_EIO. */
FERRY_API int ferry_safetensors_read(ferry_safetensors *f, size_t i, uint64_t offset, void *buf,
                                     size_t bytes);
/* The "__metadata__" string map (of the first shard): count, i-th pair, and
 * lookup by key (NULL when absent). */
FERRY_API size_t ferry_safetensors_metadata_count(const ferry_safetensors *f);
FERRY_API int ferry_safetensors_metadata_get(const ferry_safetensors *f, size_t i,
                                             const char **key, const char **value);
FERRY_API const char *ferry_safetensors_metadata_find(const ferry_safetensors *f,
                                                      const char *key);
/* Number of files (1 unless sharded) and the i-th file's path ("" for
 * memory). */
FERRY_API int ferry_safetensors_shard_count(const ferry_safetensors *f);
FERRY_API const char *ferry_safetensors_shard_path(const ferry_safetensors *f, int i);

/* The writer streams a model to disk: declare every tensor, then give each
 * tensor's bytes (in one or several pieces) in the writer's order, then
 * finish. The bytes are deterministic and laid out as Hugging Face's writer
 * does: data sorted by dtype (widest first, as its dtype order) then name,
 * header keys in data order after "__metadata__" (its keys sorted), header
 * padded with spaces to a multiple of 8. With max_shard_bytes > 0, `path` is
 * a directory: one model.safetensors when everything fits in one shard, else
 * model-0000i-of-0000N.safetensors shards filled in data order plus a
 * model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"},
 * sorted keys, indent 2). Every file is fsynced at finish. */
typedef struct ferry_safetensors_writer ferry_safetensors_writer;

FERRY_API int ferry_safetensors_writer_create(const char *path, uint64_t max_shard_bytes,
                                              ferry_safetensors_writer **out);
/* Frees; a writer not finished removes the files it made. */
FERRY_API void ferry_safetensors_writer_destroy(ferry_safetensors_writer *w);
FERRY_API const char *ferry_safetensors_writer_last_error(const ferry_safetensors_writer *w);
/* Before the first write: one metadata pair (a key again replaces it). */
FERRY_API int ferry_safetensors_writer_metadata(ferry_safetensors_writer *w, const char *key,
                                                const char *value);
/* Before the first write: a tensor (duplicate names: FERRY_EINVAL). */
FERRY_API int ferry_safetensors_writer_add(ferry_safetensors_writer *w, const char *name,
                                           ferry_dtype dtype, int ndim, const int64_t *shape);
/* The name of the tensor whose bytes come next (NULL when all are written);
 * the first call fixes the layout. */
FERRY_API const char *ferry_safetensors_writer_next(ferry_safetensors_writer *w);
/* The next `bytes` bytes of tensor `name`, which must be the one `_next`
 * names (FERRY_ESTATE otherwise); a piece may not run past its end. */
FERRY_API int ferry_safetensors_writer_write(ferry_safetensors_writer *w, const char *name,
                                             const void *data, size_t bytes);
/* Checks every byte was given, writes the index, fsyncs and closes. */
FERRY_API int ferry_safetensors_writer_finish(ferry_safetensors_writer *w);


#endif /* FERRY_API_SAFETENSORS_H */
