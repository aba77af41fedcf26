/* memory/layout.c — the chunk layout: each family's tensors packed, group by
 * group in registration order, into chunks of at most chunk_size bytes that
 * never hold two groups (core/pack.h's rule: 256-byte aligned offsets; a
 * tensor larger than a chunk gets a chunk of its own), the group to chunk-range tables, and the
 * checks that every chunk fits every tier it must pass and that every home
 * holds its family. mem_layout_build packs and builds the tables;
 * mem_layout_check runs the checks (ferry_mem_layout lets the caller look
 * at the packed sizes between the two).
 */
#include "memory/mem_impl.h"

#include "core/pack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(FERRY_PACK_TENSOR_ALIGN == MEM_DEVICE_ALIGN,
               "tensor offsets: the device pool's alignment");

static size_t chunk_align(const ferry_mem *m, int fam) {
  int home = m->cfg.home[fam], reach = m->cfg.reach[fam];
  size_t a = MEM_DEVICE_ALIGN;
  size_t h = mem_host_align(m);
  if (reach <= FERRY_TIER_HOST && home >= FERRY_TIER_HOST && h > a) a = h;
  return a;
}

static int fail_chunk_too_big(ferry_mem *m, const mem_chunk *c, int tier, size_t avail,
                              const char *what) {
  const mem_tensor *big = NULL;
  for (uint32_t k = 0; k < c->ntensors; k++) {
    const mem_tensor *t = &m->t[m->order[c->first_tensor + k]];
    if (!big || t->bytes > big->bytes) big = t;
  }
  char b1[32], b2[32];
  return ferry_err(&m->err, FERRY_ENOMEM,
                   "layout: tensor '%.200s' (%zu bytes, group %u, %s family) needs a %s chunk "
                   "of %zu bytes, but the %s tier has %s (%s); raise tiers.%s.budget or place "
                   "the family elsewhere",
                   big ? big->name : "?", big ? big->bytes : 0, big ? big->group : 0,
                   ferry_family_name(c->family), ferry_format_size(c->bytes, b1, sizeof b1),
                   c->bytes, ferry_tier_name(tier), ferry_format_size(avail, b2, sizeof b2), what,
                   tier == FERRY_TIER_DEVICE ? "gpu" : ferry_tier_name(tier));
}

/* The packing order: by family, then group, then registration. A chunk
 * holds tensors of one group only, so fetching, updating or evicting one
 * group never touches another's bytes (the optimizer thread commits a
 * group's new params while the loop fetches the next one). Returns the
 * number of tensors ordered. */
static size_t sort_order(ferry_mem *m) {
  size_t no = 0;
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    size_t from = no;
    for (size_t i = 0; i < m->nt; i++)
      if (m->t[i].family == f) m->order[no++] = (uint32_t)i;
    /* stable insertion sort by group: registration is mostly in group order */
    for (size_t k = from + 1; k < no; k++) {
      uint32_t v = m->order[k];
      size_t j = k;
      while (j > from && m->t[m->order[j - 1]].group > m->t[v].group) {
        m->order[j] = m->order[j - 1];
        j--;
      }
      m->order[j] = v;
    }
  }
  return no;
}

/* Pass 1 of the packing: how many chunks the first `no` tensors of the
 * order take (core/pack.h's rule, a new chunk at each family and group). */
static uint32_t count_chunks(const ferry_mem *m, size_t no) {
  ferry_packer p = ferry_packer_make(m->cfg.chunk_size);
  uint32_t nchunks = 0;
  int fam = -1;
  uint32_t grp = 0;
  for (size_t k = 0; k < no; k++) {
    const mem_tensor *t = &m->t[m->order[k]];
    if (t->family != fam || t->group != grp) ferry_packer_break(&p);
    fam = t->family;
    grp = t->group;
    size_t off;
    nchunks += (uint32_t)ferry_packer_place(&p, t->bytes, &off);
  }
  return nchunks;
}

