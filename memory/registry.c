/* memory/registry.c — the tensor registry: validated unique names (printable
 * ASCII, bounded length), dtype, shape, group and role of every tensor, with
 * lookup by name through an open-addressing hash table. Registration happens
 * before finalize, so its growth is allowed to allocate.
 */
#include "memory/mem_impl.h"

#include <stdlib.h>
#include <string.h>

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int role_family(int role) {
  return role == FERRY_ROLE_PARAM ? FERRY_FAMILY_PARAMS
         : role == FERRY_ROLE_GRAD ? FERRY_FAMILY_GRADS
                                   : FERRY_FAMILY_OPTIM;
}


/* Slot of `name` in the table, or of the empty slot where it would go. */
static size_t hash_find(const ferry_mem *m, const char *name) {
  size_t mask = m->hcap - 1, i = (size_t)name_hash(name) & mask;
  while (m->hash[i] && strcmp(m->t[m->hash[i] - 1].name, name) != 0) i = (i + 1) & mask;
  return i;
}

static int hash_grow(ferry_mem *m) {
  size_t nc = m->hcap ? m->hcap * 2 : 64;
  uint32_t *nh = calloc(nc, sizeof *nh);
  if (!nh) return FERRY_ENOMEM;
  free(m->hash);
  m->hash = nh;
  m->hcap = nc;
  for (size_t k = 0; k < m->nt; k++) m->hash[hash_find(m, m->t[k].name)] = (uint32_t)k + 1;
  return FERRY_OK;
}

static int check_name(ferry_mem *m, const char *name) {
  if (!name) return ferry_err(&m->err, FERRY_EINVAL, "register: tensor name is NULL");
  size_t len = strnlen(name, FERRY_MEM_NAME_MAX + 1);
  if (len == 0) return ferry_err(&m->err, FERRY_EINVAL, "register: tensor name is empty");
  if (len > FERRY_MEM_NAME_MAX)
    return ferry_err(&m->err, FERRY_EINVAL,
                     "register: tensor name '%.40s...' is longer than %d bytes", name,
                     FERRY_MEM_NAME_MAX);
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)name[i];
    if (ch < 0x20 || ch > 0x7e)
      return ferry_err(&m->err, FERRY_EINVAL,
                       "register: tensor name has a non-printable byte 0x%02x at offset %zu", ch,
                       i);
  }
  return FERRY_OK;
}

/* The checks of a registration after its name's, under the lock: not
 * final yet, a known dtype and role, a valid shape (its element count in
 * *numel), a group within the limit, room for one more tensor. */
static int check_tensor(ferry_mem *m, const char *name, ferry_dtype dtype, int ndim,
                        const int64_t *shape, uint32_t group, ferry_role role, uint64_t *numel) {
  if (m->finalized || m->laid_out)
    return ferry_err(&m->err, FERRY_ESTATE, "register '%s': the layout is already final", name);
  if (ferry_dtype_size(dtype) == 0)
    return ferry_err(&m->err, FERRY_EINVAL, "register '%s': unknown dtype %d", name, (int)dtype);
  if ((unsigned)role >= FERRY_ROLE_COUNT)
    return ferry_err(&m->err, FERRY_EINVAL, "register '%s': unknown role %d", name, (int)role);
  if (ndim < 0 || ndim > FERRY_MEM_MAX_DIMS || (ndim > 0 && !shape))
    return ferry_err(&m->err, FERRY_EINVAL, "register '%s': %d dimensions (0..%d, shape needed)",
                     name, ndim, FERRY_MEM_MAX_DIMS);
  if (group >= FERRY_MEM_MAX_GROUPS)
    return ferry_err(&m->err, FERRY_EINVAL, "register '%s': group %u is past the limit %u", name,
                     group, FERRY_MEM_MAX_GROUPS - 1);
  *numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] <= 0 || (uint64_t)shape[d] > (UINT64_MAX / 8) / *numel)
      return ferry_err(&m->err, FERRY_EINVAL, "register '%s': dimension %d is %lld", name, d,
                       (long long)shape[d]);
    *numel *= (uint64_t)shape[d];
  }
  if (m->nt >= UINT32_MAX - 1)
    return ferry_err(&m->err, FERRY_EOVERFLOW, "register: too many tensors");
  return FERRY_OK;
}

