/* tests/memory/test_mem_model.c — the tiered memory manager against a
 * reference model: random tensors in random groups, tiny budgets, and
 * thousands of random fetch / write / release / write-back / evict /
 * prefetch / flush operations, each followed by checks: contents by
 * checksum at every fetch, use counts, inclusion, legal states, bytes per
 * tier equal to the copies present, peaks within budgets.
 * usage: test_mem_model [ops] [seed] [first|last|random] [runs]
 * (the pools' fit policy: contents may not depend on where a copy lands;
 * runs: seeds seed .. seed + runs - 1)
 */
#include "memory/memory.h"
#include "tests/memory/fake_store.h"
#include "tests/test.h"

#include <stdio.h>
#include <string.h>

#define G 10
#define MAXT 256
#define MAXHELD 8

typedef struct {
  uint32_t id, group;
  int fam;
  size_t bytes;
  unsigned char *truth;
} tref;

typedef struct {
  uint32_t g;
  int fam, tier;
} held_t;

static ferry_device *dev;
static ferry_mem *m;
static fake_store fs;
static tref T[MAXT];
static int nt;
static held_t held[MAXHELD];
static int nheld;
static unsigned long long rs;
static size_t budget[FERRY_TIERS];
static ferry_fit_policy fit = FERRY_FIT_FIRST;
static int home[FERRY_FAMILIES];

