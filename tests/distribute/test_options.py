"""Tests of `ndq_tf.distribute.options.CompressionOptions` and its fields.

Its own tests (moved from integration/test_nested_allreduce.py and
core/exchanges/test_sum.py), and those of its fields declared once
(`ndq_tf.distribute.arguments`): the signatures and help of the constructors
that take them, their deprecated names, and `options=`.
"""

import inspect
import pydoc
import re
import warnings

import pytest
import tensorflow as tf

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


def test_exchanges_are_auto_and_the_exchange_names():
  assert options_lib.EXCHANGES == ("auto",) + exchanges.NAMES
  for name in exchanges.NAMES:
    assert CompressionOptions("terngrad", exchange=name).exchange == name


# -- The fields, declared once (issue #33) ------------------------------------

#: Each constructor's arguments in positional order (release 0.1.0's, with
#: the new names), and its first keyword-only one.
ORDERS = {
    "CompressionOptions": (
        ["codec", "min_elements", "seed", "compress_indexed_slices",
         "reference_codec", "reference_group", "adaptive", "exchange",
         "chunk_elements", "reduce_scatter_levels",
         "reduce_scatter_error_feedback", "group_argument"], None),
    "CompressedAllReduce": (
        ["codec", "min_elements", "seed", "compress_indexed_slices",
         "fallback", "name", "reference_codec", "reference_group", "adaptive",
         "exchange", "chunk_elements", "reduce_scatter_levels",
         "reduce_scatter_error_feedback", "options"], "options"),
    "MirroredStrategy": (
        ["codec", "devices", "cross_device_ops", "min_elements", "seed",
         "compress_indexed_slices", "fallback", "reference_codec",
         "reference_group", "adaptive", "exchange", "chunk_elements",
         "reduce_scatter_levels", "reduce_scatter_error_feedback", "options"],
        "min_elements"),
    "MultiWorkerMirroredStrategy": (
        ["codec", "cluster_resolver", "communication_options", "min_elements",
         "seed", "reference_codec", "reference_group", "cluster_timeout",
         "adaptive", "compress_indexed_slices", "exchange", "chunk_elements",
         "reduce_scatter_levels", "reduce_scatter_error_feedback", "options"],
        "options"),
}

_CLASSES = {"CompressionOptions": CompressionOptions,
            "CompressedAllReduce": ndq_tf.CompressedAllReduce,
            "MirroredStrategy": ndq_tf.MirroredStrategy,
            "MultiWorkerMirroredStrategy": ndq_tf.MultiWorkerMirroredStrategy}


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")][:2]


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_signature_keeps_the_positional_order(name):
  parameters = inspect.signature(_CLASSES[name]).parameters
  order, keyword_only = ORDERS[name]
  assert list(parameters) == order
  kinds = [p.kind for p in parameters.values()]
  first = order.index(keyword_only) if keyword_only else len(order)
  assert kinds == ([inspect.Parameter.POSITIONAL_OR_KEYWORD] * first +
                   [inspect.Parameter.KEYWORD_ONLY] * (len(order) - first))


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_signature_and_help_list_every_field_with_its_type_and_default(name):
  cls = _CLASSES[name]
  parameters = inspect.signature(cls).parameters
  doc = pydoc.render_doc(cls, renderer=pydoc.plaintext)
  for field, (annotation, default) in options_lib.FIELDS.items():
    if field == "codec" and name != "CompressionOptions":
      annotation, default = "CodecLike | None", None  # Or `options`.
    assert parameters[field].annotation == annotation, field
    assert parameters[field].default == default, field
    assert f"{field}: {annotation!r} = {default!r}" in doc or (
        default is inspect.Parameter.empty), field
    assert f"\n |    {field}: " in doc, field  # Its Args entry.
  if name != "CompressionOptions":
    assert parameters["options"].annotation == "CompressionOptions | None"
    assert "\n |    options: " in doc
  # Every argument has an Args entry, and so has every deprecated name.
  for argument in parameters:
    assert f"\n |    {argument}: " in doc, argument
  assert "\n |    transport: deprecated name of `exchange`" in doc