/* Pass 2 of the packing: places the tensors in m->c (sized by pass 1), sets
 * each tensor's chunk and offset and each chunk's family, home, index,
 * tensors, group and size (its bytes rounded up to its family's chunk
 * alignment). Returns the number of chunks filled. */
static uint32_t fill_chunks(ferry_mem *m, size_t no) {
  ferry_packer p = ferry_packer_make(m->cfg.chunk_size);
  uint32_t ci = 0;
  size_t a = 0;
  mem_chunk *cur = NULL;
  uint32_t idx = 0;
  int fam = -1;
  for (size_t k = 0; k < no; k++) {
    mem_tensor *t = &m->t[m->order[k]];
    if (t->family != fam) { /* a new family: its own alignment and numbering */
      ferry_packer_break(&p);
      fam = t->family;
      a = chunk_align(m, fam);
      idx = 0;
    } else if (t->group != cur->gfirst) { /* a new group: a new chunk */
      ferry_packer_break(&p);
    }
    size_t off;
    if (ferry_packer_place(&p, t->bytes, &off)) {
      cur = &m->c[ci++];
      cur->family = (uint8_t)fam;
      cur->home = (uint8_t)m->cfg.home[fam];
      cur->index = idx++;
      cur->first_tensor = (uint32_t)k;
      cur->gfirst = t->group;
      cur->glast = t->group;
    }
    t->chunk = (uint32_t)(cur - m->c);
    t->offset = off;
    cur->ntensors++;
    cur->bytes = ferry_align_up(p.fill, a);
  }
  return ci;
}

/* The group tables: by_group with its group_start offsets, and each (group,
 * family)'s chunk range. FERRY_ENOMEM when the scratch counts cannot be
 * allocated. */
static int build_group_tables(ferry_mem *m) {
  for (size_t i = 0; i < m->nt; i++) m->group_start[m->t[i].group + 1]++;
  for (uint32_t g = 0; g < m->ngroups; g++) m->group_start[g + 1] += m->group_start[g];
  uint32_t *fillp = calloc((size_t)m->ngroups + 1, sizeof *fillp);
  if (!fillp) return FERRY_ENOMEM;
  for (size_t i = 0; i < m->nt; i++) {
    uint32_t g = m->t[i].group;
    m->by_group[m->group_start[g] + fillp[g]++] = (uint32_t)i;
  }
  free(fillp);
  for (size_t i = 0; i < m->nt; i++) {
    const mem_tensor *t = &m->t[i];
    mem_range *r = &m->ranges[(size_t)t->group * FERRY_FAMILIES + t->family];
    if (r->count == 0) {
      r->first = t->chunk;
      r->count = 1;
    } else {
      uint32_t last = r->first + r->count - 1;
      if (t->chunk < r->first) r->first = t->chunk;
      if (t->chunk > last) last = t->chunk;
      r->count = last - r->first + 1;
    }
  }
  return FERRY_OK;
}

/* Every chunk fits every tier it passes (its largest per cache tier goes to
 * maxc); assigns NVMe slots (each of its chunk's bytes, and per family a
 * spare of its largest chunk and up to MEM_NVME_EXTRA of min(chunk_size,
 * that) within 1% of its bytes), sums the homes' bytes and marks home
 * copies resident. */
