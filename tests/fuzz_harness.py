"""Mutate valid graph / cluster / plan / importer inputs and check the contract of every command.

Shared by ``tests/core/test_fuzz_inputs.py`` (hypothesis draws the mutations, a few dozen per command)
and ``benchmarks/fuzz_inputs.py`` (a seeded random run of any size, printed as a table).

The contract (``docs/formats.md``): every ``gpp`` command exits 0, 1 or 2, never prints a
traceback (nor the CLI's last-resort "internal error" line), ends a failure with one ``gpp:`` line,
and exits 0 only with finite figures — a plan it writes validates against its graph and cluster.
The library entry points raise only :class:`GppError` subclasses.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tiny_graphs import diamond_dict

CLUSTER = {
    "format": "gpp-cluster/1",
    "devices": 4,
    "memory_bytes": 1e6,
    "devices_per_node": 2,
    "intra_node_bandwidth": 1000.0,
    "inter_node_bandwidth": 100.0,
    "latency": 0.01,
    "optimizer_state_factor": 4.0,
}

PIPER = {
    "maxDevices": 4,
    "maxMemoryPerDevice": 1e9,
    "bandwidth": 1e9,
    "mbsInBatch": 4,
    "nodes": [
        {
            "id": 7,
            "name": "a",
            "TMPCs": {
                "1": [
                    {
                        "id": "vanilla",
                        "timePerSample": 3.0,
                        "parameterSize": 10.0,
                        "memoryUsageA": 4.0,
                        "memoryUsageB": 20.0,
                        "syncTimeFw": {},
                        "syncTimeBw": {"9": 5.0},
                    }
                ]
            },
        },
        {
            "id": 9,
            "name": "b",
            "TMPCs": {
                "1": [
                    {
                        "id": "vanilla",
                        "timePerSample": 6.0,
                        "parameterSize": 10.0,
                        "memoryUsageA": 4.0,
                        "memoryUsageB": 20.0,
                        "syncTimeFw": {"7": 2.0},
                        "syncTimeBw": {},
                    }
                ]
            },
        },
    ],
    "edges": [{"sourceId": 7, "destId": 9, "communicationCost": 8.0}],
}

PIPEDREAM = (
    "node1 -- Input -- forward_compute_time=1.5, backward_compute_time=3.0, "
    "activation_size=[8.0; 8.0], parameter_size=24.000\n"
    "node2 -- ReLU -- forward_compute_time=0.5, backward_compute_time=0.5, "
    "activation_size=16.0, parameter_size=0.0\n"
    "\tnode1 -- node2\n"
)


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


#: Values a mutation puts in place of a field (wrong types, huge/tiny/negative/non-finite numbers,
#: unicode, nesting).  No large in-range count (say 10**6 devices): planning that is slow, not wrong
#: (the planner-speed issue), and would only make the run long.
WEIRD: tuple[Any, ...] = (
    None,
    True,
    False,
    "x",
    "",
    "\u00e9\u2603\U0001f600",
    "\ud800",
    [],
    {},
    -1,
    0,
    1,
    2,
    0.5,
    3.7,
    -0.0,
    1e308,
    -1e308,
    1e18,
    5e-324,
    1e-300,
    float("nan"),
    float("inf"),
    -float("inf"),
    10**400,
    2**63,
    64,
    "1e3",
    [1, 2, 3],
    {"a": 1},
    _deep(80),
    "a" * 2000,
)
#: Factors of the "scale" mutation: a number stays a number but leaves the usual range (or the
#: supported one).
SCALES = (0.0, 1e-300, 1e-16, 1e-6, 0.5, 3.0, 1e6, 1e12, 1e17, 1e20, 1e300, -1.0)
OPS = ("delete", "rename", "replace", "add", "duplicate", "scale", "scale", "scale")
RAW = ("none",) * 8 + ("truncate", "non-utf8", "bom", "trailing-garbage")
KINDS = ("graph", "cluster", "plan")


@cache
def _base_plan_json() -> str:
    from gpp_solver import cluster_from_dict, graph_from_dict, plan_to_dict, solve

    plan = solve(graph_from_dict(diamond_dict()), cluster_from_dict(CLUSTER), mini_batch_size=8, planner="pipedream")
    return json.dumps(plan_to_dict(plan))


def base(kind: str) -> Any:
    """A fresh copy of the valid document ``kind`` (graph, cluster, plan, piper, pipedream)."""
    if kind == "graph":
        return diamond_dict()
    if kind == "cluster":
        return copy.deepcopy(CLUSTER)
    if kind == "plan":
        return json.loads(_base_plan_json())
    if kind == "piper":
        return copy.deepcopy(PIPER)
    if kind == "pipedream":
        return PIPEDREAM
    raise ValueError(kind)


def _slots(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of ``doc`` (iteratively; the root is slot 0 via a wrapper)."""
    out: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k in list(v):
                out.append((v, k))
                stack.append(v[k])
        elif isinstance(v, list):
            for i in range(len(v)):
                out.append((v, i))
                stack.append(v[i])
    return out


