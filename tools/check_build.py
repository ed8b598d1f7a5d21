"""Checks the Bazel BUILD files: every package loads, and every file has a target.

Run by .ci/run after the Python suite (`make check-build`), so that a BUILD
error fails CI although CI runs the tests with pytest, not Bazel:

1. `bazel test --nobuild //...` through ../shared/tools/bazel-test: Bazel
   loads and analyzes every package and target, and builds and runs nothing.
   It fails on any BUILD error (a duplicated label, a missing dependency, a
   target that names a file that does not exist). Bazel 4 ends every
   `test --nobuild` with "Couldn't start the build. Unable to run tests" and
   exit 1, so that one line, after a completed analysis, is a success.
2. Every test file (test_*.py, *_test.py, in tests/ or a subfolder of it
   that has no BUILD file) is in the `srcs` of a `pytest_test`, and every
   other Python file of ndq_tf/ and tests/ is in the `srcs` or `data` of
   some target of its package. A file that Bazel does not know would be
   left out of `make bazel-test` without a word. Each `pytest_test` of
   tests/ has exactly one of the tier tags "quick" and "heavy"
   (tests/conftest.py turns the tags into pytest markers).

Step 2 reads the BUILD files as Python (Starlark's syntax is a subset), with
each rule recording its arguments; step 1 has already proven them valid.

Usage: python tools/check_build.py [--skip_bazel]
"""

import argparse
import fnmatch
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BAZEL_TEST = ROOT.parent / "shared" / "tools" / "bazel-test"
# The packages whose Python files must all have a target.
CHECKED = ("ndq_tf", "tests")
TIERS = ("quick", "heavy")
TEST_FILE = re.compile(r"^(test_.*|.*_test)\.py$")
NOBUILD_END = "Couldn't start the build. Unable to run tests"


def _glob(package_dir, patterns, exclude=()):
  found = set()
  for pattern in patterns:
    for path in package_dir.glob(pattern):
      name = path.relative_to(package_dir).as_posix()
      if path.is_file() and not any(fnmatch.fnmatch(name, e) for e in exclude):
        found.add(name)
  return sorted(found)


def read_build(build_file):
  """The rules of a BUILD file: a list of (rule kind, keyword arguments)."""
  package_dir = build_file.parent
  rules = []

  def record(kind):
    return lambda *args, **kwargs: rules.append((kind, kwargs))

  class Rules(dict):

    def __missing__(self, name):
      return record(name)

  scope = Rules(
      load=lambda *args, **kwargs: None,
      glob=lambda patterns, exclude=(), **kwargs: _glob(
          package_dir, patterns, exclude),
      __builtins__={})
  exec(compile(build_file.read_text(), str(build_file), "exec"), scope)  # pylint: disable=exec-used
  return rules


def _named_files(rules, kinds=None, attrs=("srcs", "data")):
  names = set()
  for kind, kwargs in rules:
    if kinds is not None and kind not in kinds:
      continue
    for attr in attrs:
      for label in kwargs.get(attr, ()):
        # Only this package's own files: "x.py" or ":x.py".
        if isinstance(label, str) and not label.startswith(("//", "@")):
          names.add(label.lstrip(":"))
  return names


def untargeted_files(root=ROOT, packages=CHECKED):
  """Messages for the Python files of `packages` that no BUILD target names."""
  problems = []
  for top in packages:
    for build_file in sorted((root / top).rglob("BUILD")):
      package_dir = build_file.parent
      rules = read_build(build_file)
      tests = _named_files(rules, kinds={"pytest_test", "py_test"},
                           attrs=("srcs",))
      named = _named_files(rules)
      for path in sorted(package_dir.rglob("*.py")):
        # A subfolder with its own BUILD is its own package.
        if any((parent / "BUILD").exists()
               for parent in path.parents
               if package_dir in parent.parents):
          continue
        name = path.relative_to(package_dir).as_posix()
        label = "//%s:%s" % (package_dir.relative_to(root).as_posix(), name)
        if TEST_FILE.match(path.name):
          if name not in tests:
            problems.append("%s: a test file with no pytest_test target in "
                            "%s" % (label, build_file.relative_to(root)))
        elif name not in named:
          problems.append("%s: in no target's srcs or data in %s" %
                          (label, build_file.relative_to(root)))
  return problems


def untiered_tests(root=ROOT):
  """Messages for the `pytest_test` targets of tests/ without one tier tag."""
  problems = []
  build_file = root / "tests" / "BUILD"
  for kind, kwargs in read_build(build_file):
    tiers = set(kwargs.get("tags", ())) & set(TIERS)
    if kind == "pytest_test" and len(tiers) != 1:
      problems.append("//tests:%s: tagged %s, not exactly one of %s" % (
          kwargs.get("name"), sorted(tiers) or "with no tier",
          " and ".join(TIERS)))
  return problems


def bazel_analyze(root=ROOT):
  """Loads and analyzes //... with Bazel; returns (ok, Bazel's output)."""
  env = dict(os.environ)
  venv_bin = root / ".venv" / "bin"
  if venv_bin.is_dir():
    env["PATH"] = "%s%s%s" % (venv_bin, os.pathsep, env.get("PATH", ""))
  result = subprocess.run(
      [str(BAZEL_TEST), "--nobuild", "//..."], cwd=root, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
  errors = [line for line in result.stdout.splitlines()
            if line.startswith("ERROR:")]
  analyzed = re.search(r"^INFO: Analyzed \d+ targets", result.stdout, re.M)
  ok = (result.returncode == 0 or
        (bool(analyzed) and errors == ["ERROR: " + NOBUILD_END]))
  return ok, result.stdout


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--skip_bazel", action="store_true",
                      help="only check that every file has a target")
  args = parser.parse_args(argv)
  failed = False
  if not args.skip_bazel:
    ok, output = bazel_analyze()
    if not ok:
      sys.stdout.write(output)
      print("check_build: Bazel could not load and analyze //...")
      failed = True
    else:
      print("check_build: Bazel loaded and analyzed //...")
  problems = untargeted_files() + untiered_tests()
  for problem in problems:
    print("check_build: " + problem)
  if not problems:
    print("check_build: every Python file of %s has a target, and every "
          "test target a tier" % " and ".join(CHECKED))
  return 1 if failed or problems else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
