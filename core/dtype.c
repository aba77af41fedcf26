/* core/dtype.c — the traits table of ferry_dtype and its public queries
 * (name, size, parse, one-element load and store).
 */
#include "core/dtype.h"

#include "core/convert.h"

static const ferry_dtype_traits k_traits[FERRY_DT_COUNT] = {
    [FERRY_DT_BOOL] = {"BOOL", 1, 0, 0},       [FERRY_DT_U8] = {"U8", 1, 0, 1},
    [FERRY_DT_I8] = {"I8", 1, 0, 2},           [FERRY_DT_F8_E5M2] = {"F8_E5M2", 1, 0, 3},
    [FERRY_DT_F8_E4M3] = {"F8_E4M3", 1, 0, 4}, [FERRY_DT_I16] = {"I16", 2, 0, 5},
    [FERRY_DT_U16] = {"U16", 2, 0, 6},         [FERRY_DT_F16] = {"F16", 2, 1, 7},
    [FERRY_DT_BF16] = {"BF16", 2, 1, 8},       [FERRY_DT_I32] = {"I32", 4, 0, 9},
    [FERRY_DT_U32] = {"U32", 4, 0, 10},        [FERRY_DT_F32] = {"F32", 4, 1, 11},
    [FERRY_DT_F64] = {"F64", 8, 0, 12},        [FERRY_DT_I64] = {"I64", 8, 0, 13},
    [FERRY_DT_U64] = {"U64", 8, 0, 14},
};

const ferry_dtype_traits *ferry_dtype_traits_of(ferry_dtype dt) {
  if ((unsigned)dt >= FERRY_DT_COUNT || !k_traits[dt].name) return NULL;
  return &k_traits[dt];
}

const char *ferry_dtype_name(ferry_dtype dt) {
  const ferry_dtype_traits *t = ferry_dtype_traits_of(dt);
  return t ? t->name : NULL;
}

size_t ferry_dtype_size(ferry_dtype dt) {
  const ferry_dtype_traits *t = ferry_dtype_traits_of(dt);
  return t ? t->size : 0;
}

int ferry_dtype_parse(const char *name, size_t len) {
  if (!name) return -1;
  for (int i = 0; i < FERRY_DT_COUNT; i++) {
    const char *n = k_traits[i].name;
    if (n && strlen(n) == len && !memcmp(n, name, len)) return i;
  }
  return -1;
}

float ferry_dtype_load(const void *buf, ferry_dtype dt, size_t i) {
  const ferry_dtype_traits *t = ferry_dtype_traits_of(dt);
  return buf && t && t->convertible ? ferry_dt_load(buf, dt, i) : 0.0f;
}

void ferry_dtype_store(void *buf, ferry_dtype dt, size_t i, float x) {
  const ferry_dtype_traits *t = ferry_dtype_traits_of(dt);
  if (buf && t && t->convertible) ferry_dt_store(buf, dt, i, x);
}

/* bf16 <-> fp32 and fp32 -> fp32 through core/convert.c's vector loops;
 * the other pairs one loop per source dtype, the store's switch inlined per
 * element (the compiler hoists it: dst_dtype does not change in the loop). */
int ferry_dtype_convert(void *dst, ferry_dtype ddt, const void *src, ferry_dtype sdt, size_t n,
                        float scale) {
  const ferry_dtype_traits *dt = ferry_dtype_traits_of(ddt), *st = ferry_dtype_traits_of(sdt);
  if (!dt || !st || !dt->convertible || !st->convertible || (n && (!dst || !src)))
    return FERRY_EINVAL;
  if (sdt == FERRY_DT_BF16 && ddt == FERRY_DT_F32) {
    ferry_convert_bf16_f32(dst, src, n, scale);
    return FERRY_OK;
  }
  if (sdt == FERRY_DT_F32 && ddt == FERRY_DT_BF16) {
    ferry_convert_f32_bf16(dst, src, n, scale);
    return FERRY_OK;
  }
  if (sdt == FERRY_DT_F32 && ddt == FERRY_DT_F32) {
    ferry_convert_f32_f32(dst, src, n, scale);
    return FERRY_OK;
  }
  switch (sdt) {
  case FERRY_DT_F16:
    for (size_t i = 0; i < n; i++)
      ferry_dt_store(dst, ddt, i, ferry_f16_to_f32(((const uint16_t *)src)[i]) * scale);
    break;
  case FERRY_DT_BF16:
    for (size_t i = 0; i < n; i++)
      ferry_dt_store(dst, ddt, i, ferry_bf16_to_f32(((const uint16_t *)src)[i]) * scale);
    break;
  default:
    for (size_t i = 0; i < n; i++) ferry_dt_store(dst, ddt, i, ((const float *)src)[i] * scale);
    break;
  }
  return FERRY_OK;
}
