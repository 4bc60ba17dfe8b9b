"""The plugin manager: entry-point discovery, LATCH_PLUGINS, loud failures, duplicate registrants.

Entry points are simulated here (latch-core alone must test itself); the root test
tests/test_plugins_entry_points.py installs a real third-party package and checks the same path.
"""

import textwrap

import click
import pytest

from core_ops import OPS
from latch_core import hookspecs, plugins
from latch_core.passes import Pass
from latch_core.plugins import GROUP, PluginError, collect, load_with, make_manager
from latch_core.registry import OpSpec, RegistryError


class FakeDist:
    def __init__(self, name, version="1.0"):
        self.name, self.version = name, version


class FakeEntryPoint:
    """What make_manager reads of an importlib.metadata.EntryPoint: name, value, dist, load()."""

    def __init__(self, name, value, dist="fake-dist"):
        self.name, self.value, self.group = name, value, GROUP
        self.dist = FakeDist(dist) if dist else None

    def load(self):
        import importlib

        return importlib.import_module(self.value)


def write_plugin(tmp_path, module, body):
    (tmp_path / f"{module}.py").write_text("from latch_core.hookspecs import hookimpl\n" + textwrap.dedent(body))


def op_plugin(tmp_path, module, op):
    write_plugin(tmp_path, module, f"""
        from latch_core.registry import OpSpec
        @hookimpl
        def latch_register_ops(register):
            register(OpSpec({op!r}, "x(a) -> b", lambda ins, attrs: [ins[0]]))
    """)


