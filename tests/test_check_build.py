"""tools/check_build.py finds the files that no BUILD target names (#36).

The Bazel half (every package loads and analyzes) runs in CI through
`make check-build`; these tests check the other half on small trees.
"""

import importlib.util
import os
import textwrap

import pytest

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "tools", "check_build.py")


@pytest.fixture(scope="module")
def check_build():
  spec = importlib.util.spec_from_file_location("ndq_check_build", _PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _tree(root, files):
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


_BUILD = """\
    load("//tools:pytest.bzl", "pytest_test")

    py_library(name = "helper", srcs = ["helper.py"])

    pytest_test(
        name = "test_a",
        srcs = ["test_a.py"],
        tags = ["quick"],
        data = glob(["scripts/*.py"]),
        deps = [":helper", "//pkg"],
    )
    """


def test_every_file_named(check_build, tmp_path):
  _tree(tmp_path, {"tests/BUILD": _BUILD, "tests/helper.py": "",
                   "tests/test_a.py": "", "tests/scripts/job.py": "",
                   "pkg/BUILD": 'py_library(name = "pkg", srcs = ["m.py"])',
                   "pkg/m.py": ""})
  assert check_build.untargeted_files(tmp_path, ("pkg", "tests")) == []


def test_a_test_file_with_no_target(check_build, tmp_path):
  _tree(tmp_path, {"tests/BUILD": _BUILD, "tests/helper.py": "",
                   "tests/test_a.py": "", "tests/test_b.py": "",
                   "tests/b_test.py": ""})
  assert check_build.untargeted_files(tmp_path, ("tests",)) == [
      "//tests:b_test.py: a test file with no pytest_test target in "
      "tests/BUILD",
      "//tests:test_b.py: a test file with no pytest_test target in "
      "tests/BUILD"]


def test_a_test_file_only_in_data_is_not_run(check_build, tmp_path):
  build = _BUILD.replace('glob(["scripts/*.py"])', '["test_c.py"]')
  _tree(tmp_path, {"tests/BUILD": build, "tests/helper.py": "",
                   "tests/test_a.py": "", "tests/test_c.py": ""})
  assert check_build.untargeted_files(tmp_path, ("tests",)) == [
      "//tests:test_c.py: a test file with no pytest_test target in "
      "tests/BUILD"]


def test_a_module_with_no_target(check_build, tmp_path):
  _tree(tmp_path, {"pkg/BUILD": 'py_library(name = "pkg", srcs = ["m.py"])',
                   "pkg/m.py": "", "pkg/n.py": "",
                   # A sub-package answers for its own files.
                   "pkg/sub/BUILD": 'py_library(name = "s", srcs = ["s.py"])',
                   "pkg/sub/s.py": "", "pkg/sub/t.py": ""})
  assert check_build.untargeted_files(tmp_path, ("pkg",)) == [
      "//pkg:n.py: in no target's srcs or data in pkg/BUILD",
      "//pkg/sub:t.py: in no target's srcs or data in pkg/sub/BUILD"]


def test_a_test_target_needs_one_tier(check_build, tmp_path):
  _tree(tmp_path, {"tests/BUILD": """
pytest_test(name = "test_a", srcs = ["test_a.py"], tags = ["quick"])
pytest_test(name = "test_b", srcs = ["test_b.py"], tags = ["oldest"])
pytest_test(name = "test_c", srcs = ["test_c.py"], tags = ["quick", "heavy"])
"""})
  assert check_build.untiered_tests(tmp_path) == [
      "//tests:test_b: tagged with no tier, not exactly one of quick and heavy",
      "//tests:test_c: tagged ['heavy', 'quick'], not exactly one of quick "
      "and heavy"]


def test_this_repository(check_build):
  if not (check_build.ROOT / "ndq_tf" / "BUILD").exists():
    pytest.skip("BUILD files are not among a Bazel test's runfiles")
  assert check_build.untargeted_files() == []
  assert check_build.untiered_tests() == []
