"""ndq_tf: dithered and nested dithered gradient compression for tf.distribute.

The names below are imported at first use (`ndq_tf._lazy`): `import ndq_tf`
alone loads no TensorFlow, so `python -m ndq_tf.launch` starts workers
without it.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019.
"""

from ndq_tf import _deprecation
from ndq_tf import _lazy

from ndq_tf.version import __version__

_NAMES = {
    "BFloat16Codec": "ndq_tf.codecs",
    "Codec": "ndq_tf.codecs",
    "DitheredCodec": "ndq_tf.codecs",
    "EntropyCodedDitheredCodec": "ndq_tf.codecs",
    "Float16Codec": "ndq_tf.codecs",
    "Float32Codec": "ndq_tf.codecs",
    "HalfDitheredCodec": "ndq_tf.codecs",
    "NestedDitheredCodec": "ndq_tf.codecs",
    "Payload": "ndq_tf.codecs",
    "PowerSGD": "ndq_tf.codecs",
    "QSGDCodec": "ndq_tf.codecs",
    "TernGradCodec": "ndq_tf.codecs",
    "CompressedAllReduce": "ndq_tf.distribute",
    "MirroredStrategy": "ndq_tf.distribute",
    "MultiWorkerMirroredStrategy": "ndq_tf.distribute",
    "CompressionStats": "ndq_tf.keras",
}

__all__ = sorted(["codecs", "core", "distribute", "keras", "ops", "theory",
                  *_NAMES])

# Merged into `theory` (deprecated path, one release).
_deprecation.moved_modules({"ndq_tf.reduce_scatter_theory": "ndq_tf.theory"})

__getattr__, __dir__ = _lazy.attach(__name__, _NAMES)
