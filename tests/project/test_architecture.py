"""The layout's rules, checked on the source: ruff's complexity rules configured (a function that
decides too much; a module is as long as its concept needs), no class whose state is declared in
one module and set in another, no function taking ``self: Any``,
at most 16 modules at the top level of ``gpp_solver/``, no import cycle (imports inside functions count), the packages never
import the top level above its bottom modules and the design card's modules, the design card's
modules are their algorithms' homes, and the solver never imports torch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpp_solver"
#: The top-level modules every package may import: records, actions, supported ranges, errors.
BOTTOM = {"gpp_solver.types", "gpp_solver.action", "gpp_solver.limits", "gpp_solver.errors"}
#: The design card's top-level modules, each its algorithm's home (shared with every planner that
#: uses it), and the main public names each defines itself.
DESIGN_CARD = {
    "gpp_solver.sp_tree": ("SPDecomposition", "decompose"),
    "gpp_solver.binary_search": ("TpsSearch", "search_many", "search_depths"),
    "gpp_solver.cp_schedule": ("ScheduleData", "schedule_data", "build_schedule_model", "verify_orders", "tighten"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports anywhere in its file (function bodies too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


#: the source trees the cohesion rules cover
SOURCE_ROOTS = [PACKAGE, ROOT / "runtime"]
#: ruff's rules for a function that does too much, and the thresholds pyproject.toml justifies
COMPLEXITY = {
    "C901": ("mccabe", "max-complexity", 15),
    "PLR0912": ("pylint", "max-branches", 15),
    "PLR0915": ("pylint", "max-statements", 60),
}


def test_complexity_rules_replace_the_size_caps():
    """A module is as long as its one concept needs; what is checked is how much one function
    decides (ruff, run by CI before the tests)."""
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    for rule, (section, key, value) in COMPLEXITY.items():
        assert rule in lint["select"], rule
        assert lint[section][key] == value, (rule, lint[section])
        ignored = {p for p, rules in lint.get("per-file-ignores", {}).items() if rule in rules}
        assert not any(p.startswith(("gpp_solver", "runtime")) for p in ignored), ignored


def _classes(roots: list[Path]) -> dict[tuple[str, str], dict]:
    """``(path, class) ->`` its bases' names, the names it owns (methods, class attributes and
    annotations, attributes its methods assign on ``self``), and the ``self`` attributes it reads."""
    out = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ClassDef):
                    continue
                owned, reads = set(), set()
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        owned.add(item.name)
                        for sub in ast.walk(item):
                            if (
                                isinstance(sub, ast.Attribute)
                                and isinstance(sub.value, ast.Name)
                                and sub.value.id == "self"
                            ):
                                (owned if isinstance(sub.ctx, ast.Store) else reads).add(sub.attr)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        owned.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        owned.update(t.id for t in item.targets if isinstance(t, ast.Name))
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in node.bases]
                out[(str(path), node.name)] = {"bases": bases, "owned": owned, "reads": reads}
    return out


def state_set_elsewhere(roots: list[Path]) -> list[str]:
    """Classes whose state is declared (or read) by a base class in another module and set by
    the subclass: a mixin whose fields another module fills in."""
    classes = _classes(roots)
    by_name: dict[str, list[tuple[str, dict]]] = {}
    for (path, name), info in classes.items():
        by_name.setdefault(name, []).append((path, info))
    found = []
    for (path, name), info in classes.items():
        for base_name in info["bases"]:
            for base_path, base in by_name.get(base_name, []):
                if base_path == path:
                    continue
                sets_self = {
                    a for a in info["owned"] if a not in base["owned"] or a in _annotated_only(base_path, base_name)
                }
                foreign = sets_self & (base["reads"] | _annotated_only(base_path, base_name))
                if foreign:
                    found.append(f"{path}:{name} sets {sorted(foreign)} that {base_path}:{base_name} declares or reads")
    return found


def _annotated_only(path: str, name: str) -> set[str]:
    """Class-level annotations of class ``name`` in ``path`` that none of its methods assigns."""
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.ClassDef) and node.name == name:
            ann = {
                i.target.id
                for i in node.body
                if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name) and i.value is None
            }
            assigned = {
                sub.attr
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                for sub in ast.walk(item)
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
            }
            dataclass = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
            return set() if dataclass else ann - assigned
    return set()


def test_no_class_state_declared_in_one_module_and_set_in_another():
    found = state_set_elsewhere(SOURCE_ROOTS)
    assert not found, found


def test_the_state_rule_sees_a_mixin_filled_in_elsewhere(tmp_path):
    (tmp_path / "base.py").write_text(
        "class Passes:\n    depth: int\n\n    def run(self):\n        return self.depth + self.table\n"
    )
    (tmp_path / "dp.py").write_text(
        "from base import Passes\n\n\nclass DP(Passes):\n    def __init__(self):\n        self.depth = 1\n        self.table = 2\n"
    )
    (tmp_path / "ok.py").write_text(
        "from base import Passes\n\n\nclass Fine(Passes):\n    def extra(self):\n        return self.run()\n"
    )
    found = state_set_elsewhere([tmp_path])
    assert len(found) == 1 and "dp.py:DP sets ['depth', 'table']" in found[0], found


def self_any(roots: list[Path]) -> list[str]:
    """Functions whose ``self`` parameter is annotated ``Any`` (a function reaching into a class it is
    not part of)."""
    found = []
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.args:
                    first = node.args.args[0]
                    if first.arg == "self" and first.annotation is not None and "Any" in ast.unparse(first.annotation):
                        found.append(f"{path}:{node.lineno} {node.name}")
    return found


def test_no_function_takes_self_any(tmp_path):
    assert not self_any(SOURCE_ROOTS)
    (tmp_path / "m.py").write_text("from typing import Any\n\n\ndef evaluate(self: Any, x):\n    return self._p\n")
    assert len(self_any([tmp_path])) == 1


def test_at_most_16_modules_at_the_top_level():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 16, top


def test_design_card_names_are_kept():
    for rel in (
        "gpp_solver/sp_tree.py",
        "gpp_solver/cp_schedule.py",
        "gpp_solver/binary_search.py",
        "runtime/__init__.py",
        "tests",
        "pyproject.toml",
        "README.md",
    ):
        assert (ROOT / rel).exists(), rel


def test_design_card_modules_are_their_algorithms_homes():
    """Each design-card module defines its public names itself (no re-export of another module)."""
    import importlib
    import inspect

    for name, main in DESIGN_CARD.items():
        mod = importlib.import_module(name)
        assert set(main) <= set(mod.__all__), name
        defined = [n for n in mod.__all__ if inspect.isclass(getattr(mod, n)) or inspect.isfunction(getattr(mod, n))]
        assert set(main) <= set(defined), name
        elsewhere = {n: getattr(mod, n).__module__ for n in defined if getattr(mod, n).__module__ != name}
        assert not elsewhere, f"{name} re-exports {elsewhere}"


def test_packages_import_only_the_bottom_of_the_top_level():
    """A module inside a package (planners, plan, cost, formats, ...) never imports a top-level module
    other than the bottom ones and the design card's (algorithm homes shared by the planners): an
    algorithm's code lives in its package or its design-card module, the rest of the top level only uses it."""
    mods = _modules()
    top = {name for name, path in mods.items() if name.count(".") == 1 and path.name != "__init__.py"}
    wrong = {
        name: sorted(deps)
        for name, path in mods.items()
        if name.count(".") >= 2
        if (deps := (_imports(name, path, set(mods)) & top) - BOTTOM - set(DESIGN_CARD))
    }
    assert not wrong, f"package modules importing the top level: {wrong}"
    bottom_up = {
        name: sorted(deps)
        for name in BOTTOM
        if (deps := {d for d in _imports(name, mods[name], set(mods)) if d != "gpp_solver"} - BOTTOM)
    }
    assert not bottom_up, f"bottom modules importing above the bottom: {bottom_up}"


