"""Tests of `ndq_tf.core.transports.all_gather` (one sender per worker).

The exchange through it runs on real worker processes in
integration/test_multi_worker.py and integration/test_strategy_parity.py.
"""

import pytest

from ndq_tf.core import exchanges
from ndq_tf.core.transports import all_gather


def test_the_all_gather_exchange_frames_with_the_transports_header():
  assert exchanges.get("all_gather").framing_words == all_gather.HEADER_WORDS


def test_framing_pads_every_row_to_the_longest_payload():
  transport = all_gather.CollectiveAllGatherTransport(None, 3, 1, "/cpu:0")
  assert transport.num_senders == 3
  # This worker's row: the header and its padding to the longest payload.
  assert transport.framing_bits([4, 9, 6], [1]) == 32 * all_gather.HEADER_WORDS
  assert transport.framing_bits([4, 9, 6], [0]) == 32 * (
      all_gather.HEADER_WORDS + 5)


def test_a_worker_id_out_of_range_is_named():
  with pytest.raises(ValueError, match=r"`worker_id` must be in \[0, 2\). "
                     r"Received: worker_id=2"):
    all_gather.CollectiveAllGatherTransport(None, 2, 2, "/cpu:0")
