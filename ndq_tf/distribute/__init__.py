"""Compressed all-reduce for `tf.distribute` strategies.

The names below are imported at first use (`ndq_tf._lazy`), so that the
old paths of the standard-library modules now in `ndq_tf.cluster`
(`tf_config`, `startup_watchdog`) load without TensorFlow.
"""

from ndq_tf import _lazy

_NAMES = {
    "CompressedAllReduce": "ndq_tf.distribute.cross_device_ops",
    "ExchangeEngine": "ndq_tf.distribute.engine",
    "FusionPlan": "ndq_tf.distribute.fusion",
    "decode_sum": "ndq_tf.distribute.fusion",
    "encode_fused": "ndq_tf.distribute.fusion",
    "MirroredStrategy": "ndq_tf.distribute.mirrored",
    "MultiWorkerMirroredStrategy": "ndq_tf.distribute.multi_worker",
    "DEFAULT_CHUNK_ELEMENTS": "ndq_tf.distribute.options",
    "CompressionOptions": "ndq_tf.distribute.options",
    "compressed": "ndq_tf.distribute.scope",
    "uncompressed": "ndq_tf.distribute.scope",
}

__all__ = sorted(["telemetry", "transports", *_NAMES])

__getattr__, __dir__ = _lazy.attach(__name__, _NAMES)
