/*
 * cmd_run.h - what the files of `attnres run` (cmd_run*.c) share: the parsed
 * options, and the helpers each op's run calls.
 */

typedef struct run_opts {
    attnres_op op;
    const char *op_name;
    const char *device, *db, *sources, *query, *gain, *partial, *out_gain, *normed, *out;
    const char *queries, *gains, *lse, *o1, *sublayer, *partial_out;
    double eps, scale, alpha, out_eps;
    int64_t heads;
    attnres_dtype dtype;
    int have_alpha, have_out_eps, have_heads, require_exact;
} run_opts;

/* Device copies of a run's buffers; freed together. */
typedef struct staged {
    attnres_device *dev;
    void *ptr[8];
    int count, failed;
} staged;

/* One output file: its path, float32 data and shape. */
typedef struct out_file {
    const char *path;
    const float *data;
    int ndim;
    int64_t shape[3];
} out_file;
