"""The plugin manager: discovers plugins through the ``latch.plugins`` entry-point group.

Built-in packages and third-party packages take the same path. ``LATCH_PLUGINS=a,b`` limits which
entry points load (by entry-point name); the core plugin always loads. A plugin that implements a
hook Latch does not define fails at load (pluggy's ``check_pending``), naming the hook.
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any, Iterable

import pluggy

from . import hookspecs
from .registry import OpSpec, Registry, RegistryError
from .errors import UserError

GROUP = "latch.plugins"
ENV = "LATCH_PLUGINS"
CORE_PLUGIN = "core"


class PluginError(UserError, RuntimeError):
    pass


# registry attribute -> (hook, what one registered item is called in messages)
KINDS = {
    "ops": ("latch_register_ops", "op"),
    "lowerings": ("latch_register_lowerings", "lowering"),
    "schedulers": ("latch_register_schedulers", "scheduler"),
    "passes": ("latch_register_passes", "pass"),
    "commands": ("latch_register_commands", "command"),
    "configs": ("latch_register_configs", "body-configuration function"),
}


class Registries:
    """One registry per hook, each filled on first use: ``latch-pipeline --help`` asks only for the
    commands, so no plugin's op, lowering or pass registrations run (or import what they need)."""

    def __init__(self, manager: pluggy.PluginManager, plugins: list[tuple[str, str]]):
        self.manager = manager
        self.plugins = plugins  # (plugin name, distribution "name version" or "-")
        self._filled: dict[str, Registry] = {}

    def _registry(self, attr: str) -> Registry:
        reg = self._filled.get(attr)
        if reg is None:
            hook_name, kind = KINDS[attr]
            reg = Registry(kind)
            _fill(self.manager, hook_name, reg)
            self._filled[attr] = reg
        return reg

    ops = property(lambda self: self._registry("ops"))
    lowerings = property(lambda self: self._registry("lowerings"))
    schedulers = property(lambda self: self._registry("schedulers"))
    passes = property(lambda self: self._registry("passes"))
    commands = property(lambda self: self._registry("commands"))
    configs = property(lambda self: self._registry("configs"))

    def by_hook(self) -> dict[str, Registry]:
        return {hook: self._registry(attr) for attr, (hook, _) in KINDS.items()}

    def __repr__(self) -> str:
        return f"Registries(plugins={self.plugins!r}, filled={sorted(self._filled)})"


def _allowed() -> set[str] | None:
    raw = os.environ.get(ENV)
    if raw is None or not raw.strip():
        return None
    return {x.strip() for x in raw.split(",") if x.strip()}


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name)


def make_manager(extra_plugins: Iterable[tuple[str, Any]] = (), *, entry_points: bool = True) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("latch")
    pm.add_hookspecs(hookspecs)
    allowed = _allowed()
    if entry_points:
        seen: dict[str, str] = {}
        for ep in _entry_points():
            if allowed is not None and ep.name not in allowed and ep.name != CORE_PLUGIN:
                continue
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "-"
            if ep.name in seen:
                if seen[ep.name] == dist:
                    continue  # the same distribution seen twice on sys.path
                raise PluginError(
                    f"two plugins named {ep.name!r} in entry-point group {GROUP!r}: from {seen[ep.name]} and {dist}"
                )
            try:
                plugin = ep.load()
            except Exception as e:  # a broken plugin must name itself
                raise PluginError(f"plugin {ep.name!r} ({dist}, {ep.value}) failed to import: {e}") from e
            seen[ep.name] = dist
            pm.register(plugin, name=ep.name)
            pm._latch_dists = getattr(pm, "_latch_dists", {})  # type: ignore[attr-defined]
            pm._latch_dists[ep.name] = dist  # type: ignore[attr-defined]
        if allowed is not None:
            missing = allowed - set(seen) - {CORE_PLUGIN}
            if missing:
                raise PluginError(
                    f"{ENV} names plugins that are not installed: {sorted(missing)}; "
                    f"installed: {sorted(e.name for e in _entry_points())}"
                )
    for name, plugin in extra_plugins:
        pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        # pluggy's error carries the plugin object; name it as it was registered (the entry point).
        name = pm.get_name(e.plugin) if e.plugin is not None else "?"
        raise PluginError(
            f"plugin {name!r} implements a hook Latch does not define: {e}; "
            f"Latch's hooks: {', '.join(sorted(h for h in dir(pm.hook) if not h.startswith('_')))}"
        ) from None
    return pm


def collect(pm: pluggy.PluginManager, *, lazy: bool = False) -> Registries:
    """The registries of ``pm``'s plugins; every hook runs now unless ``lazy`` (then each runs when
    its registry is first used, and its registration errors surface there)."""
    dists = getattr(pm, "_latch_dists", {})
    plugins = [(name, dists.get(name, "-")) for name, _ in sorted(pm.list_name_plugin()) if name is not None]
    regs = Registries(pm, plugins)
    if not lazy:
        regs.by_hook()
    return regs


def _fill(pm: pluggy.PluginManager, hook_name: str, registry: Registry) -> None:
    hook = getattr(pm.hook, hook_name)
    # get_hookimpls() lists implementations in registration order (pluggy CALLS them in reverse);
    # registering in that order makes "registered by A and again by B" name the first one as A.
    for impl in hook.get_hookimpls():
        registrant = impl.plugin_name

        def register(*args, _registrant=registrant):
            _register(registry, hook_name, _registrant, args)

        impl.function(register=register)


def _register(registry: Registry, hook: str, registrant: str, args: tuple) -> None:
    if hook == "latch_register_ops":
        if len(args) != 1 or not isinstance(args[0], OpSpec):
            raise RegistryError(f"plugin {registrant!r}: {hook} register() takes one OpSpec, got {args!r}")
        registry.add(args[0].name, args[0], registrant)
    elif hook in ("latch_register_passes", "latch_register_commands"):
        if len(args) != 1:
            raise RegistryError(f"plugin {registrant!r}: {hook} register() takes one object, got {len(args)}")
        item = args[0]
        name = getattr(item, "name", None)
        if not isinstance(name, str):
            raise RegistryError(f"plugin {registrant!r}: {hook} item {item!r} has no string .name")
        registry.add(name, item, registrant)
    else:
        if len(args) != 2 or not isinstance(args[0], str):
            raise RegistryError(f"plugin {registrant!r}: {hook} register() takes (name, item), got {args!r}")
        if hook == "latch_register_configs" and not callable(args[1]):
            raise RegistryError(f"plugin {registrant!r}: {hook} register({args[0]!r}, fn) needs a callable "
                                f"fn(in_types, out_types, attrs) -> list[BodyConfig], got {args[1]!r}")
        registry.add(args[0], args[1], registrant)


_CACHE: Registries | None = None


def registries() -> Registries:
    """The process-wide registries from installed plugins (loaded once)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = collect(make_manager(), lazy=True)
    return _CACHE


def reset() -> None:
    """Forget the cached registries (tests that change LATCH_PLUGINS or register plugins)."""
    global _CACHE
    _CACHE = None


def load_with(*plugins: tuple[str, Any], entry_points: bool = True) -> Registries:
    """Registries from installed plugins plus the given (name, plugin) objects; not cached."""
    return collect(make_manager(plugins, entry_points=entry_points))
