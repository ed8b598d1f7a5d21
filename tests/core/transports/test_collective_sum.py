"""Tests of `ndq_tf.core.transports.collective_sum` (one sender per worker).

The integer sum through it runs on real worker processes in
integration/test_all_reduce_multi_worker.py.
"""

import pytest

from ndq_tf.core import exchanges
from ndq_tf.core.transports import collective_sum


def test_the_all_reduce_exchange_frames_with_the_transports_stamp():
  assert (exchanges.get("all_reduce").framing_words ==
          collective_sum.STAMP_WORDS)


def test_a_worker_id_out_of_range_is_named():
  with pytest.raises(ValueError, match=r"`worker_id` must be in \[0, 2\). "
                     r"Received: worker_id=2"):
    collective_sum.CollectiveSumTransport(None, 2, 2, "/cpu:0")
