"""Gradients are compressed by every common route, or a warning says why not (#19).

`ndq_tf.MirroredStrategy` on 4 logical CPUs (tests/conftest.py), both
transports. The routes (tests/multi_worker_scripts/gradient_routes_worker.py):
Keras 3 `fit`, tf_keras `fit` (`import tf_keras`; `tf.keras` with
`TF_USE_LEGACY_KERAS=1` in a fresh process), TF's low-level loop
(`batch_reduce_to(SUM, grads_and_vars)` + `extended.update`), and the
routes nothing recognises (`ReplicaContext.all_reduce` of gradients then
an update; a tf_keras optimizer told to skip its aggregation), which
travel losslessly with a warning and a count. The multi-worker half is
tests/integration/test_gradient_routes_multi_worker.py.
"""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import multi_worker_job
import ndq_tf
from ndq_tf.distribute import gradient_detection

NUM_REPLICAS = 4
TRANSPORTS = ("all_gather", "all_reduce")
WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "gradient_routes_worker.py")


routes = multi_worker_job.load_script(WORKER, "gradient_routes_worker")


def _devices(n=NUM_REPLICAS):
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  assert len(devices) >= n, devices
  return devices[:n]


def _strategy(transport):
  return ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=1),
                                 devices=_devices(), exchange=transport)


#: Elements of the MLP's trainable variables of at least min_elements=256.
COMPRESSIBLE = routes.INPUTS * routes.HIDDEN + routes.HIDDEN + (
    routes.HIDDEN * routes.CLASSES)


@pytest.fixture(autouse=True)
def _fresh_warnings():
  gradient_detection._WARNED.clear()  # pylint: disable=protected-access
  yield


_RUNS = {}


def _run(transport, route):
  """`(strategy, result)` of `route` on a fresh strategy, run once per test
  file and shared by the checks that only read it (not by those that count
  warnings, which need a strategy of their own)."""
  if (transport, route) not in _RUNS:
    strategy = _strategy(transport)
    _RUNS[transport, route] = strategy, routes.run_route(strategy, route)
  return _RUNS[transport, route]


@pytest.fixture(scope="module", params=TRANSPORTS)
def keras3(request):
  """The Keras 3 route's results on the same model: the reference."""
  return request.param, _run(request.param, "keras3")[1]


def _check_compressed(result, reference, transport):
  stats = result["stats"]
  assert result["exchanges"] == routes.STEPS, result
  assert stats["transport"] == transport
  assert stats["compressed_elements"] == COMPRESSIBLE > 0
  bits = stats["sent_bits_per_element"]
  ref = reference["stats"]["sent_bits_per_element"]
  assert abs(bits / ref - 1.0) <= 0.10, (bits, ref)
  assert result["replicas_identical"]
  assert result["unrecognised_steps"] == 0
  assert result["uncompressed_reductions"] == 0
  assert not result["warnings"], result["warnings"]


def test_keras3_fit_compresses(keras3):
  transport, result = keras3
  _check_compressed(result, result, transport)
  # CompressionStats logged the same numbers under Keras 3's fit.
  assert result["logged"]["sent_bits_per_element"] == pytest.approx(
      result["stats"]["sent_bits_per_element"])


def test_tf_keras_fit_compresses_with_the_same_bits(keras3):
  pytest.importorskip("tf_keras")
  transport, reference = keras3
  result = _run(transport, "tf_keras")[1]
  _check_compressed(result, reference, transport)
  # CompressionStats works as a tf_keras callback, with the same keys.
  for key in ("sent_bits_per_element", "compression_ratio",
              "link_compression_ratio"):
    assert result["logged"][key] == pytest.approx(result["stats"][key])


def test_low_level_batch_reduce_to_loop_compresses(keras3):
  transport, reference = keras3
  result = _run(transport, "low_level")[1]
  _check_compressed(result, reference, transport)


def test_low_level_reduce_to_per_gradient_compresses(keras3):
  # One `reduce_to` per gradient is one compressed exchange per variable of
  # at least `min_elements` (3 of the 4) and step; the telemetry's last
  # call is the last of them (w2). Before, TF sent each to a
  # ReductionToOneDevice of its own, losslessly and in silence.
  transport, _ = keras3
  result = routes.run_route(_strategy(transport), "reduce_to")
  stats = result["stats"]
  assert result["exchanges"] == 3 * routes.STEPS, result
  assert stats["transport"] == transport
  assert stats["compressed_elements"] == routes.HIDDEN * routes.CLASSES
  assert stats["sent_bits_per_element"] < 8.0  # float32 sends 32.
  assert result["replicas_identical"]
  assert result["unrecognised_steps"] == 0
  # b2 alone (10 elements) is a gradient aggregation with nothing to
  # compress, counted once per step.
  assert result["uncompressed_reductions"] == routes.STEPS
  assert not result["warnings"], result["warnings"]


