"""The exchange cost model of `ndq_tf.theory` (bits per worker per step)."""

import math
import warnings

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf import theory
from ndq_tf.core import cost_model
from ndq_tf.core import exchanges
from ndq_tf.core.transports import all_gather
from ndq_tf.core.transports import collective_sum

_N = 2**20


def _dqsg(m=1, d=512):
  return ndq_tf.DitheredCodec(num_levels=m, bucket_size=d)


class SharedScaleVarianceTest(tf.test.TestCase, parameterized.TestCase):

  def test_hand_values(self):
    # P·κ²Δ²/12 with Δ = 1/M.
    self.assertAlmostEqual(theory.shared_scale_variance(1, 1), 1 / 12)
    self.assertAlmostEqual(theory.shared_scale_variance(1, 8), 8 / 12)
    self.assertAlmostEqual(theory.shared_scale_variance(3, 8), 8 / (12 * 9))
    self.assertAlmostEqual(theory.shared_scale_variance(2, 4, kappa_max=3.0),
                           4 * 9 / (12 * 4))

  @parameterized.parameters(1, 3, 7)
  def test_one_worker_is_dqsg(self, m):
    self.assertAlmostEqual(theory.shared_scale_variance(m, 1),
                           theory.dithered_variance(m))

  def test_no_workers_raises(self):
    with self.assertRaisesRegex(ValueError, "num_workers=0"):
      theory.shared_scale_variance(1, 0)


class RingTest(tf.test.TestCase):

  def test_ring_hand_values(self):
    self.assertEqual(theory.ring_all_reduce_bits(1000, 1), 0)
    self.assertEqual(theory.ring_all_reduce_bits(1000, 2), 1000)
    self.assertAlmostEqual(theory.ring_all_reduce_bits(1000, 4), 1500)
    self.assertEqual(theory.ring_all_gather_bits(100, 1), 0)
    self.assertEqual(theory.ring_all_gather_bits(100, 5), 400)


