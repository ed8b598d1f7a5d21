"""Codecs: configured quantizers with a common encode/decode interface."""

from ndq_tf.codecs.base import Codec
from ndq_tf.codecs.base import Payload
from ndq_tf.codecs.baselines import BFloat16Codec
from ndq_tf.codecs.baselines import Float16Codec
from ndq_tf.codecs.baselines import Float32Codec
from ndq_tf.codecs.baselines import QSGDCodec
from ndq_tf.codecs.baselines import TernGradCodec
from ndq_tf.codecs.bucketed import BucketedCodec
from ndq_tf.codecs.dithered import DitheredCodec
from ndq_tf.codecs.dithered import HalfDitheredCodec
from ndq_tf.codecs.entropy_coded import EntropyCodedDitheredCodec
from ndq_tf.codecs.low_rank import PowerSGD
from ndq_tf.codecs.nested import NestedDitheredCodec
from ndq_tf.codecs.low_rank import get
from ndq_tf.codecs.registry import serialize