def test_arguments_keep_their_positions():
  ops = ndq_tf.CompressedAllReduce(
      "ndqsg", 64, 5, True, None, "ops", ndq_tf.DitheredCodec(num_levels=1),
      None, None, "all_gather", 1024, None, False)
  assert (ops.min_elements, ops.seed, ops.compress_indexed_slices, ops.name,
          ops.exchange, ops.chunk_elements) == (64, 5, True, "ops",
                                                "all_gather", 1024)
  options = CompressionOptions("dqsg", 64, 5, False, None, None, None,
                               "all_reduce", None)
  assert (options.min_elements, options.seed, options.exchange,
          options.chunk_elements) == (64, 5, "all_reduce", None)
  # The multi-worker strategy takes `min_elements` and `seed` by position
  # (bad values, so that it stops before joining a cluster).
  strategy = ndq_tf.MultiWorkerMirroredStrategy
  with pytest.raises(ValueError, match="Received: min_elements=0"):
    strategy("dqsg", None, None, 0)
  with pytest.raises(ValueError, match="Received: seed=1099511627776"):
    strategy("dqsg", None, None, 64, 2**40)
  with pytest.raises(TypeError, match="MirroredStrategy.*too many positional"):
    ndq_tf.MirroredStrategy("dqsg", None, None, 64)


def _one_warning(record):
  found = [w for w in record if issubclass(w.category, DeprecationWarning)]
  assert len(found) == 1, [str(w.message) for w in record]
  assert found[0].filename == __file__  # Where the old name was used.
  return str(found[0].message)


def _nested_kwargs():
  return {"codec": _nested(), "reference_codec": _reference()}


@pytest.mark.parametrize("make, old, new, value, read", [
    (CompressionOptions, "transport", "exchange", "all_reduce",
     lambda o: o.exchange),
    (ndq_tf.CompressedAllReduce, "transport", "exchange", "all_reduce",
     lambda o: o.exchange),
    (ndq_tf.CompressedAllReduce, "reference_replicas", "reference_group", 1,
     lambda o: o.reference_group),
    (lambda **k: ndq_tf.MirroredStrategy(devices=_devices(), **k),
     "transport", "exchange", "all_reduce",
     lambda s: s.compressed_all_reduce.exchange),
    (lambda **k: ndq_tf.MirroredStrategy(devices=_devices(), **k),
     "reference_replicas", "reference_group", 1,
     lambda s: s.compressed_all_reduce.reference_group),
], ids=["options_transport", "ops_transport", "ops_reference_replicas",
        "mirrored_transport", "mirrored_reference_replicas"])
def test_a_deprecated_name_warns_once_and_sets_its_argument(
    make, old, new, value, read):
  kwargs = _nested_kwargs() if new == "reference_group" else {
      "codec": "terngrad"}
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    made = make(**kwargs, **{old: value})
  message = _one_warning(record)
  assert f"The argument `{old}` of ndq_tf." in message
  assert f"use `{new}` instead" in message
  assert read(made) == value
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    assert read(make(**kwargs, **{new: value})) == value


@pytest.mark.parametrize("old, value, match", [
    ("transport", "ring", r"`exchange` must be one of .*exchange='ring'"),
    ("reference_workers", 1,
     r"only for a nested `codec`.*reference_group=1"),
])
def test_multi_worker_deprecated_names_warn_once(old, value, match):
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    with pytest.raises(ValueError, match=match):
      ndq_tf.MultiWorkerMirroredStrategy("dqsg", **{old: value})
  message = _one_warning(record)
  assert f"`{old}` of ndq_tf.MultiWorkerMirroredStrategy" in message


@pytest.mark.parametrize("make, old, new", [
    (CompressionOptions, "transport", "exchange"),
    (ndq_tf.CompressedAllReduce, "transport", "exchange"),
    (ndq_tf.CompressedAllReduce, "reference_replicas", "reference_group"),
    (ndq_tf.MirroredStrategy, "transport", "exchange"),
    (ndq_tf.MirroredStrategy, "reference_replicas", "reference_group"),
    (ndq_tf.MultiWorkerMirroredStrategy, "transport", "exchange"),
    (ndq_tf.MultiWorkerMirroredStrategy, "reference_workers",
     "reference_group"),
])
def test_both_names_of_an_argument_are_an_error_naming_both(make, old, new):
  values = {"exchange": "all_gather", "transport": "all_reduce",
            "reference_group": 1, "reference_replicas": 2,
            "reference_workers": 2}
  with pytest.raises(ValueError, match=re.escape(
      f"`{old}` is the deprecated name of `{new}`: pass only `{new}`. "
      f"Received: {new}={values[new]!r} and {old}={values[old]!r}.")):
    make("dqsg", **{old: values[old], new: values[new]})


def test_deprecated_properties_and_constant_warn():
  ops = ndq_tf.CompressedAllReduce(**_nested_kwargs(), reference_group=1,
                                   exchange="all_gather")
  with pytest.warns(DeprecationWarning, match="use `exchange` instead"):
    assert ops.transport == "all_gather"
  with pytest.warns(DeprecationWarning, match="use `reference_group` inst"):
    assert ops.reference_replicas == 1
  with pytest.warns(DeprecationWarning, match="options.EXCHANGES"):
    assert options_lib.TRANSPORTS is options_lib.EXCHANGES