Op = tuple[int, str, int]  # (slot index, operation, index into WEIRD)


def mutate(doc: Any, ops: Sequence[Op]) -> Any:
    """Apply ``ops`` to a deep copy of the JSON value ``doc`` (a text document mutates by lines)."""
    if isinstance(doc, str):
        return _mutate_text(doc, ops)
    root = {"doc": copy.deepcopy(doc)}
    for i, op, w in ops:
        slots = _slots(root)
        if op == "scale":  # a numeric leaf, so the document mostly still parses and reaches the planners
            slots = [(p, k) for p, k in slots if isinstance(p[k], (int, float)) and not isinstance(p[k], bool)] or slots
        parent, key = slots[i % len(slots)]
        value = WEIRD[w % len(WEIRD)]
        if op == "delete":
            del parent[key]
        elif op == "rename" and isinstance(parent, dict) and parent is not root:
            parent[f"{key}_" if isinstance(key, str) else "gpus_per_node"] = parent.pop(key)
        elif op == "add" and isinstance(parent[key], dict):
            parent[key]["gpus_per_node" if w % 2 else f"k{w}"] = value
        elif op == "add" and isinstance(parent[key], list):
            parent[key].append(value)
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        elif op == "scale" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            try:
                v = parent[key] * SCALES[w % len(SCALES)]
            except OverflowError:  # an integer no float holds, scaled by a float
                v = float("inf")
            parent[key] = int(v) if isinstance(parent[key], int) and abs(v) < 2**63 else v
        else:
            parent[key] = copy.deepcopy(value)
        if "doc" not in root:
            root["doc"] = None
    return root["doc"]


def _mutate_text(text: str, ops: Sequence[Op]) -> str:
    lines = text.splitlines()
    for i, op, w in ops:
        if not lines:
            lines = [""]
        j = i % len(lines)
        value = WEIRD[w % len(WEIRD)]
        if op == "delete":
            del lines[j]
        elif op == "duplicate":
            lines.append(lines[j])
        else:  # replace one number (or the first word) by a weird token
            token = json.dumps(value, allow_nan=True) if not isinstance(value, str) else value
            new = re.sub(r"\d+(\.\d+)?", token, lines[j], count=1 + (w % 3))
            lines[j] = new if new != lines[j] else token + lines[j]
    return "\n".join(lines) + "\n"


