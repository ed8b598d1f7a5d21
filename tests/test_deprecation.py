"""Every old path and name still works, is the new object, and warns.

The one helper, `ndq_tf._deprecation`, serves every deprecated alias: the
modules moved to `ndq_tf.core` (and `ndq_tf.reduce_scatter_theory`, merged
into `ndq_tf.theory`), the cost model's old names in `ndq_tf.theory` and
`ndq_tf.core.exchanges`, the transports renamed for what they move
(`AllGatherTransport`, `AllToAllTransport`), the telemetry's old keys and
properties. The old
cluster paths (`ndq_tf.launch`, ...) are tested in fresh interpreters by
test_package.py.
"""

import importlib
import sys
import warnings

import pytest

import ndq_tf
from ndq_tf import _deprecation
from ndq_tf import theory
from ndq_tf.core import cost_model
from ndq_tf.core import exchanges
from ndq_tf.core import telemetry
from ndq_tf.core import transports
from ndq_tf.core.exchanges import reduce_scatter
from ndq_tf.core.transports import all_gather
from ndq_tf.core.transports import all_to_all
from ndq_tf.core.transports import collective_sum
from ndq_tf.distribute import cross_device_ops

#: Old module path -> new one.
MOVED_MODULES = {
    **{f"ndq_tf.distribute.{name}": f"ndq_tf.core.{name}"
       for name in ("engine", "exchanges", "fingerprint", "fusion",
                    "fusion_codec", "fusion_plan", "fusion_sum",
                    "nested_state", "ready_order", "scope", "telemetry",
                    "tf_internals", "transports")},
    "ndq_tf.distribute.exchanges.gather": "ndq_tf.core.exchanges.gather",
    "ndq_tf.distribute.exchanges.nested_shards":
        "ndq_tf.core.exchanges.nested_shards",
    "ndq_tf.distribute.transports.all_gather":
        "ndq_tf.core.transports.all_gather",
    "ndq_tf.reduce_scatter_theory": "ndq_tf.theory",
}

#: Old name (module, attribute) -> its object.
MOVED_NAMES = {
    ("ndq_tf.theory", "exchange_bits"): cost_model.exchange_bits,
    ("ndq_tf.theory", "auto_transport"): cost_model.auto,
    ("ndq_tf.theory", "TRANSPORTS"): cost_model.TRANSPORTS,
    ("ndq_tf.theory", "reduce_scatter_bits"):
        reduce_scatter.reduce_scatter_bits,
    ("ndq_tf.theory", "ALL_GATHER_HEADER_WORDS"): all_gather.HEADER_WORDS,
    ("ndq_tf.theory", "ALL_REDUCE_STAMP_WORDS"): collective_sum.STAMP_WORDS,
    **{("ndq_tf.core.exchanges", name): getattr(cost_model, name)
       for name in ("DECODE_NS", "DEFAULT_LINK_GBPS", "DRAW_NS", "LANE_NS",
                    "auto", "bits_summary", "costs", "exchange_bits",
                    "exchange_seconds", "exchange_work", "summary",
                    "time_model")},
    ("ndq_tf.core.transports", "AllGatherTransport"):
        all_gather.CollectiveAllGatherTransport,
    ("ndq_tf.core.transports", "AllToAllTransport"):
        all_to_all.CollectiveAllToAllTransport,
    ("ndq_tf.core.transports.all_gather", "AllGatherTransport"):
        all_gather.CollectiveAllGatherTransport,
    ("ndq_tf.core.transports.all_to_all", "AllToAllTransport"):
        all_to_all.CollectiveAllToAllTransport,
}


def _one_deprecation(record):
  found = [w for w in record if issubclass(w.category, DeprecationWarning)]
  assert len(found) == 1, [str(w.message) for w in record]
  return found[0]


@pytest.mark.parametrize("old, new", sorted(MOVED_MODULES.items()))
def test_old_module_path_is_the_moved_module_and_warns(old, new):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    importlib.import_module(new)  # Whatever it imports may warn too.
    importlib.import_module(old.rpartition(".")[0])  # An old parent.
  sys.modules.pop(old, None)  # The alias only, as if never imported.
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    module = importlib.import_module(old)
  assert module is importlib.import_module(new)
  warning = _one_deprecation(record)
  assert str(warning.message) == (
      f"`{old}` is deprecated and will be removed in the next release; use "
      f"`{new}` instead.")
  assert warning.filename == __file__  # Where the old path was used.
  # Then it is imported: no second warning.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert importlib.import_module(old) is module


