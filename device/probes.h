/* device/probes.h — what tests measure the device layer by (not public
 * API): the host waits on device work the calling thread has made (stream
 * and event synchronizes), and the host backend's copy-engine speed, a
 * slow link between host and emulated GPU.
 */
#ifndef FERRY_DEVICE_PROBES_H
#define FERRY_DEVICE_PROBES_H

#include "ferry.h"

#include <stdint.h>

/* Stream and event synchronizes the calling thread has made so far (a
 * stream's destroy, which drains it, is not counted). */
uint64_t ferry_device_host_waits(void);

/* Host backend: each H2D and D2H copy first occupies its copy engine for
 * latency_s plus bytes / bytes_per_s (rate 0: latency alone), sleeping,
 * without a CPU core, then moves the bytes: a slow link on which a read of
 * the source or the destination out of stream order shows. FERRY_ENOTSUP
 * on another backend. */
int ferry_device_host_copy_rate(ferry_device *dev, double bytes_per_s, double latency_s);

#endif
