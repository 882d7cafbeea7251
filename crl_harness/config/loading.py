"""Loading a training configuration: a shipped name or a YAML path, merged over the schema's
defaults by OmegaConf, then ``key=value`` overrides, then the checks of ``validation``; a
setting ``bfloat16-if-native`` is then made the dtype this machine runs (``resolve_dtype``).

Holds:
- ``load_config``: the one entry point (``None``: the defaults);
- ``config_dir``: the shipped configs (``assets/configs``);
- ``config_to_dict``: a config as a plain nested dict (metrics headers, checkpoints);
- the overrides' guard: ``_OverrideLoader`` parses each value as YAML without anchors or aliases
  (an alias bomb) and at most ``MAX_OVERRIDE_DEPTH`` levels deep, in at most
  ``MAX_OVERRIDE_CHARS`` characters.
"""

from __future__ import annotations

from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from crl_harness.assets import assets_dir
from crl_harness.config.schema import TrainConfig
from crl_harness.config.validation import SWITCHES, ConfigError, _check_switch, _validate
from crl_harness.models.hf_loading import BF16_IF_NATIVE, resolve_device, resolve_dtype

__all__ = [
    "load_config",
    "config_dir",
    "config_to_dict",
    "MAX_OVERRIDE_CHARS",
    "MAX_OVERRIDE_DEPTH",
]


def config_dir() -> Path:
    """The shipped configs (``assets/configs`` of the checkout or of an installed copy)."""
    return assets_dir() / "configs"


# A key=value override is typed on a command line: these bounds are far above any real one, and
# keep a hostile one (an alias bomb, a nesting bomb) from exhausting memory or the stack.
MAX_OVERRIDE_CHARS = 10_000
MAX_OVERRIDE_DEPTH = 20


def _resolve_path(path: str | Path) -> Path:
    """A path as given, else a name under ``assets/configs`` (``cpu-demo`` -> cpu-demo.yaml)."""
    p = Path(path)
    if p.exists():
        return p
    shipped = config_dir()
    for candidate in (shipped / p, shipped / f"{p}.yaml"):
        if candidate.exists():
            return candidate
    known = ", ".join(sorted(q.stem for q in shipped.glob("*.yaml")))
    raise ConfigError(f"config '{path}' not found; give a YAML path or one of: {known}")


class _OverrideLimit(yaml.YAMLError):
    """An override value beyond what ``_OverrideLoader`` accepts."""


class _OverrideLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases (``*a`` repeats a node: ten nested ones make 10^10
    nodes once OmegaConf copies them) and with a nesting bound."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _OverrideLimit("anchors and aliases (&name, *name) are not allowed in an "
                                 "override; write the value out")
        self.depth += 1
        try:
            if self.depth > MAX_OVERRIDE_DEPTH:
                raise _OverrideLimit(f"the value nests deeper than {MAX_OVERRIDE_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _override_value(item: str, text: str) -> Any:
    """The YAML value of one ``key=value`` override (``item``), parsed within the bounds."""
    try:
        return yaml.load(text, Loader=_OverrideLoader)  # a SafeLoader: builds plain data only
    except _OverrideLimit as err:
        raise ConfigError(f"override '{_shorten(item)}': {err}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"override '{_shorten(item)}': the value is not valid YAML: "
                          f"{err}") from err


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."


def _omegaconf_message(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None) or "?"
    message = str(err).split("\n")[0]
    section = getattr(err, "object_type", None)
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)) and is_dataclass(section):
        # an unknown key: name the ones that exist
        message += f"; known keys: {', '.join(f.name for f in fields(section))}"
    return f"bad config key '{key}': {message}"


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Load ``path`` (YAML, or a name under ``assets/configs``; ``None``: the defaults), apply
    ``key=value`` overrides (dotted keys, YAML values), check types and values."""
    layers = [OmegaConf.structured(TrainConfig)]
    source = "defaults"
    if path is not None:
        resolved = _resolve_path(path)
        source = str(resolved)
        try:
            loaded = OmegaConf.load(resolved)
        except Exception as err:  # YAML syntax
            raise ConfigError(f"{resolved}: not valid YAML: {err}") from err
        if not OmegaConf.is_dict(loaded):
            raise ConfigError(f"{resolved}: the top level must be a mapping of keys")
        if not loaded:  # an empty file (/dev/null, a typo'd redirect) would train the defaults
            raise ConfigError(f"{resolved}: the file sets nothing; give a config (e.g. cpu-demo) "
                              "or write the keys that differ from the defaults")
        for key in SWITCHES:
            value = OmegaConf.select(loaded, key, default=None)
            if value is not None:
                _check_switch(key, value, source)
        layers.append(loaded)
    try:
        merged = OmegaConf.merge(*layers)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{source}: {_omegaconf_message(err)}") from err
    for item in overrides:
        if len(item) > MAX_OVERRIDE_CHARS:
            raise ConfigError(f"override '{_shorten(item)}' is {len(item)} characters; at most "
                              f"{MAX_OVERRIDE_CHARS} (put long settings in the YAML file)")
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override '{_shorten(item)}' must look like key=value "
                              "(e.g. run.steps=10)")
        value = _override_value(item, text)
        try:
            if key in SWITCHES:
                _check_switch(key, value, f"override '{item}'")
            # update (not a dotlist merge) so that list items can be set: tasks.envs.0.weight=2
            OmegaConf.update(merged, key, value, merge=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"override '{_shorten(item)}': {_omegaconf_message(err)}") from err
    try:
        cfg: TrainConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        raise ConfigError(f"{source}: {_omegaconf_message(err)}") from err
    _validate(cfg, source)
    _resolve_bf16_if_native(cfg)
    return cfg


def _resolve_bf16_if_native(cfg: TrainConfig) -> None:
    """``bfloat16-if-native`` made ``bfloat16`` or ``float32`` for this machine, once, where the
    config loads: every reader (the backends, the printed headers, a run's config.json) then
    sees the dtype that runs."""
    sections = [cfg.actor, cfg.extractor, cfg.warmstart]
    if not any(s.dtype == BF16_IF_NATIVE for s in sections):
        return
    import torch

    device = resolve_device(torch, "auto")  # no config setting names a device
    for section in sections:
        if section.dtype == BF16_IF_NATIVE:
            section.dtype = resolve_dtype(section.dtype, device)


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain nested dict of a config (for metrics headers and checkpoints)."""
    return asdict(cfg)
