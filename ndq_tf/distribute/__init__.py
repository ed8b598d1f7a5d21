"""Compressed all-reduce for `tf.distribute` strategies: the adapters.

`CompressedAllReduce` (a `tf.distribute.CrossDeviceOps`), the strategies
that plug it in, and the options they share, over the exchange core
(`ndq_tf.core`), which some names below re-export.

The names below are imported at first use (`ndq_tf._lazy`), so that the
old paths of the standard-library modules now in `ndq_tf.cluster`
(`tf_config`, `startup_watchdog`) load without TensorFlow. The old paths of
the modules now in `ndq_tf.core` (`ndq_tf.distribute.telemetry`,
`.transports`, `.engine`, ...) import those modules and warn
(`ndq_tf._deprecation`).
"""

from ndq_tf import _deprecation
from ndq_tf import _lazy

_NAMES = {
    "CompressedAllReduce": "ndq_tf.distribute.cross_device_ops",
    "ExchangeEngine": "ndq_tf.core.engine",
    "FusionPlan": "ndq_tf.core.fusion",
    "decode_sum": "ndq_tf.core.fusion",
    "encode_fused": "ndq_tf.core.fusion",
    "MirroredStrategy": "ndq_tf.distribute.mirrored",
    "MultiWorkerMirroredStrategy": "ndq_tf.distribute.multi_worker",
    "DEFAULT_CHUNK_ELEMENTS": "ndq_tf.distribute.options",
    "CompressionOptions": "ndq_tf.distribute.options",
    "compressed": "ndq_tf.core.scope",
    "uncompressed": "ndq_tf.core.scope",
}

__all__ = sorted(_NAMES)

# Modules that moved to the exchange core (deprecated paths, one release).
_deprecation.moved_modules({
    f"ndq_tf.distribute.{name}": f"ndq_tf.core.{name}"
    for name in ("engine", "exchanges", "fingerprint", "fusion",
                 "fusion_codec", "fusion_plan", "fusion_sum", "nested_state",
                 "ready_order", "scope", "telemetry", "tf_internals",
                 "transports")})

__getattr__, __dir__ = _lazy.attach(__name__, _NAMES)
