"""`make mutate`: mutation testing of the identity and bounds code (issue 22).

mutmut changes one thing at a time (an operator, a constant, a condition) in the functions that
targets.toml names, and runs the fast tests it names that reach the changed function; a mutant no test
kills survives. Survivors listed in equivalent.toml (the mutated code behaves as the original, with the
reason) are counted apart; any other survivor, or a listed one that matches no mutant, fails the run.

mutmut wants each package importable from the folder it copies, and `operator/` is a source root here,
so the run happens in a staged copy (.skyscan/mutate): the three packages side by side, the tests, and
pyproject.toml with the [tool.mutmut] section made from targets.toml.

    python tools/mutate/run.py                       every target (make mutate)
    python tools/mutate/run.py --since REF           the targets whose module, tests or this tool changed
                                                     between REF and the work tree (make mutate SINCE=REF)
    python tools/mutate/run.py --since auto          CI's choice of REF: $SKYSCAN_MUTATE_BASE, else the
                                                     merge-base with origin/main when HEAD is not on it, else
                                                     HEAD's first parent; none (a root commit): every target
    python tools/mutate/run.py --module api_shim.auth [--module ...]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STAGE = ROOT / ".skyscan" / "mutate"
SOURCE_ROOTS = {"api_shim": "api_shim", "skyscan": "skyscan", "skyscan_operator": "operator/skyscan_operator"}
# What the tests read besides their own files (docs/security.md): whole folders, as mutmut copies a
# file into its mutants/ tree without making the file's folder.
ALSO_COPY = ("docs",)
RESULT_MARKS = "🎉🫥⏰🤔🙁🔇🧙🛑"  # mutmut's line per mutant, when given their names
KILLED = {"killed", "timeout", "segfault"}  # a test failed, or the mutant never finished: caught


@dataclass(frozen=True)
class Target:
    module: str
    functions: tuple[str, ...] | None  # None: all of the file's
    tests: tuple[str, ...]
    deselect: tuple[str, ...]

    @property
    def staged(self) -> str:
        """The file's path in the staged copy (and mutmut's name for it)."""
        return self.module.replace(".", "/") + ".py"

    @property
    def source(self) -> str:
        """The file's path in the repository."""
        package, _, rest = self.staged.partition("/")
        return f"{SOURCE_ROOTS[package]}/{rest}"

    def patterns(self) -> list[str]:
        """mutmut's names of this target's mutants, as globs."""
        if self.functions is None:
            return [f"{self.module}.x*"]
        return [f"{self.module}.{mangled(f)}__mutmut_*" for f in self.functions]

    def owns(self, mutant: str) -> bool:
        module = mutant.partition("__mutmut_")[0].rpartition(".")[0]
        return module == self.module and (self.functions is None or function_of(mutant) in self.functions)


def mangled(function: str) -> str:
    """mutmut's key of a function (`name`) or method (`Class.name`)."""
    cls, _, name = function.rpartition(".")
    return f"xǁ{cls}ǁ{name}" if cls else f"x_{name}"


def function_of(mutant: str) -> str:
    """`Class.name` or `name`, from a mutant's name (`pkg.mod.xǁClassǁname__mutmut_3`,
    `pkg.mod.x_name__mutmut_3`)."""
    key = mutant.partition("__mutmut_")[0].rpartition(".")[2]
    if key.startswith("xǁ"):
        return ".".join(key[2:].split("ǁ"))
    return key.removeprefix("x_")


@dataclass(frozen=True)
class Equivalent:
    module: str
    function: str
    diff: str
    reason: str


def normalised(diff: str) -> str:
    """A mutant's change, whitespace aside: its removed and added lines only."""
    lines = []
    for line in diff.strip().splitlines():
        if line.startswith(("---", "+++", "@@")) or not line.startswith(("-", "+")):
            continue
        lines.append(f"{line[0]} {' '.join(line[1:].split())}")
    return "\n".join(lines)


def load_config() -> dict[str, Any]:
    return tomllib.loads((HERE / "targets.toml").read_text())


def load_targets() -> list[Target]:
    data = load_config()
    return [
        Target(
            module=t["module"],
            functions=tuple(t["functions"]) if "functions" in t else None,
            tests=tuple(t["tests"]),
            deselect=tuple(t.get("deselect", ())),
        )
        for t in data["target"]
    ]


