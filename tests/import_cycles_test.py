"""No import cycle among bertfam_jax's modules: the package's imports, read with `ast` (lazy
imports inside functions included, since a cycle held together by them is still a cycle)."""

import ast
import os

import bertfam_jax

PACKAGE_DIR = os.path.dirname(bertfam_jax.__file__)


def module_files(package_dir: str = PACKAGE_DIR) -> dict[str, str]:
  """{dotted module name: file} of every module of the package (a package by its __init__)."""
  root = os.path.dirname(package_dir)
  modules = {}
  for directory, _, names in os.walk(package_dir):
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
        modules[dotted.removesuffix(".__init__")] = path
  return modules


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
  """{module: the package's modules importing it runs}. `from a.b import c` imports the module
  a.b.c when there is one, else a.b; relative imports are resolved against the importing
  module. Importing a module also runs the `__init__` of each package above it that the importer
  is not itself inside (those are already running): `workdir` importing `hf.io` runs `hf`."""
  graph = {}
  for module, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    imported = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        imported.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
          base = f"{parent}.{base}" if base else parent
        for alias in node.names:
          full = f"{base}.{alias.name}"
          imported.add(full if full in modules else base)
    runs = set()
    for name in imported:
      parts = name.split(".")
      runs.update(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                  if not module.startswith(".".join(parts[:i]) + "."))
    graph[module] = {name for name in runs if name in modules and name != module}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan's algorithm)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for successor in sorted(graph[node]):
      if successor not in index:
        visit(successor)
        low[node] = min(low[node], low[successor])
      elif successor in on_stack:
        low[node] = min(low[node], index[successor])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return found


def test_the_package_has_no_import_cycle():
  modules = module_files()
  assert {"bertfam_jax.main", "bertfam_jax.workdir", "bertfam_jax.train.loop"} <= set(modules)
  assert cycles(import_graph(modules)) == []


def test_a_cycle_is_found(tmp_path):
  """The checker itself: a three-module cycle closed by a lazy import, and a relative import."""
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "a.py").write_text("from pkg import b\n")
  (package / "b.py").write_text("from . import c\n")
  (package / "c.py").write_text("def f():\n  import pkg.a\n")
  (package / "d.py").write_text("from pkg import a\n")
  graph = import_graph(module_files(str(package)))
  assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
  assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
  """`top` imports `pkg.leaf`, which runs `pkg/__init__`, which imports `top`: a cycle; while
  `pkg/__init__` importing its own `pkg.leaf`, which imports `pkg.other`, is none."""
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("from pkg import leaf\nimport top\n")
  (tmp_path / "pkg" / "leaf.py").write_text("from pkg import other\n")
  (tmp_path / "pkg" / "other.py").write_text("")
  (tmp_path / "pkg" / "top.py").write_text("def f():\n  from pkg import leaf\n")
  graph = import_graph(module_files(str(tmp_path / "pkg")))
  assert graph["pkg.leaf"] == {"pkg.other"}
  assert cycles(graph) == []
  (tmp_path / "pkg" / "__init__.py").write_text("from pkg import leaf\nfrom pkg import top\n")
  (tmp_path / "pkg" / "top.py").write_text("")
  (tmp_path / "pkg" / "sub").mkdir()
  (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from pkg import top\n")
  (tmp_path / "pkg" / "sub" / "mod.py").write_text("")
  (tmp_path / "pkg" / "top.py").write_text("def f():\n  from pkg.sub import mod\n")
  graph = import_graph(module_files(str(tmp_path / "pkg")))
  assert graph["pkg.top"] == {"pkg.sub", "pkg.sub.mod"}
  assert cycles(graph) == [["pkg.sub", "pkg.top"]]
