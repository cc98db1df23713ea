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
