"""What a real node changes on this machine, read and put back: sysctls, iptables chains, mounts,
cgroups, directories and network interfaces (skyscan_local.node records before it changes, and undoes
with these on stop).

The kubelet, kube-proxy, containerd and the CNI plugins change the host by themselves (sysctls, chains,
cgroups under /kubepods, fixed directories); the node cannot stop them from doing so, so it snapshots
what they may touch before it starts them and restores it when it stops them. `snapshot` is the test's
view of the host: what must read the same before a node's start and after its stop.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

# The sysctls a real node may change: the kubelet's kernel tunables (vm.overcommit_memory, vm.panic_on_oom,
# kernel.panic, kernel.panic_on_oops, the root key quotas), the bridge plugin's forwarding, and what
# kube-proxy sets unless told not to (route_localnet, conntrack sizes; the node tells it not to).
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv6.conf.all.forwarding",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
CGROUP_ROOT = Path("/sys/fs/cgroup")


class HostError(RuntimeError):
    pass


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise HostError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return done


# --- sysctls -------------------------------------------------------------------------------------


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: Iterable[str] = SYSCTLS) -> dict[str, str]:
    """The current values of those that exist on this kernel."""
    values = {}
    for name in names:
        with contextlib.suppress(OSError):
            values[name] = _sysctl_path(name).read_text().strip()
    return values


def write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(f"{value}\n")


def restore_sysctls(before: dict[str, str]) -> list[str]:
    """Put back every recorded value that changed; returns their names. ip_forward first: writing it
    resets the per-interface forwarding switches, which are then put back after it."""
    restored = []
    now = read_sysctls(before)
    for name in sorted(before, key=lambda n: n != "net.ipv4.ip_forward"):
        if now.get(name) != before[name] and read_sysctls([name]).get(name) != before[name]:
            write_sysctl(name, before[name])
            restored.append(name)
    return restored


# --- iptables ------------------------------------------------------------------------------------


def chains(family: str, table: str) -> list[str]:
    """The user-defined chains of one table (`-N` lines of `iptables -S`)."""
    done = run(family, "-w", "5", "-t", table, "-S", check=False)
    return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("-N ")]


def owned_chains(prefixes: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """Chains named with one of `prefixes`, by (family, table)."""
    found = {}
    for family in IPTABLES:
        for table in TABLES:
            if names := [c for c in chains(family, table) if c.startswith(prefixes)]:
                found[family, table] = names
    return found


def remove_chains(prefixes: tuple[str, ...]) -> int:
    """Every chain named with one of `prefixes`, and every rule that jumps to one, in both families and
    all tables; returns how many chains were removed."""
    removed = 0
    for (family, table), names in owned_chains(prefixes).items():
        rules = run(family, "-w", "5", "-t", table, "-S").stdout.splitlines()
        for rule in rules:  # jumps into them from chains of others (the built-in ones)
            words = shlex.split(rule)  # comments are quoted
            if words[0] == "-A" and not words[1].startswith(prefixes) and _target(words) in names:
                run(family, "-w", "5", "-t", table, "-D", *words[1:], check=False)
        for name in names:
            run(family, "-w", "5", "-t", table, "-F", name, check=False)
        for name in names:
            run(family, "-w", "5", "-t", table, "-X", name)
            removed += 1
    if left := owned_chains(prefixes):
        raise HostError(f"iptables chains left: {left}")
    return removed


def _target(words: list[str]) -> str | None:
    for flag in ("-j", "-g"):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return None


def iptables_rules() -> dict[str, list[str]]:
    """Both families' rules, without counters or comments: what a node must leave as it found."""
    out = {}
    for family in IPTABLES:
        text = run(f"{family}-save", check=False).stdout
        out[family] = in_use(
            [
                re.sub(r"\[\d+:\d+\]", "", line).rstrip()
                for line in text.splitlines()
                if line and not line.startswith("#")
            ]
        )
    return out


# A saved table's header, a built-in chain at its default policy, its end.
BARE = re.compile(r"^(\*\w+|:[A-Z]+ ACCEPT|COMMIT)$")


def in_use(lines: list[str]) -> list[str]:
    """The saved tables that hold anything: a table with no rule, no chain of its own and every policy
    ACCEPT is as if absent (the first use of iptables on a machine loads tables that stay empty)."""
    tables: list[list[str]] = []
    for line in lines:
        if line.startswith("*") or not tables:
            tables.append([])
        tables[-1].append(line)
    return [line for table in tables if not all(BARE.match(x) for x in table) for line in table]


def ipsets(prefixes: tuple[str, ...]) -> list[str]:
    """The ipsets named with one of `prefixes` (none when ipset is not installed)."""
    if shutil.which("ipset") is None:
        return []
    return sorted(n for n in run("ipset", "list", "-n").stdout.split() if n.startswith(prefixes))


