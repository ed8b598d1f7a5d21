"""Tests of `ndq_tf.core.exchanges.nested_shards`: nested groups in shards.

What it refuses across processes, on its own and through the strategies.
The nested group's shards keeping the all-gather's noise state bit for bit
is tested with the reduce-scatter in test_reduce_scatter.py.
"""

import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import cost_model
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import transports
from ndq_tf.core.exchanges import nested_shards
from ndq_tf.core.exchanges import reduce_scatter
from ndq_tf.distribute.options import CompressionOptions


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")[:1]]


def test_only_the_adaptive_nested_reduce_scatter_is_refused():
  nested = dict(codec=ndq_tf.NestedDitheredCodec(coarse_ratio=3),
                reference_codec=ndq_tf.DitheredCodec(num_levels=1))
  refused = CompressionOptions(exchange="reduce_scatter", adaptive=True,
                               **nested)
  assert "across processes" in nested_shards.adaptive_refusal(refused)
  with pytest.raises(ValueError, match=r"Received: exchange='reduce_scatter', "
                     r"adaptive=True\."):
    nested_shards.check_across_processes(refused)
  for options in (
      CompressionOptions(exchange="reduce_scatter", adaptive=False, **nested),
      CompressionOptions(exchange="all_gather", adaptive=True, **nested),
      CompressionOptions("dqsg", exchange="reduce_scatter")):
    assert nested_shards.adaptive_refusal(options) is None
    nested_shards.check_across_processes(options)

def test_adaptive_nested_group_is_refused_across_processes():
  """One sender per worker: shard j's side information is on worker j only."""
  kwargs = dict(codec=ndq_tf.NestedDitheredCodec(coarse_ratio=3),
                reference_codec=ndq_tf.DitheredCodec(num_levels=1),
                exchange="reduce_scatter")
  match = ("exchange='reduce_scatter' cannot run the adaptive nested mode "
           r"\(adaptive=True.*across processes.*exchange='all_gather'")
  with pytest.raises(ValueError, match=match):
    ndq_tf.MultiWorkerMirroredStrategy(adaptive=True, **kwargs)
  # The exchange itself refuses it where a sender is in another process.
  options = CompressionOptions(adaptive=True, **kwargs)
  engine = engine_lib.ExchangeEngine(options)
  device = _devices()[0]
  gather = transports.CollectiveAllGatherTransport(lambda row: row, 2, 1,
                                                   device)
  scatter = transports.CollectiveAllToAllTransport(lambda rows: rows, gather,
                                                   2, 1, device)
  with tf.device(device):
    sender = engine_lib.LocalSender(1, device, [tf.ones([1024])])
  with pytest.raises(ValueError, match=match):
    engine.exchange({"all_gather": gather, "reduce_scatter": scatter},
                    [sender], "sum")
  # The fixed mode is carried; "auto" gathers nested groups whatever the
  # reduce-scatter's cost.
  CompressionOptions(adaptive=False, **kwargs)
  codecs = options.sender_codecs(4)
  assert reduce_scatter.EXCHANGE.bits(codecs, 2**20, 4) > 0
  assert cost_model.auto(codecs, 2**20, 4) == "all_gather"
