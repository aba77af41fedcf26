/* memory/names.c — the names of tiers, families and residency states used in
 * every message of the manager (and by its callers). A leaf: it calls
 * nothing, so every other source of memory/ may use it.
 */
#include "memory/memory.h"

const char *ferry_tier_name(int tier) {
  switch (tier) {
  case FERRY_TIER_DEVICE: return "device";
  case FERRY_TIER_HOST: return "host";
  case FERRY_TIER_NVME: return "nvme";
  }
  return "?";
}

const char *ferry_family_name(int family) {
  switch (family) {
  case FERRY_FAMILY_PARAMS: return "params";
  case FERRY_FAMILY_GRADS: return "grads";
  case FERRY_FAMILY_OPTIM: return "optimizer";
  }
  return "?";
}

const char *ferry_res_state_name(int s) {
  switch (s) {
  case FERRY_RES_ABSENT: return "absent";
  case FERRY_RES_LOADING: return "loading";
  case FERRY_RES_RESIDENT: return "resident";
  case FERRY_RES_DIRTY: return "dirty";
  case FERRY_RES_WRITING: return "writing";
  }
  return "?";
}