def encode(doc: Any, raw: str) -> bytes:
    """The file bytes of ``doc`` after a byte-level mutation ``raw`` (see :data:`RAW`)."""
    if isinstance(doc, str):
        data = doc.encode("utf-8", "surrogatepass")
    else:
        try:
            data = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
        except (ValueError, RecursionError):
            data = b"[" * 5000
    if raw == "truncate":
        return data[: max(1, len(data) * 2 // 3)]
    if raw == "non-utf8":
        return data[:10] + b"\xff\xfe\xc3" + data[10:]
    if raw == "bom":
        return b"\xef\xbb\xbf" + data
    if raw == "trailing-garbage":
        return data + b" }"
    return data


@dataclass
class Outcome:
    command: str
    rc: int | str
    stdout: str
    stderr: str
    problem: str | None  # None: the contract holds


def run_cli(argv: list[str]) -> tuple[int | str, str, str]:
    """``gpp_solver.cli.main(argv)`` in this process; an escaping exception is reported as its name."""
    from gpp_solver.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            rc: int | str = main(argv)
        except BaseException as exc:  # noqa: BLE001 - the point is to see any escape
            rc = f"raised {type(exc).__name__}: {exc}"[:300]
    return rc, out.getvalue(), err.getvalue()


_NONFINITE = re.compile(r"\b(inf|nan|Infinity|NaN)\b", re.IGNORECASE)


def _all_finite(obj: Any) -> bool:
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def check(
    command: str, rc: Any, stdout: str, stderr: str, check_ok: Callable[[], str | None] | None = None
) -> str | None:
    """The first way ``(rc, stdout, stderr)`` breaks the contract, or None."""
    if rc not in (0, 1, 2):
        return f"exit {rc!r}"
    if "Traceback" in stderr or "internal error" in stderr:
        return "traceback or internal error: " + stderr.strip().splitlines()[-1][:200]
    if rc != 0:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        return None if last.startswith("gpp") else f"exit {rc} without a 'gpp:' message line: {last[:200]!r}"
    if _NONFINITE.search(stdout):
        return "exit 0 with a non-finite figure: " + _NONFINITE.search(stdout).group(0)
    return check_ok() if check_ok else None


def _plan_ok(plan_path: Path, graph_path: Path, cluster_path: Path) -> Callable[[], str | None]:
    def ok() -> str | None:
        from gpp_solver import load_cluster, load_graph, load_plan, plan_to_dict, validate

        try:
            plan = load_plan(plan_path)
            validate(plan, load_graph(graph_path), load_cluster(cluster_path))
        except Exception as exc:  # noqa: BLE001
            return f"exit 0 but the plan written does not validate: {exc}"[:300]
        return None if _all_finite(plan_to_dict(plan)) else "exit 0 with a non-finite figure in the plan"

    return ok


#: command -> (which documents it reads, argv builder)
COMMANDS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Path], Path], list[str]]]] = {
    "validate": (
        ("graph", "cluster", "plan"),
        lambda f, d: ["validate", str(f["graph"]), "--cluster", str(f["cluster"]), "--plan", str(f["plan"])],
    ),
    "plan": (
        ("graph", "cluster"),
        lambda f, d: [
            "plan",
            str(f["graph"]),
            "--cluster",
            str(f["cluster"]),
            "--batch",
            "8",
            "--planner",
            "pipedream",
            "--quiet",
            "-o",
            str(d / "out.json"),
        ],
    ),
    "plan-gpp": (
        ("graph", "cluster"),
        lambda f, d: [
            "plan",
            str(f["graph"]),
            "--cluster",
            str(f["cluster"]),
            "--batch",
            "8",
            "--time-limit",
            "5",
            "--no-tighten",
            "--quiet",
            "-o",
            str(d / "out.json"),
        ],
    ),
    "simulate": (
        ("graph", "cluster", "plan"),
        lambda f, d: ["simulate", str(f["plan"]), "--graph", str(f["graph"]), "--cluster", str(f["cluster"])],
    ),
    "show": (
        ("graph", "cluster", "plan"),
        lambda f, d: [
            "show",
            str(f["plan"]),
            "--graph",
            str(f["graph"]),
            "--cluster",
            str(f["cluster"]),
            "-o",
            str(d / "out.png"),
        ],
    ),
    "compare": (
        ("graph", "cluster"),
        lambda f, d: [
            "compare",
            str(f["graph"]),
            "--cluster",
            str(f["cluster"]),
            "--batch",
            "8",
            "--planners",
            "pipedream,graphpipe",
            "--format",
            "json",
        ],
    ),
    "import-piper": (("piper",), lambda f, d: ["import", "piper", str(f["piper"]), "-o", str(d / "out.json")]),
    "import-pipedream": (
        ("pipedream",),
        lambda f, d: ["import", "pipedream", str(f["pipedream"]), "--batch-size", "2", "-o", str(d / "out.json")],
    ),
}


