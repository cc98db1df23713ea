"""Commands run with a directory read-only to them, as a read-only mount
makes it: as root, in a mount namespace of their own (unshare -m) where the
directory is bind-mounted read-only; as another user, with the directory's
write bits cleared. Shared by the command line's test and pytest.

    prefix, why = read_only_prefix(directory)
    subprocess.run(prefix + argv)         # when prefix is not None

prefix is None where neither works (why says so): the caller skips."""

import os
import shutil
import stat
import subprocess

# unshare -m makes the namespace's mounts private, so the read-only bind
# mount ends with the command and is never seen outside it.
_MOUNT_RO = 'd=$1; shift; mount --bind "$d" "$d" && mount -o remount,ro,bind "$d" "$d" && exec "$@"'
_PROBE = ["sh", "-c", 'touch "$1/.write-probe" 2>/dev/null && rm -f "$1/.write-probe" && exit 1; exit 0', "sh"]


def read_only_prefix(directory):
    """(argv prefix that runs a command with directory read-only, None) or
    (None, why not)."""
    directory = os.path.abspath(directory)
    if os.geteuid() != 0:
        os.chmod(directory, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        if os.access(directory, os.W_OK):
            return None, f"{directory} is still writable after chmod 0555"
        return [], None
    if not shutil.which("unshare") or not shutil.which("mount"):
        return None, "running as root without unshare(1) and mount(8), so no read-only bind mount"
    prefix = ["unshare", "-m", "sh", "-c", _MOUNT_RO, "sh", directory]
    probe = subprocess.run(prefix + _PROBE + [directory], capture_output=True, text=True)
    if probe.returncode != 0:
        return None, (f"running as root, and a read-only bind mount in a mount namespace failed "
                      f"(exit {probe.returncode}: {probe.stderr.strip()[-300:]})")
    return prefix, None


def restore(directory):
    """Makes the directory writable again (after a non-root run)."""
    if os.geteuid() != 0:
        os.chmod(directory, stat.S_IRWXU)