class ExchangeBitsTest(tf.test.TestCase, parameterized.TestCase):

  def test_small_case_by_hand(self):
    # DQSG M = 1, d = 4, n = 10, P = 3.
    codec = _dqsg(1, 4)
    # Payload: ceil(10/20) = 1 word of codes + ceil(10/4) = 3 scales;
    # row: 5 header words + 4 = 9 words; (P - 1) rows sent.
    self.assertEqual(cost_model.exchange_bits(codec, 10, 3, "all_gather"),
                     2 * 9 * 32)
    # Sums up to 3·2 = 6: 3-bit lanes, 10 per int32: 1 word (an int64 would
    # be 64 bits); plus 3 float32 scales and the 8 words of step and
    # fingerprint stamps, through rings: 2(P-1)/P = 4/3.
    self.assertAlmostEqual(cost_model.exchange_bits(codec, 10, 3, "all_reduce"),
                           4 / 3 * (32 + (3 + 8) * 32))
    self.assertAlmostEqual(cost_model.exchange_bits(None, 10, 3, "float32_ring"),
                           4 / 3 * 320)
    self.assertAlmostEqual(cost_model.exchange_bits(None, 10, 3, "float16_ring"),
                           4 / 3 * 160)

  def test_larger_case_by_hand(self):
    # Ternary DQSG, d = 512, n = 2**20, P = 8: 5-bit lanes, 6 per int32
    # (12 per int64: as dense): 174763 words; 2048 scales, 8 stamp words.
    codec = _dqsg(1, 512)
    words = -(-_N // 6)
    self.assertAlmostEqual(cost_model.exchange_bits(codec, _N, 8, "all_reduce"),
                           2 * 7 / 8 * 32 * (words + 2048 + 8))
    self.assertEqual(cost_model.exchange_bits(codec, _N, 8, "all_gather"),
                     7 * 32 * (5 + -(-_N // 20) + 2048))

  def test_nested_group_rows_are_padded_to_the_longest_payload(self):
    # P1 = one DQSG(M = 3) sender (7 symbols, 11 per word), P2 = two NDQSG
    # (3 symbols, 20 per word); n = 100, d = 64: 10 + 2 and 5 + 2 words.
    reference = _dqsg(3, 64)
    nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                        bucket_size=64)
    codecs = [reference, nested, nested]
    self.assertEqual(cost_model.exchange_bits(codecs, 100, 3, "all_gather"),
                     2 * 32 * (5 + 12))
    self.assertEqual(cost_model.exchange_bits([nested] * 3, 100, 3, "all_gather"),
                     2 * 32 * (5 + 7))
    self.assertEqual(cost_model.auto(codecs, 100, 3), "all_gather")
    with self.assertRaisesRegex(ValueError, "`codec`.*same for every worker"):
      cost_model.exchange_bits(codecs, 100, 3, "all_reduce")
    with self.assertRaisesRegex(ValueError, "`codec`.*one per worker \\(4\\)"):
      cost_model.exchange_bits(codecs, 100, 4, "all_gather")

  def test_all_gather_matches_the_transports_framing(self):
    # The transport's own accounting: payload + framing = one row.
    codecs = [_dqsg(3, 64), ndq_tf.NestedDitheredCodec(
        num_levels=3, coarse_ratio=3, bucket_size=64), _dqsg(3, 64)]
    n, p = 1000, 3
    transport = all_gather.CollectiveAllGatherTransport(None, p, 0, "/cpu:0")
    words = [c.wire_bits(n) // 32 for c in codecs]
    for k, c in enumerate(codecs):
      row = c.wire_bits(n) + transport.framing_bits(words, [k])
      self.assertEqual(cost_model.exchange_bits(codecs, n, p, "all_gather"),
                       (p - 1) * row)

  @parameterized.parameters(2, 3, 8, 128)
  def test_all_reduce_counts_the_tensors_it_would_send(self, p):
    # The lanes pack_lanes really makes, the scales encode really makes and
    # the step stamps the multi-worker transport really adds.
    codec = _dqsg(3, 128)
    n = 5000
    layout = ops.lane_layout(codec.alphabet_size, p, n)
    words = ops.pack_lanes(tf.zeros([n], tf.int32), layout)
    payload = codec.encode(tf.ones([n]), seed=[1, 2])
    stamps = collective_sum.CollectiveSumTransport(
        None, p, 0, "/cpu:0").framing_bits(step_checked=True)
    bits = (words.shape[0] * words.dtype.size * 8
            + payload.scales.shape[0] * 32 + stamps)
    self.assertAlmostEqual(cost_model.exchange_bits(codec, n, p, "all_reduce"),
                           2 * (p - 1) / p * bits)

  @parameterized.parameters("all_gather", "all_reduce", "float32_ring",
                            "float16_ring")
  def test_one_worker_sends_nothing(self, transport):
    codec = None if transport.startswith("float") else _dqsg()
    self.assertEqual(cost_model.exchange_bits(codec, _N, 1, transport), 0)

  def test_float_codecs_all_reduce_through_their_float_ring(self):
    for p in (2, 8, 64):
      self.assertEqual(
          cost_model.exchange_bits(ndq_tf.Float32Codec(), _N, p, "all_reduce"),
          cost_model.exchange_bits(None, _N, p, "float32_ring"))
      self.assertEqual(
          cost_model.exchange_bits(ndq_tf.Float16Codec(), _N, p, "all_reduce"),
          cost_model.exchange_bits(None, _N, p, "float16_ring"))
      self.assertEqual(
          cost_model.exchange_bits(ndq_tf.Float16Codec(), _N, p, "float16_ring"),
          cost_model.exchange_bits(None, _N, p, "float16_ring"))
      # bfloat16 values are summed in the float32 ring (NCCL takes no
      # bfloat16): 32 bits on the wire, though the all-gather sends 16.
      self.assertEqual(
          cost_model.exchange_bits(ndq_tf.BFloat16Codec(), _N, p, "all_reduce"),
          cost_model.exchange_bits(None, _N, p, "float32_ring"))
      self.assertEqual(
          cost_model.exchange_bits(ndq_tf.BFloat16Codec(), _N, p, "all_gather"),
          cost_model.exchange_bits(ndq_tf.Float16Codec(), _N, p, "all_gather"))

  def test_codes_add_up(self):
    adds_up = {"float32", "float16", "bfloat16", "dqsg", "half_dithered", "qsgd",
               "terngrad"}
    for name in ndq_tf.codecs.registry.NAMES:
      codec = ndq_tf.codecs.get(name)
      self.assertEqual(theory.codes_add_up(codec), name in adds_up, name)

    class MyCodec(ndq_tf.DitheredCodec):  # may decode otherwise
      pass

    self.assertFalse(theory.codes_add_up(MyCodec()))
    with self.assertRaisesRegex(ValueError, "`codec`.*only DitheredCodec"):
      cost_model.exchange_bits(MyCodec(), 10, 2, "all_reduce")

  def test_nested_codec_under_all_reduce_says_why(self):
    nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
    with self.assertRaisesRegex(
        ValueError, "`codec`.*nested codes.*side information.*all_gather"):
      cost_model.exchange_bits(nested, _N, 8, "all_reduce")
    self.assertEqual(cost_model.auto(nested, _N, 1024), "all_gather")

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(
        ValueError, "`transport` must be one of 'all_gather', 'all_reduce', "
        "'reduce_scatter', 'float32_ring', 'float16_ring'. Received: "
        "transport='ring'"):
      cost_model.exchange_bits(_dqsg(), 10, 2, "ring")
    with self.assertRaisesRegex(ValueError, "`num_workers`.*num_workers=0"):
      cost_model.exchange_bits(_dqsg(), 10, 0, "all_gather")
    with self.assertRaisesRegex(ValueError, "`num_elements`.*=-1"):
      cost_model.exchange_bits(_dqsg(), -1, 2, "all_gather")
    with self.assertRaisesRegex(ValueError, "`codec` must be None"):
      cost_model.exchange_bits(_dqsg(), 10, 2, "float16_ring")
    with self.assertRaisesRegex(ValueError, "`codec` must be None"):
      cost_model.exchange_bits(ndq_tf.Float32Codec(), 10, 2, "float16_ring")
    with self.assertRaisesRegex(ValueError, "`codec` must be None"):
      cost_model.exchange_bits(ndq_tf.BFloat16Codec(), 10, 2, "float16_ring")
    with self.assertRaisesRegex(ValueError, "`codec` is required"):
      cost_model.exchange_bits(None, 10, 2, "all_gather")
    with self.assertRaisesRegex(ValueError, "below 2\\*\\*31"):
      cost_model.exchange_bits(_dqsg(32767), 10, 2**16, "all_reduce")
    self.assertEqual(cost_model.auto(_dqsg(32767), 10, 2**16),
                     "all_gather")


class BreakEvenTest(tf.test.TestCase):
  """The issue's break-even numbers follow from the model."""

  def test_all_gather_of_ternary_codes_against_rings(self):
    codec = _dqsg(1, 512)
    bits = theory.bits_per_element(codec, _N)  # 1.6625
    self.assertAlmostEqual(bits, 32 / 20 + 32 / 512, places=3)

    def first_worse(baseline_bits):
      for p in range(2, 200):
        if (cost_model.exchange_bits(codec, _N, p, "all_gather")
            > theory.ring_all_reduce_bits(baseline_bits * _N, p)):
          return p
      return None

    # (P - 1)·b = 2(P - 1)/P·B at P = 2B/b: 38.5 (float32), 19.2 (fp16),
    # 9.6 (8 bits): "about 38, 19 and 10". The first P at which the
    # all-gather sends more is the next integer.
    for baseline, about, first in ((32, 38, 39), (16, 19, 20), (8, 10, 10)):
      self.assertAlmostEqual(2 * baseline / bits, about, delta=0.6)
      self.assertEqual(first_worse(baseline), first)
    self.assertLess(cost_model.exchange_bits(codec, _N, 38, "all_gather"),
                    cost_model.exchange_bits(None, _N, 38, "float32_ring"))
    self.assertGreater(cost_model.exchange_bits(codec, _N, 20, "all_gather"),
                       cost_model.exchange_bits(None, _N, 20, "float16_ring"))

  def test_by_bits_alone_the_all_gather_yields_once(self):
    # On devices whose work the model does not price (`on_cpu=False`):
    # bits alone. The reduce-scatter sends fewer from P = 3 on, and the
    # all-gather never comes back.
    for codec in (_dqsg(1), _dqsg(3), ndq_tf.TernGradCodec(),
                  ndq_tf.QSGDCodec(num_levels=1)):
      choices = [cost_model.auto(codec, _N, p, on_cpu=False)
                 for p in range(1, 257)]
      self.assertEqual(choices[:2], ["all_gather"] * 2, repr(codec))
      self.assertNotIn("all_gather", choices[2:], repr(codec))

  def test_all_reduce_grows_like_log_p(self):
    # Per worker, the all-reduce's bits grow only with the lane width,
    # about log2(2MP); the all-gather's grow like P.
    codec = _dqsg(1)
    for p in (8, 64, 1024):
      lane = math.ceil(math.log2(2 * p + 1))
      per_element = cost_model.exchange_bits(codec, _N, p, "all_reduce") / _N
      self.assertLess(per_element, 2 * (lane * 64 / (63 // lane) + 0.07))
    self.assertLess(cost_model.exchange_bits(codec, _N, 1024, "all_reduce"),
                    cost_model.exchange_bits(None, _N, 1024, "float16_ring"))
    self.assertTrue(np.isclose(
        cost_model.exchange_bits(codec, _N, 1024, "all_gather") / _N,
        1023 * (theory.bits_per_element(codec, _N)
                + all_gather.HEADER_WORDS * 32 / _N)))


@pytest.mark.parametrize("p", [2, 8, 64])
def test_decode_work_per_worker(p):
  n = 1000
  codec = ndq_tf.DitheredCodec(num_levels=1)
  # All-gather: encode once, decode (and draw the dither of) every sender.
  assert cost_model.exchange_work(codec, n, p, "all_gather") == (
      exchanges.base.Work(dither_draws=(p + 1) * n, decodes=p))
  # Integer sum: encode once, one decode that subtracts every dither; the
  # codes go into lanes once and out once.
  assert cost_model.exchange_work(codec, n, p, "all_reduce") == (
      exchanges.base.Work(dither_draws=(p + 1) * n, decodes=1,
                          lane_codes=2 * n))
  # Float values through a float ring: nothing drawn, nothing decoded.
  for float_codec in (ndq_tf.Float16Codec(), ndq_tf.BFloat16Codec()):
    assert cost_model.exchange_work(float_codec, n, p,
                                   "all_reduce") == exchanges.base.Work(0, 0)
  # Reduce-scatter: stage 1 encodes and decodes one buffer in shards,
  # stage 2's DQSG encodes one shard and decodes every shard.
  assert cost_model.exchange_work(codec, n, p, "reduce_scatter") == (
      exchanges.base.Work(dither_draws=3 * n + -(-n // p), decodes=2))
  # TernGrad draws to encode only.
  assert cost_model.exchange_work(ndq_tf.TernGradCodec(), n, p,
                                 "all_reduce") == exchanges.base.Work(
                                     n, 1, 2 * n)


def test_time_model_prices_bits_and_cpu_work():
  codec, n, p = ndq_tf.DitheredCodec(num_levels=1), 2**20, 4
  for name in exchanges.NAMES:
    bits = cost_model.exchange_bits(codec, n, p, name)
    work = cost_model.exchange_work(codec, n, p, name)
    cpu = 1e-9 * (work.dither_draws * cost_model.DRAW_NS
                  + work.decodes * n * cost_model.DECODE_NS
                  + work.lane_codes * cost_model.LANE_NS)
    assert cost_model.exchange_seconds(codec, n, p, name) == pytest.approx(
        bits / 10e9 + cpu)
    # Other devices: the bits alone; one memory: the work alone.
    assert cost_model.exchange_seconds(
        codec, n, p, name, link_gbps=1.0, on_cpu=False) == pytest.approx(
            bits / 1e9)
    shared = exchanges.get(name).work([codec] * p, n, p, shared_memory=True)
    assert cost_model.exchange_seconds(
        codec, n, p, name, shared_memory=True) == pytest.approx(
            1e-9 * (shared.dither_draws * cost_model.DRAW_NS
                    + shared.decodes * n * cost_model.DECODE_NS
                    + shared.lane_codes * cost_model.LANE_NS))


def test_auto_picks_the_fastest_exchange_of_the_model():
  codec, n = ndq_tf.DitheredCodec(num_levels=1), 2**20
  for p in (2, 3, 8, 1024):
    for model in ({}, {"on_cpu": False}, {"shared_memory": True},
                  {"link_gbps": 0.1}):
      costs = cost_model.costs(codec, n, p, **model)
      assert set(costs) == set(exchanges.NAMES)
      assert cost_model.auto(codec, n, p, **model) == min(
          costs, key=lambda name: (costs[name], name != "all_gather"))
  # Worker processes on CPUs: the all-gather for two, then the
  # reduce-scatter, whose work is flat in P; one shared memory moves no
  # bits and decodes least by gathering.
  assert [cost_model.auto(codec, n, p) for p in (2, 3, 8, 1024)] == [
      "all_gather"] + ["reduce_scatter"] * 3
  assert {cost_model.auto(codec, n, p, shared_memory=True)
          for p in (2, 3, 8, 1024)} == {"all_gather"}
  assert cost_model.auto(codec, n, 1) == "all_gather"
  nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
  assert cost_model.auto(nested, n, 8) == "all_gather"


def test_auto_never_sums_a_variable_length_codec():
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0)
  with pytest.raises(ValueError, match=r"exchange='all_reduce'.*entropy-"
                     r"coded.*Received: codec=EntropyCodedDitheredCodec\("):
    cost_model.exchange_bits(codec, _N, 8, "all_reduce")
  for p in (2, 3, 8, 1024):
    for model in ({}, {"on_cpu": False}, {"shared_memory": True},
                  {"link_gbps": 0.1}):
      assert set(cost_model.costs(codec, _N, p, **model)) == {
          "all_gather", "reduce_scatter"}
      assert cost_model.auto(codec, _N, p, **model) != "all_reduce"


def test_variable_length_bits_are_expectations_after_a_length_round():
  codec, p = ndq_tf.EntropyCodedDitheredCodec(bits=1.0), 4
  words = codec.wire_bits(_N) // 32  # An expectation.
  assert words < codec.max_wire_bits(_N) // 32 / 8
  # A round of 5-word headers, then rows of the longest payload.
  assert cost_model.exchange_bits(codec, _N, p, "all_gather") == (
      32 * (p - 1) * (2 * all_gather.HEADER_WORDS + words))
  # Stage 1: headers with every shard's length, then the rows; stage 2 the
  # all-gather's two rounds, ECDQ re-coding the reduced shards.
  shard = codec.wire_bits(_N // p) // 32
  assert cost_model.exchange_bits(codec, _N, p, "reduce_scatter") == (
      32 * (p - 1) * ((5 + p + shard) + (10 + shard)))


def test_time_model_is_cpu_only_for_cpu_devices():
  cpu = "/job:worker/replica:0/task:1/device:CPU:0"
  gpu = "/job:worker/replica:0/task:1/device:GPU:0"
  assert cost_model.time_model([cpu, "/device:CPU:1"], True) == {
      "on_cpu": True, "shared_memory": True}
  assert cost_model.time_model([cpu, gpu], False) == {
      "on_cpu": False, "shared_memory": False}
  # Tensors built without a device scope: this process's default device.
  assert cost_model.time_model(["", ""], False) == {
      "on_cpu": True, "shared_memory": True}


def test_work_of_codecs_an_exchange_refuses_raises():
  nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
  with pytest.raises(ValueError, match="residues"):
    cost_model.exchange_work(nested, 10, 2, "all_reduce")


def test_bits_summary_lists_the_exchanges_that_carry_the_codec():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    text = cost_model.bits_summary([ndq_tf.DitheredCodec(1)] * 4, 4096, 4)
  assert text.startswith("all_gather ") and ", all_reduce " in text
  assert ", reduce_scatter " in text
  nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
  assert "all_reduce" not in cost_model.bits_summary([nested] * 4, 4096, 4)
  text = cost_model.summary([ndq_tf.DitheredCodec(1)] * 4, 4096, 4)
  assert text.startswith("all_gather ") and " bits " in text
  assert text.endswith(" ms") and ", reduce_scatter " in text


if __name__ == "__main__":
  tf.test.main()
