"""Tests of `ndq_tf.core.exchanges`: what every exchange declares.

Pure Python and a few codecs: no devices, no strategies. The bits of the
cost model against the tensors really sent are in test_exchange_cost.py.
"""

import warnings

import pytest

import ndq_tf
from ndq_tf import theory
from ndq_tf.core import cost_model
from ndq_tf.core import exchanges
from ndq_tf.core import telemetry
from ndq_tf.core import transports
from ndq_tf.core.transports import all_gather
from ndq_tf.core.transports import all_to_all
from ndq_tf.core.transports import collective_sum
from ndq_tf.distribute import options as options_lib


def test_one_list_of_names_for_options_cost_model_and_telemetry():
  assert exchanges.NAMES == ("all_gather", "all_reduce", "reduce_scatter")
  assert options_lib.TRANSPORTS == ("auto",) + exchanges.NAMES
  assert cost_model.TRANSPORTS[:len(exchanges.NAMES)] == exchanges.NAMES
  assert telemetry.TRANSPORT_NAMES == exchanges.NAMES
  assert [exchanges.get(n).name for n in exchanges.NAMES] == list(
      exchanges.NAMES)


def test_transports_are_named_for_what_they_move_not_for_an_exchange():
  names = {t.name: t for t in (
      transports.DeviceCopyTransport, transports.DeviceSumTransport,
      transports.DeviceAllToAllTransport,
      transports.CollectiveAllGatherTransport,
      transports.CollectiveSumTransport,
      transports.CollectiveAllToAllTransport)}
  assert sorted(names) == [
      "collective_all_gather", "collective_all_to_all", "collective_sum",
      "device_all_to_all", "device_copy", "device_sum"]
  assert not set(names) & set(exchanges.NAMES)
  assert not set(names) & set(telemetry.TRANSPORT_NAMES)


def test_unknown_name_lists_the_valid_ones():
  with pytest.raises(ValueError, match="'all_gather', 'all_reduce'.*ring"):
    exchanges.get("ring")


def test_framing_is_the_transports_own():
  assert exchanges.get("all_gather").framing_words == all_gather.HEADER_WORDS
  assert (exchanges.get("all_reduce").framing_words ==
          collective_sum.STAMP_WORDS)
  assert (exchanges.get("reduce_scatter").framing_words ==
          all_to_all.SCATTER_HEADER_WORDS)


@pytest.mark.parametrize("codec, form", [
    (ndq_tf.DitheredCodec(1), "codes"),
    (ndq_tf.HalfDitheredCodec(1), "codes"),
    (ndq_tf.QSGDCodec(), "codes"),
    (ndq_tf.TernGradCodec(), "codes"),
    (ndq_tf.Float16Codec(), "float16"),
    (ndq_tf.Float32Codec(), "float32"),
    (ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3), None),
])
def test_codec_declares_how_its_codes_add_up(codec, form):
  assert codec.summed_form() == form
  assert theory.summed_form(codec) == form
  assert theory.codes_add_up(codec) == (form is not None)


def test_a_subclass_is_not_summed_unless_it_declares_it():

  class Undeclared(ndq_tf.DitheredCodec):
    pass

  class Declared(ndq_tf.DitheredCodec):
    SUMMED_FORM = "codes"

  assert Undeclared().summed_form() is None
  assert Declared().summed_form() == "codes"


def test_refusal_says_why_and_options_raise_it():
  nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
  summed = exchanges.get("all_reduce")
  assert summed.refusal(ndq_tf.DitheredCodec(1), nested=False) is None
  assert "residues" in summed.refusal(nested, nested=True)
  assert exchanges.get("all_gather").refusal(nested, nested=True) is None
  with pytest.raises(ValueError, match="all_reduce' cannot sum.*residues"):
    options_lib.CompressionOptions(nested, exchange="all_reduce",
                                   reference_codec=ndq_tf.DitheredCodec(3))

  class Undeclared(ndq_tf.DitheredCodec):
    pass

  with pytest.raises(ValueError, match="all_reduce' cannot sum.*only the"):
    options_lib.CompressionOptions(Undeclared(), exchange="all_reduce")


def test_the_cost_model_is_each_exchanges_own_bits():
  codec = ndq_tf.DitheredCodec(num_levels=1)
  for p in (2, 8, 64):
    for name in exchanges.NAMES:
      assert exchanges.get(name).bits([codec] * p, 2**20, p) == (
          cost_model.exchange_bits(codec, 2**20, p, name))


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
  assert cost_model.exchange_work(ndq_tf.Float16Codec(), n, p,
                                 "all_reduce") == exchanges.base.Work(0, 0)
  # Reduce-scatter: stage 1 encodes and decodes one buffer in shards,
  # stage 2's DQSG encodes one shard and decodes every shard.
  assert cost_model.exchange_work(codec, n, p, "reduce_scatter") == (
      exchanges.base.Work(dither_draws=3 * n + -(-n // p), decodes=2))
  # TernGrad draws to encode only.
  assert cost_model.exchange_work(ndq_tf.TernGradCodec(), n, p,
                                 "all_reduce") == exchanges.base.Work(
                                     n, 1, 2 * n)


@pytest.mark.parametrize("p", [2, 8])
def test_work_in_one_shared_memory_counts_every_local_sender(p):
  n = 1000
  codecs = [ndq_tf.DitheredCodec(num_levels=1)] * p

  def work(name):
    return exchanges.get(name).work(codecs, n, p, shared_memory=True)

  # Every sender encoded and decoded once.
  assert work("all_gather") == exchanges.base.Work(2 * p * n, p)
  # P encodes into lanes, one decode of the sum (every dither).
  assert work("all_reduce") == exchanges.base.Work(2 * p * n, 1,
                                                   (p + 1) * n)
  # P receivers decode P shards each (P buffers), stage 2 once.
  assert work("reduce_scatter") == exchanges.base.Work(2 * p * n + 2 * n,
                                                       p + 1)


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
