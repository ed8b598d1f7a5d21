"""Constructor arguments declared once: signature, help and binding.

The fields of `CompressionOptions` are declared once, in
`ndq_tf.distribute.options` (`FIELDS`: type and default; its docstring:
help). `ndq_tf.CompressedAllReduce`, `ndq_tf.MirroredStrategy` and
`ndq_tf.MultiWorkerMirroredStrategy` take them among their own arguments,
each in its own positional order. An `Arguments` gives such a constructor
(written `__init__(self, *args, **kwargs)`) its `inspect.signature`, so
that `help()` lists every argument with its type and default, writes the
Args section of its docstring, and binds a call to the values, resolving
the deprecated names of arguments (`ndq_tf._deprecation`).
"""

import inspect
import re
import textwrap
from typing import Any, NamedTuple

from ndq_tf import _deprecation

__all__ = [
    "REQUIRED",
    "Argument",
    "Arguments",
    "args_section",
]

#: The default of an argument without one.
REQUIRED = inspect.Parameter.empty


class Argument(NamedTuple):
  """One constructor argument.

  Attributes:
    name: its name.
    annotation: its type, as written in the signature (`"int | None"`).
    default: its default, `REQUIRED` for none.
    doc: its help, one paragraph (the Args entry without the name).
  """
  name: str
  annotation: str
  default: Any = REQUIRED
  doc: str = ""


def args_section(docstring):
  """`{name: help}` of the Args section of a Google-style docstring.

  Each entry's lines are joined into one paragraph.
  """
  lines = inspect.cleandoc(docstring).splitlines()
  docs, name = {}, None
  for line in lines[lines.index("Args:") + 1:]:
    if not line.startswith("  "):
      break  # A blank line or the next section.
    entry = re.match(r"  (\w+): (.*)", line)
    if entry:
      name = entry.group(1)
      docs[name] = entry.group(2)
    else:
      docs[name] += " " + line.strip()
  return docs


class Arguments:
  """The arguments of one constructor, in positional order.

  Args:
    who: the constructor's public name, for messages
      (`"ndq_tf.MirroredStrategy"`).
    arguments: the `Argument`s, in positional order.
    keyword_only: the name of the first keyword-only argument (None: none).
    renamed: `{deprecated name: its argument's name}`: accepted by
      keyword, warning once per call site (`_deprecation.warn`).
  """

  def __init__(self, who, arguments, keyword_only=None, renamed=None):
    self._who = who
    self._arguments = tuple(arguments)
    self._renamed = dict(renamed or {})
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("self", kind)]
    for argument in self._arguments:
      if argument.name == keyword_only:
        kind = inspect.Parameter.KEYWORD_ONLY
      parameters.append(inspect.Parameter(
          argument.name, kind, default=argument.default,
          annotation=argument.annotation))
    self.signature = inspect.Signature(parameters, return_annotation="None")

  @property
  def names(self):
    """The names of the arguments, in positional order."""
    return tuple(a.name for a in self._arguments)

  def bind(self, instance, args, kwargs):
    """The values of a call `__init__(instance, *args, **kwargs)`.

    Returns:
      `(values, given)`: `{name: value}` of every argument, defaults
      included, and `{name: value}` of those the caller passed (a deprecated
      name counts as its argument's).

    Raises:
      TypeError: as Python would for a call that does not fit the
        signature (too many positional arguments, an unknown keyword).
      ValueError: if an argument is passed under both its name and a
        deprecated name, naming both and their values.
    """
    kwargs = dict(kwargs)
    old = {name: kwargs.pop(name) for name in self._renamed if name in kwargs}
    try:
      bound = self.signature.bind(instance, *args, **kwargs)
    except TypeError as e:
      raise TypeError(f"{self._who}(): {e}") from None
    given = dict(bound.arguments)
    del given["self"]
    for name, value in old.items():
      new = self._renamed[name]
      if new in given:
        raise ValueError(
            f"`{name}` is the deprecated name of `{new}`: pass only `{new}`. "
            f"Received: {new}={given[new]!r} and {name}={value!r}.")
      _deprecation.warn(f"The argument `{name}` of {self._who}", f"`{new}`")
      given[new] = value
    bound.apply_defaults()
    values = dict(bound.arguments, **given)
    del values["self"]
    return values, given

  def apply(self, cls, document=True):
    """Gives `cls.__init__` this signature and `cls` the Args section.

    The Args section (when `document`) goes before the docstring's
    "Raises:" (at its end without one), followed by the deprecated names.
    """
    init = cls.__init__
    init.__signature__ = self.signature
    init.__annotations__ = dict(
        {a.name: a.annotation for a in self._arguments}, **{"return": "None"})
    if document and cls.__doc__:
      cls.__doc__ = self._document(cls.__doc__)
    return cls

  def _document(self, doc):
    indent = min((len(line) - len(line.lstrip())
                  for line in doc.splitlines()[1:] if line.strip()), default=0)
    pad = " " * indent
    entries = [(a.name, a.doc) for a in self._arguments] + [
        (old, f"deprecated name of `{new}` (warns once; passing both is an "
              f"error).") for old, new in self._renamed.items()]
    lines = [pad + "Args:"]
    for name, text in entries:
      lines += textwrap.wrap(f"{name}: {text}", 78,
                             initial_indent=pad + "  ",
                             subsequent_indent=pad + "    ",
                             break_on_hyphens=False, break_long_words=False)
    section = "\n".join(lines) + "\n\n"
    head, raises, tail = doc.partition(pad + "Raises:")
    if not raises:
      return doc.rstrip() + "\n\n" + section + pad
    return head + section + raises + tail
