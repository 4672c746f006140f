"""Tests and benchmarks stand alone: no test module imports another, and no benchmark imports tests.

A test module that another imports runs its imports, and defines its fixtures, wherever it is
imported; moving or renaming one test then breaks unrelated ones, and a fixture taken that way is
module state that other modules patch. Fixtures that several test modules use live in the nearest
conftest.py; helpers in modules whose names do not start with ``test_`` (tests/factories.py,
tests/agent_wire.py, tests/processes.py, ...); what the tests and the benchmarks share in
``harness/``, which imports neither.
"""

import ast
import graphlib
import io
import tokenize
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPORTERS = {"import_module", "__import__"}
PROJECT_PACKAGES = ("portal", "accounts", "runs", "peer_agent", "harness", "bench")
# Where an import inside a function must say why it is not at the module's top (docs/design.md, "What may import
# what"); the two harness modules are in the middle of other changes, and join the check after them.
LAZY_IMPORTS_EXPLAINED_IN = ("portal", "accounts", "runs", "harness", "peer_agent")
LAZY_IMPORTS_NOT_YET_CHECKED = ()


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports anywhere in it (inside functions too), by absolute name;
    ``from package import name`` counts as importing ``package.name`` as well, since ``name`` may be
    a module. ``importlib.import_module("...")`` and ``__import__("...")`` with a literal count too."""
    package = list(path.relative_to(root).parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join([*parts, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if function in IMPORTERS:
                names.add(node.args[0].value)
    return names


def is_test_module(name: str) -> bool:
    """A module of tests/ that pytest collects or loads itself: ``test_*.py`` or a ``conftest.py``."""
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") or part == "conftest" for part in parts[1:])


def importers(folder: str, forbidden, root: Path = ROOT) -> dict[str, list[str]]:
    """The modules under ``folder`` that import a module ``forbidden`` accepts, with what they import."""
    files = sorted((root / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    found = {}
    for path in files:
        bad = sorted(name for name in imported(path, root) if forbidden(name))
        if bad:
            found[str(path.relative_to(root))] = bad
    return found


def test_no_module_of_the_tests_imports_a_test_module_or_a_conftest():
    offenders = importers("tests", is_test_module)
    assert not offenders, (
        "test modules and conftest.py files are loaded by pytest, not imported: move what is shared to "
        f"a conftest.py fixture or a helper module: {offenders}")


@pytest.mark.parametrize("folder, forbidden", [("bench", ("tests",)), ("harness", ("tests", "bench"))])
def test_the_benchmarks_and_the_harness_import_no_test_code(folder, forbidden):
    offenders = importers(folder, lambda name: name.split(".")[0] in forbidden)
    assert not offenders, f"{folder}/ must not import {' or '.join(forbidden)} (use harness/): {offenders}"


@pytest.mark.parametrize("source, found", [
    ("from tests.runs.ingest.test_agent_socket import report", True),
    ("from tests.runs import test_agent_socket", True),
    ("import tests.peer_agent.test_reporter", True),
    ("from tests.security.conftest import World", True),
    ("from .test_join_api import post", True),
    ("def f():\n    from tests.browser.test_run_pages import log_in", True),
    ("importlib.import_module('tests.runs.credit.test_verification')", True),
    ("from tests.factories import RunFactory", False),
    ("from tests.agent_wire import report", False),
    ("from django.test import Client", False),
])
def test_the_check_sees_every_way_of_importing_a_test_module(tmp_path, source, found):
    module = tmp_path / "tests" / "runs" / "test_example.py"
    module.parent.mkdir(parents=True)
    module.write_text(source + "\n")
    assert bool(importers("tests", is_test_module, root=tmp_path)) is found


def test_no_import_circle_in_the_project_counting_imports_inside_functions():
    """A circle of imports hidden by an import inside a function is still one: modules that need each other
    cannot be read, tested or moved apart. grimp (the import graph `make lint`'s import-linter reads) sees
    imports inside functions too; graphlib finds a circle if there is one."""
    graph = grimp.build_graph(*PROJECT_PACKAGES)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    try:
        list(graphlib.TopologicalSorter(imports).static_order())
    except graphlib.CycleError as circle:
        pytest.fail(f"import circle: {' imports '.join(reversed(circle.args[1]))}")


def imports_unexplained(path: Path, root: Path = ROOT) -> list[str]:
    """The imports inside functions of ``path`` with a comment neither on their lines nor on a line of its own
    directly above their block (the imports that follow one another), as ``path:line: the import``."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    commented = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
                 if token.type == tokenize.COMMENT}
    found = {}
    for function in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            for statements in (value for _, value in ast.iter_fields(node) if isinstance(value, list)):
                block_start = None
                for statement in statements:
                    if not isinstance(statement, (ast.Import, ast.ImportFrom)):
                        block_start = None
                        continue
                    block_start = block_start or statement.lineno
                    line = statement.lineno
                    above = lines[block_start - 2].lstrip() if block_start > 1 else ""
                    if not above.startswith("#") and commented.isdisjoint(range(line, statement.end_lineno + 1)):
                        found[line] = f"{path.relative_to(root)}:{line}: {lines[line - 1].strip()}"
    return [found[line] for line in sorted(found)]


@pytest.mark.parametrize("package", LAZY_IMPORTS_EXPLAINED_IN)
def test_an_import_inside_a_function_says_why_it_is_not_at_the_top(package):
    """The web and the worker stay light by importing the ML stack late, a management command by importing late what
    only its run needs; anything else belongs at the module's top, where a reader and the linters see it."""
    unexplained = [site for path in sorted((ROOT / package).rglob("*.py"))
                   if "migrations" not in path.relative_to(ROOT).parts
                   and str(path.relative_to(ROOT)) not in LAZY_IMPORTS_NOT_YET_CHECKED
                   for site in imports_unexplained(path)]
    assert not unexplained, ("move these imports to the module's top, or say next to them (on the line, or in a comment "
                             "line above the block) why they are late:\n" + "\n".join(unexplained))


@pytest.mark.parametrize("source, unexplained", [
    ("def f():\n    import torch\n", [2]),
    ("def f():\n    import torch  # the web never loads it\n", []),
    ("def f():\n    # the web never loads these\n    import torch\n\n    from peer_agent.model import model_build\n", []),
    ("def f():\n    # the web never loads it\n    import torch\n    x = 1\n    import hivemind\n", [5]),
    ("def f():\n    from PIL import (  # only for a PNG\n        Image,\n    )\n", []),
    ("class A:\n    def f(self):\n        if True:\n            import torch\n", [4]),
    ("def f():\n    def g():\n        import torch\n", [3]),
    ("def f():\n    x = 1  # a comment on another line\n    import torch\n", [3]),
    ("import torch\n\ndef f():\n    return torch\n", []),
])
def test_the_check_sees_imports_inside_functions_and_the_comments_that_explain_them(tmp_path, source, unexplained):
    module = tmp_path / "example.py"
    module.write_text(source)
    assert [int(site.split(":")[1]) for site in imports_unexplained(module, root=tmp_path)] == unexplained


def test_the_tests_of_runs_are_laid_out_as_runs_is():
    """tests/runs/<package>/ holds the tests of runs/<package>/ (docs/design.md): a reader finds the tests of
    a module beside those of its neighbours, and tests/runs/ itself keeps only what its packages share."""
    packages = {path.parent.name for path in (ROOT / "runs").glob("*/__init__.py")}
    misplaced = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "tests" / "runs").rglob("test_*.py"))
                 if path.parent.name not in packages]
    assert not misplaced, f"test modules outside a package named as one of runs/'s ({sorted(packages)}): {misplaced}"
