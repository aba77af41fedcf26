/* bench/profile_out.h — writing the profile `ferry plan --profile` reads
 * (bench/bench_all.c owns the format's writer): a benchmark that measures
 * some keys puts them into a profile file, keeping the file's other keys.
 */
#ifndef FERRY_BENCH_PROFILE_OUT_H
#define FERRY_BENCH_PROFILE_OUT_H

#include <stddef.h>

/* Keys bits[i] (FERRY_PLAN_BW_*) = vals[i], with their sources, into the
 * profile at path: a missing file is created; an existing profile keeps its
 * other measured keys and their sources. The file is written whole, renamed
 * into place and read back with the planner's parser. 0, or -1 with why. */
int bench_profile_update(const char *path, const unsigned *bits, const double *vals,
                         const char *const *sources, int n, const char *machine, char *why,
                         size_t wl);

#endif
