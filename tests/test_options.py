"""Tests of `ndq_tf.distribute.options.CompressionOptions` on its own.

Moved from test_nested_allreduce.py and test_all_reduce.py; no devices.
"""

import pytest

import ndq_tf
from ndq_tf.core import cost_model
from ndq_tf.core import exchanges
from ndq_tf.distribute import options as options_lib
from ndq_tf.distribute.options import CompressionOptions


def _nested(**kwargs):
  kwargs.setdefault("num_levels", 3)
  kwargs.setdefault("coarse_ratio", 3)
  return ndq_tf.NestedDitheredCodec(**kwargs)


def _reference():
  return ndq_tf.DitheredCodec(num_levels=3)


@pytest.mark.parametrize("fraction, replicas, count", [
    (0.5, 4, 2), (0.25, 4, 1), (0.01, 4, 1), (0.9, 4, 3), (0.9, 2, 1),
    (0.5, 3, 2), (1, 4, 1), (3, 4, 3)])
def test_reference_count(fraction, replicas, count):
  options = CompressionOptions(_nested(), reference_codec=_reference(),
                               reference_group=fraction)
  assert options.reference_count(replicas) == count


def test_auto_with_a_nested_group_gathers():
  options = options_lib.CompressionOptions(
      _nested(), reference_codec=_reference())
  assert options.resolve_transport(1024, 1 << 20) == "all_gather"


@pytest.mark.parametrize("p", [2, 4, 8, 1024])
def test_auto_resolves_what_the_exchanges_pick(p):
  options = CompressionOptions(ndq_tf.DitheredCodec(num_levels=1))
  assert options.resolve_transport(p, 1 << 20) == cost_model.auto(
      options.sender_codecs(p), 1 << 20, p)


def test_transports_are_auto_and_the_exchange_names():
  assert options_lib.TRANSPORTS == ("auto",) + exchanges.NAMES
  for name in exchanges.NAMES:
    assert CompressionOptions("terngrad", transport=name).transport == name
