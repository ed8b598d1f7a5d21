"""Transports: they move packed `int32` payloads and know nothing of codecs."""

from ndq_tf.distribute.transports.all_gather import AllGatherTransport
from ndq_tf.distribute.transports.base import Reception
from ndq_tf.distribute.transports.base import Transport
from ndq_tf.distribute.transports.device_copy import DeviceCopyTransport
