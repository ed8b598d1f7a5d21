"""Compressed all-reduce for `tf.distribute` strategies."""

from ndq_tf.distribute import telemetry
from ndq_tf.distribute import transports
from ndq_tf.distribute.cross_device_ops import CompressedAllReduce
from ndq_tf.distribute.engine import ExchangeEngine
from ndq_tf.distribute.fusion import FusionPlan
from ndq_tf.distribute.fusion import decode_sum
from ndq_tf.distribute.fusion import encode_fused
from ndq_tf.distribute.mirrored import MirroredStrategy
from ndq_tf.distribute.multi_worker import MultiWorkerMirroredStrategy
from ndq_tf.distribute.options import DEFAULT_CHUNK_ELEMENTS
from ndq_tf.distribute.options import CompressionOptions
from ndq_tf.distribute.scope import compressed
from ndq_tf.distribute.scope import uncompressed
