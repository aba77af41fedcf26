/* device/peer.h — a face of device/: what the library's other parts (the
 * communicators in comm/) ask of a device and a stream beyond the public
 * API (include/ferry/device.h), without the structs behind them
 * (backend_impl.h stays private to device/). Cheap reads of fixed fields:
 * no lock, no call into the backend.
 */
#ifndef FERRY_DEVICE_PEER_H
#define FERRY_DEVICE_PEER_H

#include "ferry.h"

/* The device a stream belongs to (s not NULL). */
ferry_device *ferry_stream_device(const ferry_stream *s);
/* The backend the device runs on: FERRY_DEVICE_HOST or FERRY_DEVICE_CUDA
 * (never AUTO: the one chosen at create). */
ferry_device_kind ferry_device_backend(const ferry_device *dev);
/* The CUDA device a cuda device runs on (its config's cuda_ordinal). */
int ferry_device_cuda_ordinal(const ferry_device *dev);

#endif /* FERRY_DEVICE_PEER_H */
