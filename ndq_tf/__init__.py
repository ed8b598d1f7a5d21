"""ndq_tf: dithered and nested dithered gradient compression for tf.distribute.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019.
"""

from ndq_tf import codecs
from ndq_tf import ops
from ndq_tf import theory
from ndq_tf.codecs import Codec
from ndq_tf.codecs import DitheredCodec
from ndq_tf.codecs import Float16Codec
from ndq_tf.codecs import Float32Codec
from ndq_tf.codecs import HalfDitheredCodec
from ndq_tf.codecs import NestedDitheredCodec
from ndq_tf.codecs import Payload
from ndq_tf.codecs import QSGDCodec
from ndq_tf.codecs import TernGradCodec
from ndq_tf import distribute
from ndq_tf import keras
from ndq_tf.distribute import CompressedAllReduce
from ndq_tf.distribute import MirroredStrategy
from ndq_tf.distribute import MultiWorkerMirroredStrategy
from ndq_tf.keras import CompressionStats

from ndq_tf.version import __version__