def load_equivalents() -> list[Equivalent]:
    data = tomllib.loads((HERE / "equivalent.toml").read_text())
    return [
        Equivalent(e["module"], e["function"], normalised(e["diff"]), " ".join(e["reason"].split()))
        for e in data.get("equivalent", [])
    ]


def git(*args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def auto_base() -> str | None:
    """The commit a CI run compares with (see the module's doc)."""
    if base := os.environ.get("SKYSCAN_MUTATE_BASE"):
        return base
    head = git("rev-parse", "HEAD")
    fork = git("merge-base", "HEAD", "origin/main")
    if fork and fork != head:
        return fork
    return git("rev-parse", "--verify", "-q", "HEAD^1")


def changed_files(base: str) -> set[str]:
    diff = git("diff", "--name-only", base)
    if diff is None:
        raise SystemExit(f"mutate: cannot compare with {base!r}")
    untracked = git("ls-files", "--others", "--exclude-standard") or ""
    return {p for p in (diff + "\n" + untracked).splitlines() if p}


def touched(targets: list[Target], changed: set[str]) -> list[Target]:
    """The targets a change can affect: its module or one of its tests changed; all when the tool did."""
    if any(p.startswith("tools/mutate/") or p == "pyproject.toml" for p in changed):
        return targets
    return [t for t in targets if t.source in changed or changed & set(t.tests)]


def stage(targets: list[Target]) -> None:
    """The staged copy, made anew: a run never reuses an earlier run's results."""
    shutil.rmtree(STAGE, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package, source in SOURCE_ROOTS.items():
        shutil.copytree(ROOT / source, STAGE / package, ignore=ignore)
    shutil.copytree(ROOT / "tests", STAGE / "tests", ignore=ignore)
    for name in ALSO_COPY:
        shutil.copytree(ROOT / name, STAGE / name, ignore=ignore)
    tests = sorted({t for target in targets for t in target.tests})
    deselect = sorted({d for target in targets for d in target.deselect})
    selection = [*tests, *(arg for d in deselect for arg in ("--deselect", d))]
    config = load_config()
    section = "\n".join(
        [
            "",
            "[tool.mutmut]",
            f"do_not_mutate_patterns = {toml_list(config['skip_lines'], quote=SINGLE)}",
            f"timeout_multiplier = {config['timeout_multiplier']}",
            f"source_paths = {toml_list(SOURCE_ROOTS)}",
            f"also_copy = {toml_list(ALSO_COPY)}",
            f"only_mutate = {toml_list(t.staged for t in targets)}",
            f"pytest_add_cli_args_test_selection = {toml_list(selection)}",
            'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
            "use_git_change_detection = false",
            "",
        ]
    )
    (STAGE / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + section)


SINGLE = "'"  # a TOML literal string: backslashes are the pattern's own


def toml_list(items: Any, quote: str = '"') -> str:
    return "[" + ", ".join(f"{quote}{i}{quote}" for i in items) + "]"


def run_mutmut(targets: list[Target], children: int) -> None:
    """mutmut over the targets' mutants; its spinner is kept to a progress line a minute (the whole
    output: .skyscan/mutate/mutmut.log)."""
    mutmut = Path(sys.executable).with_name("mutmut")
    patterns = [p for t in targets for p in t.patterns()]
    env = {**os.environ, "SKYSCAN_TEST_KUBECONFIG": "/nonexistent"}  # a test that wants a cluster fails
    command = [str(mutmut), "run", "--max-children", str(children), *patterns]
    with (
        (STAGE / "mutmut.log").open("wb") as log,
        subprocess.Popen(
            command, cwd=STAGE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ) as mutmut_run,
    ):
        stream = cast(io.BufferedReader, mutmut_run.stdout)
        progress, shown, pending = "", time.monotonic(), b""
        while chunk := stream.read1(1 << 16):
            log.write(chunk)
            *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
            for line in (raw.decode(errors="replace").strip() for raw in lines):
                if line[:1] and "\u2800" <= line[0] <= "\u28ff":  # a spinner frame
                    progress = line[1:].strip()
                elif line and line[0] not in RESULT_MARKS:  # not one line per mutant
                    print(line, flush=True)
            if progress and time.monotonic() - shown > 60:
                print(f"    {progress}", flush=True)
                shown = time.monotonic()
        print(f"    {progress}", flush=True)
    if mutmut_run.returncode != 0:
        raise SystemExit(f"mutate: mutmut failed (exit {mutmut_run.returncode}); see {STAGE / 'mutmut.log'}")


@dataclass
class Outcome:
    target: Target
    counts: Counter[str]
    survivors: list[tuple[str, str]]  # (mutant, diff)
    stale: list[Equivalent]


def outcomes(targets: list[Target], equivalents: list[Equivalent]) -> list[Outcome]:
    os.chdir(STAGE)  # mutmut reads its configuration and results from the working directory
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    found = []
    for target in targets:
        data = SourceFileMutationData(path=target.staged)
        data.load()
        listed = [e for e in equivalents if e.module == target.module]
        matched: set[int] = set()
        counts: Counter[str] = Counter()
        survivors = []
        for mutant, code in sorted(data.exit_code_by_key.items()):
            if not target.owns(mutant):
                continue
            counts["generated"] += 1
            status = status_by_exit_code[code]
            diff = get_diff_for_mutant(mutant, path=target.staged)
            same = [i for i, e in enumerate(listed) if e.function == function_of(mutant)
                    and e.diff == normalised(diff)]  # fmt: skip
            matched.update(same)
            if status in KILLED:
                counts["killed"] += 1
                if same:  # a timing test failing under load, or the listing is wrong: worth a look
                    print(f"note: {mutant}, listed as equivalent, was {status}")
            elif status == "survived" and same:
                counts["equivalent"] += 1
            else:
                counts["survived"] += 1
                survivors.append((mutant, f"{status}\n{diff}"))
        stale = [e for i, e in enumerate(listed) if i not in matched]
        found.append(Outcome(target, counts, survivors, stale))
    return found


def report(found: list[Outcome], seconds: float) -> bool:
    print(f"\n{'module':<32} {'generated':>9} {'killed':>7} {'equivalent':>10} {'survived':>8}")
    total: Counter[str] = Counter()
    for o in found:
        c = o.counts
        total.update(c)
        row = (c["generated"], c["killed"], c["equivalent"], c["survived"])
        print(f"{o.target.module:<32} {row[0]:>9} {row[1]:>7} {row[2]:>10} {row[3]:>8}")
    print(f"{'total':<32} {total['generated']:>9} {total['killed']:>7} {total['equivalent']:>10} "
          f"{total['survived']:>8}   in {seconds:.0f} s")  # fmt: skip
    good = True
    for o in found:
        for mutant, text in o.survivors:
            good = False
            print(f"\nSURVIVED {mutant}: {text}")
        for e in o.stale:
            good = False
            print(f"\nSTALE equivalent.toml entry ({e.module}, {e.function}): no mutant is\n{e.diff}")
    return good


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--since", help="a git ref, or auto: only the targets changed since then")
    parser.add_argument("--module", action="append", help="only this target (repeatable)")
    parser.add_argument("--max-children", type=int, default=int(os.environ.get("MUTATE_JOBS", "2")))
    args = parser.parse_args()

    targets = load_targets()
    if args.module:
        unknown = set(args.module) - {t.module for t in targets}
        if unknown:
            raise SystemExit(f"mutate: not a target: {', '.join(sorted(unknown))}")
        targets = [t for t in targets if t.module in args.module]
    if args.since:
        base = auto_base() if args.since == "auto" else args.since
        if base is None:
            print("mutate: no commit to compare with: every target")
        else:
            targets = touched(targets, changed_files(base))
            print(f"mutate: changed since {base}: {', '.join(t.module for t in targets) or 'no target'}")
    if not targets:
        return
    started = time.monotonic()
    stage(targets)
    run_mutmut(targets, args.max_children)
    found = outcomes(targets, load_equivalents())
    if not report(found, time.monotonic() - started):
        raise SystemExit("mutate: mutants survived (kill them with a test, or list them in equivalent.toml)")


if __name__ == "__main__":
    main()
