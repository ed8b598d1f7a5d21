"""Tests of `ndq_tf.core.tf_internals`: the TensorFlow and Keras it accepts.

Moved from test_packaging.py, which keeps pyproject.toml and the Makefile
equal to these bounds.
"""

import keras
import pytest
import tensorflow as tf

from ndq_tf.core import tf_internals


def test_installed_versions_are_supported():
  tf_internals.check_versions(tf.__version__, keras.__version__)
  tf_keras = pytest.importorskip("tf_keras")
  assert (tf_internals.parse_version(tf_keras.__version__) ==
          tf_internals.parse_version(tf.__version__))


@pytest.mark.parametrize("tensorflow_version, keras_version, named", [
    ("2.17.1", "3.10.0", ["tensorflow >=2.18,<2.22", "tensorflow 2.17.1"]),
    ("2.22.0rc0", "3.15.1", ["tensorflow >=2.18,<2.22",
                             "tensorflow 2.22.0rc0"]),
    ("2.21.0", "3.9.2", ["keras >=3.10,<3.16", "keras 3.9.2"]),
    ("2.21.0", "2.15.0", ["keras >=3.10,<3.16", "keras 2.15.0"]),
    ("2.16.2", "3.16.0", ["tensorflow 2.16.2", "keras 3.16.0"]),
])
def test_unsupported_versions_name_installed_and_supported(
    tensorflow_version, keras_version, named):
  with pytest.raises(ImportError) as info:
    tf_internals.check_versions(tensorflow_version, keras_version)
  message = str(info.value)
  for text in named:
    assert text in message
  assert f"tensorflow_version={tensorflow_version!r}" in message


@pytest.mark.parametrize("tensorflow_version, keras_version", [
    ("2.18.0", "3.10.0"), ("2.19.1", "3.12.4"), ("2.21.0", "3.15.1"),
    ("2.20.0.dev20250101", "3.11.3")])
def test_supported_versions_pass(tensorflow_version, keras_version):
  tf_internals.check_versions(tensorflow_version, keras_version)


def test_parse_version():
  assert tf_internals.parse_version("2.19.1") == (2, 19)
  assert tf_internals.parse_version("2.20.0rc1") == (2, 20)
  assert tf_internals.parse_version("3") == (3, 0)
  assert tf_internals.parse_version("3.10.0+cpu") == (3, 10)
