"""The exchange in chunks (issue #12): the same bits as without chunks.

`FusionPlan.chunks` cuts the fused buffer on bucket boundaries (or, for
codecs without buckets, between tensors); the engine encodes, moves, decodes
and sums every chunk with ops of its own, each chunk drawing the dither it
has in the whole buffer. These tests check that the result is bit for bit
the one of the exchange without chunks, on every replica, for every codec
and both transports, nested senders (their statistics and adaptive state
included) too; and the plan's arithmetic. Real processes:
tests/integration/test_all_reduce_multi_worker.py (`--chunk_elements`).
"""

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import fusion
from ndq_tf.distribute import options as options_lib

NUM_REPLICAS = 4
SEED = 11
#: Tensors that do not fill their last bucket, so chunks cross tensors and
#: padding.
SHAPES = [(3000,), (37, 41), (700,), (5, 300)]
#: Fewer, smaller tensors for chunks of one bucket each (`chunk_elements=1`,
#: ops built per chunk): 4 chunks of 512-element buckets, 12 of 128, one per
#: tensor without buckets; every tensor's last bucket padded.
ONE_BUCKET_SHAPES = [(700,), (5, 61), (300,)]


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")[:NUM_REPLICAS]]


def _gradients(step, shapes=SHAPES):
  rng = np.random.default_rng(step)
  spread = np.exp(rng.uniform(-1.0, 1.0, size=NUM_REPLICAS))
  return [[(rng.standard_normal(s) * spread[r]).astype(np.float32)
           for s in shapes] for r in range(NUM_REPLICAS)]


def _run(steps=2, reduce_op="sum", shapes=SHAPES, **kwargs):
  """`steps` compressed batch_reduces; per step and replica, one flat array."""
  strategy = ndq_tf.MirroredStrategy(devices=_devices(), seed=SEED, **kwargs)
  out = []
  for step in range(steps):
    grads = _gradients(step, shapes)
    pairs = []
    for i in range(len(shapes)):
      value = strategy.experimental_distribute_values_from_function(
          lambda ctx, i=i: tf.constant(grads[ctx.replica_id_in_sync_group][i]))
      pairs.append((value, value))
    with ndq_tf.distribute.compressed():
      reduced = strategy.extended.batch_reduce_to(reduce_op, pairs)
    out.append([np.concatenate([r.values[k].numpy().ravel() for r in reduced])
                for k in range(NUM_REPLICAS)])
  return out, strategy


def _assert_same_bits(a, b):
  for step_a, step_b in zip(a, b):
    for x in step_a[1:]:  # Every replica the same bits.
      np.testing.assert_array_equal(x.view(np.uint32),
                                    step_a[0].view(np.uint32))
    np.testing.assert_array_equal(step_a[0].view(np.uint32),
                                  step_b[0].view(np.uint32))


_GATHER = ["dqsg:num_levels=1", "dqsg:num_levels=3,bucket_size=128",
           "half_dithered:num_levels=2,dither_order=3", "terngrad",
           "qsgd:num_levels=2", "float16", "float32"]
_SUM = ["dqsg:num_levels=1", "dqsg:num_levels=3,bucket_size=128",
        "half_dithered:num_levels=2,dither_order=3", "terngrad",
        "qsgd:num_levels=2", "float16"]


@pytest.mark.parametrize("transport, spec",
                         [("all_gather", s) for s in _GATHER]
                         + [("all_reduce", s) for s in _SUM])
@pytest.mark.parametrize("chunk_elements, shapes",
                         [(1, ONE_BUCKET_SHAPES), (1000, SHAPES)],
                         ids=["one_bucket_chunks", "chunks_of_1000"])
def test_chunks_give_the_bits_of_one_exchange(transport, spec,
                                              chunk_elements, shapes):
  whole, _ = _run(codec=spec, exchange=transport, chunk_elements=None,
                  shapes=shapes)
  chunked, strategy = _run(codec=spec, exchange=transport,
                           chunk_elements=chunk_elements, shapes=shapes)
  _assert_same_bits(chunked, whole)
  assert strategy.compression_stats()["exchange_count"] == 2


def test_mean_in_chunks_is_the_mean_of_one_exchange():
  whole, _ = _run(codec="dqsg:num_levels=2", reduce_op="mean",
                  exchange="all_gather", chunk_elements=None)
  chunked, _ = _run(codec="dqsg:num_levels=2", reduce_op="mean",
                    exchange="all_gather", chunk_elements=700)
  _assert_same_bits(chunked, whole)


