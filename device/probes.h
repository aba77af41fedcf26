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

/* Host backend: each H2D and D2H copy takes at least latency_s plus
 * bytes / bytes_per_s (0: no floor) on its copy engine, which sleeps out
 * the rest without a CPU core. FERRY_ENOTSUP on another backend. */
int ferry_device_host_copy_rate(ferry_device *dev, double bytes_per_s, double latency_s);

#endif
