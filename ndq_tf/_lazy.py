"""Lazy package attributes (PEP 562): a name's module is imported at first use.

`import ndq_tf` then costs only the standard library, so that
`python -m ndq_tf.launch` (which imports the package first) and the
start-up watchdog start without TensorFlow; `ndq_tf.DitheredCodec` and the
other public names import their module, and TensorFlow, when first read.
"""

import importlib
import importlib.util

__all__ = [
    "attach",
]


def attach(package, names):
  """`(__getattr__, __dir__)` for a package's module namespace.

  Args:
    package: the package's `__name__`.
    names: `{public name: the module that defines it}`. Any submodule of
      the package is imported when read as an attribute, as an eager
      `__init__` would have made it one.

  Returns:
    The module-level `__getattr__` and `__dir__`.
  """
  namespace = importlib.import_module(package).__dict__

  def __getattr__(name):  # pylint: disable=invalid-name
    if name in names:
      value = getattr(importlib.import_module(names[name]), name)
    elif not name.startswith("__") and importlib.util.find_spec(
        f"{package}.{name}") is not None:
      value = importlib.import_module(f"{package}.{name}")
    else:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    namespace[name] = value
    return value

  def __dir__():  # pylint: disable=invalid-name
    return sorted(set(namespace) | set(namespace.get("__all__", ())))

  return __getattr__, __dir__

