"""Imports go downward only, through the layers that ndq_tf's folders show.

Pure Python: reads every module of ndq_tf/ with `ast` (imports inside
functions included) and imports none of them, so it runs in a fraction of a
second and without TensorFlow.

A module may import modules of its own layer and of the layers below it,
never of a layer above, and no chain of imports may lead back to where it
started (a circle). A package's `__init__` re-exporting its own modules is
no circle: importing `ndq_tf.core.exchanges.base` names that module, not
the package around it. Names resolved by string when first read (the lazy
public names of `ndq_tf._lazy`, the deprecated aliases of
`ndq_tf._deprecation`) are not imports; `importlib.import_module` with a
literal name is.
"""

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ndq_tf"

#: The layers, lowest first, each with the modules it holds (a package
#: holds its submodules). The one place the order is written down;
#: docs/distribute.md ("Layout") describes it.
LAYERS = (
    # Standard library only: the version, lazy names, deprecated aliases.
    ("base", ("ndq_tf._deprecation", "ndq_tf._lazy", "ndq_tf.version")),
    # Plain `math`: the formulas.
    ("theory", ("ndq_tf.theory",)),
    # Starting and joining a cluster; loads no TensorFlow.
    ("cluster", ("ndq_tf.cluster",)),
    # Pure TF functions.
    ("ops", ("ndq_tf.ops",)),
    # Configured quantizers.
    ("codecs", ("ndq_tf.codecs",)),
    # The exchange, strategy-agnostic: engine, fusion, exchanges,
    # transports, state, fingerprint, telemetry, cost model; the scopes it
    # reads and the one module reaching into TF's internals.
    ("core", ("ndq_tf.core",)),
    # The tf.distribute adapters: cross-device ops, strategies, options.
    ("distribute", ("ndq_tf.distribute",)),
    # Callbacks and optimizer wrappers.
    ("keras", ("ndq_tf.keras",)),
    # The public API's lazy re-exports, and the launcher's old path.
    ("package", ("ndq_tf", "ndq_tf.launch")),
)

#: Layers that load no TensorFlow: no module-level import outside the
#: standard library and ndq_tf (the cluster's `tf_config` imports TF inside
#: the one function that needs TF's resolver).
LIGHT = ("base", "theory", "cluster")


def module_names(package=PACKAGE):
  """`{dotted module name: path}` of every module of ndq_tf/."""
  names = {}
  for path in sorted(package.rglob("*.py")):
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts.pop()
    names[".".join(parts)] = path
  return names


def layer_of(module, layers=LAYERS):
  """`(index, name)` of the layer holding `module`, or None."""
  best = None
  for index, (name, prefixes) in enumerate(layers):
    for prefix in prefixes:
      # "ndq_tf" holds itself only; other prefixes their submodules too.
      if module == prefix or (prefix != "ndq_tf" and
                              module.startswith(prefix + ".")):
        if best is None or len(prefix) > best[2]:
          best = (index, name, len(prefix))
  return best and best[:2]


def _known(name, modules):
  """The longest prefix of `name` that is a module of ndq_tf, or None."""
  while name and name not in modules:
    name = name.rpartition(".")[0]
  return name or None


def imports(module, path, modules):
  """`[(line, imported ndq_tf module, as written)]`, anywhere in `module`."""
  tree = ast.parse(path.read_text(), str(path))
  package = module if path.name == "__init__.py" else module.rpartition(
      ".")[0]
  found = []

  def add(node, name, written):
    target = _known(name, modules)
    if target is not None:
      found.append((node.lineno, target, written))

  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        add(node, alias.name, f"import {alias.name}")
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # Relative: from the package, `level - 1` up.
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
      for alias in node.names:
        full = f"{base}.{alias.name}"
        name = full if full in modules else base
        add(node, name, f"from {'.' * node.level}{node.module or ''} "
            f"import {alias.name}")
    elif (isinstance(node, ast.Call) and node.args and
          isinstance(node.args[0], ast.Constant) and
          isinstance(node.args[0].value, str) and
          ((isinstance(node.func, ast.Attribute) and
            node.func.attr == "import_module") or
           (isinstance(node.func, ast.Name) and
            node.func.id in ("import_module", "__import__")))):
      add(node, node.args[0].value,
          f"import_module({node.args[0].value!r})")
  return sorted(found)


def import_graph(package=PACKAGE):
  """`{module: [(line, imported module, as written)]}` of ndq_tf/."""
  modules = module_names(package)
  return {m: [(line, target, written)
              for line, target, written in imports(m, path, modules)
              if target != m]
          for m, path in modules.items()}


def upward_imports(graph, layers=LAYERS):
  """Messages for the imports that go up a layer (or from no layer)."""
  problems = []
  for module, found in sorted(graph.items()):
    here = layer_of(module, layers)
    if here is None:
      problems.append(f"{module}: in no layer; add it to LAYERS")
      continue
    for line, target, written in found:
      there = layer_of(target, layers)
      if there is None:
        continue  # Reported as a module of its own.
      if there[0] > here[0]:
        problems.append(
            f"{module} (layer {here[1]}) imports {target} (layer "
            f"{there[1]}), line {line}: `{written}`")
  return problems


def circles(graph):
  """`[(modules, circle)]`: each set of modules that import each other.

  Tarjan's strongly connected components, each with one circle through
  its first module, `[a, b, ..., a]`.
  """
  index, low, stack, on_stack, components = {}, {}, [], set(), []
  edges = {m: sorted({t for _, t, _ in found if t in graph})
           for m, found in graph.items()}

  def visit(v):  # Recursive: ndq_tf's graph is shallow.
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1 or v in edges[v]:
        components.append(sorted(component))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  found = []
  for component in components:
    # One circle through the component's first module, by breadth first.
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    circle = None
    while queue and circle is None:
      v = queue.pop(0)
      for w in edges[v]:
        if w == start:
          circle = paths[v] + [start]
          break
        if w in component and w not in paths:
          paths[w] = paths[v] + [w]
          queue.append(w)
    found.append((component, circle))
  return found


