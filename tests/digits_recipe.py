"""The digits MLP recipe shared by the training tests.

tests/integration/test_mirrored_training.py compares DQSG with float32 and
tests/integration/test_nested_allreduce.py compares NDQSG groups with DQSG: both
comparisons must train the same model on the same split, so both use this
one recipe (scikit-learn's digits, MLP 64-256-10, Adam 4e-3, batch 128,
8 epochs, Keras seed 1 unless told). It lives in benchmarks/common.py, which
benchmarks/nested_digits.py trains too; this module re-exports it under the
names the tests use.
"""

import importlib.util
import os

__all__ = ["load", "model", "sync_bn_model", "fit"]


def _benchmarks_common():
  """benchmarks/common.py, loaded by path.

  benchmarks/ is a folder of scripts, not a package, and the tests run with
  tests/ (not the repository) on `sys.path`; a path relative to this file
  holds in a checkout and in Bazel's runfiles alike.
  """
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))), "benchmarks", "common.py")
  spec = importlib.util.spec_from_file_location("ndq_benchmarks_common", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_common = _benchmarks_common()

#: `() -> (x_train, x_test, y_train, y_test)`: a fixed stratified 75/25 split.
load = _common.load_digits
#: `(strategy, seed=1) -> model`: the recipe's MLP, compiled, untrained.
model = _common.digits_mlp
#: `(strategy, seed=0) -> model`: the MLP with a synchronized BatchNorm.
sync_bn_model = _common.sync_bn_mlp
#: `(strategy, data, seed=1, callbacks=None) -> (model, history)`.
fit = _common.fit_digits_mlp