static int check_chunks(ferry_mem *m, size_t maxc[FERRY_TIERS]) {
  memset(m->home_bytes, 0, sizeof m->home_bytes);
  memset(m->nvme_spare, 0, sizeof m->nvme_spare);
  size_t data[FERRY_FAMILIES] = {0};
  m->nslots = 0;
  m->slot_size = 0;
  for (uint32_t i = 0; i < m->nc; i++) {
    mem_chunk *c = &m->c[i];
    int reach = m->cfg.reach[c->family];
    for (int t = reach; t <= c->home; t++) {
      if (c->bytes > m->cfg.budget[t])
        return fail_chunk_too_big(m, c, t, m->cfg.budget[t], "budget");
      if (t < c->home && c->bytes > maxc[t]) maxc[t] = c->bytes;
    }
    if (c->home == FERRY_TIER_NVME) {
      c->off[FERRY_TIER_NVME] = m->nslots++;
      if (c->bytes > m->slot_size) m->slot_size = c->bytes;
      if (c->bytes > m->nvme_spare[c->family]) m->nvme_spare[c->family] = c->bytes;
      data[c->family] += c->bytes;
      c->never_written = 1;
    }
    m->home_bytes[c->home] += c->bytes;
    c->state[c->home] = FERRY_RES_RESIDENT;
  }
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    size_t z = m->nvme_spare[f] < m->cfg.chunk_size ? m->nvme_spare[f] : m->cfg.chunk_size;
    size_t k = z ? data[f] / 100 / z : 0;
    m->nvme_extra[f] = (uint32_t)(k < MEM_NVME_EXTRA ? k : MEM_NVME_EXTRA);
    m->nvme_extra_bytes[f] = z;
    m->home_bytes[FERRY_TIER_NVME] += m->nvme_spare[f] + m->nvme_extra[f] * z;
  }
  return FERRY_OK;
}

/* Every home holds its families, and each cache tier keeps room for its
 * largest chunk (maxc) after the chunks that live there. */
static int check_homes(ferry_mem *m, const size_t maxc[FERRY_TIERS]) {
  size_t spares = 0;
  for (int f = 0; f < FERRY_FAMILIES; f++)
    spares += m->nvme_spare[f] + m->nvme_extra[f] * m->nvme_extra_bytes[f];
  for (int t = 0; t < FERRY_TIERS; t++) {
    char b1[32], b2[32], what[160] = "";
    if (t == FERRY_TIER_NVME) /* the swap files: the chunks and the spare slots */
      snprintf(what, sizeof what, " in swap files: %zu bytes of chunks and %zu of spare slots",
               m->home_bytes[t] - spares, spares);
    if (m->home_bytes[t] > m->cfg.budget[t])
      return ferry_err(&m->err, FERRY_ENOMEM,
                       "layout: the families that live in the %s tier need %s (%zu bytes%s), "
                       "more than its budget of %s (%zu bytes)",
                       ferry_tier_name(t), ferry_format_size(m->home_bytes[t], b1, sizeof b1),
                       m->home_bytes[t], what, ferry_format_size(m->cfg.budget[t], b2, sizeof b2),
                       m->cfg.budget[t]);
    if (maxc[t] && m->cfg.budget[t] - m->home_bytes[t] < maxc[t]) {
      for (uint32_t i = 0; i < m->nc; i++)
        if (m->c[i].bytes == maxc[t] && m->cfg.reach[m->c[i].family] <= t && m->c[i].home > t)
          return fail_chunk_too_big(m, &m->c[i], t, m->cfg.budget[t] - m->home_bytes[t],
                                    "left after the chunks that live there");
    }
  }
  return FERRY_OK;
}

int mem_layout_build(ferry_mem *m) {
  m->ngroups = m->max_group;
  m->order = malloc((m->nt + 1) * sizeof *m->order);
  m->by_group = malloc((m->nt + 1) * sizeof *m->by_group);
  m->group_start = calloc((size_t)m->ngroups + 1, sizeof *m->group_start);
  m->ranges = calloc((size_t)m->ngroups * FERRY_FAMILIES + 1, sizeof *m->ranges);
  if (!m->order || !m->by_group || !m->group_start || !m->ranges) goto oom;

  size_t no = sort_order(m);
  uint32_t nchunks = count_chunks(m, no);
  m->c = calloc((size_t)nchunks + 1, sizeof *m->c);
  if (!m->c) goto oom;
  m->nc = nchunks;
  uint32_t ci = fill_chunks(m, no);
  FERRY_ASSERT(ci == nchunks, "layout: counted %u chunks, filled %u", nchunks, ci);
  if (build_group_tables(m)) goto oom;
  return FERRY_OK;
oom:
  return ferry_err(&m->err, FERRY_ENOMEM, "layout: out of memory for %zu tensors", m->nt);
}

