/* core/part.c — the split of a group's elements between ranks
 * (core/part.h).
 */
#include "core/part.h"

size_t ferry_part_even(size_t n, size_t nranks, size_t r) {
  return n / nranks * r + n % nranks * r / nranks;
}

size_t ferry_part_snap(size_t t, size_t start, size_t align) {
  return start + (t - start) / align * align;
}

size_t ferry_part_piece(size_t lo, size_t hi, size_t start, size_t n, size_t *off) {
  size_t a = lo > start ? lo - start : 0, b = hi > start ? hi - start : 0;
  if (a > n) a = n;
  if (b > n) b = n;
  *off = a;
  return b - a;
}

size_t ferry_part_bound(const size_t *n, size_t count, size_t nranks, size_t r, size_t align) {
  size_t total = 0, start = 0;
  for (size_t k = 0; k < count; k++) total += n[k];
  if (r >= nranks) return total;
  size_t t = ferry_part_even(total, nranks, r);
  for (size_t k = 0; k < count; k++) {
    if (t >= start && t < start + n[k]) return ferry_part_snap(t, start, align);
    start += n[k];
  }
  return total;
}
