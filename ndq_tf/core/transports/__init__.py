"""Transports: they move packed payloads and know nothing of codecs.

Each is named for what it moves and how (`base`): device copies and sums
between the replicas of one process, TF's collectives between workers.
"""

from ndq_tf import _deprecation
from ndq_tf.core.transports.all_gather import CollectiveAllGatherTransport
from ndq_tf.core.transports.all_to_all import CollectiveAllToAllTransport
from ndq_tf.core.transports.all_to_all import DeviceAllToAllTransport
from ndq_tf.core.transports.base import Reception
from ndq_tf.core.transports.base import Reduction
from ndq_tf.core.transports.base import SummingTransport
from ndq_tf.core.transports.base import Transport
from ndq_tf.core.transports.collective_sum import CollectiveSumTransport
from ndq_tf.core.transports.device_copy import DeviceCopyTransport
from ndq_tf.core.transports.device_sum import DeviceSumTransport

__all__ = [
    "CollectiveAllGatherTransport",
    "CollectiveAllToAllTransport",
    "CollectiveSumTransport",
    "DeviceAllToAllTransport",
    "DeviceCopyTransport",
    "DeviceSumTransport",
    "Reception",
    "Reduction",
    "SummingTransport",
    "Transport",
]

# Renamed for what they move (deprecated names, one release).
__getattr__ = _deprecation.moved_attributes(__name__, {
    "AllGatherTransport":
        "ndq_tf.core.transports.all_gather.CollectiveAllGatherTransport",
    "AllToAllTransport":
        "ndq_tf.core.transports.all_to_all.CollectiveAllToAllTransport",
})