int mem_layout_check(ferry_mem *m) {
  size_t maxc[FERRY_TIERS] = {0};
  int rc = check_chunks(m, maxc);
  return rc ? rc : check_homes(m, maxc);
}

void mem_layout_free(ferry_mem *m) {
  free(m->order);
  free(m->by_group);
  free(m->group_start);
  free(m->ranges);
  free(m->c);
  m->order = m->by_group = m->group_start = NULL;
  m->ranges = NULL;
  m->c = NULL;
  m->nc = 0;
  m->laid_out = 0;
}

int ferry_mem_group_tensors(ferry_mem *m, uint32_t group, const uint32_t **ids, size_t *n) {
  if (!m || !ids || !n) return FERRY_EINVAL;
  if (!m->laid_out) return ferry_err(&m->err, FERRY_ESTATE, "group tensors: not laid out");
  if (group >= m->ngroups) return ferry_err(&m->err, FERRY_ENOENT, "no group %u", group);
  *ids = m->by_group + m->group_start[group];
  *n = m->group_start[group + 1] - m->group_start[group];
  return FERRY_OK;
}

int ferry_mem_group_chunks(ferry_mem *m, uint32_t group, int family, uint32_t *first,
                           uint32_t *count) {
  if (!m || !first || !count || family < 0 || family >= FERRY_FAMILIES) return FERRY_EINVAL;
  if (!m->laid_out) return ferry_err(&m->err, FERRY_ESTATE, "group chunks: not laid out");
  if (group >= m->ngroups) return ferry_err(&m->err, FERRY_ENOENT, "no group %u", group);
  const mem_range *r = &m->ranges[(size_t)group * FERRY_FAMILIES + family];
  *first = r->first;
  *count = r->count;
  return FERRY_OK;
}

uint32_t ferry_mem_chunk_count(ferry_mem *m) { return m && m->laid_out ? m->nc : 0; }

int ferry_mem_store_slot_sizes(ferry_mem *m, size_t *sizes, uint32_t cap, uint32_t *n) {
  if (!m || !n || (cap && !sizes)) return FERRY_EINVAL;
  if (!m->finalized) return ferry_err(&m->err, FERRY_ESTATE, "store slot sizes: not finalized");
  uint32_t k = m->nslots;
  for (int f = 0; f < FERRY_FAMILIES; f++) k += (m->nvme_spare[f] > 0) + m->nvme_extra[f];
  *n = k;
  if (!cap && !sizes) return FERRY_OK; /* the count alone */
  if (cap < k)
    return ferry_err(&m->err, FERRY_EINVAL, "store slot sizes: %u slots, room for %u", k, cap);
  for (uint32_t i = 0; i < m->nc; i++)
    if (m->c[i].home == FERRY_TIER_NVME) sizes[m->c[i].off[FERRY_TIER_NVME]] = m->c[i].bytes;
  k = m->nslots;
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    if (m->nvme_spare[f]) sizes[k++] = m->nvme_spare[f];
    for (uint32_t x = 0; x < m->nvme_extra[f]; x++) sizes[k++] = m->nvme_extra_bytes[f];
  }
  return FERRY_OK;
}

int ferry_mem_store_layout(ferry_mem *m, uint32_t *nslots, size_t *slot_size) {
  if (!m || !nslots || !slot_size) return FERRY_EINVAL;
  if (!m->finalized) return ferry_err(&m->err, FERRY_ESTATE, "store layout: not finalized");
  *nslots = m->nslots;
  *slot_size = m->slot_size;
  return FERRY_OK;
}
