"""Tests of `ndq_tf.core.exchanges`: what every exchange declares.

Pure Python and a few codecs: no devices, no strategies. The cost model
(the bits against the tensors really sent, the work, `"auto"`) is tested in
core/test_cost_model.py, the transports' framing in core/transports/.
"""

import pytest

import ndq_tf
from ndq_tf import theory
from ndq_tf.core import cost_model
from ndq_tf.core import exchanges
from ndq_tf.core import telemetry
from ndq_tf.distribute import options as options_lib


def test_one_list_of_names_for_options_cost_model_and_telemetry():
  assert exchanges.NAMES == ("all_gather", "all_reduce", "reduce_scatter")
  assert options_lib.TRANSPORTS == ("auto",) + exchanges.NAMES
  assert cost_model.TRANSPORTS[:len(exchanges.NAMES)] == exchanges.NAMES
  assert telemetry.TRANSPORT_NAMES == exchanges.NAMES
  assert [exchanges.get(n).name for n in exchanges.NAMES] == list(
      exchanges.NAMES)


def test_unknown_name_lists_the_valid_ones():
  with pytest.raises(ValueError, match="'all_gather', 'all_reduce'.*ring"):
    exchanges.get("ring")


@pytest.mark.parametrize("codec, form", [
    (ndq_tf.DitheredCodec(1), "codes"),
    (ndq_tf.HalfDitheredCodec(1), "codes"),
    (ndq_tf.QSGDCodec(), "codes"),
    (ndq_tf.TernGradCodec(), "codes"),
    (ndq_tf.Float16Codec(), "float16"),
    (ndq_tf.BFloat16Codec(), "bfloat16"),
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


