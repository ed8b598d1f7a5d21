"""The digits MLP recipe shared by the training tests.

tests/test_mirrored_training.py compares DQSG with float32 and
tests/test_nested_allreduce.py compares NDQSG groups with DQSG: both
comparisons must train the same model on the same split, so both use this
one recipe (scikit-learn's digits, MLP 64-256-10, Adam 4e-3, batch 128,
8 epochs, Keras seed 1 unless told).
"""

import keras


def load():
  """`(x_train, x_test, y_train, y_test)`: a fixed stratified 75/25 split."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  x = (data.data / 16.0).astype("float32")
  return model_selection.train_test_split(
      x, data.target, test_size=0.25, random_state=0, stratify=data.target)


def fit(strategy, data, seed=1, callbacks=None):
  """Trains the recipe's model under `strategy`; returns `(model, history)`.

  `seed` sets Keras' seed (initial weights, batch order); 1 by default.
  `callbacks` go to `model.fit`.
  """
  x_train, _, y_train, _ = data
  keras.utils.set_random_seed(seed)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(4e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  history = model.fit(x_train, y_train, batch_size=128, epochs=8,
                      shuffle=True, verbose=0, callbacks=callbacks)
  return model, history
