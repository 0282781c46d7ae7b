#!/usr/bin/env python3
"""Stop what an earlier run of this unit left in its control group, before the server starts again.

The unit's ExecStartPre. The API server forks VLLM::EngineCore and its workers; when the API server
is SIGKILLed they are orphaned (vllm#55510) and keep the GPU's memory, so a server started beside
them fails to load or is sized against a GPU that is partly taken. systemd kills the whole control
group when the unit stops (KillMode=control-group), but it does not always wait for it: inside a
container on the legacy cgroup hierarchy it restarts without waiting (systemd commit 743970d2), and
under load a restart was seen beside the killed generation's engine (docs/unit.md). So the unit
checks for itself: when ExecStartPre runs, no process of this start exists yet, and every other
process in the unit's control group is a leftover.

Each leftover is opened as a pidfd and signalled only if it is still in this control group (a PID
reused by another process is never signalled): SIGTERM, GRACE_S for them to go, SIGKILL, GRACE_S
again. Standard library only (it runs on the bundle's python). Prints one line to the journal when
it stopped something.

It acts only in the control group of the unit it is named (`%n`, systemd's own name for the unit): run
by hand from a shell, its group is the login session's, and it refuses rather than stop the session.

usage: stop-leftovers UNIT_NAME
exit 0: nothing was left, or everything left was stopped, or the control group cannot be read here
(nothing to judge); 1: a leftover survived SIGKILL (the start fails and systemd's Restart= tries
again, rather than starting beside it); 2: not run as that unit's ExecStartPre.
"""

import os
import signal
import sys
import time

GRACE_S = 5.0
POLL_S = 0.1
# Where the hierarchy that systemd tracks units in is mounted: the unified hierarchy ("0::" in
# /proc/self/cgroup) at /sys/fs/cgroup, or under it on a hybrid host; the legacy one by its name.
MOUNTS = {"0:": ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"), "name=systemd": ("/sys/fs/cgroup/systemd",)}


def own_cgroup(pid="self"):
    """{hierarchy key: path} of a process, from /proc/PID/cgroup; None when it is gone or unreadable.
    A path outside this cgroup namespace (it climbs with "..") is not one this script acts in."""
    try:
        with open("/proc/%s/cgroup" % pid, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/") or ".." in path.split("/"):
            continue
        if number == "0" and controllers == "":
            out["0:"] = path
        elif controllers == "name=systemd":
            out["name=systemd"] = path
    return out


def unit_directory(me):
    """(hierarchy key, the directory of this process's control group) or None when not readable."""
    for key, mounts in MOUNTS.items():
        if key not in me:
            continue
        for mount in mounts:
            directory = mount.rstrip("/") + me[key]
            if str(os.getpid()) in members(directory):
                return key, directory
    return None


def members(directory):
    """PIDs (as text) in the control group at `directory` and every group below it; links not followed."""
    found: set[str] = set()
    for root, _dirs, _files in os.walk(directory, followlinks=False):
        try:
            with open(os.path.join(root, "cgroup.procs"), encoding="ascii") as f:
                found.update(line.strip() for line in f if line.strip() not in ("", "0"))
        except OSError:
            continue
    return found


def inside(pid, key, path):
    """Whether process `pid` is still in the unit's control group (or one below it)."""
    current = (own_cgroup(pid) or {}).get(key)
    return current is not None and (current == path or current.startswith(path.rstrip("/") + "/"))


def command_name(pid):
    try:
        with open("/proc/%s/comm" % pid, encoding="utf-8", errors="replace") as f:
            return f.read().strip()[:32]
    except OSError:
        return "?"


def described(pids):
    """'167 (VLLM::EngineCore), 183 (VLLM::Worker)': the journal's names for them."""
    return ", ".join("%s (%s)" % (pid, command_name(pid)) for pid in sorted(pids, key=int))


def signal_leftovers(pids, sig, key, path):
    """Send `sig` to each PID still in the unit's group: through a pidfd opened before the membership
    check, so the process checked is the process signalled."""
    for pid in pids:
        try:
            fd = os.pidfd_open(int(pid))
        except ProcessLookupError:
            continue  # gone already
        except (OSError, AttributeError):
            fd = None  # a kernel before 5.3 or a Python before 3.9: check, then signal by PID
        try:
            if not inside(pid, key, path):
                continue
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(int(pid), sig)
        except ProcessLookupError:
            continue
        except PermissionError:
            print("stop-leftovers: not allowed to signal %s (%s)" % (pid, command_name(pid)), file=sys.stderr)
        finally:
            if fd is not None:
                os.close(fd)


def wait_gone(directory, deadline):
    while True:
        left = members(directory) - {str(os.getpid())}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def main(argv):
    if len(argv) != 1 or not argv[0].endswith(".service") or "/" in argv[0]:
        print("usage: stop-leftovers UNIT_NAME (the unit's ExecStartPre passes %n)", file=sys.stderr)
        return 2
    me = own_cgroup()
    if me is None:
        return 0  # /proc/self/cgroup unreadable: nothing to judge
    mine = {key: path for key, path in me.items() if path.rsplit("/", 1)[-1] == argv[0]}
    if not mine:
        print(
            "stop-leftovers: this process is in %s, not in %s's control group: it stops nothing outside a "
            "unit's ExecStartPre"
            % (" ".join(sorted(set(me.values()))) or "no control group of this namespace", argv[0]),
            file=sys.stderr,
        )
        return 2
    found = unit_directory(mine)
    if found is None:
        return 0  # the control group is not mounted where it can be read: nothing to judge
    key, directory = found
    path = mine[key]
    left = members(directory) - {str(os.getpid())}
    if not left:
        return 0
    names = described(left)
    signal_leftovers(left, signal.SIGTERM, key, path)
    left = wait_gone(directory, time.monotonic() + GRACE_S)
    killed = bool(left)
    if left:
        signal_leftovers(left, signal.SIGKILL, key, path)
        left = wait_gone(directory, time.monotonic() + GRACE_S)
    if left:
        print(
            "stop-leftovers: %d process(es) of an earlier run survived SIGKILL: %s; not starting beside them"
            % (len(left), described(left)),
            file=sys.stderr,
        )
        return 1
    print("stopped leftovers of an earlier run (%s): %s" % ("SIGKILL" if killed else "SIGTERM", names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