def test_no_import_cycle():
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for dep in _imports(name, path, set(mods)):
            # a package's __init__ re-exporting its own children is not a cycle of code
            if dep.startswith(name + ".") or name.startswith(dep + ".") and mods[dep].name == "__init__.py":
                continue
            g.add_edge(name, dep)
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles[:5]}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_solver_never_imports_torch(path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        assert not any(n == "torch" or n.startswith("torch.") for n in names), path


#: runtime/'s jobs, bottom first: a sub-package imports only the ones below it (calibration runs
#: the engine's pipeline to calibrate the profile); the command-line entry points at the top level
#: (train, profile, probe, cores, emulate) import any of them.
RUNTIME_LAYERS = ("capture", "lowering", "engine", "calibration")


def _runtime_imports(path: Path) -> set[str]:
    """The runtime sub-packages (or ``"top"``) that ``path`` imports relatively, anywhere in the file."""
    depth = len(path.relative_to(ROOT / "runtime").parts) - 1  # 0: runtime/x.py, 1: runtime/sub/x.py
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = path.relative_to(ROOT / "runtime").parts[:depth][: depth - (node.level - 1)]
            target = list(parts) + (node.module.split(".") if node.module else [a.name for a in node.names])
            found.add(target[0] if target and target[0] in RUNTIME_LAYERS else "top")
    return found


def test_runtime_jobs_import_only_the_jobs_below_them():
    bad = []
    for i, layer in enumerate(RUNTIME_LAYERS):
        allowed = set(RUNTIME_LAYERS[: i + 1])
        for path in sorted((ROOT / "runtime" / layer).glob("*.py")):
            if extra := _runtime_imports(path) - allowed:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(extra)}")
    assert not bad, bad


def test_at_most_8_modules_at_the_top_level_of_runtime():
    """The entry points sit together at runtime/'s top level; each job is a sub-package."""
    top = sorted(p.name for p in (ROOT / "runtime").glob("*.py"))
    assert len(top) <= 8, top


#: where the runtime is imported, run or named from (README.md and docs/ are test_docs.py's)
RUNTIME_USERS = ("runtime", "gpp_solver", "tests", "benchmarks", "examples", "notebooks", ".ci", "pyproject.toml")
#: a dotted name starting at a bare ``runtime`` (not gpp_runtime's, tests' runtime folder or a path;
#: a file name such as runtime.md is not a module), or a statement importing the bare package
OLD_RUNTIME_NAME = re.compile(
    r"(?<![\w./-])runtime\.(?!(?:md|py|json)\b)[A-Za-z_]\w*|^\s*(?:import|from) runtime\b(?!\.)"
)


def test_the_runtime_has_one_import_name():
    """Every import, command (``-m``, ``--model``), logger and docstring names the runtime
    ``gpp_runtime``, the name it installs as; the runtime/ directory is never a module name."""
    files = []
    for name in RUNTIME_USERS:
        path = ROOT / name
        files += [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()]
    found = [
        f"{path.relative_to(ROOT)}:{i}: {m.group()}"
        for path in files
        if "__pycache__" not in path.parts and path.suffix not in (".pyc", ".png", ".pt")
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for m in OLD_RUNTIME_NAME.finditer(line)
    ]
    assert not found, found
