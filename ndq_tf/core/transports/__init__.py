"""Transports: they move packed payloads and know nothing of codecs."""

from ndq_tf.core.transports.all_gather import AllGatherTransport
from ndq_tf.core.transports.all_to_all import AllToAllTransport
from ndq_tf.core.transports.all_to_all import DeviceAllToAllTransport
from ndq_tf.core.transports.base import Reception
from ndq_tf.core.transports.base import Reduction
from ndq_tf.core.transports.base import SummingTransport
from ndq_tf.core.transports.base import Transport
from ndq_tf.core.transports.collective_sum import CollectiveSumTransport
from ndq_tf.core.transports.device_copy import DeviceCopyTransport
from ndq_tf.core.transports.device_sum import DeviceSumTransport
