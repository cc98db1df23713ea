"""one_case.py - one named check at a time for the Python tests, as
tests/lib/check.h gives the C tests:

    --case NAME   runs only the check NAME (may repeat); a NAME that the
                  script does not have is an error (exit 2);
    --list        prints the names of the checks instead of running them.

A script calls take_args(N) before it reads its N arguments from sys.argv, wanted(name) before
each named check, failed() when a check fails (which prints the command that
reruns the check alone, once) and finish(passed, failures) at the end.
record(name, problems) does the counting, printing and failed() of a check
for the scripts that let it keep the counts (finish() adds them), and
scratch(prefix) makes the scratch directory that every script removes at
its end."""

import atexit
import os
import shlex
import shutil
import sys
import tempfile

_selected = []
_hit = set()
_listing = False
_current = None
_rerun_printed = set()
_program = []  # the rerun line's words before --case
_args = []  # and after it: the script's own arguments
_passed = 0  # the checks record() counted
_failures = 0


def take_args(nargs):
    """Removes --case NAME, --case=NAME and --list from sys.argv, leaving
    the script's own arguments, and keeps what the rerun line needs. Under
    --list, which runs nothing, the first nargs arguments may be left out:
    they read as empty."""
    global _listing, _program, _args
    rest = [sys.argv[0]]
    args = iter(sys.argv[1:])
    for arg in args:
        if arg == "--list":
            _listing = True
        elif arg == "--case":
            name = next(args, None)
            if name is None:
                print("%s: --case needs a check name (--list prints them)" % sys.argv[0], file=sys.stderr)
                sys.exit(2)
            _selected.append(name)
        elif arg.startswith("--case="):
            _selected.append(arg[len("--case="):])
        else:
            rest.append(arg)
    # The ATTNRES_ variables the test started with: ctest sets some.
    env = ["%s=%s" % (k, v) for k, v in sorted(os.environ.items()) if k.startswith("ATTNRES_")]
    _program = (["env"] + env if env else []) + [sys.executable, os.path.abspath(sys.argv[0])]
    _args = rest[1:]
    if _listing:
        rest += [""] * (1 + nargs - len(rest))
    sys.argv[:] = rest


def wanted(name):
    """Whether the check `name` runs (under --list: prints it, and no)."""
    global _current
    if _selected and name not in _selected:
        return False
    _hit.add(name)
    if _listing:
        print(name)
        return False
    _current = name
    return True


def failed():
    """Prints the command that reruns the check now running, once."""
    if _current is None or _current in _rerun_printed:
        return
    _rerun_printed.add(_current)
    words = _program + ["--case", _current] + _args
    print("rerun: " + " ".join(shlex.quote(w) for w in words), flush=True)


def record(name, problems, detail=""):
    """Counts the check `name`, which is running: failed when `problems`
    (what went wrong, a list of phrases) is not empty, printed with the
    rerun line, else passed, printed with `detail` where one is given."""
    global _passed, _failures
    if problems:
        _failures += 1
        print("FAIL %s: %s" % (name, "; ".join(problems)))
        failed()
    else:
        _passed += 1
        print("ok   %s%s" % (name, ": " + detail if detail else ""))


def counts():
    """(passed, failed): the checks record() counted so far."""
    return _passed, _failures


def scratch(prefix):
    """A fresh directory under the system's temporary one, removed however
    the script ends (a failed check, an exception or sys.exit)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def finish(passed=0, failures=0):
    """Prints the summary, with the counts record() kept added to the
    script's own, and exits: 2 when a --case named no check, 1 when a check
    failed, else 0."""
    passed += _passed
    failures += _failures
    if not _listing:
        print("%d passed, %d failed" % (passed, failures))
    unknown = [n for n in _selected if n not in _hit]
    for name in unknown:
        print("no check named %r (--list prints the checks)" % name, file=sys.stderr)
    sys.exit(2 if unknown else 1 if failures else 0)
