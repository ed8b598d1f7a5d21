"""Each module of ndq_tf/ stays small: at most 400 lines of code.

Pure Python (no TensorFlow): counts, with `tokenize` and `ast`, the lines
that hold code, leaving out docstrings, comments and blank lines. The
exchange engine, which every exchange passes through, has at most 300.
"""

import ast
import io
import pathlib
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ndq_tf"

#: Lines of code a module may have, and the modules held to fewer.
MAX_LINES = 400
LIMITS = {"ndq_tf/core/engine.py": 300}

_SKIPPED = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
            tokenize.DEDENT, tokenize.ENDMARKER)


def docstring_lines(tree):
  """The line numbers of every docstring in `tree`."""
  lines = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      first = node.body[0] if node.body else None
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
        lines.update(range(first.lineno, first.end_lineno + 1))
  return lines


def lines_of_code(source):
  """Lines of `source` holding code: no docstring, comment or blank line."""
  docstrings = docstring_lines(ast.parse(source))
  lines = set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type in _SKIPPED:
      continue
    lines.update(line for line in range(token.start[0], token.end[0] + 1)
                 if line not in docstrings)
  return len(lines)


def oversized(package=PACKAGE, max_lines=MAX_LINES, limits=None):
  """`path: n lines of code, limit m` for every module over its limit."""
  limits = LIMITS if limits is None else limits
  problems = []
  for path in sorted(package.rglob("*.py")):
    name = path.relative_to(package.parent).as_posix()
    limit = limits.get(name, max_lines)
    count = lines_of_code(path.read_text())
    if count > limit:
      problems.append(f"{name}: {count} lines of code, limit {limit}")
  return problems


def test_no_module_is_over_its_limit():
  assert oversized() == []


def test_docstrings_comments_and_blank_lines_do_not_count():
  source = ('"""Module.\n\nMore."""\n\n# A comment.\n'
            'def f(x):\n  """Doc."""\n  return (x +\n          1)  # Two.\n')
  assert lines_of_code(source) == 3


def test_a_module_over_its_limit_is_reported(tmp_path):
  package = tmp_path / "ndq_tf"
  (package / "core").mkdir(parents=True)
  (package / "__init__.py").write_text("x = 1\n")
  (package / "core" / "engine.py").write_text("a = 1\nb = 2\nc = 3\n")
  limits = {"ndq_tf/core/engine.py": 2}
  assert oversized(package, max_lines=3, limits=limits) == [
      "ndq_tf/core/engine.py: 3 lines of code, limit 2"]
