"""Tests of the fusion core: `FusionPlan`, fused encode/decode, the seeds.

Moved from test_mirrored.py; no devices or strategies needed.
"""

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf.core import fusion

M = 3  # DitheredCodec(num_levels=3): 7 levels, step 1/3.


# -- FusionPlan ----------------------------------------------------------------


class TestFusionPlan:

  def test_every_tensor_starts_on_a_bucket_boundary(self):
    plan = fusion.FusionPlan([(3, 4), (5,), (8,)],
                             [tf.float32, tf.float16, tf.float64],
                             bucket_size=8)
    assert plan.sizes == (12, 5, 8)
    assert plan.padded_sizes == (16, 8, 8)
    assert plan.offsets == (0, 16, 24)
    assert plan.total_size == 32
    assert plan.num_elements == 25
    assert plan.segments == ((0, 32),)

  def test_codec_without_buckets_gets_one_segment_per_tensor(self):
    plan = fusion.FusionPlan([(3,), (2, 2)], [tf.float32] * 2)
    assert plan.padded_sizes == (3, 4)
    assert plan.segments == ((0, 3), (3, 4))

  def test_flatten_split_round_trip_restores_shapes_and_dtypes(self):
    tensors = [tf.reshape(tf.range(12, dtype=tf.float32), [3, 4]),
               tf.constant([1.5, -2.0, 3.25], tf.float16),
               tf.constant([[7.0]], tf.float64)]
    plan = fusion.FusionPlan.from_tensors(tensors, bucket_size=4)
    fused = plan.flatten(tensors)
    assert fused.shape == [plan.total_size] and fused.dtype == tf.float32
    np.testing.assert_array_equal(fused[12:16].numpy(), [1.5, -2.0, 3.25, 0.0])
    for original, back in zip(tensors, plan.split(fused)):
      assert back.dtype == original.dtype and back.shape == original.shape
      np.testing.assert_array_equal(back.numpy(), original.numpy())

  @pytest.mark.parametrize("kwargs, error", [
      ({"shapes": [(None, 3)], "dtypes": [tf.float32]}, ValueError),
      ({"shapes": [(3,)], "dtypes": [tf.int32]}, TypeError),
      ({"shapes": [(3,)], "dtypes": [tf.float32], "bucket_size": 0},
       ValueError),
      ({"shapes": [(3,), (2,)], "dtypes": [tf.float32]}, ValueError),
  ])
  def test_invalid_arguments_raise(self, kwargs, error):
    with pytest.raises(error):
      fusion.FusionPlan(**kwargs)


class TestFusedCoding:

  def _inputs(self, num_senders=3):
    rng = np.random.default_rng(0)
    return [[tf.constant(rng.normal(size=(40, 30)), tf.float32),
             tf.constant(rng.normal(size=(70,)), tf.float32)]
            for _ in range(num_senders)]

  def test_wire_has_the_plans_size_and_one_payload_per_sender(self):
    codec = ndq_tf.DitheredCodec(num_levels=M, bucket_size=64)
    tensors = self._inputs(1)[0]
    plan = fusion.FusionPlan.from_tensors(tensors, codec.bucket_size)
    wire = fusion.encode_fused(codec, tensors, tf.constant([1, 2]), plan)
    assert wire.dtype == tf.int32
    assert wire.shape == [plan.wire_words(codec)]
    assert plan.wire_bits(codec) == codec.wire_bits(plan.total_size)
    assert plan.total_size == 1216 + 128  # 19 and 2 buckets of 64

  def test_decode_sum_is_within_the_dqsg_bound(self):
    codec = ndq_tf.DitheredCodec(num_levels=M, bucket_size=64)
    senders = self._inputs()
    plan = fusion.FusionPlan.from_tensors(senders[0], codec.bucket_size)
    seeds = [fusion.derive_seed(tf.constant([5, 6]), 0, s) for s in range(3)]
    wires = [fusion.encode_fused(codec, t, s, plan)
             for t, s in zip(senders, seeds)]
    summed = fusion.decode_sum(codec, wires, seeds, plan)
    for k, result in enumerate(summed):
      exact = sum(s[k] for s in senders)
      # |error| <= sum over senders of kappa * step / 2, kappa <= max |g|.
      bound = sum(float(tf.reduce_max(tf.abs(s[k]))) for s in senders) / (2 * M)
      assert float(tf.reduce_max(tf.abs(result - exact))) <= bound * (1 + 1e-5)
    mean = fusion.decode_sum(codec, wires, seeds, plan, mean=True)
    np.testing.assert_allclose(mean[0].numpy(), summed[0].numpy() / 3,
                               rtol=1e-6)

  def test_sender_needing_side_information_first_raises(self):
    nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                        bucket_size=64)
    tensors = self._inputs(1)[0]
    plan = fusion.FusionPlan.from_tensors(tensors, 64)
    seed = tf.constant([1, 1])
    wire = fusion.encode_fused(nested, tensors, seed, plan)
    with pytest.raises(ValueError, match="side information"):
      fusion.decode_senders([nested], [wire], [seed], plan)

  def test_nested_senders_get_the_mean_of_the_senders_before_them(self):
    """Side information: the mean of every buffer decoded before the sender.

    Checked against the codec's own decode given a mean computed here
    (float32, in sender order), on one tensor of whole buckets (one
    segment, seed folded with segment 0).
    """
    reference = ndq_tf.DitheredCodec(num_levels=3, bucket_size=64)
    nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                        bucket_size=64)
    codecs = [reference, reference, nested, nested]
    rng = np.random.default_rng(1)
    common = rng.normal(size=256)
    senders = [[tf.constant(common + 0.05 * rng.normal(size=256),
                            tf.float32)] for _ in codecs]
    plan = fusion.FusionPlan.from_tensors(senders[0], 64)
    seeds = [fusion.derive_seed(tf.constant([3, 4]), 2, s)
             for s in range(len(codecs))]
    wires = [fusion.encode_fused(c, t, s, plan)
             for c, t, s in zip(codecs, senders, seeds)]
    decoded, side = fusion.decode_senders(codecs, wires, seeds, plan,
                                          return_side_information=True)
    assert side[0] is None and side[1] is None
    for i in (2, 3):
      before = [d.numpy() for d in decoded[:i]]
      mean = before[0]
      for d in before[1:]:
        mean = mean + d
      mean = mean / np.float32(i)
      np.testing.assert_allclose(side[i].numpy(), mean, rtol=1e-6, atol=1e-7)
      payload = nested.from_wire(wires[i], [256], tf.float32)
      want = nested.decode(payload, ops.fold_seed(seeds[i], 0),
                           side_information=tf.constant(mean))
      np.testing.assert_allclose(decoded[i].numpy(), want.numpy(),
                                 rtol=1e-6, atol=1e-6)
      # And the nested codes decode close to what the sender had.
      error = np.abs(decoded[i].numpy() - senders[i][0].numpy())
      assert error.max() < 0.5, error.max()

  def test_different_steps_and_senders_give_different_seeds(self):
    base = tf.constant([0, 0])
    seeds = {tuple(fusion.derive_seed(base, t, s).numpy())
             for t in range(5) for s in range(4)}
    assert len(seeds) == 20