def run_case(command: str, which: str, ops: Sequence[Op], raw: str, tmp: Path) -> Outcome:
    """Mutate document ``which`` (one the command reads) with ``ops``/``raw`` and run ``command``."""
    kinds, argv = COMMANDS[command]
    files: dict[str, Path] = {}
    for kind in kinds:
        doc = base(kind)
        data = encode(mutate(doc, ops), raw) if kind == which else encode(doc, "none")
        files[kind] = tmp / f"{kind}.{'txt' if kind == 'pipedream' else 'json'}"
        files[kind].write_bytes(data)
    for out in ("out.json", "out.png"):
        (tmp / out).unlink(missing_ok=True)
    rc, stdout, stderr = run_cli(argv(files, tmp))
    ok = None
    if command.startswith("plan"):
        ok = _plan_ok(tmp / "out.json", files["graph"], files["cluster"])
    elif command == "import-piper" or command == "import-pipedream":

        def ok() -> str | None:
            from gpp_solver import load_graph

            try:
                load_graph(tmp / "out.json")
            except Exception as exc:  # noqa: BLE001
                return f"exit 0 but the graph written does not load: {exc}"[:300]
            return None
    elif command == "compare":

        def ok() -> str | None:
            try:
                rows = json.loads(stdout)
            except ValueError:
                return "exit 0 but compare's JSON does not parse"
            return None if _all_finite(rows) else "exit 0 with a non-finite figure in compare's rows"

    return Outcome(command, rc, stdout, stderr, check(command, rc, stdout, stderr, ok))


def run_library(which: str, ops: Sequence[Op]) -> str | None:
    """``graph_from_dict``/``cluster_from_dict``/``plan_from_dict``, ``solve`` and ``validate`` on a
    mutated document: they return or raise a GppError, nothing else (None when the contract holds)."""
    import gpp_solver as gs

    docs = {k: base(k) for k in KINDS}
    docs[which] = mutate(docs[which], ops)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            g = gs.graph_from_dict(docs["graph"])
            c = gs.cluster_from_dict(docs["cluster"])
            p = gs.plan_from_dict(docs["plan"])
            gs.validate(p, g, c, check_predictions=False)
            sim = gs.simulate(p, g, c)
            if not all(math.isfinite(x) for x in (sim.iteration_time, sim.throughput, sim.peak_memory_bytes)):
                return "simulate returned a non-finite figure"
            if which != "plan":
                plan = gs.solve(docs["graph"], docs["cluster"], mini_batch_size=8, planner="pipedream")
                gs.validate(plan, g, c)
                if not _all_finite(gs.plan_to_dict(plan)):
                    return "solve returned a non-finite figure"
        except gs.GppError:
            return None
        except Exception as exc:  # noqa: BLE001
            return f"raised {type(exc).__name__}: {exc}"[:300]
    return None


def run_arguments(values: Sequence[Any]) -> str | None:
    """``solve`` with weird argument values: a Plan or an InvalidInputError, nothing else."""
    import gpp_solver as gs

    mini_batch_size, planner, time_limit, tighten, options = values
    try:
        gs.solve(
            base("graph"),
            base("cluster"),
            mini_batch_size=mini_batch_size,
            planner=planner,
            time_limit=time_limit,
            tighten=tighten,
            options=options,
        )
    except gs.GppError:
        return None
    except Exception as exc:  # noqa: BLE001
        return f"raised {type(exc).__name__}: {exc}"[:300]
    return None
