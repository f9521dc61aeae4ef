"""The whole package against its layers (:mod:`fedshift.core.layers`): no import circle anywhere, no
import that points up, lazy imports of fedshift only where they keep an optional extra from
loading, in the command line and in the entry point; docs/layout.md shows the same table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fedshift.core.layers import LAYERS, LAZY_IMPORTERS, layer_of, markdown

SRC = Path(__file__).resolve().parents[1] / "src" / "fedshift"
ROOT = SRC.parents[1]
#: third-party packages of the optional extras (pyproject's optional-dependencies)
EXTRAS = ("ray", "flwr", "flwr_datasets", "datasets", "wandb", "mlflow", "tensorboard")
EXTRA_MODULES = ("torch.utils.tensorboard",)  # TensorBoard's writer, which needs the package


def module_name(path: Path, src: Path = SRC) -> str:
    parts = path.relative_to(src.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, src: Path = SRC) -> list[tuple[str, bool, int]]:
    """(module, lazy, line) for every import of a file (``from a import b`` as ``a.b``, which
    :func:`package_graph` resolves to the module it loads); relative imports resolved; lazy =
    inside a function (an import under ``if TYPE_CHECKING:`` is not an import at run time: left
    out)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, bool, int]] = []

    def walk(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for orelse in child.orelse:
                    walk(orelse, lazy)
                continue
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, lazy, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                # ``from package import module`` loads that module (and its package first);
                # ``from module import name``, the module
                out.extend((f"{base}.{a.name}", lazy, child.lineno) for a in child.names)
            walk(child, inner)

    walk(tree, False)
    return out


def package_graph(src: Path = SRC):
    """modules -> {imported fedshift module: (lazy, line)}, each import resolved to the module
    it loads (``from fedshift.x import name`` is an import of ``fedshift.x``, or of
    ``fedshift.x.name`` where that is a module)."""
    files = {module_name(p, src): p for p in src.rglob("*.py")}
    graph: dict[str, dict[str, tuple[bool, int]]] = {}
    extras: set[str] = set()
    for mod, path in files.items():
        edges: dict[str, tuple[bool, int]] = {}
        for target, lazy, line in imports_of(path, src):
            extra = target.split(".")[0] in EXTRAS or target.startswith(EXTRA_MODULES)
            if extra and not lazy:
                extras.add(mod)
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != mod:
                old = edges.get(target)
                edges[target] = (lazy and (old is None or old[0]), line)
        graph[mod] = edges
    return graph, extras


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a path that returns to its start), or None."""
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n, [*path, n])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [m])):
            return found
    return None


def problems(src: Path = SRC) -> list[str]:
    """Every breach of the layers in the package below ``src``: circles, upward imports, lazy
    imports where none is allowed, modules in no layer."""
    graph, extras = package_graph(src)
    out = []
    found = cycle({m: set(e) for m, e in graph.items()})
    if found:
        out.append("import circle: " + " -> ".join(found))
    for mod, edges in sorted(graph.items()):
        try:
            mine = layer_of(mod)
        except KeyError as err:
            out.append(str(err))
            continue
        for target, (lazy, line) in sorted(edges.items()):
            theirs = layer_of(target)
            if theirs > mine:
                out.append(
                    f"{mod}:{line} imports {target}: layer {LAYERS[mine][0]!r} is below "
                    f"{LAYERS[theirs][0]!r}"
                )
            elif lazy and target not in extras and not _lazy_allowed(mod):
                out.append(f"{mod}:{line} imports {target} inside a function (not an extra)")
    return out


def _lazy_allowed(mod: str) -> bool:
    """The entry point itself, and every module of the other lazy importers (the CLI)."""
    return mod == "fedshift" or any(
        mod == p or mod.startswith(p + ".") for p in LAZY_IMPORTERS if p != "fedshift"
    )


def test_the_package_keeps_its_layers():
    found = problems()
    assert not found, "\n".join(found)


def test_docs_layout_shows_the_layers_and_every_module():
    page = (ROOT / "docs" / "layout.md").read_text()
    assert markdown() in page, "docs/layout.md: paste `python -m fedshift.core.layers`"
    missing = [
        str(p.relative_to(SRC.parent))
        for p in sorted(SRC.rglob("*.py"))
        if p.name != "__init__.py" and p.stem not in page
    ]
    assert not missing, f"docs/layout.md names none of {missing}"


def _copy(tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "fedshift"
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__", "configs"))
    return dst


def test_a_planted_cycle_fails(tmp_path):
    src = _copy(tmp_path)
    with (src / "core" / "seeds.py").open("a") as f:
        f.write("\nfrom fedshift.core.errors import FedshiftError  # planted\n")
    with (src / "core" / "errors.py").open("a") as f:
        f.write("\nfrom fedshift.core.seeds import derive_seed  # planted\n")
    found = problems(src)
    assert any(p.startswith("import circle") and "fedshift.core.seeds" in p for p in found), found


def test_a_planted_upward_import_fails(tmp_path):
    src = _copy(tmp_path)
    with (src / "config" / "schema.py").open("a") as f:
        f.write("\nfrom fedshift.algorithms import get_algorithm  # planted\n")
    found = problems(src)
    assert any("fedshift.config.schema" in p and "below 'algorithms'" in p for p in found), found


def test_a_planted_lazy_import_fails_outside_the_cli(tmp_path):
    src = _copy(tmp_path)
    with (src / "studies" / "sweep.py").open("a") as f:
        f.write("\ndef planted():\n    from fedshift.run.folder import RunDir\n")
    assert any("inside a function" in p for p in problems(src))


@pytest.mark.parametrize("module", ["fedshift.cli.console", "fedshift.core.errors", "fedshift"])
def test_every_module_has_a_layer(module):
    assert 0 <= layer_of(module) < len(LAYERS)


# ------------------------------------------------------------------ inside the layers

#: data catalogues (one entry per corruption), not logic: allowed to be longer
CATALOGUES = {"data/corruptions/cifar10c.py"}


def cli_commands(source: str) -> int:
    """The commands a CLI module defines: every function decorated ``@user_errors`` (what the
    package's ``__init__`` registers as a command)."""
    tree = ast.parse(source)
    return sum(
        any(ast.unparse(d) == "user_errors" for d in node.decorator_list)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    )


def test_the_command_count_sees_every_command():
    source = "@user_errors\ndef a(): ...\n@user_errors\ndef b(): ...\ndef plain(): ...\n"
    assert cli_commands(source) == 2
    total = sum(cli_commands(p.read_text()) for p in (SRC / "cli").glob("*.py"))
    assert total >= 16  # 12 commands, results check/render, deploy's commands


def test_cli_is_thin_and_no_module_is_over_500_lines():
    """Modules stay readable in one sitting: under 500 lines (the aim is 400), catalogues
    aside; the command line parses, calls the library and prints (about 30 lines a command,
    options and docstring included); its ``__init__`` only assembles the commands."""
    sizes = {p: len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    for path in (SRC / "cli").glob("*.py"):
        commands = cli_commands(path.read_text())
        if commands:
            assert sizes[path] < 40 * commands + 60, (path.name, sizes[path], commands)
    assert cli_commands((SRC / "cli" / "__init__.py").read_text()) == 0
    big = {str(p.relative_to(SRC)): n for p, n in sizes.items() if n > 500}
    assert not (big.keys() - CATALOGUES), big


def test_the_data_builders_are_leaves():
    """Only ``fedshift.data.scenario`` picks a builder; no module of the data layer imports
    one (or the scenario), so a builder is replaced without touching the rest."""
    graph, _ = package_graph()
    builders = {f"fedshift.data.{b}" for b in ("static", "timeline", "attributes", "drift")}
    for mod, edges in graph.items():
        if mod.startswith("fedshift.data.") and mod != "fedshift.data.scenario":
            bad = set(edges) & (builders | {"fedshift.data.scenario"})
            assert not bad, (mod, bad)


def test_the_cycle_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_tests_mirror_the_packages_and_no_test_module_imports_another():
    """Tests sit under tests/<package>/ (the whole-package checks and the docs at the top);
    shared helpers live in the conftest files (fixtures and their helpers), never imported
    from another test module."""
    tests = ROOT / "tests"
    top = {"test_layers", "test_docs", "test_readme", "test_suite"}
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    for path in tests.rglob("test_*.py"):
        where = path.parent.relative_to(tests).parts
        assert (not where and path.stem in top) or (where and where[0] in packages), path
        for target, _, line in imports_of(path, tests):
            leaf = target.split(".")[-2:] if target.startswith("tests.") else []
            assert not any(p.startswith("test_") for p in leaf), f"{path.name}:{line} {target}"
