"""Compressed all-reduce for `tf.distribute` strategies."""

from ndq_tf.distribute.cross_device_ops import CompressedAllReduce
from ndq_tf.distribute.cross_device_ops import uncompressed
from ndq_tf.distribute.fusion import FusionPlan
from ndq_tf.distribute.fusion import decode_sum
from ndq_tf.distribute.fusion import encode_fused
from ndq_tf.distribute.mirrored import MirroredStrategy
from ndq_tf.distribute.multi_worker import MultiWorkerMirroredStrategy
