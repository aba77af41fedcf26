/* offload/safetensors.h — the safetensors reader and writer inside the
 * library (the public API is in include/ferry.h). Internal helpers shared
 * with checkpoints: the strict header parser over a buffer in memory.
 */
#ifndef FERRY_OFFLOAD_SAFETENSORS_H
#define FERRY_OFFLOAD_SAFETENSORS_H

#include "core/core.h"

/* The safetensors limit on the JSON header (Hugging Face refuses larger). */
#define FERRY_ST_MAX_HEADER (100u * 1000u * 1000u)

#endif
