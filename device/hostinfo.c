/* device/hostinfo.c — the host side of the machine, as ferry info and the
 * planner need it: CPU model, cores, NUMA nodes and their memory (hwloc),
 * RAM, the locked-memory limit and the huge page size.
 */
#include "core/core.h"

#include <hwloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>

static uint64_t meminfo_kb(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kl = strlen(key);
  uint64_t v = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      unsigned long long x = 0;
      if (sscanf(line + kl + 1, "%llu", &x) == 1) v = x;
      break;
    }
  }
  fclose(f);
  return v;
}

int ferry_host_get_info(ferry_host_info *out) {
  if (!out) return FERRY_EINVAL;
  memset(out, 0, sizeof *out);
  out->simd = ferry_cpu_simd();

  struct sysinfo si;
  if (sysinfo(&si) == 0) out->ram_bytes = (uint64_t)si.totalram * si.mem_unit;
  out->ram_available_bytes = meminfo_kb("MemAvailable") * 1024;
  out->hugepage_bytes = meminfo_kb("Hugepagesize") * 1024;
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
    out->memlock_bytes = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;

  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return ferry_err_thread(FERRY_ENOTSUP, "hwloc init failed");
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return ferry_err_thread(FERRY_ENOTSUP, "hwloc topology load failed");
  }
  out->cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  out->threads = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  int nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  out->numa_nodes = nn;
  for (int i = 0; i < nn && i < FERRY_MAX_NUMA; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
    out->numa_memory[i] = o && o->attr ? o->attr->numanode.local_memory : 0;
  }
  hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
  const char *model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
  if (!model) model = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topo), "CPUModel");
  snprintf(out->cpu_model, sizeof out->cpu_model, "%s", model ? model : "unknown");
  hwloc_topology_destroy(topo);
  return FERRY_OK;
}

int ferry_host_info_get(ferry_host_info *out) { return ferry_host_get_info(out); }