@pytest.fixture
def fake_eps(monkeypatch, tmp_path, fresh_registries):
    """Replace installed entry points with (name, module) pairs written under tmp_path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("LATCH_PLUGINS", raising=False)
    eps: list[FakeEntryPoint] = [FakeEntryPoint("core", "latch_core.plugin", "latch-core")]
    monkeypatch.setattr(plugins, "_entry_points", lambda: sorted(eps, key=lambda e: e.name))
    return eps


def test_entry_points_are_discovered_and_registrants_recorded(fake_eps, tmp_path):
    op_plugin(tmp_path, "alpha_plugin", "alpha::x")
    fake_eps.append(FakeEntryPoint("alpha", "alpha_plugin", "alpha-dist"))
    regs = plugins.registries()
    assert "alpha::x" in regs.ops and regs.ops.owner("alpha::x") == "alpha"
    assert ("alpha", "alpha-dist 1.0") in regs.plugins and ("core", "latch-core 1.0") in regs.plugins
    assert regs.passes.owner("core.lint") == "core"
    assert plugins.registries() is regs  # cached for the process
    plugins.reset()
    assert plugins.registries() is not regs


def test_latch_plugins_limits_what_loads_but_core_always_loads(fake_eps, tmp_path, monkeypatch):
    op_plugin(tmp_path, "alpha_plugin2", "alpha::x")
    op_plugin(tmp_path, "beta_plugin2", "beta::x")
    fake_eps += [FakeEntryPoint("alpha", "alpha_plugin2"), FakeEntryPoint("beta", "beta_plugin2")]
    monkeypatch.setenv("LATCH_PLUGINS", " beta , ")
    regs = collect(make_manager())
    assert [n for n, _ in regs.plugins] == ["beta", "core"]
    assert "beta::x" in regs.ops and "alpha::x" not in regs.ops
    monkeypatch.setenv("LATCH_PLUGINS", "")  # empty: no limit
    assert {"alpha::x", "beta::x"} <= set(collect(make_manager()).ops)


def test_latch_plugins_naming_an_absent_plugin_fails_listing_what_is_installed(fake_eps, monkeypatch):
    monkeypatch.setenv("LATCH_PLUGINS", "core,gamma")
    with pytest.raises(PluginError, match=r"LATCH_PLUGINS names plugins that are not installed: \['gamma'\]; "
                                          r"installed: \['core'\]"):
        make_manager()


def test_excluded_plugins_are_not_even_imported(fake_eps, tmp_path, monkeypatch):
    write_plugin(tmp_path, "exploding_plugin", "raise RuntimeError('imported!')\n")
    fake_eps.append(FakeEntryPoint("boom", "exploding_plugin"))
    monkeypatch.setenv("LATCH_PLUGINS", "core")
    make_manager()  # no error: boom is never imported


def test_a_plugin_that_fails_to_import_names_itself(fake_eps, tmp_path):
    write_plugin(tmp_path, "exploding_plugin2", "raise RuntimeError('no GPU driver')\n")
    fake_eps.append(FakeEntryPoint("boom", "exploding_plugin2", "boom-dist"))
    with pytest.raises(PluginError, match=r"plugin 'boom' \(boom-dist 1.0, exploding_plugin2\) failed to import: "
                                          r"no GPU driver"):
        make_manager()


def test_a_misspelt_hook_fails_loudly_naming_it(fake_eps, tmp_path):
    write_plugin(tmp_path, "typo_plugin", """
        @hookimpl
        def latch_register_opps(register):
            pass
    """)
    fake_eps.append(FakeEntryPoint("typo", "typo_plugin"))
    with pytest.raises(PluginError, match="plugin 'typo' implements a hook Latch does not define: .*latch_register_opps"):
        make_manager()


def test_two_distributions_with_one_entry_point_name_fail(fake_eps, tmp_path):
    op_plugin(tmp_path, "dup_a", "dup::a")
    op_plugin(tmp_path, "dup_b", "dup::b")
    fake_eps += [FakeEntryPoint("dup", "dup_a", "first-dist"), FakeEntryPoint("dup", "dup_b", "second-dist")]
    with pytest.raises(PluginError, match="two plugins named 'dup' in entry-point group 'latch.plugins': "
                                          "from first-dist 1.0 and second-dist 1.0"):
        make_manager()


def test_the_same_distribution_seen_twice_loads_once(fake_eps, tmp_path):
    op_plugin(tmp_path, "twice_plugin", "twice::x")
    fake_eps += [FakeEntryPoint("twice", "twice_plugin", "d"), FakeEntryPoint("twice", "twice_plugin", "d")]
    assert collect(make_manager()).ops.owner("twice::x") == "twice"


def test_duplicate_op_from_two_plugins_names_both_registrants(fake_eps, tmp_path):
    op_plugin(tmp_path, "first_ops", "shared::op")
    op_plugin(tmp_path, "second_ops", "shared::op")
    fake_eps += [FakeEntryPoint("first", "first_ops"), FakeEntryPoint("second", "second_ops")]
    with pytest.raises(RegistryError) as e:
        collect(make_manager())
    msg = str(e.value)
    assert "duplicate op 'shared::op'" in msg and "'first'" in msg and "'second'" in msg
    assert "LATCH_PLUGINS" in msg  # and what to do about it


# ------------------------------------------------------------------------------------------------
# Every hook: one example registration each. A hook added to hookspecs.py without an entry here
# fails test_every_hook_has_an_example (the pluggy habit: each hook is exercised by a test).

def _scheduler(doc, options):
    return None


def _configs(in_types, out_types, attrs):
    return []


@click.command("hello")
def _hello():
    click.echo("hello")


EXAMPLES = {
    "latch_register_ops": ((OPS[0],), "latch::add", "ops"),
    "latch_register_lowerings": (("demo::op", "lowering-object"), "demo::op", "lowerings"),
    "latch_register_schedulers": (("greedy", _scheduler), "greedy", "schedulers"),
    "latch_register_passes": ((Pass("demo.pass", lambda d: d),), "demo.pass", "passes"),
    "latch_register_commands": ((_hello,), "hello", "commands"),
    "latch_register_configs": (("demo::op", _configs), "demo::op", "configs"),
}


def make_plugin(hook, args):
    ns = {}
    exec(f"def {hook}(register):\n    register(*ARGS)\n", {"ARGS": args}, ns)
    return type("P", (), {hook: staticmethod(hookspecs.hookimpl(ns[hook]))})()


def test_every_hook_has_an_example():
    pm = make_manager(entry_points=False)
    hooks = {h for h in dir(pm.hook) if not h.startswith("_")}
    assert hooks == set(EXAMPLES) == set(collect(pm).by_hook())
    assert all(h.startswith("latch_register_") for h in hooks)
    specs = {h for h in dir(hookspecs) if h.startswith("latch_")}
    assert specs == hooks  # hookspecs.py holds only these specs, each documented
    assert all(getattr(hookspecs, h).__doc__ for h in specs)


@pytest.mark.parametrize("hook", sorted(EXAMPLES))
def test_each_hook_registers_through_its_callback(hook):
    args, name, registry = EXAMPLES[hook]
    regs = load_with(("one", make_plugin(hook, args)), entry_points=False)
    reg = getattr(regs, registry)
    assert list(reg) == [name] and reg.owner(name) == "one"
    assert reg.get(name) is args[-1]
    assert regs.by_hook()[hook] is reg


@pytest.mark.parametrize("hook", sorted(EXAMPLES))
def test_each_hook_rejects_a_duplicate_naming_both_registrants(hook):
    args, name, _ = EXAMPLES[hook]
    with pytest.raises(RegistryError) as e:
        load_with(("one", make_plugin(hook, args)), ("two", make_plugin(hook, args)), entry_points=False)
    assert f"{name!r}: registered by 'one' and again by 'two'" in str(e.value)


@pytest.mark.parametrize("hook,bad,expected", [
    ("latch_register_ops", ("not a spec",), "plugin 'bad': latch_register_ops register\\(\\) takes one OpSpec"),
    ("latch_register_passes", (object(),), "plugin 'bad': latch_register_passes item .* has no string .name"),
    ("latch_register_commands", (1, 2), "plugin 'bad': latch_register_commands register\\(\\) takes one object, got 2"),
    ("latch_register_schedulers", (_scheduler,), "plugin 'bad': latch_register_schedulers register\\(\\) takes \\(name, item\\)"),
    ("latch_register_lowerings", (3, "x"), "plugin 'bad': latch_register_lowerings register\\(\\) takes \\(name, item\\)"),
])
def test_malformed_registrations_name_the_plugin(hook, bad, expected):
    with pytest.raises(RegistryError, match=expected):
        load_with(("bad", make_plugin(hook, bad)), entry_points=False)


def test_registrations_arrive_in_registration_order_and_by_owner():
    a = make_plugin("latch_register_ops", (OPS[0],))
    b = make_plugin("latch_register_ops", (OPS[1],))
    regs = load_with(("a", a), ("b", b), entry_points=False)
    assert regs.ops.by_owner() == {"a": ["latch::add"], "b": ["latch::sub"]}
    assert [n for n, _ in regs.plugins] == ["a", "b"]


def test_registry_lookup_errors_list_what_is_registered():
    regs = load_with(("a", make_plugin("latch_register_ops", (OPS[0],))), entry_points=False)
    with pytest.raises(RegistryError, match="no op named 'latch::mul'; registered: latch::add"):
        regs.ops.get("latch::mul")
    with pytest.raises(RegistryError, match=r"no scheduler named 'x'; registered: \(none\)"):
        regs.schedulers.get("x")
    assert len(regs.ops) == 1 and regs.ops.items() == [("latch::add", OPS[0])]


def test_opspec_checks_operand_count_before_its_rule():
    spec = OpSpec("t::two", "two(a, b)", lambda ins, a: [ins[0]], num_inputs=(2, 2))
    from latch_core.ir import TensorType
    from latch_core.registry import ShapeError

    t = TensorType((2,), "f32")
    assert spec.check([t, t], {}) == [t]
    with pytest.raises(ShapeError, match="t::two takes 2..2 operands, got 1"):
        spec.check([t], {})
