/* examples/gpt/cuda_load.c — finding and opening the CUDA model's module
 * (libferry-gpt-cuda.so, which brings cuBLAS) for --device cuda only, and
 * checking its table's ABI before anything calls through it.
 */
#include "gpt_cuda.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef GPT_INSTALL_LIBDIR
#define GPT_INSTALL_LIBDIR "/usr/local/lib"
#endif

/* Appends "; path: why" to err (the reasons of every path tried). */
static void note(char *err, size_t len, const char *path, const char *why) {
  size_t n = strlen(err);
  if (n < len) snprintf(err + n, len - n, "%s%s: %s", n ? "; " : "", path, why);
}

/* The table, once its ABI and the shared structs' sizes match this build. */
static const gpt_cuda_api *check_table(const gpt_cuda_api *a, char *why, size_t len) {
  if (!a) return snprintf(why, len, "%s() returned no table", GPT_CUDA_ENTRY), NULL;
  if (a->abi != GPT_CUDA_ABI || a->api_bytes != sizeof(gpt_cuda_api) ||
      a->schema_bytes != sizeof(gpt_schema) || a->run_bytes != sizeof(gpt_run_config) ||
      a->provider_bytes != sizeof(gpt_provider) || a->mem_bytes != sizeof(gpt_cuda_mem) ||
      a->resident_bytes != sizeof(gpt_cuda_resident)) {
    snprintf(why, len, "ABI %u (table %u bytes) where this ferry-gpt has ABI %d (table %zu "
             "bytes), or its structs differ: a module of another build", a->abi, a->api_bytes,
             GPT_CUDA_ABI, sizeof(gpt_cuda_api));
    return NULL;
  }
  return a;
}

/* dlopen + dlsym + the ABI check of one path; NULL with why. */
static const gpt_cuda_api *try_path(const char *path, char *why, size_t len) {
  /* never closed, refused or not: a CUDA library's exit handlers may point
   * into what it mapped */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    size_t pl = strlen(path);
    if (e && !strncmp(e, path, pl) && !strncmp(e + pl, ": ", 2)) e += pl + 2; /* said once */
    snprintf(why, len, "%s", e ? e : "dlopen failed");
    return NULL;
  }
  dlerror();
  gpt_cuda_entry_fn entry;
  *(void **)&entry = dlsym(h, GPT_CUDA_ENTRY); /* POSIX: object -> function pointer */
  if (!entry) {
    const char *e = dlerror();
    snprintf(why, len, "no %s (%s)", GPT_CUDA_ENTRY, e ? e : "NULL");
    return NULL;
  }
  return check_table(entry(), why, len);
}

/* $ORIGIN/../lib/<module>: /proc/self/exe is the resolved path, so its
 * folder's parent is a string cut (build/bin/ferry-gpt -> build/lib/...);
 * "" when unknown. */
static void beside_exe(char *out, size_t len) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  out[0] = '\0';
  if (n <= 0) return;
  exe[n] = '\0';
  for (int cut = 0; cut < 2; cut++) { /* the file name, then its folder */
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = '\0';
  }
  snprintf(out, len, "%s/lib/%s", exe, GPT_CUDA_MODULE_FILE);
}

int gpt_cuda_load(const gpt_cuda_api **out, char *err, size_t len) {
  static const gpt_cuda_api *loaded;
  *out = NULL;
  err[0] = '\0';
#ifndef GPT_CUDA_MODULE_BUILT
  snprintf(err, len, "this build has no CUDA (configure with nvcc on PATH)");
  return -1;
#endif
  if (loaded) return *out = loaded, 0;
  char paths[2][PATH_MAX + 64], why[1024];
  int n = 0;
  const char *env = getenv(GPT_CUDA_MODULE_ENV);
  if (env && env[0]) {
    snprintf(paths[n++], sizeof paths[0], "%s", env);
  } else {
    beside_exe(paths[n], sizeof paths[0]);
    if (paths[n][0]) n++;
    snprintf(paths[n++], sizeof paths[0], "%s/%s", GPT_INSTALL_LIBDIR, GPT_CUDA_MODULE_FILE);
  }
  for (int i = 0; i < n; i++) {
    if ((loaded = try_path(paths[i], why, sizeof why))) return *out = loaded, 0;
    note(err, len, paths[i], why);
  }
  return -1;
}
