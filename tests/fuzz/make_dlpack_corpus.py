"""Writes the seed corpus of fuzz_dlpack (tests/fuzz/corpus/dlpack/): honest
tensors that must be accepted (ok-) and lying ones that must be refused
(bad-), in the input format fuzz_dlpack.c describes. Run it again after a
change of that format:

    python3 tests/fuzz/make_dlpack_corpus.py
"""

import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "dlpack")

VERSIONED, SHAPE_NULL, STRIDES_NULL, IN_BUFFER, WRITABLE, ROWS = 1, 2, 4, 8, 16, 32
I64_MIN, I64_MAX, U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
F32, BF16, F16 = (2, 32), (4, 16), (2, 16)


def tensor(form=VERSIONED | IN_BUFFER, want=3, major=1, minor=0, flags=0, ndim=None, dtype=F32, lanes=1,
           device=(1, 0), byte_offset=0, data=0, shape=(3, 4, 16), strides=None):
    if ndim is None:
        ndim = len(shape)
    if strides is None:
        form |= STRIDES_NULL
        strides = (0,) * len(shape)
    b = struct.pack("<BB", form, (want - 1) % 3)
    b += struct.pack("<IIQiBBHiiQQ", major, minor, flags, ndim, dtype[0], dtype[1], lanes, device[0], device[1],
                     byte_offset, data)
    b += b"".join(struct.pack("<q", s) for s in shape)
    b += b"".join(struct.pack("<q", s) for s in strides)
    return b


CASES = {
    # Honest tensors.
    "ok-compact-3d-f32": tensor(),
    "ok-strided-3d-f32": tensor(strides=(128, 32, 1)),
    "ok-legacy-2d": tensor(form=IN_BUFFER, want=2, shape=(4, 16), strides=(16, 1)),
    "ok-query-1d": tensor(want=1, shape=(16,)),
    "ok-bf16": tensor(dtype=BF16, strides=(64, 16, 1)),
    "ok-f16-rows": tensor(form=VERSIONED | IN_BUFFER | ROWS, dtype=F16, strides=(128, 32, 1)),
    "ok-int8": tensor(dtype=(0, 8)),
    "ok-complex128": tensor(dtype=(5, 128), shape=(2, 2, 4)),
    "ok-byte-offset": tensor(byte_offset=1024),
    "ok-negative-strides-in-buffer": tensor(data=2048, strides=(-256, 16, 1)),
    "ok-size-1-axis-any-stride": tensor(shape=(1, 4, 16), strides=(2**62, 16, 1)),
    "ok-empty-t0-huge-strides": tensor(form=VERSIONED, shape=(3, 0, 16), strides=(I64_MAX, I64_MIN, 7)),
    "ok-empty-null-data": tensor(form=VERSIONED, shape=(0, 4, 16), data=0),
    "ok-read-only-input": tensor(flags=1),
    "ok-writable-output": tensor(form=VERSIONED | IN_BUFFER | WRITABLE, want=2, shape=(4, 16)),
    "ok-cuda-device-pointer": tensor(form=VERSIONED, device=(2, 0), data=0x7F0000000000),
    "ok-later-minor-version": tensor(minor=3),
    # Lies about the shape and the dimensions.
    "bad-shape-null": tensor(form=VERSIONED | IN_BUFFER | SHAPE_NULL),
    "bad-shape-null-legacy": tensor(form=IN_BUFFER | SHAPE_NULL),
    "bad-negative-size": tensor(shape=(3, -4, 16)),
    "bad-size-int64-min": tensor(shape=(3, I64_MIN, 16)),
    "bad-more-elements-than-memory": tensor(shape=(3, 2**62, 16)),
    "bad-element-count-overflows": tensor(shape=(2**32, 2**32, 2**32)),
    "bad-ndim-0": tensor(ndim=0),
    "bad-ndim-7": tensor(ndim=7),
    "bad-ndim-negative": tensor(ndim=-1),
    "bad-ndim-huge": tensor(ndim=2**31 - 1),
    # Lies about the offset and the strides.
    "bad-byte-offset-2-63": tensor(byte_offset=2**63),
    "bad-byte-offset-max": tensor(byte_offset=U64_MAX),
    "bad-byte-offset-wraps": tensor(form=VERSIONED, data=0xFFFFFFFFFFFF0000, byte_offset=0x10000),
    "bad-token-stride-2-61": tensor(strides=(64, 2**61, 1)),
    "bad-token-stride-2-61-rows": tensor(form=VERSIONED | IN_BUFFER | ROWS, want=2, shape=(4, 16),
                                         strides=(2**61, 1)),
    "bad-stride-int64-min": tensor(strides=(I64_MIN, 16, 1)),
    "bad-stride-int64-max": tensor(strides=(I64_MAX, 16, 1)),
    "bad-strides-sum-overflows": tensor(shape=(3, 3, 16), strides=(2**59, 2**59, 1)),
    "bad-negative-strides-below-zero": tensor(form=VERSIONED, data=4096, strides=(-(2**44), 16, 1)),
    "bad-top-of-memory": tensor(form=VERSIONED, data=2**64 - 64),
    # Found by fuzz_dlpack: the lowest element at address 0 (UBSan: a
    # pointer computed to NULL).
    "bad-element-at-address-0": tensor(form=VERSIONED, data=2048, strides=(-256, 16, 1)),
    # Lies about the element type, the device and the data.
    "bad-lanes-4": tensor(lanes=4),
    "bad-lanes-0": tensor(lanes=0),
    "bad-bits-0": tensor(dtype=(2, 0)),
    "bad-bits-12": tensor(dtype=(2, 12)),
    "bad-device-type-0": tensor(device=(0, 0)),
    "bad-device-type-negative": tensor(device=(-3, 0)),
    "bad-device-id-negative": tensor(device=(1, -1)),
    "bad-data-null": tensor(form=VERSIONED, data=0),
    "bad-data-misaligned": tensor(data=2),
    # The versioned header.
    "bad-major-version-2": tensor(major=2),
    "bad-major-version-0": tensor(major=0),
    "bad-read-only-output": tensor(form=VERSIONED | IN_BUFFER | WRITABLE, flags=1),
    "bad-copied-output": tensor(form=VERSIONED | IN_BUFFER | WRITABLE, flags=2),
    "bad-empty-input": b"",
    "bad-cut-short": tensor()[:20],
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.unlink(os.path.join(OUT, name))
    for name, data in CASES.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"{len(CASES)} files in {OUT}")


if __name__ == "__main__":
    main()
