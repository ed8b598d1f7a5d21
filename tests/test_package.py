"""The package's lazy public names (PEP 562, `ndq_tf._lazy`)."""

import os
import subprocess
import sys

import pytest

import ndq_tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code):
  """Runs `code` in a fresh interpreter with this checkout on its path."""
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=60, cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=ROOT))


def test_import_loads_no_tensorflow():
  code = ("import sys, ndq_tf, ndq_tf.core, ndq_tf.distribute, "
          "ndq_tf.launch, ndq_tf.theory, ndq_tf.distribute.tf_config, "
          "ndq_tf.distribute.startup_watchdog\n"
          "heavy = [m for m in sys.modules if m.split('.')[0] in "
          "('tensorflow', 'keras', 'numpy')]\n"
          "assert not heavy, heavy\n"
          "print(ndq_tf.__version__)")
  proc = _python(code)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == ndq_tf.__version__


def test_old_cluster_paths_are_the_moved_modules_and_warn():
  code = ("import warnings\n"
          "warnings.simplefilter('always')\n"
          "import ndq_tf.launch, ndq_tf.distribute.tf_config, "
          "ndq_tf.distribute.startup_watchdog, ndq_tf.cluster as c\n"
          "import sys\n"
          "for old, new in (('ndq_tf.launch', c.launch), "
          "('ndq_tf.distribute.tf_config', c.tf_config), "
          "('ndq_tf.distribute.startup_watchdog', c.startup_watchdog)):\n"
          "  assert sys.modules[old] is new, old\n")
  proc = _python(code)
  assert proc.returncode == 0, proc.stderr
  for new in ("ndq_tf.cluster.launch", "ndq_tf.cluster.tf_config",
              "ndq_tf.cluster.startup_watchdog"):
    assert "DeprecationWarning: " in proc.stderr and new in proc.stderr


@pytest.mark.parametrize("package", [ndq_tf, ndq_tf.core, ndq_tf.distribute],
                         ids=["ndq_tf", "ndq_tf.core", "ndq_tf.distribute"])
def test_every_public_name_resolves_and_is_listed(package):
  for name in package.__all__:
    assert getattr(package, name) is not None, name
  assert set(package.__all__) <= set(dir(package))


def test_names_are_the_defining_modules_objects():
  from ndq_tf.codecs import dithered  # pylint: disable=g-import-not-at-top
  from ndq_tf.distribute import multi_worker  # pylint: disable=g-import-not-at-top
  assert ndq_tf.DitheredCodec is dithered.DitheredCodec
  assert (ndq_tf.MultiWorkerMirroredStrategy is
          ndq_tf.distribute.MultiWorkerMirroredStrategy is
          multi_worker.MultiWorkerMirroredStrategy)
  # Submodules read as attributes, as an eager __init__ made them.
  assert ndq_tf.core.engine.SEED_TAG == 0x4E445154
  assert ndq_tf.core.cost_model.TRANSPORTS


def test_unknown_name_is_an_attribute_error():
  with pytest.raises(AttributeError, match="'ndq_tf' has no attribute "
                     "'NoSuchCodec'"):
    ndq_tf.NoSuchCodec  # pylint: disable=pointless-statement
  assert not hasattr(ndq_tf.distribute, "no_such_module")
