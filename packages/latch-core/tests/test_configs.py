"""Body configurations (latch_core.configs): the record's checks, the lookup through the
``latch_register_configs`` registry, and the errors naming the op and the registrant."""

import pytest

from latch_core import hookspecs
from latch_core.configs import BodyConfig, ConfigError, configs_for, find_config
from latch_core.ir import TensorType
from latch_core.plugins import load_with
from latch_core.registry import RegistryError

A, B, OUT = TensorType((128, 64), "bf16"), TensorType((64, 256), "bf16"), TensorType((128, 256), "f32")


def _plugin(fn, op="demo::mm"):
    class P:
        @staticmethod
        @hookspecs.hookimpl
        def latch_register_configs(register):
            register(op, fn)

    return P()


def _two(in_types, out_types, attrs):
    n = out_types[0].shape[-1]
    return [BodyConfig("wide", (128, n), 64, (128 + n) * 64 * 2, "wgmma"),
            BodyConfig("simt", (128, 128), 32, 0, "simt", notes="fallback")]


def test_lookup_lists_and_finds_by_name():
    regs = load_with(("cfg", _plugin(_two)), entry_points=False)
    got = configs_for("demo::mm", [A, B], [OUT], {}, regs.configs)
    assert [c.name for c in got] == ["wide", "simt"] and got[0].tile == (128, 256)
    assert find_config("demo::mm", [A, B], [OUT], {}, "simt", regs.configs).k_tile == 32
    assert configs_for("demo::other", [A, B], [OUT], {}, regs.configs) == []


def test_unknown_recorded_config_names_the_op_and_the_offered_ones():
    regs = load_with(("cfg", _plugin(_two)), entry_points=False)
    with pytest.raises(ConfigError, match=r"demo::mm\(bf16\[128,64\], bf16\[64,256\]\) records body configuration "
                                          r"'gone'.*offer: wide, simt"):
        find_config("demo::mm", [A, B], [OUT], {}, "gone", regs.configs)


def test_a_misbehaving_function_is_named_with_its_registrant():
    regs = load_with(("bad", _plugin(lambda i, o, a: ["x"])), entry_points=False)
    with pytest.raises(ConfigError, match="registered by 'bad'.*must be a list"):
        configs_for("demo::mm", [A, B], [OUT], {}, regs.configs)
    same = BodyConfig("a", (1, 1), 1, 0, "simt")
    regs = load_with(("dup", _plugin(lambda i, o, a: [same, same])), entry_points=False)
    with pytest.raises(ConfigError, match=r"registered by 'dup'.*repeat the names \['a'\]"):
        configs_for("demo::mm", [A, B], [OUT], {}, regs.configs)


def test_a_second_function_for_one_op_is_refused_naming_both():
    with pytest.raises(RegistryError, match="'demo::mm': registered by 'one' and again by 'two'"):
        load_with(("one", _plugin(_two)), ("two", _plugin(_two)), entry_points=False)
    with pytest.raises(RegistryError, match="plugin 'bad'.*needs a callable"):
        load_with(("bad", _plugin("not callable")), entry_points=False)


@pytest.mark.parametrize("kw,fragment", [
    ({"kind": "tensor"}, "kind must be one of"),
    ({"tile": (128, 0)}, "tile must be positive ints"),
    ({"tile": ()}, "tile must be positive ints"),
    ({"k_tile": 0}, "k_tile must be a positive int"),
    ({"stage_bytes": -1}, "stage_bytes must be a non-negative int"),
    ({"name": ""}, "name must be a non-empty string"),
])
def test_the_record_checks_its_fields(kw, fragment):
    base = dict(name="c", tile=(128, 64), k_tile=64, stage_bytes=0, kind="wgmma")
    with pytest.raises(ConfigError, match=fragment):
        BodyConfig(**{**base, **kw})