def test_legacy_tf_keras_fit_compresses_in_a_fresh_process():
  """`tf.keras` with TF_USE_LEGACY_KERAS=1 (read when TF is imported).

  On the all-gather only: which Keras computed the gradients is told apart
  before any exchange, and
  tests/integration/test_gradient_routes_multi_worker.py runs this route on
  both exchanges.
  """
  pytest.importorskip("tf_keras")
  transport = "all_gather"
  reference = _run(transport, "keras3")[1]
  env = multi_worker_job.env()
  env["TF_USE_LEGACY_KERAS"] = "1"
  out = subprocess.run(
      [sys.executable, WORKER, "--strategy", "mirrored", "--transport",
       transport, "--routes", "legacy", "--replicas", str(NUM_REPLICAS)],
      env=env, cwd=multi_worker_job.ROOT, capture_output=True, text=True,
      timeout=300, check=False)
  lines = [line for line in out.stdout.splitlines()
           if line.startswith(routes.MARKER + " ")]
  assert out.returncode == 0 and lines, out.stdout[-5000:] + out.stderr[-5000:]
  result = json.loads(lines[0].split(" ", 1)[1])["results"][transport][
      "legacy"]
  assert "error" not in result, result
  _check_compressed(result, reference, transport)
  # The same model from the same seed trains to the same bits as tf_keras
  # imported directly: one Keras, two names.
  direct = _run(transport, "tf_keras")[1]
  assert result["sha256"] == direct["sha256"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("route", routes.UNRECOGNISED)
def test_unrecognised_routes_warn_once_and_are_counted(route, transport,
                                                       caplog):
  if route == "tf_keras_skip":
    pytest.importorskip("tf_keras")
  strategy = _strategy(transport)
  with caplog.at_level(logging.WARNING):
    result = routes.run_route(strategy, route)
  assert result["exchanges"] == 0  # Lossless: nothing recognised them.
  assert result["replicas_identical"]
  # Counted per step (the check is made when the step is traced).
  assert result["unrecognised_steps"] == routes.STEPS
  assert result["stats"]["unrecognised_gradient_steps"] == routes.STEPS
  warned = [m for m in result["warnings"] if "did not recognise" in m]
  assert len(warned) == 1, result["warnings"]
  assert "ndq_tf.distribute.compressed()" in warned[0]
  if route == "tf_keras_skip":
    assert "tf_keras" in warned[0] and "SGD" in warned[0], warned[0]
  # Once: a second run by the same route does not warn again.
  again = routes.run_route(strategy, route)
  assert not [m for m in again["warnings"] if "did not recognise" in m]
  assert again["unrecognised_steps"] == routes.STEPS


@pytest.mark.parametrize("route,exchanges", [
    ("all_reduce_compressed", routes.STEPS), ("all_reduce_uncompressed", 0)])
def test_scoped_all_reduces_are_the_users_choice_and_not_warned(route,
                                                                exchanges):
  result = routes.run_route(_strategy("all_gather"), route)
  assert result["exchanges"] == exchanges
  assert result["unrecognised_steps"] == 0
  assert not result["warnings"], result["warnings"]
  assert result["replicas_identical"]


def test_low_level_loop_user_all_reduce_and_strategy_reduce_stay_exact():
  """Beside a compressed batch_reduce_to, other reductions equal TF's."""
  strategy = _run("all_gather", "low_level")[0]
  theirs = tf.distribute.MirroredStrategy(
      _devices(), cross_device_ops=tf.distribute.ReductionToOneDevice())

  def per_replica(s):
    return s.experimental_distribute_values_from_function(
        lambda ctx: tf.random.stateless_normal(
            [1000], [ctx.replica_id_in_sync_group, 3]))

  for op in ("SUM", "MEAN"):
    np.testing.assert_array_equal(
        strategy.reduce(op, per_replica(strategy), axis=None).numpy(),
        theirs.reduce(op, per_replica(theirs), axis=None).numpy())

  # A batch_reduce_to to values (not variables) is not gradient aggregation.
  values = per_replica(strategy)
  got = strategy.extended.batch_reduce_to("SUM", [(values, values)])
  want = theirs.extended.batch_reduce_to(
      "SUM", [(per_replica(theirs), per_replica(theirs))])
  np.testing.assert_array_equal(got[0].values[0].numpy(),
                                want[0].values[0].numpy())


def _tf_keras_sync_bn_model(strategy, K):
  K.utils.set_random_seed(0)
  with strategy.scope():
    model = K.Sequential([
        K.Input((routes.INPUTS,)),
        K.layers.Dense(256),
        K.layers.BatchNormalization(synchronized=True, momentum=0.5),
        K.layers.ReLU(),
        K.layers.Dense(routes.CLASSES),
    ])
    model.compile(K.optimizers.Adam(4e-3),
                  K.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  return model


def test_tf_keras_sync_batch_norm_and_metrics_equal_tf_bitwise():
  K = pytest.importorskip("tf_keras")
  x, y = routes._data()  # pylint: disable=protected-access
  x = x + 5.0  # Channel means large against their spread.
  theirs = tf.distribute.MirroredStrategy(
      _devices(), cross_device_ops=tf.distribute.ReductionToOneDevice())
  reference = _tf_keras_sync_bn_model(theirs, K)
  strategy = _strategy("all_gather")
  model = _tf_keras_sync_bn_model(strategy, K)
  model.set_weights(reference.get_weights())
  assert model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True) == (
      reference.evaluate(x, y, batch_size=64, verbose=0, return_dict=True))
  # One step from the same weights: the statistics come from the forward
  # pass, before any compressed gradient is applied.
  for m in (model, reference):
    m.fit(x[:64], y[:64], batch_size=64, epochs=1, shuffle=False, verbose=0)
  bn, bn_ref = model.layers[1], reference.layers[1]
  for ours, want in ((bn.moving_mean, bn_ref.moving_mean),
                     (bn.moving_variance, bn_ref.moving_variance)):
    np.testing.assert_array_equal(
        strategy.experimental_local_results(ours)[0].numpy(),
        theirs.experimental_local_results(want)[0].numpy())
  assert int(strategy.compression_step.numpy()) == 1  # The gradients.


def test_single_replica_strategy_warns_once(caplog):
  gradient_detection._WARNED.clear()  # pylint: disable=protected-access
  with caplog.at_level(logging.WARNING):
    ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(), devices=_devices(1))
    ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(), devices=_devices(1))
  warned = [r.getMessage() for r in caplog.records
            if "one replica" in r.getMessage()]
  assert len(warned) == 1, warned
  assert "set_logical_device_configuration" in warned[0]


