"""A larger fuzz run of the input contract: mutated graph / cluster / plan / importer
inputs through every ``gpp`` command and the library, with a table of outcomes.

    python benchmarks/fuzz_inputs.py [--examples 200] [--seed 0] [--commands plan,simulate,...]

Each example picks a command, one of the documents it reads, 1-3 mutations (delete / rename /
replace with a weird value / add a field / duplicate a list entry; values: wrong types, huge, tiny,
negative, NaN/inf, integers over 1e308, unicode, deep nesting) and a byte-level mutation
(truncation, non-UTF-8 bytes, a BOM, trailing garbage), runs it in-process
(``gpp_solver.cli.main``) and checks the contract (``tests/fuzz_harness.py``).  The table counts
exits 0/1/2 and contract violations per command; violations are listed after it.  Exit status 1
when any example broke the contract.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fuzz_harness as F  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200, help="number of mutated inputs (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--commands",
        default=",".join(list(F.COMMANDS) + ["library"]),
        help="comma-separated subset of: " + ", ".join(list(F.COMMANDS) + ["library"]),
    )
    args = ap.parse_args(argv)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    for c in commands:
        if c not in F.COMMANDS and c != "library":
            ap.error(f"unknown command {c!r}")
    rng = random.Random(args.seed)
    counts: dict[str, Counter] = {c: Counter() for c in commands}
    seconds: Counter = Counter()
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.examples):
            command = commands[i % len(commands)]
            kinds = F.KINDS if command == "library" else F.COMMANDS[command][0]
            which = rng.choice(kinds)
            ops = [
                (rng.randrange(10**4), rng.choice(F.OPS), rng.randrange(len(F.WEIRD))) for _ in range(rng.randint(1, 3))
            ]
            raw = rng.choice(F.RAW)
            t0 = time.perf_counter()
            if command == "library":
                problem, rc = F.run_library(which, ops), "-"
            else:
                out = F.run_case(command, which, ops, raw, Path(d))
                problem, rc = out.problem, out.rc
            seconds[command] += time.perf_counter() - t0
            counts[command]["violations" if problem else f"exit {rc}"] += 1
            if problem:
                problems.append(f"{command} {which} ops={ops} raw={raw}: {problem}")
    cols = ["exit 0", "exit 1", "exit 2", "exit -", "violations"]
    print(f"fuzz_inputs: {args.examples} examples, seed {args.seed}\n")
    print(
        "| command | examples | "
        + " | ".join(c.replace("exit -", "returned/raised GppError") for c in cols)
        + " | seconds |"
    )
    print("|" + " --- |" * (len(cols) + 3))
    for c in commands:
        n = sum(counts[c].values())
        print(f"| {c} | {n} | " + " | ".join(str(counts[c][k]) for k in cols) + f" | {seconds[c]:.1f} |")
    total = sum(sum(v.values()) for v in counts.values())
    print(f"\n{total} examples, {len(problems)} contract violations")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
