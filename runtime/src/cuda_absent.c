/* cuda_absent.c - the CUDA slot of a build configured without CUDA
 * (ATTNRES_CUDA=OFF): no devices, and a message that says why. */
#include "device.h"

static int absent_count(void) { return 0; }

static int absent_open(attnres_device *dev, int index)
{
    (void)index;
    return ar_device_fail(dev, ATTNRES_ENODEV, "this libattnres was built without CUDA support");
}

static void absent_close(attnres_device *dev) { (void)dev; }

const ar_backend ar_cuda_backend = {
    .name = "cuda",
    .count = absent_count,
    .open = absent_open,
    .close = absent_close,
};
