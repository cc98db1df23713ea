/* cmd_devices.c - `attnres devices`: what this host offers, with the
 * fingerprint under which tuning results are stored. */
#include <stdio.h>
#include <string.h>

#include "attnres.h"
#include "cli.h"

static void show(const char *spec)
{
    attnres_device *dev;
    char msg[512];
    if (attnres_device_open(spec, &dev, msg, sizeof msg) != ATTNRES_OK) {
        printf("%-8s unavailable: %s\n", spec, msg);
        return;
    }
    attnres_device_info info = {.struct_size = sizeof info};
    attnres_device_info_get(dev, &info);
    printf("%-8s %s%s\n         arch %s, %d %s, %.1f GiB, driver %s\n         fingerprint %s\n", spec, info.name,
           info.simulated ? " (simulated)" : "", info.arch, info.units, strcmp(info.backend, "cuda") == 0 ? "SMs" : "cores",
           (double)info.memory / (1024.0 * 1024.0 * 1024.0), info.driver, info.fingerprint);
    attnres_device_close(dev);
}

static const char devices_usage[] =
    "usage: attnres devices\n\n  Lists the CPU and every CUDA device, with the fingerprint\n"
    "  (backend|name|arch|units|memory|driver, then |simulated for a device of\n"
    "  the simulated CUDA driver) that keys tuning results.\n";

int cmd_devices(int argc, char **argv)
{
    const cli_opt opts[] = {CLI_OPT_END};
    const cli_spec spec = {.cmd = "devices", .usage = devices_usage, .opts = opts};
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED)
        return rc == CLI_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    show("cpu");
    int n = attnres_device_count("cuda");
    if (n == 0)
        show("cuda:0"); /* says why there is none */
    for (int i = 0; i < n; i++) {
        char spec[16];
        snprintf(spec, sizeof spec, "cuda:%d", i);
        show(spec);
    }
    return CLI_EXIT_OK;
}