def destroy_ipsets(prefixes: tuple[str, ...], keep: Iterable[str]) -> None:
    """Every ipset named with one of `prefixes` but those in `keep` (there before)."""
    for name in set(ipsets(prefixes)) - set(keep):
        run("ipset", "destroy", name)


# --- mounts, directories, cgroups, interfaces ---------------------------------------------------


def mount_points() -> list[str]:
    """Every mount point of our mount namespace, in mount order (mountinfo's fifth field, unescaped)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), raw))
    return points


def mounts() -> list[str]:
    """Every mount as `point fstype source`, sorted (mount ids differ between runs)."""
    rows = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        fstype, source = ([*tail.split(), "", ""])[:2]
        rows.append(f"{fields.split()[4]} {fstype} {source}")
    return sorted(rows)


def under(path: str, roots: Iterable[Path]) -> bool:
    return any(path == str(r) or path.startswith(f"{r}/") for r in roots)


def unmount_under(roots: Iterable[Path], keep: Iterable[str] = ()) -> list[str]:
    """Unmount every mount point at or below `roots` (deepest and newest first), except those in
    `keep` (there before us). A busy one is detached lazily. Returns what was unmounted."""
    roots, kept = list(roots), set(keep)
    done: list[str] = []
    for _ in range(5):  # stacked mounts on one point come off one at a time
        points = [p for p in reversed(mount_points()) if under(p, roots) and p not in kept]
        if not points:
            return done
        for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
            if run("umount", point, check=False).returncode != 0:
                run("umount", "-l", point, check=False)
            done.append(point)
    left = [p for p in mount_points() if under(p, roots) and p not in kept]
    if left:
        raise HostError(f"still mounted: {left}")
    return done


def remove_tree(path: Path) -> None:
    """Delete a directory that holds no mount point (a bind mount would take its source with it)."""
    if not path.exists() and not path.is_symlink():
        return
    if mounted := [p for p in mount_points() if under(p, [path])]:
        raise HostError(f"refusing to delete {path}: mounts below it: {mounted}")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def tree(path: Path) -> list[str] | None:
    """Every path below a directory, relative to it (not into mounts); None when it does not exist."""
    if not path.is_dir():
        return None
    found = []
    for parent, dirs, files in os.walk(path):
        rel = Path(parent).relative_to(path)
        dirs[:] = [d for d in dirs if not os.path.ismount(Path(parent) / d)]
        found += [str(rel / name) for name in (*dirs, *files)]
    return sorted(found)


def restore_dir(path: Path, before: list[str] | None) -> None:
    """Back to what `tree` saw: deleted when it did not exist, else whatever was added below removed."""
    if before is None:
        remove_tree(path)
        return
    kept = set(before)
    for rel in tree(path) or []:  # sorted: a new directory comes before what is inside it
        if rel not in kept and (path / rel).parent.exists():
            remove_tree(path / rel)


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies (one per v1 controller set, and a v2 one), as directories."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split()[0] in ("cgroup", "cgroup2"):
            found.append(Path(fields.split()[4]))
    return found


def cgroup_pids(groups: Iterable[Path]) -> set[int]:
    pids: set[int] = set()
    for group in groups:
        for procs in group.rglob("cgroup.procs") if group.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_cgroups(groups: list[Path], timeout: float = 10.0) -> None:
    """SIGKILL every process in these cgroups (and below) until none is left."""
    deadline = time.monotonic() + timeout
    while pids := cgroup_pids(groups):
        if time.monotonic() > deadline:
            raise HostError(f"processes survive SIGKILL in {groups}: {sorted(pids)}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_cgroup(group: Path, timeout: float = 10.0) -> None:
    """rmdir a cgroup and its children, deepest first (empty ones only: their processes are gone;
    a cgroup may stay busy briefly after its last process died)."""
    if not group.is_dir():
        return
    deadline = time.monotonic() + timeout
    for child in sorted(
        (d for d in group.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True
    ):
        _rmdir(child, deadline)
    _rmdir(group, deadline)


def _rmdir(d: Path, deadline: float) -> None:
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def interfaces() -> list[str]:
    """Network interface names (veth peers and bridges included)."""
    return sorted(os.listdir("/sys/class/net"))


def routes() -> list[str]:
    """The IPv4 main table's routes, each as `ip -4 route show` prints it."""
    return sorted(line.strip() for line in run("ip", "-4", "route", "show").stdout.splitlines())


def snapshot() -> dict[str, object]:
    """What a real node must leave as it found: mounts, interfaces, routes, iptables rules, ipsets,
    sysctls (the routes a node holds until `make reset` aside: skyscan_local.node.held_routes)."""
    return {
        "mounts": mounts(),
        "interfaces": interfaces(),
        "routes": routes(),
        "iptables": iptables_rules(),
        "ipsets": ipsets(("",)),
        "sysctls": read_sysctls(),
    }


def processes_with(argument: str) -> Iterator[int]:
    """Pids whose command line has `argument` as one of its words (the shims of one containerd)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if argument in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                    yield int(proc.name)