int ferry_mem_register(ferry_mem *m, const char *name, ferry_dtype dtype, int ndim,
                       const int64_t *shape, uint32_t group, ferry_role role, uint32_t *id) {
  if (!m) return FERRY_EINVAL;
  int rc = check_name(m, name);
  if (rc) return rc;
  pthread_mutex_lock(&m->mu);
  uint64_t numel = 1;
  if ((rc = check_tensor(m, name, dtype, ndim, shape, group, role, &numel))) goto out;
  if ((m->nt + 1) * 2 > m->hcap && (rc = hash_grow(m))) goto oom;
  size_t slot = hash_find(m, name);
  if (m->hash[slot]) {
    rc = ferry_err(&m->err, FERRY_EINVAL, "register: tensor name '%s' is already registered",
                   name);
    goto out;
  }
  if (m->nt == m->capt) {
    size_t nc = m->capt ? m->capt * 2 : 64;
    mem_tensor *nt = realloc(m->t, nc * sizeof *nt);
    if (!nt) goto oom;
    m->t = nt;
    m->capt = nc;
  }
  mem_tensor *t = &m->t[m->nt];
  memset(t, 0, sizeof *t);
  t->name = strdup(name);
  if (!t->name) goto oom;
  t->dtype = (uint8_t)dtype;
  t->role = (uint8_t)role;
  t->family = (uint8_t)role_family(role);
  t->ndim = (uint8_t)ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  t->group = group;
  t->bytes = (size_t)(numel * ferry_dtype_size(dtype));
  t->chunk = UINT32_MAX;
  m->hash[slot] = (uint32_t)m->nt + 1;
  if (id) *id = (uint32_t)m->nt;
  m->nt++;
  if (group + 1 > m->max_group) m->max_group = group + 1;
  rc = FERRY_OK;
  goto out;
oom:
  rc = ferry_err(&m->err, FERRY_ENOMEM, "register '%s': out of memory", name);
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_lookup(ferry_mem *m, const char *name, uint32_t *id) {
  if (!m || !name || !id) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_ENOENT;
  if (m->hcap) {
    size_t slot = hash_find(m, name);
    if (m->hash[slot]) {
      *id = m->hash[slot] - 1;
      rc = FERRY_OK;
    }
  }
  pthread_mutex_unlock(&m->mu);
  if (rc) return ferry_err(&m->err, rc, "lookup: no tensor named '%.200s'", name);
  return rc;
}

int ferry_mem_tensor_get(ferry_mem *m, uint32_t id, ferry_mem_tensor_info *out) {
  if (!m || !out) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  if (id >= m->nt) {
    pthread_mutex_unlock(&m->mu);
    return ferry_err(&m->err, FERRY_ENOENT, "tensor id %u is not registered", id);
  }
  const mem_tensor *t = &m->t[id];
  out->name = t->name;
  out->dtype = (ferry_dtype)t->dtype;
  out->ndim = t->ndim;
  out->shape = t->shape;
  out->group = t->group;
  out->role = (ferry_role)t->role;
  out->family = t->family;
  out->bytes = t->bytes;
  out->chunk = t->chunk;
  out->offset = t->offset;
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

int mem_registry_metadata(const ferry_mem *m, size_t *bytes) {
  size_t b = m->capt * sizeof *m->t + m->hcap * sizeof *m->hash;
  for (size_t i = 0; i < m->nt; i++) b += strlen(m->t[i].name) + 1;
  *bytes = b;
  return FERRY_OK;
}

void mem_registry_free(ferry_mem *m) {
  for (size_t i = 0; i < m->nt; i++) free(m->t[i].name);
  free(m->t);
  free(m->hash);
  m->t = NULL;
  m->hash = NULL;
  m->nt = m->capt = m->hcap = 0;
}