def test_keras3_loss_scale_optimizer_refuses_a_tf_keras_optimizer():
  tf_keras = pytest.importorskip("tf_keras")
  with pytest.raises(TypeError, match="Keras 3 feature") as info:
    ndq_tf.keras.LossScaleOptimizer(tf_keras.optimizers.SGD(0.1))
  message = str(info.value)
  assert "inner_optimizer" in message
  assert tf_keras.__version__ in message  # Both versions named.
  import keras  # pylint: disable=g-import-not-at-top
  assert keras.__version__ in message


def test_tf_keras_loss_scale_optimizer_fit_compresses():
  K = pytest.importorskip("tf_keras")
  strategy = _strategy("all_gather")
  K.utils.set_random_seed(1)
  with strategy.scope():
    model = K.Sequential([K.Input((routes.INPUTS,)),
                          K.layers.Dense(routes.HIDDEN, activation="relu"),
                          K.layers.Dense(routes.CLASSES)])
    model.compile(
        K.mixed_precision.LossScaleOptimizer(K.optimizers.SGD(0.1)),
        K.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = routes._data()  # pylint: disable=protected-access
  model.fit(x, y, batch_size=routes.GLOBAL_BATCH, epochs=1, verbose=0)
  assert int(strategy.compression_step.numpy()) == routes.STEPS
  assert strategy.compression_stats()["compressed_elements"] == COMPRESSIBLE


def test_renamed_telemetry_keeps_deprecated_aliases():
  strategy = _run("all_gather", "low_level")[0]
  ops = strategy.compressed_all_reduce
  stats = ops.stats()
  for name, want in (("last_wire_bits", stats["sent_bits"]),
                     ("wire_bits_per_element",
                      stats["sent_bits_per_element"])):
    with pytest.warns(DeprecationWarning, match=r"stats\(\)\[") as record:
      assert getattr(ops, name) == want
    assert name in str(record[0].message)
  with pytest.warns(DeprecationWarning, match="overload_rate"):
    assert np.isnan(ops.last_overload_rate)  # No nested codec.
