"""What main wrote at 2be80a5 restores with today's code (#33, compatibility).

tests/fixtures/compat_2be80a5/ holds a `tf.train.Checkpoint`, a
`.weights.h5` file and the configs of ndq_tf's serializable objects,
written by tests/fixtures/make_compat_fixtures.py with the code of commit
2be80a5, and `expected.json`: the values they hold, and the weights one
training step later. Each test restores into a freshly built model and
`ndq_tf.MirroredStrategy` with the same options, through the public API,
and asserts the same step, weights and strategy state bit for bit; the
checkpoint's object names and the `.weights.h5` keys are those of today's
saves; and a restored job takes the saved job's next step (the same
from both files; the fixture's digests of that step are those of the
CPU that wrote them, so not compared). Real TensorFlow
on 2 of the logical CPU devices of tests/conftest.py.
"""

import copy
import hashlib
import json
import pathlib

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / (
    "compat_2be80a5")
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CONFIGS = json.loads((FIXTURES / "config.json").read_text())
SETUP = EXPECTED["generator"]
GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _build():
  """The generator's model and strategy, built with today's public API."""
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  strategy = ndq_tf.MirroredStrategy(
      codec=ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                       bucket_size=64),
      reference_codec=ndq_tf.DitheredCodec(num_levels=3, bucket_size=64),
      reference_replicas=1, adaptive=True, transport="reduce_scatter",
      reduce_scatter_error_feedback=True, min_elements=64, seed=7,
      devices=devices[:SETUP["num_devices"]])
  keras.utils.set_random_seed(1)  # Not the generator's: restoring must tell.
  features = SETUP["features"]
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(features, activation="tanh", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
  return strategy, model


def _built(strategy, model):
  # What fit builds first; Keras skips the saved variables of an optimizer
  # that is not built yet.
  with strategy.scope():
    model.optimizer.build(model.trainable_variables)
  return strategy, model


def _next_step(model):
  """The generator's step after the saved ones (its data, same seed)."""
  rng = np.random.default_rng(SETUP["data_seed"])
  batch, steps = SETUP["batch"], SETUP["train_steps"] + 1
  x = rng.normal(size=(steps * batch, SETUP["features"])).astype(np.float32)
  y = (x @ rng.normal(size=(SETUP["features"], 1)) +
       0.1 * rng.normal(size=(steps * batch, 1))).astype(np.float32)
  start = SETUP["train_steps"] * batch
  model.fit(x[start:], y[start:], batch_size=batch, epochs=1, shuffle=False,
            verbose=0)


def _digest(value):
  value = np.asarray(value)
  return {"dtype": value.dtype.name, "shape": list(value.shape),
          "sha256": hashlib.sha256(
              np.ascontiguousarray(value).tobytes()).hexdigest()}


def _state(strategy, model, expected):
  """`expected`'s values, read from the live objects (see the generator)."""
  engine = strategy.compression_engine
  noise = {}
  for signature, want in expected["noise_state"].items():
    # Made at the first exchange of the plan; made now, a restored value is
    # assigned on creation (deferred restoration).
    scale, gain = engine.nested_state.variables_for(signature,
                                                    *want["scale"]["shape"])
    noise[signature] = {"scale": _digest(scale.numpy()),
                        "gain": _digest(gain.numpy())}
  feedback = {}
  for signature, want in expected["feedback"].items():
    feedback[signature] = _digest(engine.feedback.variable_for(
        signature, *want["shape"]).numpy())
  return {
      "compression_step": int(strategy.compression_step.numpy()),
      "optimizer_iterations": int(model.optimizer.iterations.numpy()),
      "weights": {w.path: _digest(w.numpy()) for w in model.weights},
      "optimizer_variables": {v.path: _digest(v.numpy())
                              for v in model.optimizer.variables},
      "noise_state": noise,
      "feedback": feedback,
  }


def _assert_state(strategy, model, expected):
  got = _state(strategy, model, expected)
  assert got["compression_step"] == expected["compression_step"]
  assert got["optimizer_iterations"] == expected["optimizer_iterations"]
  for key in ("weights", "optimizer_variables", "noise_state", "feedback"):
    assert got[key] == expected[key], key


def _h5_values(path):
  values = {}

  def visit(name, item):
    if isinstance(item, h5py.Dataset):
      values[name] = _digest(item[()])

  with h5py.File(path, "r") as f:
    f.visititems(visit)
  return values


def _checkpoint(model):
  return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


@pytest.fixture(autouse=True)
def _fresh_keras_names():
  # Keras numbers unnamed objects per session; the fixture's optimizer
  # variable paths are those of the first model of a session.
  keras.backend.clear_session()


def test_fixtures_were_written_by_main_at_2be80a5():
  assert EXPECTED["written_by"]["commit"].startswith("2be80a5")
  size = sum(p.stat().st_size for p in FIXTURES.iterdir())
  assert size < 200_000, size


def test_checkpoint_restores_to_the_same_step_and_state(tmp_path):
  strategy, model = _built(*_build())
  status = _checkpoint(model).restore(tf.train.latest_checkpoint(FIXTURES))
  status.assert_existing_objects_matched()
  _assert_state(strategy, model, EXPECTED["saved"])
  # Every saved value found its object (the lazily made noise state and
  # residuals included) ...
  status.assert_consumed()
  # ... under the names today's code saves it with, telemetry included.
  path = _checkpoint(model).write(str(tmp_path / "ckpt"))
  resaved = {name: _digest(tf.train.load_variable(path, name))
             for name, _ in tf.train.list_variables(path) if name != GRAPH}
  # `write` keeps no save counter; the fixture's `save` did.
  expected = {name: value for name, value in
              EXPECTED["checkpoint_values"].items()
              if not name.startswith("save_counter/")}
  assert resaved == expected


def test_weights_file_loads_to_the_same_step_and_state(tmp_path):
  strategy, model = _built(*_build())
  model.load_weights(str(FIXTURES / "model.weights.h5"))
  _assert_state(strategy, model, EXPECTED["saved"])
  # Today's code saves the same keys and values.
  model.save_weights(str(tmp_path / "m.weights.h5"))
  assert _h5_values(tmp_path / "m.weights.h5") == _h5_values(
      FIXTURES / "model.weights.h5")


def test_restored_job_takes_the_saved_jobs_next_step():
  """From the checkpoint or the `.weights.h5` file, the same next step.

  Both restored jobs take step `saved + 1` of the dither, Adam's iteration
  `saved + 1`, and end it bitwise identical: weights, optimizer state,
  noise state and residuals. The fixture's own digests of that step
  (`after_one_more_step`) are not compared: they hold the bits of the
  machine that wrote them, and a tanh or a reduction of another CPU's
  vector width (AVX-512 against AVX2) gives other bits from the same
  restored state.
  """
  states = []
  for restore in ("checkpoint", "weights"):
    strategy, model = _build()
    if restore == "checkpoint":
      _checkpoint(model).restore(tf.train.latest_checkpoint(
          FIXTURES)).assert_existing_objects_matched()
    else:
      _built(strategy, model)
      model.load_weights(str(FIXTURES / "model.weights.h5"))
    # The noise state and the residuals are made by the step itself and
    # restored on creation, before they are read.
    _next_step(model)
    states.append(_state(strategy, model, EXPECTED["after_one_more_step"]))
  want = EXPECTED["after_one_more_step"]
  for state in states:
    assert state["compression_step"] == want["compression_step"]
    assert state["optimizer_iterations"] == want["optimizer_iterations"]
  # Values in the model's order (the second model's layer names differ).
  first, second = ({k: list(v.values()) if isinstance(v, dict) else v
                    for k, v in state.items()} for state in states)
  assert first == second


def _without_module(config):
  """A Keras object config, without where the class lives (it may move)."""
  if isinstance(config, dict):
    return {k: _without_module(v) for k, v in config.items()
            if k != "module" or "registered_name" not in config}
  if isinstance(config, list):
    return [_without_module(v) for v in config]
  return config


def _revive(config):
  # Keras' LossScaleOptimizer.from_config pops from the dict it is given.
  revived = keras.saving.deserialize_keras_object(copy.deepcopy(config))
  assert _without_module(keras.saving.serialize_keras_object(revived)) == (
      _without_module(config))
  return revived


def test_codec_configs_and_specs_revive_to_equal_codecs():
  for config in CONFIGS["codecs"]:
    codec = _revive(config)
    assert codec == getattr(ndq_tf, config["class_name"])(**config["config"])
  for name, config in CONFIGS["codec_get_configs"]:
    cls = getattr(ndq_tf, name)
    assert cls.from_config(config).get_config() == config
  for spec, config in CONFIGS["specs"].items():
    assert ndq_tf.codecs.get(spec) == _revive(config) == ndq_tf.codecs.get(
        config), spec


def test_strategy_configs_revive_to_equal_objects():
  ops = _revive(CONFIGS["compressed_all_reduce"])
  assert isinstance(ops, ndq_tf.CompressedAllReduce)
  strategy, _ = _build()
  config = CONFIGS["compressed_all_reduce_get_config"]
  assert strategy.compressed_all_reduce.get_config() == config
  assert ndq_tf.CompressedAllReduce.from_config(config).get_config() == config
  options = ndq_tf.distribute.CompressionOptions
  config = CONFIGS["compression_options_get_config"]
  assert options.from_config(config) == options(
      "dqsg:num_levels=3", min_elements=1024, seed=5, transport="all_gather",
      chunk_elements=None)
  assert options.from_config(config).get_config() == config


def test_keras_object_configs_revive():
  # `import ndq_tf` is lazy: Keras finds a class once its name was used.
  assert ndq_tf.CompressionStats and ndq_tf.keras.LossScaleOptimizer
  callback = _revive(CONFIGS["compression_stats"])
  assert isinstance(callback, ndq_tf.CompressionStats)
  optimizer = _revive(CONFIGS["loss_scale_optimizer"])
  assert isinstance(optimizer, ndq_tf.keras.LossScaleOptimizer)
  assert float(optimizer.initial_scale) == 256.0
  assert float(optimizer.inner_optimizer.learning_rate) == pytest.approx(0.1)
