"""The one way ndq_tf keeps a renamed or moved name for one release.

Standard library only, at the bottom of the layers (tests/test_layers.py).
Every old name keeps working and warns (`DeprecationWarning`) naming its
replacement, in one sentence: "`old` is deprecated and will be removed in
the next release; use `new` instead." The warning points at the code that
used the old name, outside ndq_tf and the import machinery.

* `warn(old, new)`: the warning alone, for an alias that computes its value
  (a property, a dict key).
* `moved_attributes(module, {old name: "new.module.name"})`: a module's
  `__getattr__` (PEP 562) for names that moved. The new home is imported by
  its name when the old name is read, so that the old home adds no import
  of it: it may sit in a layer above. The value is the new name's object.
* `moved_modules({old module: new module})`: old module paths, their
  submodules included, that import as the module now at the new path (the
  same module object, not a second copy), warning once each.
* `moved_module(old, new)`: the same, from the old module's own file (one
  kept because it also runs as a script).
"""

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

__all__ = [
    "moved_attributes",
    "moved_module",
    "moved_modules",
    "warn",
]

# Frames in these files are skipped: the warning points at the user's code.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep


def _bootstrap(frame):
  # The import system's own frames, which `warnings.warn` skips itself
  # without counting them in `stacklevel` (CPython's rule).
  name = frame.f_code.co_filename
  return "importlib" in name and "_bootstrap" in name


def _stacklevel():
  """`warnings.warn`'s stacklevel, from `warn`, of the first outside frame."""
  level, frame = 2, sys._getframe(2)  # pylint: disable=protected-access
  while True:
    while frame is not None and _bootstrap(frame):
      frame = frame.f_back
    if frame is None or not os.path.abspath(
        frame.f_code.co_filename).startswith((_PACKAGE_DIR, _IMPORTLIB_DIR)):
      return level
    level, frame = level + 1, frame.f_back


def warn(old, new):
  """Warns that `old` is deprecated, naming `new` (both as written).

  Args:
    old: what is deprecated, quoted as the message should show it:
      "`last_wire_bits`", "The telemetry key 'step'".
    new: its replacement, likewise: '`stats()["sent_bits"]`'.
  """
  warnings.warn(f"{old} is deprecated and will be removed in the next "
                f"release; use {new} instead.", DeprecationWarning,
                stacklevel=_stacklevel())


def _resolve(target):
  """The object named `target`: "package.module" or "package.module.name"."""
  module, _, name = target.rpartition(".")
  try:
    return getattr(importlib.import_module(module), name)
  except AttributeError:
    return importlib.import_module(target)


def moved_attributes(module, moves):
  """The `__getattr__` of module `module` for names moved elsewhere.

  Args:
    module: the old home's `__name__`.
    moves: `{old name: "new.module.name"}`.

  Returns:
    A PEP 562 `__getattr__`: an old name warns and returns the new one's
    object; any other name raises `AttributeError`.
  """
  moves = dict(moves)

  def __getattr__(name):  # pylint: disable=invalid-name
    if name not in moves:
      raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn(f"`{module}.{name}`", f"`{moves[name]}`")
    return _resolve(moves[name])

  return __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports an old module path as the module at its new path."""

  def __init__(self):
    self.moves = {}

  def target(self, name):
    for old, new in self.moves.items():
      if name == old or name.startswith(old + "."):
        return new + name[len(old):]
    return None

  def find_spec(self, fullname, path=None, target=None):
    del path, target  # Any path: the old name alone decides.
    if self.target(fullname) is None:
      return None
    return importlib.machinery.ModuleSpec(fullname, self)

  def create_module(self, spec):
    del spec  # A placeholder module, replaced in `exec_module`.
    return None

  def exec_module(self, module):
    # The import system returns what `sys.modules` holds after this: the
    # module at the new path, which keeps its own name and spec.
    new = self.target(module.__name__)
    sys.modules[module.__name__] = importlib.import_module(new)
    warn(f"`{module.__name__}`", f"`{new}`")


_FINDER = _MovedModules()


def moved_modules(moves):
  """Old module paths that import as the modules now at the new paths.

  `import old` and `import old.sub` give the modules `new` and `new.sub`
  themselves, and warn once each (then `sys.modules` has them).

  Args:
    moves: `{old module: new module}`.
  """
  _FINDER.moves.update(moves)
  if _FINDER not in sys.meta_path:
    sys.meta_path.insert(0, _FINDER)


def moved_module(old, new):
  """Makes the module named `old`, from its own file, the module `new`.

  Called in the old module's body: puts `new` in `sys.modules[old]`, so that
  both names are one module, and warns naming the new path.
  """
  moved_modules({old: new})
  sys.modules[old] = importlib.import_module(new)
  warn(f"`{old}`", f"`{new}`")