@pytest.mark.parametrize("adaptive", [False, True])
def test_nested_senders_in_chunks_decode_and_learn_the_same(adaptive):
  """Side information, statistics and the adaptive state: chunk-blind."""
  nested = dict(codec=ndq_tf.NestedDitheredCodec(coarse_ratio=3),
                reference_codec=ndq_tf.DitheredCodec(num_levels=1),
                reference_group=2, adaptive=adaptive)
  # Three steps: the adaptive mode's second and third encode with the noise
  # state the chunked statistics left.
  whole, s_whole = _run(steps=3, chunk_elements=None, **nested)
  chunked, s_chunked = _run(steps=3, chunk_elements=1536, **nested)
  _assert_same_bits(chunked, whole)
  stats_whole = s_whole.compression_stats()
  stats_chunked = s_chunked.compression_stats()
  for key in ("overloads", "nested_elements", "overload_probability",
              "fallback_fraction"):
    np.testing.assert_array_equal(stats_chunked[key], stats_whole[key])
  state_whole = dict(s_whole.compression_engine.nested_state.items())
  state_chunked = dict(s_chunked.compression_engine.nested_state.items())
  assert state_whole.keys() == state_chunked.keys()
  for key, (scale, gain) in state_whole.items():
    np.testing.assert_array_equal(state_chunked[key][0].numpy(), scale.numpy())
    np.testing.assert_array_equal(state_chunked[key][1].numpy(), gain.numpy())


def test_telemetry_counts_every_chunk():
  codec = ndq_tf.DitheredCodec(num_levels=1)
  _, strategy = _run(steps=1, codec=codec, exchange="all_gather",
                     chunk_elements=1024)
  plan = fusion.FusionPlan(SHAPES, [tf.float32] * len(SHAPES),
                           codec.bucket_size)
  chunks = plan.chunks(1024)
  assert len(chunks) > 2
  stats = strategy.compression_stats()
  assert stats["payload_bits"] == NUM_REPLICAS * 32 * sum(
      plan.chunk_wire_words(codec, c) for c in chunks)
  assert stats["compressed_elements"] == plan.num_elements


# -- The plan -----------------------------------------------------------------


@pytest.mark.parametrize("bucket_size, chunk_elements",
                         [(512, 1), (512, 1000), (512, 4096), (128, 3000),
                          (512, None), (512, 10**9)])
def test_bucketed_chunks_tile_the_buffer_in_whole_buckets(bucket_size,
                                                          chunk_elements):
  plan = fusion.FusionPlan(SHAPES, [tf.float32] * len(SHAPES), bucket_size)
  chunks = plan.chunks(chunk_elements)
  assert chunks[0].start == 0
  assert sum(c.length for c in chunks) == plan.total_size
  for a, b in zip(chunks[:-1], chunks[1:]):
    assert a.start + a.length == b.start
  lengths = [c.length for c in chunks]
  assert all(n % bucket_size == 0 and n > 0 for n in lengths)
  # Nearly equal: at most one bucket apart.
  assert max(lengths) - min(lengths) <= bucket_size
  expected = 1 if chunk_elements is None else min(
      plan.total_size // bucket_size, -(-plan.total_size // chunk_elements))
  assert len(chunks) == expected
  for c in chunks:
    ((segment, start, length, offset),) = c.pieces
    assert (segment, start, length, offset) == (0, c.start, c.length,
                                                c.start)


def test_chunks_without_buckets_group_whole_tensors():
  plan = fusion.FusionPlan(SHAPES, [tf.float32] * len(SHAPES), None)
  sizes = [int(np.prod(s)) for s in SHAPES]  # 3000, 1517, 700, 1500
  chunks = plan.chunks(2000)
  assert [[p[0] for p in c.pieces] for c in chunks] == [[0], [1, 2], [3]]
  assert [c.length for c in chunks] == [3000, 2217, 1500]
  assert all(p[3] == 0 for c in chunks for p in c.pieces)
  assert sum(c.length for c in chunks) == sum(sizes)


def test_flatten_and_split_by_chunks_are_flatten_and_split():
  plan = fusion.FusionPlan(SHAPES, [tf.float32, tf.float16, tf.float32,
                                    tf.bfloat16], 512)
  tensors = [tf.cast(g, d) for g, d in zip(_gradients(0)[0], plan.dtypes)]
  whole = plan.flatten(tensors).numpy()
  for chunk_elements in (1, 1000, None):
    chunks = plan.chunks(chunk_elements)
    parts = [plan.flatten(tensors, c) for c in chunks]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    for got, want in zip(plan.split_chunks(chunks, parts),
                         plan.split(tf.constant(whole))):
      assert got.dtype == want.dtype and got.shape == want.shape
      np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "big"])
def test_bad_chunk_elements_are_named(value):
  with pytest.raises(ValueError, match=r"`chunk_elements` must be .*"
                     r"Received: chunk_elements="):
    ndq_tf.CompressedAllReduce("dqsg", chunk_elements=value)


def test_chunk_elements_round_trips_through_the_config():
  ops = ndq_tf.CompressedAllReduce("dqsg", chunk_elements=4096)
  again = ndq_tf.CompressedAllReduce.from_config(ops.get_config())
  assert again.chunk_elements == 4096
  assert ndq_tf.CompressedAllReduce("dqsg").chunk_elements == (
      options_lib.DEFAULT_CHUNK_ELEMENTS)
  assert ndq_tf.CompressedAllReduce(
      "dqsg", chunk_elements=None).chunk_elements is None
