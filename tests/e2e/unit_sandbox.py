"""Run a command under what a unit's ``SystemCallFilter=``, ``SystemCallErrorNumber=``,
``SystemCallArchitectures=native``, ``RestrictAddressFamilies=`` and
``MemoryDenyWriteExecute=`` would impose, without systemd (there is none in CI):
a seccomp filter built with libseccomp through ctypes, and ``PR_SET_MDWE``.

    python unit_sandbox.py --allow @system-service --deny @resources \\
        --families AF_UNIX,AF_NETLINK --errno EPERM [--mdwe] -- COMMAND...

The syscall groups are systemd's own, read from ``systemd-analyze syscall-filter`` of the
systemd that will run the unit. Used by ``test_service_unit.py``; setpriv(1) does the
capabilities, supplementary groups and no_new_privs, unshare(1) the private /tmp.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import os
import socket
import subprocess
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
SCMP_FLTATR_CTL_NNP = 3
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def syscall_groups() -> dict[str, list[str]]:
    """systemd's groups (``@system-service``: its members, groups or syscalls)."""
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        if not line[0].isspace():
            current = groups.setdefault(item, [])
        elif current is not None:
            current.append(item)
    return groups


def expand(name: str, groups: dict[str, list[str]], seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if not name.startswith("@"):
        return {name}
    out: set[str] = set()
    for item in groups[name]:
        if item not in seen:
            seen.add(item)
            out |= expand(item, groups, seen)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--allow", action="append", default=[])
    parser.add_argument("--deny", action="append", default=[])
    parser.add_argument("--families", default="")
    parser.add_argument("--errno", default="EPERM")
    parser.add_argument("--mdwe", action="store_true")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    groups = syscall_groups()
    allowed = set().union(*(expand(a, groups) for a in args.allow)) - set().union(*(expand(d, groups) for d in
                                                                                     args.deny))
    families = [int(getattr(socket, f)) for f in args.families.split(",") if f]
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(ArgCmp)]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(0x00050000 | getattr(errno, args.errno))  # SCMP_ACT_ERRNO(errno)
    for name in sorted(allowed):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # not a syscall of this architecture
            continue
        if name == "socket" and families:
            for family in families:
                cmp = ArgCmp(0, SCMP_CMP_EQ, family, 0)
                if lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, ctypes.byref(cmp)) != 0:
                    sys.exit(f"unit_sandbox: cannot add socket({family})")
            continue
        if lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 0, None) != 0:
            sys.exit(f"unit_sandbox: cannot allow {name}")
    lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 1)
    if args.mdwe:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
            sys.exit(f"unit_sandbox: PR_SET_MDWE: {os.strerror(ctypes.get_errno())}")
    if lib.seccomp_load(ctx) != 0:
        sys.exit(f"unit_sandbox: seccomp_load: {os.strerror(ctypes.get_errno())}")
    os.execvp(args.command[0], args.command)


if __name__ == "__main__":
    main()
