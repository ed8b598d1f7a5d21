"""The exchange core: a compressed all-reduce that knows no strategy.

Below `ndq_tf.distribute` (the `tf.distribute` adapters), above
`ndq_tf.codecs` (tests/test_layers.py has the order):

* `engine`: what is compressed, the fusion plan, the seeds, the step;
* `fusion`, `fusion_plan`, `fusion_codec`, `fusion_sum`: one buffer per
  call, encoded, decoded and summed in a fixed order;
* `exchanges`: the algorithms (all-gather, integer all-reduce,
  reduce-scatter), listed once; `cost_model`: their bits, work and
  `exchange="auto"`'s choice;
* `transports`: what moves the bytes, knowing no codec;
* `nested_state`, `fingerprint`, `ready_order`, `telemetry`: the noise
  state of nested senders, what every receiver must agree on, the order
  gradients become ready in, and what the last exchange did;
* `scope`: `compressed()` and `uncompressed()`, which the engine reads;
* `tf_internals`: the one module that reaches into TensorFlow's and
  Keras' internals (the adapters above use it too).

Submodules are imported at first use (`ndq_tf._lazy`).
"""

from ndq_tf import _lazy

__all__ = [
    "cost_model",
    "engine",
    "exchanges",
    "fingerprint",
    "fusion",
    "fusion_codec",
    "fusion_plan",
    "fusion_sum",
    "nested_state",
    "ready_order",
    "scope",
    "telemetry",
    "tf_internals",
    "transports",
]

__getattr__, __dir__ = _lazy.attach(__name__, {})
