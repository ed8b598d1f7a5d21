"""The package's metadata agrees with the code and with what CI tests.

One source each: the version (`ndq_tf/version.py`), the supported TensorFlow
and Keras (`ndq_tf.core.tf_internals`, which refuses others at import),
the oldest pair CI installs (the Makefile's `OLDEST`, `make test-oldest`) and
the tiers (tests/BUILD's tags, read by tests/conftest.py). These tests
keep pyproject.toml, the Makefile, the changelog and the code equal.
"""

import pathlib
import re

import pytest

import conftest
import ndq_tf
from ndq_tf import version as version_lib
from ndq_tf.cluster import launch
from ndq_tf.core import tf_internals

ROOT = pathlib.Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+.


def _pyproject():
  return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirement(requirements, name):
  (spec,) = [r for r in requirements
             if re.match(rf"{re.escape(name)}\b(?![-_])", r)]
  return spec[len(name):].replace(" ", "")


def _bounds_text(bounds):
  (low_major, low_minor), (high_major, high_minor) = bounds
  return f">={low_major}.{low_minor},<{high_major}.{high_minor}"


def test_dependencies_are_the_supported_versions():
  dependencies = _pyproject()["project"]["dependencies"]
  assert _requirement(dependencies, "tensorflow") == _bounds_text(
      tf_internals.TENSORFLOW_VERSIONS)
  assert _requirement(dependencies, "keras") == _bounds_text(
      tf_internals.KERAS_VERSIONS)
  # tf_keras follows TensorFlow's minor.
  test_extra = _pyproject()["project"]["optional-dependencies"]["test"]
  assert _requirement(test_extra, "tf-keras") == _bounds_text(
      tf_internals.TENSORFLOW_VERSIONS)


def test_ci_installs_the_oldest_supported_versions():
  (line,) = re.findall(r"^OLDEST := (.*)$", (ROOT / "Makefile").read_text(),
                       flags=re.M)
  tf_low = tf_internals.TENSORFLOW_VERSIONS[0]
  keras_low = tf_internals.KERAS_VERSIONS[0]
  assert line.split() == [
      "tensorflow==%d.%d.*" % tf_low, "keras==%d.%d.*" % keras_low,
      "tf-keras==%d.%d.*" % tf_low]
  ci = ROOT / ".ci" / "run"  # Not among the Bazel target's runfiles.
  if ci.exists():
    text = ci.read_text()
    assert "make test-oldest" in text and "make test\n" in text


def test_one_version_source():
  project = _pyproject()
  assert "version" in project["project"]["dynamic"]
  assert project["tool"]["setuptools"]["dynamic"]["version"] == {
      "attr": "ndq_tf.version.__version__"}
  assert ndq_tf.__version__ == version_lib.__version__
  changelog = (ROOT / "CHANGELOG.md").read_text()
  assert f"## [{ndq_tf.__version__}]" in changelog
  assert "## [Unreleased]" in changelog


def test_console_script_and_typing_marker():
  project = _pyproject()
  assert project["project"]["scripts"] == {
      "ndq-tf-launch": "ndq_tf.cluster.launch:main"}
  assert callable(launch.main)
  assert "py.typed" in project["tool"]["setuptools"]["package-data"]["ndq_tf"]
  assert (ROOT / "ndq_tf" / "py.typed").exists()
  assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
  assert project["project"]["license"] == "Apache-2.0"


def test_tier_markers_mirror_the_bazel_tags():
  build = """
pytest_test(
    name = "test_a",
    srcs = ["test_a.py"],
    tags = ["heavy"],
)

pytest_test(
    name = "test_b",
    srcs = ["test_b.py"],
    tags = ["manual", "oldest", "quick"],
)

pytest_test(
    name = "test_c",
    srcs = ["test_c.py"],
)
"""
  assert conftest.tiers_of_test_files(build) == {
      "test_a.py": {"heavy"}, "test_b.py": {"oldest", "quick"},
      "test_c.py": set()}
  text = (ROOT / "tests" / "BUILD").read_text()
  tiers = conftest.tiers_of_test_files(text)
  assert len(tiers) == text.count("\npytest_test(") > 0
  for name, tags in tiers.items():
    assert (ROOT / "tests" / name).exists()
    assert len(tags & {"quick", "heavy"}) == 1, (name, tags)
  assert any("oldest" in tags for tags in tiers.values())
  ini = (ROOT / "pytest.ini").read_text()
  for tier in conftest.TIERS:
    assert f"    {tier}:" in ini, tier


def test_keras_saving_accepts_the_strategies_obj_type():
  # Keras raises for types it does not know when it saves a model that
  # holds a compressed strategy (model.save_weights).
  from keras.src.saving import saving_lib  # pylint: disable=g-import-not-at-top
  saving_lib.get_attr_skipset(tf_internals.keras_saveable_obj_type())
