/* tests/python/stats_layout.c — prints the size of each public struct that
 * the Python binding mirrors with ctypes (python/ferry/_lib.py) and the
 * offset of each field, one "struct[.field] number" line each, for
 * test_stats_layout.py to hold the mirrors to. */
#include "ferry.h"

#include <stddef.h>
#include <stdio.h>

#define SIZE(T) printf(#T " %zu\n", sizeof(T))
#define OFF(T, f) printf(#T "." #f " %zu\n", offsetof(T, f))

int main(int argc, char **argv) {
  (void)argv;
  if (argc > 1) {
    printf("usage: python_stats_layout\n\nPrints sizes and field offsets of the structs that "
           "python/ferry/_lib.py mirrors.\n");
    return 0;
  }
  SIZE(ferry_stats);
  OFF(ferry_stats, budget);
  OFF(ferry_stats, current);
  OFF(ferry_stats, peak);
  OFF(ferry_stats, tier_current);
  OFF(ferry_stats, tier_peak);
  OFF(ferry_stats, bytes_h2d);
  OFF(ferry_stats, bytes_d2h);
  OFF(ferry_stats, bytes_host_to_nvme);
  OFF(ferry_stats, bytes_nvme_to_host);
  OFF(ferry_stats, evictions);
  OFF(ferry_stats, writebacks);
  OFF(ferry_stats, fetches);
  OFF(ferry_stats, fetch_hits);
  OFF(ferry_stats, stalls);
  OFF(ferry_stats, stall_seconds);
  OFF(ferry_stats, metadata_bytes);
  OFF(ferry_stats, managed_bytes);
  OFF(ferry_stats, host_pageable_bytes);
  OFF(ferry_stats, nvme_read_bytes);
  OFF(ferry_stats, nvme_write_bytes);
  OFF(ferry_stats, optim_bytes_per_param);
  OFF(ferry_stats, comm_ops);
  OFF(ferry_stats, comm_bytes);
  OFF(ferry_stats, comm_seconds);
  OFF(ferry_stats, comm_wait_seconds);
  OFF(ferry_stats, nvme_reclaimed_files);
  OFF(ferry_stats, nvme_reclaimed_bytes);
  OFF(ferry_stats, nvme_file_bytes);
  OFF(ferry_stats, nvme_data_bytes);
  SIZE(ferry_step_info);
  OFF(ferry_step_info, step);
  OFF(ferry_step_info, skipped);
  OFF(ferry_step_info, grad_norm);
  OFF(ferry_step_info, loss_scale);
  OFF(ferry_step_info, clip_coef);
  OFF(ferry_step_info, seconds);
  SIZE(ferry_checkpoint_options);
  OFF(ferry_checkpoint_options, keep);
  OFF(ferry_checkpoint_options, max_shard_bytes);
  SIZE(ferry_checkpoint_info);
  OFF(ferry_checkpoint_info, step);
  OFF(ferry_checkpoint_info, blob_bytes);
  OFF(ferry_checkpoint_info, tensors);
  OFF(ferry_checkpoint_info, total_bytes);
  OFF(ferry_checkpoint_info, files);
  OFF(ferry_checkpoint_info, path);
  SIZE(ferry_device_info);
  OFF(ferry_device_info, name);
  OFF(ferry_device_info, kind);
  OFF(ferry_device_info, emulated);
  OFF(ferry_device_info, capacity);
  OFF(ferry_device_info, used);
  OFF(ferry_device_info, peak);
  OFF(ferry_device_info, total_memory);
  OFF(ferry_device_info, free_memory);
  OFF(ferry_device_info, pcie_gen);
  OFF(ferry_device_info, pcie_width);
  OFF(ferry_device_info, host_lock_pinned);
  return 0;
}
