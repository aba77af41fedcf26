/* examples/gpt/cuda_entry.c — the one symbol libferry-gpt-cuda.so exports:
 * GPT_CUDA_ENTRY, the table of the CUDA model's functions (model_cuda.cu)
 * with the ABI number and struct sizes the loader (cuda_load.c) checks.
 */
#include "gpt_cuda.h"

static const gpt_cuda_api k_api = {
    .abi = GPT_CUDA_ABI,
    .api_bytes = sizeof(gpt_cuda_api),
    .schema_bytes = sizeof(gpt_schema),
    .run_bytes = sizeof(gpt_run_config),
    .provider_bytes = sizeof(gpt_provider),
    .mem_bytes = sizeof(gpt_cuda_mem),
    .resident_bytes = sizeof(gpt_cuda_resident),
    .available = gpt_cuda_available,
    .model_create = gpt_cuda_model_create,
    .model_free = gpt_cuda_model_free,
    .model_last_error = gpt_cuda_model_last_error,
    .model_stream = gpt_cuda_model_stream,
    .model_bytes = gpt_cuda_model_bytes,
    .model_forward = gpt_cuda_model_forward,
    .model_backward = gpt_cuda_model_backward,
    .model_loss = gpt_cuda_model_loss,
    .model_logits = gpt_cuda_model_logits,
    .resident_init = gpt_cuda_resident_init,
    .resident_free = gpt_cuda_resident_free,
    .resident_provider = gpt_cuda_resident_provider,
    .resident_upload = gpt_cuda_resident_upload,
    .resident_download_grads = gpt_cuda_resident_download_grads,
    .host_register = gpt_cuda_host_register,
    .host_unregister = gpt_cuda_host_unregister,
    .resident_init_weights = gpt_cuda_resident_init_weights,
    .kv_create = gpt_cuda_kv_create,
    .kv_free = gpt_cuda_kv_free,
    .kv_reset = gpt_cuda_kv_reset,
    .kv_forward = gpt_cuda_kv_forward,
    .kv_logits = gpt_cuda_kv_logits,
    .kv_pos = gpt_cuda_kv_pos,
    .kv_rows = gpt_cuda_kv_rows,
    .kv_last_error = gpt_cuda_kv_last_error,
    .kv_stream = gpt_cuda_kv_stream,
};

/* Exported (the build hides everything else). */
__attribute__((visibility("default"))) const gpt_cuda_api *gpt_cuda_module_api(void);

const gpt_cuda_api *gpt_cuda_module_api(void) { return &k_api; }