static uint64_t sum64(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static int verify_group(uint32_t g, int fam, int tier, const char *when) {
  int bad = 0;
  for (int i = 0; i < nt; i++) {
    if (T[i].group != g || T[i].fam != fam) continue;
    void *p = NULL;
    int rc = ferry_mem_tensor_ptr(m, T[i].id, tier, &p);
    if (rc) {
      fprintf(stderr, "%s: tensor %u: ptr: %s\n", when, T[i].id, ferry_mem_last_error(m));
      bad++;
      continue;
    }
    if (sum64(p, T[i].bytes) != sum64(T[i].truth, T[i].bytes)) {
      fprintf(stderr, "%s: tensor %u (group %u, %s) in the %s tier: contents differ\n", when,
              T[i].id, g, ferry_family_name(fam), ferry_tier_name(tier));
      bad++;
    }
  }
  EXPECT(bad == 0);
  return bad;
}

static void write_group(uint32_t g, int fam, int tier) {
  for (int i = 0; i < nt; i++) {
    if (T[i].group != g || T[i].fam != fam) continue;
    void *p = NULL;
    REQUIRE(ferry_mem_tensor_ptr(m, T[i].id, tier, &p) == 0);
    for (size_t k = 0; k < T[i].bytes; k++) T[i].truth[k] = (unsigned char)test_rand(&rs);
    memcpy(p, T[i].truth, T[i].bytes);
  }
}

static void check_invariants(int op) {
  uint32_t nc = ferry_mem_chunk_count(m);
  uint64_t present[FERRY_TIERS] = {0};
  for (uint32_t ci = 0; ci < nc; ci++) {
    ferry_mem_chunk_info c;
    REQUIRE(ferry_mem_chunk_get(m, ci, &c) == 0);
    for (int t = 0; t < FERRY_TIERS; t++) {
      EXPECT(c.state[t] <= FERRY_RES_WRITING);
      if (c.state[t] != FERRY_RES_ABSENT) present[t] += c.bytes;
      if (t > c.home) EXPECT(c.state[t] == FERRY_RES_ABSENT);
      uint32_t want = 0;
      for (int h = 0; h < nheld; h++) {
        uint32_t first, count;
        REQUIRE(ferry_mem_group_chunks(m, held[h].g, held[h].fam, &first, &count) == 0);
        if (ci >= first && ci < first + count && held[h].tier <= t && t < c.home) want++;
      }
      if (c.use[t] != want) {
        fprintf(stderr, "op %d: chunk %u %s use %u, model %u\n", op, ci, ferry_tier_name(t),
                c.use[t], want);
        test_failures++;
      }
    }
    EXPECT(c.state[c.home] == FERRY_RES_RESIDENT);
    /* Inclusion: a device copy of an NVMe-homed chunk has a host copy. */
    if (c.home == FERRY_TIER_NVME && c.state[0] != FERRY_RES_ABSENT)
      EXPECT(c.state[1] != FERRY_RES_ABSENT);
  }
  ferry_stats st;
  REQUIRE(ferry_mem_get_stats(m, &st) == 0);
  for (int t = 0; t < FERRY_TIERS; t++) {
    if (st.tier_current[t] != present[t]) {
      fprintf(stderr, "op %d: %s tier accounts %llu bytes, copies hold %llu\n", op,
              ferry_tier_name(t), (unsigned long long)st.tier_current[t],
              (unsigned long long)present[t]);
      test_failures++;
    }
    EXPECT(st.tier_peak[t] <= budget[t]);
    uint64_t fam_sum = 0;
    for (int f = 0; f < FERRY_FAMILIES; f++) fam_sum += st.current[t][f];
    EXPECT(fam_sum == st.tier_current[t]);
  }
  if (test_failures) {
    fprintf(stderr, "failed at op %d\n", op);
    exit(1);
  }
}

static void full_check(const char *when) {
  while (nheld) {
    nheld--;
    REQUIRE(ferry_mem_release(m, held[nheld].g, held[nheld].fam, held[nheld].tier, NULL) == 0);
  }
  int rc = ferry_mem_flush(m);
  if (rc) fprintf(stderr, "flush: %s\n", ferry_mem_last_error(m));
  REQUIRE(rc == 0);
  for (uint32_t g = 0; g < G; g++)
    for (int f = 0; f < FERRY_FAMILIES; f++) {
      rc = ferry_mem_fetch(m, g, f, FERRY_TIER_HOST, NULL, 0);
      if (rc) fprintf(stderr, "%s: fetch %u/%d: %s\n", when, g, f, ferry_mem_last_error(m));
      REQUIRE(rc == 0);
      verify_group(g, f, FERRY_TIER_HOST, when);
      REQUIRE(ferry_mem_release(m, g, f, FERRY_TIER_HOST, NULL) == 0);
    }
}

static void dump_op(int op, unsigned r, uint32_t g, int fam, int tier) {
  fprintf(stderr, "op %d r %u g %u fam %d tier %d held %d:", op, r, g, fam, tier, nheld);
  uint32_t nc = ferry_mem_chunk_count(m);
  for (uint32_t ci = 0; ci < nc; ci++) {
    ferry_mem_chunk_info c;
    ferry_mem_chunk_get(m, ci, &c);
    fprintf(stderr, " %u[%u-%u]%d%d%d/%u%u", ci, c.group_first, c.group_last, c.state[0], c.state[1],
            c.state[2], c.use[0], c.use[1]);
  }
  fprintf(stderr, "\n");
}

static int random_tier(int fam) {
  if (fam == FERRY_FAMILY_OPTIM) return FERRY_TIER_HOST;
  return (int)(test_rand(&rs) % 2);
}

static void run(int variant, int ops, unsigned long long seed) {
  rs = seed * 2654435761ull + (unsigned long long)variant + 1;
  const size_t cs = 4096;
  /* Placements: (params, grads, optim) homes. */
  static const int homes[3][3] = {{1, 1, 2}, {2, 1, 2}, {2, 2, 2}};
  for (int f = 0; f < 3; f++) home[f] = homes[variant][f];

  nt = 0;
  size_t host_home = 0;
  uint32_t ids[MAXT];
  int64_t shapes[MAXT];
  int dts[MAXT], roles[MAXT];
  uint32_t groups[MAXT];
  for (uint32_t g = 0; g < G; g++)
    for (int f = 0; f < 3; f++) {
      int k = 1 + (int)(test_rand(&rs) % 3);
      for (int j = 0; j < k && nt < MAXT; j++) {
        int role = f == 0 ? FERRY_ROLE_PARAM : f == 1 ? FERRY_ROLE_GRAD
                                                     : FERRY_ROLE_MASTER + j % 3;
        int dt = f == 2 ? FERRY_DT_F32 : (test_rand(&rs) & 1) ? FERRY_DT_F16 : FERRY_DT_BF16;
        int64_t n = 16 + (int64_t)(test_rand(&rs) % 700);
        if (f == 0 && test_rand(&rs) % 30 == 0) n = 3000; /* bigger than a chunk: its own */
        groups[nt] = g;
        shapes[nt] = n;
        dts[nt] = dt;
        roles[nt] = role;
        size_t b = (size_t)n * (dt == FERRY_DT_F32 ? 4 : 2);
        if (home[f] == FERRY_TIER_HOST) host_home += ferry_align_up(b, 256);
        T[nt].bytes = b;
        T[nt].group = g;
        T[nt].fam = f;
        nt++;
      }
    }
  budget[FERRY_TIER_DEVICE] = 5 * cs + 2048;
  budget[FERRY_TIER_HOST] = host_home * 2 + 6 * cs + 8192;
  budget[FERRY_TIER_NVME] = (size_t)64 << 20;

  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = budget[0] + 4096;
  REQUIRE(ferry_device_create(&dc, &dev) == 0);
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = dev;
  for (int t = 0; t < 3; t++) mc.budget[t] = budget[t];
  mc.chunk_size = cs;
  for (int f = 0; f < 3; f++) mc.home[f] = home[f];
  mc.policy = variant == 1 ? FERRY_EVICT_TRACE : FERRY_EVICT_LRU;
  mc.fit = fit;
  mc.fit_seed = seed;
  mc.nvme_align = 512;
  mc.host_pinned = 0;
  mc.numa_local = 0;
  REQUIRE(ferry_mem_create(&mc, &m) == 0);
  for (int i = 0; i < nt; i++) {
    char name[64];
    snprintf(name, sizeof name, "g%u.%s.%d", groups[i], ferry_family_name(T[i].fam), i);
    REQUIRE(ferry_mem_register(m, name, (ferry_dtype)dts[i], 1, &shapes[i], groups[i],
                               (ferry_role)roles[i], &ids[i]) == 0);
    T[i].id = ids[i];
    T[i].truth = calloc(1, T[i].bytes);
  }
  int rc = ferry_mem_finalize(m);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_mem_last_error(m));
  REQUIRE(rc == 0);
  REQUIRE(fake_store_attach(&fs, m, 40) == 0);
  if (variant == 1) REQUIRE(ferry_mem_trace_record(m, 1) == 0);

  int enomem = 0, ebusy = 0;
  nheld = 0;
  for (int op = 0; op < ops; op++) {
    if (variant == 1 && op == ops / 4) REQUIRE(ferry_mem_trace_record(m, 0) == 0);
    unsigned r = (unsigned)(test_rand(&rs) % 100);
    uint32_t g = (uint32_t)(test_rand(&rs) % G);
    int fam = (int)(test_rand(&rs) % 3);
    int tier = random_tier(fam);
    if (getenv("MODEL_TRACE")) dump_op(op, r, g, fam, tier);
    if (r < 30 && nheld < MAXHELD) { /* fetch */
      unsigned flags = (fam == 1 && test_rand(&rs) % 8 == 0) ? FERRY_MEM_NOLOAD : 0;
      rc = ferry_mem_fetch(m, g, fam, tier, NULL, flags);
      if (rc == FERRY_ENOMEM) {
        enomem++;
        EXPECT(strstr(ferry_mem_last_error(m), "held by") != NULL);
      } else if (rc == FERRY_EBUSY && tier == FERRY_TIER_HOST) {
        ebusy++; /* dirty and held on the device */
      } else {
        if (rc) fprintf(stderr, "op %d fetch: %s\n", op, ferry_mem_last_error(m));
        REQUIRE(rc == 0);
        held[nheld++] = (held_t){g, fam, tier};
        if (flags) {
          rc = ferry_mem_mark_dirty(m, g, fam, tier, NULL);
          if (rc == 0) write_group(g, fam, tier);
          else REQUIRE(rc == FERRY_EBUSY);
        } else {
          verify_group(g, fam, tier, "fetch");
        }
      }
    } else if (r < 50 && nheld) { /* write a held group */
      held_t h = held[test_rand(&rs) % (unsigned)nheld];
      rc = ferry_mem_mark_dirty(m, h.g, h.fam, h.tier, NULL);
      if (rc == FERRY_EBUSY) ebusy++;
      else {
        if (rc) fprintf(stderr, "op %d mark dirty: %s\n", op, ferry_mem_last_error(m));
        REQUIRE(rc == 0);
        write_group(h.g, h.fam, h.tier);
      }
    } else if (r < 72 && nheld) { /* release */
      int k = (int)(test_rand(&rs) % (unsigned)nheld);
      REQUIRE(ferry_mem_release(m, held[k].g, held[k].fam, held[k].tier, NULL) == 0);
      held[k] = held[--nheld];
    } else if (r < 80) {
      rc = ferry_mem_writeback(m, g, fam, tier);
      if (rc) fprintf(stderr, "op %d writeback: %s\n", op, ferry_mem_last_error(m));
      REQUIRE(rc == 0);
    } else if (r < 88) {
      rc = ferry_mem_evict(m, g, fam, tier);
      if (rc && rc != FERRY_EBUSY) fprintf(stderr, "op %d evict: %s\n", op, ferry_mem_last_error(m));
      REQUIRE(rc == 0 || rc == FERRY_EBUSY);
    } else if (r < 94) {
      rc = ferry_mem_prefetch(m, g, fam, tier);
      REQUIRE(rc == 0 || rc == FERRY_ENOMEM || rc == FERRY_EBUSY);
    } else if (r < 96) {
      REQUIRE(ferry_mem_flush(m) == 0);
    } else {
      REQUIRE(ferry_mem_poll(m) == 0);
    }
    check_invariants(op);
    if (op % 700 == 699) {
      full_check("periodic");
      check_invariants(op);
    }
  }
  full_check("final");
  check_invariants(ops);
  ferry_stats st;
  REQUIRE(ferry_mem_get_stats(m, &st) == 0);
  printf("variant %d: %d tensors, %u chunks, %llu fetches (%llu hits), %d ENOMEM, %d EBUSY, "
         "evictions %llu/%llu, H2D %llu D2H %llu ->nvme %llu nvme-> %llu bytes, %llu stalls\n",
         variant, nt, ferry_mem_chunk_count(m), (unsigned long long)st.fetches,
         (unsigned long long)st.fetch_hits, enomem, ebusy, (unsigned long long)st.evictions[0],
         (unsigned long long)st.evictions[1], (unsigned long long)st.bytes_h2d,
         (unsigned long long)st.bytes_d2h, (unsigned long long)st.bytes_host_to_nvme,
         (unsigned long long)st.bytes_nvme_to_host, (unsigned long long)st.stalls);
  EXPECT(st.fetches > 0 && st.evictions[0] > 0);
  uint64_t rd = 0, wr = 0; /* the per-family NVMe counts add up to the totals */
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    rd += st.nvme_read_bytes[f];
    wr += st.nvme_write_bytes[f];
  }
  EXPECT(rd == st.bytes_nvme_to_host && wr == st.bytes_host_to_nvme);
  EXPECT(fs.errors == 0);
  ferry_mem_destroy(m);
  fake_store_close(&fs);
  ferry_device_destroy(dev);
  for (int i = 0; i < nt; i++) free(T[i].truth);
}

int main(int argc, char **argv) {
  int ops = argc > 1 ? atoi(argv[1]) : 6000;
  unsigned long long seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
  if (argc > 3) {
    if (!strcmp(argv[3], "last")) fit = FERRY_FIT_LAST;
    else if (!strcmp(argv[3], "random")) fit = FERRY_FIT_RANDOM;
    else if (strcmp(argv[3], "first")) {
      fprintf(stderr, "test_mem_model: fit %s is not first, last or random\n", argv[3]);
      return 2;
    }
  }
  int runs = argc > 4 ? atoi(argv[4]) : 1;
  for (int r = 0; r < runs; r++)
    for (int v = 0; v < 3; v++) run(v, ops, seed + (unsigned long long)r);
  return test_finish("test_mem_model");
}
