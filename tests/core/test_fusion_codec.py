"""Tests of `ndq_tf.core.fusion_codec`: fused encode/decode and the seeds.

Moved from test_mirrored.py; no devices or strategies needed. The plan's
layout is tested in test_fusion_plan.py, the sum in test_fusion_sum.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf.core import fusion_codec
from ndq_tf.core import fusion_plan

M = 3  # DitheredCodec(num_levels=3): 7 levels, step 1/3.


class TestFusedCoding:

  def _inputs(self, num_senders=3):
    rng = np.random.default_rng(0)
    return [[tf.constant(rng.normal(size=(40, 30)), tf.float32),
             tf.constant(rng.normal(size=(70,)), tf.float32)]
            for _ in range(num_senders)]

  def test_wire_has_the_plans_size_and_one_payload_per_sender(self):
    codec = ndq_tf.DitheredCodec(num_levels=M, bucket_size=64)
    tensors = self._inputs(1)[0]
    plan = fusion_plan.FusionPlan.from_tensors(tensors, codec.bucket_size)
    wire = fusion_codec.encode_fused(codec, tensors, tf.constant([1, 2]), plan)
    assert wire.dtype == tf.int32
    assert wire.shape == [plan.wire_words(codec)]
    assert plan.wire_bits(codec) == codec.wire_bits(plan.total_size)
    assert plan.total_size == 1216 + 128  # 19 and 2 buckets of 64

  def test_decode_sum_is_within_the_dqsg_bound(self):
    codec = ndq_tf.DitheredCodec(num_levels=M, bucket_size=64)
    senders = self._inputs()
    plan = fusion_plan.FusionPlan.from_tensors(senders[0], codec.bucket_size)
    seeds = [fusion_codec.derive_seed(tf.constant([5, 6]), 0, s) for s in range(3)]
    wires = [fusion_codec.encode_fused(codec, t, s, plan)
             for t, s in zip(senders, seeds)]
    summed = fusion_codec.decode_sum(codec, wires, seeds, plan)
    for k, result in enumerate(summed):
      exact = sum(s[k] for s in senders)
      # |error| <= sum over senders of kappa * step / 2, kappa <= max |g|.
      bound = sum(float(tf.reduce_max(tf.abs(s[k]))) for s in senders) / (2 * M)
      assert float(tf.reduce_max(tf.abs(result - exact))) <= bound * (1 + 1e-5)
    mean = fusion_codec.decode_sum(codec, wires, seeds, plan, mean=True)
    np.testing.assert_allclose(mean[0].numpy(), summed[0].numpy() / 3,
                               rtol=1e-6)

  def test_sender_needing_side_information_first_raises(self):
    nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                        bucket_size=64)
    tensors = self._inputs(1)[0]
    plan = fusion_plan.FusionPlan.from_tensors(tensors, 64)
    seed = tf.constant([1, 1])
    wire = fusion_codec.encode_fused(nested, tensors, seed, plan)
    with pytest.raises(ValueError, match="side information"):
      fusion_codec.decode_senders([nested], [wire], [seed], plan)

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
    plan = fusion_plan.FusionPlan.from_tensors(senders[0], 64)
    seeds = [fusion_codec.derive_seed(tf.constant([3, 4]), 2, s)
             for s in range(len(codecs))]
    wires = [fusion_codec.encode_fused(c, t, s, plan)
             for c, t, s in zip(codecs, senders, seeds)]
    decoded, side = fusion_codec.decode_senders(codecs, wires, seeds, plan,
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
    seeds = {tuple(fusion_codec.derive_seed(base, t, s).numpy())
             for t in range(5) for s in range(4)}
    assert len(seeds) == 20
