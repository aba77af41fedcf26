/* examples/gpt/cuda_device.cuh — device helpers the CUDA model's kernel
 * files share (model_cuda.cu, kernels_cuda.cu): the grid of a grid-stride
 * loop, the loop itself, a warp's sum, and a weight element of any dtype
 * read as fp32. Header-only (static), included after the CUDA headers.
 */
#ifndef FERRY_GPT_CUDA_DEVICE_CUH
#define FERRY_GPT_CUDA_DEVICE_CUH

/* Blocks of per_block threads for n items: at most 2^20, never 0. */
#define GRID_CAP ((size_t)1 << 20)
static inline unsigned grid_for(size_t n, size_t per_block) {
  size_t g = (n + per_block - 1) / per_block;
  return (unsigned)(g < 1 ? 1 : g > GRID_CAP ? GRID_CAP : g);
}
#define FOR_EACH(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__device__ __forceinline__ static float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* A weight element of dtype dt (FERRY_DT_F32 / F16 / BF16) as fp32. */
__device__ __forceinline__ static float ldw(const void *p, size_t i, int dt) {
  if (dt == FERRY_DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (dt == FERRY_DT_F16) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

#endif