def test_from_import_of_an_old_path_gives_the_new_objects():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    # pylint: disable=g-import-not-at-top
    from ndq_tf.distribute import engine
    from ndq_tf.distribute.exchanges import gather
    from ndq_tf.distribute.transports import CollectiveAllGatherTransport
    from ndq_tf.reduce_scatter_theory import reduce_scatter_total_mse
    # pylint: enable=g-import-not-at-top
  assert engine.ExchangeEngine is ndq_tf.core.engine.ExchangeEngine
  assert gather is exchanges.gather
  assert CollectiveAllGatherTransport is (
      all_gather.CollectiveAllGatherTransport)
  assert reduce_scatter_total_mse is theory.reduce_scatter_total_mse


@pytest.mark.parametrize("module, name", sorted(MOVED_NAMES))
def test_old_name_is_the_new_object_and_warns(module, name):
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    value = getattr(importlib.import_module(module), name)
  assert value is MOVED_NAMES[module, name]
  warning = _one_deprecation(record)
  assert f"`{module}.{name}` is deprecated" in str(warning.message)
  assert "ndq_tf.core." in str(warning.message)
  assert warning.filename == __file__


def test_renamed_transport_warns_naming_its_replacement():
  with pytest.warns(DeprecationWarning) as record:
    old = transports.AllToAllTransport
  assert old is transports.CollectiveAllToAllTransport
  assert str(record[0].message) == (
      "`ndq_tf.core.transports.AllToAllTransport` is deprecated and will be "
      "removed in the next release; use "
      "`ndq_tf.core.transports.all_to_all.CollectiveAllToAllTransport` "
      "instead.")
  assert record[0].filename == __file__
  # The old name builds the same transport, which keeps its new name.
  with pytest.warns(DeprecationWarning, match="CollectiveAllGatherTransport"):
    gather = transports.AllGatherTransport(None, 2, 0, "/cpu:0")
  assert isinstance(gather, transports.CollectiveAllGatherTransport)
  assert gather.name == "collective_all_gather"


def test_unknown_name_is_still_an_attribute_error():
  with pytest.raises(AttributeError, match="'ndq_tf.theory' has no "
                     "attribute 'no_such_formula'"):
    theory.no_such_formula  # pylint: disable=pointless-statement
  assert not hasattr(exchanges, "no_such_name")


def test_public_names_are_not_deprecated():
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    for package in (ndq_tf, ndq_tf.core, ndq_tf.distribute, theory,
                    exchanges, transports):
      for name in package.__all__:
        assert getattr(package, name) is not None, name


def test_telemetry_key_and_property_aliases_warn_through_the_helper():
  stats = telemetry.Stats({"exchange_count": 3, "step": 3})
  with pytest.warns(DeprecationWarning) as record:
    assert stats["step"] == 3
  assert str(record[0].message) == (
      "The telemetry key 'step' is deprecated and will be removed in the "
      "next release; use 'exchange_count' instead.")
  assert record[0].filename == __file__

  class Ops(cross_device_ops.DeprecatedTelemetry):

    def stats(self):
      return {"sent_bits": 640, "sent_bits_per_element": 2.5}

  with pytest.warns(DeprecationWarning) as record:
    assert Ops().last_wire_bits == 640
  assert str(record[0].message) == (
      '`last_wire_bits` is deprecated and will be removed in the next '
      'release; use `stats()["sent_bits"]` instead.')
  assert record[0].filename == __file__


def test_the_helper_imports_the_new_home_only_when_the_old_name_is_read():
  getattr_ = _deprecation.moved_attributes(
      "old.home", {"name": "ndq_tf.no_such_module.name"})
  with pytest.raises(AttributeError, match="'old.home' has no attribute"):
    getattr_("other")
  with pytest.warns(DeprecationWarning, match="`old.home.name`"):
    with pytest.raises(ModuleNotFoundError, match="ndq_tf.no_such_module"):
      getattr_("name")
