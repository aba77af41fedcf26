/* ferry/checkpoint.h — checkpoints: save, load, verify, find, and weight export.
 * Part of the public API: include ferry.h, which includes this file. */
#ifndef FERRY_API_CHECKPOINT_H
#define FERRY_API_CHECKPOINT_H

#ifndef FERRY_H
#error "include ferry.h, not ferry/checkpoint.h"
#endif

/* ------------------------------------------------------------------------ */
/* Checkpoints (offload/)                                                    */

/* A checkpoint holds every piece of training state, from whichever tier it
 * lives in: the params in their dtype, the fp32 master weights and
 * optimizer states, the step count, the loss scaler and a blob of the
 * caller's (data-loader position, RNG state). It is a folder
 * DIR/step-<12 digits>/ holding params/ (a plain Hugging Face safetensors
 * model: model.safetensors, or shards and model.safetensors.index.json),
 * optim/ ("<name>.master", ".exp_avg", ".exp_avg_sq", fp32), user.bin and
 * a manifest (format version, scalars, the size and CRC32C of every file).
 * Tensors stream one group at a time through the memory manager, so no
 * call needs the model in RAM. Save and load wait for a running step and
 * the gradient drain, and must be called between steps (FERRY_ESTATE when
 * micro-batch grads are accumulated or a group is fetched), from the
 * thread that drives the loop, one saver per DIR. After a load the next
 * steps are bit-identical to an uninterrupted run.
 *
 * With ranks (ferry_engine_set_comm, more than one rank) save and load are
 * collectives: every rank calls them between the same steps with the same
 * DIR, which every rank sees (one machine or a shared file system). The
 * checkpoint is the one a single rank writes, every tensor whole: each
 * rank writes its pieces of the master and optimizer states into the
 * shared files at their offsets, rank 0 writes the params, rank 0's blob
 * and the manifest (which records the number of ranks and
 * dist.zero_stage, for information). It loads on any number of ranks and
 * at any stage, each rank reading its pieces. A failure or refusal on any
 * rank fails the call on every rank (the message of a rank that did not
 * fail names the one that did), with the same guarantees as alone. */
typedef struct {
  int keep;                 /* checkpoints kept in DIR, newest by step; 0 = all (default 3) */
  uint64_t max_shard_bytes; /* safetensors shard size (default 4 GiB; 0 = the default) */
} ferry_checkpoint_options;

FERRY_API ferry_checkpoint_options ferry_checkpoint_options_default(void);

/* Writes DIR/step-<steps>/ atomically: into DIR/.tmp-step-..., every file
 * and folder fsynced, then renamed into place (replacing one of the same
 * step), then DIR fsynced and checkpoints past `keep` removed. A failure
 * (FERRY_ENOSPC, FERRY_EIO, ...) removes the temporary folder and leaves
 * every earlier checkpoint untouched; a process killed while saving leaves
 * only a .tmp-* folder, which loads ignore and the next save removes. A
 * save locks DIR (flock on DIR/.lock, removed when it is done) for its
 * whole length, pruning included: a second saver gets FERRY_EBUSY naming
 * DIR and the holder's pid, and a save removes only the .tmp-* folders of
 * saves whose process is gone.
 * blob may be NULL when blob_len is 0 (at most 1 GiB); opt NULL: defaults. */
FERRY_API int ferry_checkpoint_save(ferry_engine *e, const char *dir, const void *blob,
                                    size_t blob_len, const ferry_checkpoint_options *opt);
/* Loads `path`: one checkpoint folder, or a DIR of them (its newest). The
 * manifest, the size and CRC32C of every file, the safetensors headers, and
 * every tensor's name, dtype and shape against the engine's registration
 * (and the optimizer type, precision.params) are checked before anything
 * is changed: a damaged or foreign checkpoint is FERRY_ECORRUPT with the
 * file and the reason, and the engine is as it was. The blob goes into
 * blob (NULL: not read); *blob_len (may be NULL) gets its size; a buffer
 * larger than blob_cap is FERRY_EOVERFLOW, nothing changed. */
FERRY_API int ferry_checkpoint_load(ferry_engine *e, const char *path, void *blob,
                                    size_t blob_cap, size_t *blob_len);

typedef struct {
  int64_t step;          /* optimizer steps taken */
  uint64_t blob_bytes;
  uint64_t tensors;      /* params */
  uint64_t total_bytes;  /* of every file listed */
  int files;
  char path[1024];       /* the checkpoint folder found */
} ferry_checkpoint_info;

/* Finds the checkpoint that ferry_checkpoint_load(path) would load, reading
 * no tensor: path itself when it holds a manifest, else the newest
 * "step-<N>" folder in it. folder (cap bytes) gets its path; *step (may be
 * NULL) the N of its folder name (-1 when path itself is a checkpoint
 * folder with another name). FERRY_ENOENT when there is none, with the
 * reason in ferry_last_error(). */
FERRY_API int ferry_checkpoint_find(const char *path, char *folder, size_t cap, int64_t *step);

/* Checks a checkpoint without an engine (manifest, files, CRCs, headers);
 * the reason of a failure in ferry_last_error(). info may be NULL. */
FERRY_API int ferry_checkpoint_verify(const char *path, ferry_checkpoint_info *info);

/* Reads the blob (user.bin) of one checkpoint folder without an engine:
 * the manifest is checked whole, then user.bin's size and CRC32C against
 * it, before anything is copied into buf. *len (may be NULL) gets the
 * blob's size; larger than cap: FERRY_EOVERFLOW, nothing copied. A damaged
 * manifest or user.bin: FERRY_ECORRUPT naming the file and what failed
 * (ferry_last_error()). */
FERRY_API int ferry_checkpoint_read_blob(const char *folder, void *buf, size_t cap, size_t *len);

/* Exports the params as a plain safetensors model (their dtype, names as
 * registered, metadata {"format": "pt"}) that Hugging Face tools load:
 * max_shard_bytes 0 writes one file at path; otherwise path is a folder of
 * model.safetensors or shards plus model.safetensors.index.json. Written
 * beside path first and renamed into place. */
FERRY_API int ferry_export_weights(ferry_engine *e, const char *path, uint64_t max_shard_bytes);

#endif /* FERRY_API_CHECKPOINT_H */
