"""How the CLI tests compare what the command line wrote with the fp64
reference (tests/cli/reference.py): nested lists flattened, and the
relative error over a whole output."""

import math


def flat(x):
    """The numbers of a nested list, in order."""
    if isinstance(x, list):
        return [v for item in x for v in flat(item)]
    return [x]


def rel_err(got, want):
    """||got - want|| / ||want|| (the plain norm where want is all zeros);
    infinite when the two differ in length, so that a short output fails."""
    if len(got) != len(want):
        return math.inf
    num = sum((g - w) ** 2 for g, w in zip(got, want))
    den = sum(w * w for w in want)
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)


def dalpha_err(got, want, sources, dout):
    """The error of dalpha = sum over tokens of dout . mix, held to the size
    of its terms, as the tuner and backend_ops hold it: the terms cancel, so
    a correct fp32 sum in another order can miss its own size by more than
    1e-5. |mix| is at most the largest |v_n| (a convex blend). sources is
    [n][t][d], dout [t][d]; got and want hold one number each."""
    if len(got) != 1 or len(want) != 1:
        return math.inf
    scale = sum(abs(dout[t][k]) * max(abs(v[t][k]) for v in sources)
                for t in range(len(dout)) for k in range(len(dout[t])))
    return abs(got[0] - want[0]) / (scale or 1.0)