def circle_messages(graph):
  """Messages naming each circle and the imports that close it."""
  problems = []
  for component, circle in circles(graph):
    steps = []
    for a, b in zip(circle, circle[1:]):
      line, written = [(l, w) for l, t, w in graph[a] if t == b][0]
      steps.append(f"{a} line {line} `{written}`")
    problems.append(f"{len(component)} modules import each other "
                    f"({', '.join(component)}), e.g. "
                    + " -> ".join(steps) + f" -> {circle[-1]}")
  return problems


def heavy_imports(package=PACKAGE, layers=LAYERS, light=LIGHT):
  """Module-level imports outside the standard library in `light` layers."""
  problems = []
  stdlib = set(sys.stdlib_module_names)
  for module, path in module_names(package).items():
    here = layer_of(module, layers)
    if here is None or here[1] not in light:
      continue
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:  # Module level only.
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""] if isinstance(node, ast.ImportFrom)
               and not node.level else [])
      for name in names:
        top = name.split(".")[0]
        if top not in stdlib and top != "ndq_tf" and top != "__future__":
          problems.append(f"{module} (layer {here[1]}) imports {name} at "
                          f"line {node.lineno}: it must load no TensorFlow")
  return problems


# -- ndq_tf itself -------------------------------------------------------------


@pytest.fixture(scope="module")
def graph():
  return import_graph()


def test_every_module_is_in_a_layer(graph):
  assert len(graph) > 50
  assert [m for m in graph if layer_of(m) is None] == []


def test_imports_go_downward(graph):
  assert upward_imports(graph) == []


def test_no_circle(graph):
  assert circle_messages(graph) == []


def test_light_layers_load_no_tensorflow():
  assert heavy_imports() == []


def test_theory_imports_nothing_of_ndq_tf_but_the_deprecations(graph):
  assert {t for _, t, _ in graph["ndq_tf.theory"]} <= {"ndq_tf._deprecation"}


# -- The checks themselves, on small trees ------------------------------------


def _tree(root, files):
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return root / "ndq_tf"


_SMALL_LAYERS = (("low", ("ndq_tf.low",)), ("high", ("ndq_tf.high",)),
                 ("package", ("ndq_tf",)))


def test_an_upward_import_inside_a_function_is_reported(tmp_path):
  package = _tree(tmp_path, {
      "ndq_tf/__init__.py": "",
      "ndq_tf/low/__init__.py": "",
      "ndq_tf/low/a.py": ("def f():\n"
                          "  from ndq_tf.high import b\n"
                          "  return b\n"),
      "ndq_tf/high/__init__.py": "",
      "ndq_tf/high/b.py": "from ndq_tf.low import a\n",
  })
  problems = upward_imports(import_graph(package), _SMALL_LAYERS)
  assert problems == [
      "ndq_tf.low.a (layer low) imports ndq_tf.high.b (layer high), line 2: "
      "`from ndq_tf.high import b`"]


def test_a_circle_is_reported_with_its_imports(tmp_path):
  package = _tree(tmp_path, {
      "ndq_tf/__init__.py": "",
      "ndq_tf/low/__init__.py": "",
      "ndq_tf/low/a.py": "import ndq_tf.low.b\n",
      "ndq_tf/low/b.py": ("import importlib\n"
                          "def f():\n"
                          "  return importlib.import_module('ndq_tf.low.a')\n"),
  })
  assert circle_messages(import_graph(package)) == [
      "2 modules import each other (ndq_tf.low.a, ndq_tf.low.b), e.g. "
      "ndq_tf.low.a line 1 `import ndq_tf.low.b` -> ndq_tf.low.b line 3 "
      "`import_module('ndq_tf.low.a')` -> ndq_tf.low.a"]


def test_a_package_reexporting_its_modules_is_no_circle(tmp_path):
  package = _tree(tmp_path, {
      "ndq_tf/__init__.py": "",
      "ndq_tf/low/__init__.py": "from ndq_tf.low.a import f\n",
      "ndq_tf/low/a.py": "from ndq_tf.low import b\ndef f(): pass\n",
      "ndq_tf/low/b.py": "from . import c\n",
      "ndq_tf/low/c.py": "",
  })
  graph = import_graph(package)
  assert graph["ndq_tf.low.b"] == [(1, "ndq_tf.low.c", "from . import c")]
  assert circle_messages(graph) == []


def test_a_module_in_no_layer_is_reported(tmp_path):
  package = _tree(tmp_path, {"ndq_tf/__init__.py": "",
                             "ndq_tf/stray.py": ""})
  assert upward_imports(import_graph(package), _SMALL_LAYERS) == [
      "ndq_tf.stray: in no layer; add it to LAYERS"]


def test_tensorflow_in_a_light_layer_is_reported(tmp_path):
  package = _tree(tmp_path, {
      "ndq_tf/__init__.py": "",
      "ndq_tf/low/__init__.py": "import math\nimport tensorflow as tf\n",
      "ndq_tf/low/lazy.py": "def f():\n  import tensorflow\n",
  })
  assert heavy_imports(package, _SMALL_LAYERS, ("low",)) == [
      "ndq_tf.low (layer low) imports tensorflow at line 2: it must load no "
      "TensorFlow"]