def test_options_argument_is_used_as_is():
  options = CompressionOptions("dqsg:num_levels=2", seed=4,
                               exchange="all_gather")
  assert ndq_tf.CompressedAllReduce(options=options).options is options
  strategy = ndq_tf.MirroredStrategy(options=options, devices=_devices())
  assert strategy.compressed_all_reduce.options is options
  fallback = tf.distribute.ReductionToOneDevice()
  strategy = ndq_tf.MirroredStrategy(devices=_devices(), fallback=fallback,
                                     options=options)
  assert strategy.compressed_all_reduce.fallback is fallback


@pytest.mark.parametrize("make", [
    ndq_tf.CompressedAllReduce,
    lambda *a, **k: ndq_tf.MirroredStrategy(*a, devices=_devices(), **k),
    ndq_tf.MultiWorkerMirroredStrategy])
def test_options_and_fields_together_are_an_error_naming_both(make):
  options = CompressionOptions("dqsg", seed=4)
  with pytest.raises(ValueError, match=r"either as `options` or as "
                     r"arguments \(`seed`\), not both. Received: options="
                     r"CompressionOptions\(.*seed=4.*\) and seed=3\."):
    make(options=options, seed=3)
  with pytest.raises(ValueError, match=r"\(`codec`\).* and codec='dqsg'"):
    make("dqsg", options=options)
  with pytest.raises(TypeError, match="`options` of ndq_tf.* must be an "
                     "ndq_tf.distribute.CompressionOptions. Received: "
                     "options='dqsg' of type str"):
    make(options="dqsg")


def test_config_keeps_its_keys_and_loads_either_name():
  ops = ndq_tf.CompressedAllReduce(**_nested_kwargs(), reference_group=1,
                                   exchange="all_gather")
  config = ops.get_config()
  assert config["transport"] == "all_gather"
  assert config["reference_replicas"] == 1
  assert "exchange" not in config and "reference_group" not in config
  assert CompressionOptions.from_config(
      ops.options.get_config()) == ops.options
  renamed = dict(config, exchange=config.pop("transport"),
                 reference_group=config.pop("reference_replicas"))
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    for each in (ops.get_config(), renamed):
      back = ndq_tf.CompressedAllReduce.from_config(each)
      assert back.get_config() == ops.get_config()
  with pytest.raises(ValueError, match="both its names. Received: exchange="
                     "'all_gather' and transport='all_gather'"):
    ndq_tf.CompressedAllReduce.from_config(
        dict(renamed, transport="all_gather"))


@pytest.mark.parametrize("codec", [
    "ecdq:bits=1.0", ndq_tf.EntropyCodedDitheredCodec(step_ratio=2.0)])
def test_variable_length_codecs_travel_only_as_the_options_own_codec(codec):
  # The all-gather trims ECDQ's payloads to the words they use; PowerSGD's
  # factors and a nested group's reference codes stay fixed-length.
  for exchange in ("auto", "all_gather"):
    options = CompressionOptions(codec=codec, exchange=exchange)
    assert options.codec.variable_length
  assert ndq_tf.MirroredStrategy(codec=codec, devices=["/cpu:0"])
  with pytest.raises(ValueError, match=r"`factor_codec` must have "
                     r"fixed-length.*Received: factor_codec="):
    ndq_tf.PowerSGD(rank=2, factor_codec=codec)
  with pytest.raises(ValueError, match=r"`reference_codec` must have "
                     r"fixed-length.*Received: reference_codec=EntropyCoded"):
    CompressionOptions(codec=ndq_tf.NestedDitheredCodec(),
                       reference_codec=codec)


def test_the_integer_all_reduce_refuses_variable_length_codecs_naming_it():
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0)
  with pytest.raises(ValueError, match=r"exchange='all_reduce' cannot sum "
                     r"the payloads of codec=EntropyCodedDitheredCodec\("):
    CompressionOptions(codec=codec, exchange="all_reduce")
  options = CompressionOptions(codec=codec, exchange="reduce_scatter")
  assert options.reduce_scatter_levels is None
  # Stage 2 re-codes with the codec itself: DQSG's levels do not apply.
  with pytest.raises(ValueError, match=r"`reduce_scatter_levels` sets stage "
                     r"2's DQSG.*Received: reduce_scatter_levels=2, "
                     r"codec=EntropyCodedDitheredCodec\("):
    CompressionOptions(codec=codec, exchange="reduce_scatter",
                       reduce_scatter_levels=2)
